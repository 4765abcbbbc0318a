"""``/admin/v2/tenants[/{tenant}]`` (Pulsar's ``TenantsBase``): list, get, create
(PUT), update (POST), delete; body and answer are Pulsar's ``TenantInfo``
(``adminRoles``, ``allowedClusters``)."""
from __future__ import annotations

from aiohttp import web

from proto.errors import InvalidArgument

from .edge import json_response, no_content, read_json, run_verb

routes = web.RouteTableDef()


def tenant_info(stored: dict) -> dict:
    """Pulsar's TenantInfo JSON of a stored tenant dict."""
    return {"adminRoles": list(stored.get("admin_roles") or []),
            "allowedClusters": list(stored.get("allowed_clusters") or [])}


async def _body(request: web.Request) -> dict:
    data = await read_json(request, {})
    if not isinstance(data, dict):
        raise InvalidArgument("the body must be TenantInfo: {\"adminRoles\": [...], \"allowedClusters\": [...]}")
    return {"tenant": request.match_info["tenant"], "allowed_clusters": data.get("allowedClusters"),
            "admin_roles": data.get("adminRoles")}


@routes.get("/admin/v2/tenants")
async def list_tenants(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "tenants.list"))


@routes.get("/admin/v2/tenants/{tenant}")
async def get_tenant(request: web.Request) -> web.Response:
    return json_response(tenant_info(await run_verb(request, "tenants.get", {"tenant": request.match_info["tenant"]})))


@routes.put("/admin/v2/tenants/{tenant}")
async def create_tenant(request: web.Request) -> web.Response:
    await run_verb(request, "tenants.create", await _body(request))
    return no_content()


@routes.post("/admin/v2/tenants/{tenant}")
async def update_tenant(request: web.Request) -> web.Response:
    await run_verb(request, "tenants.update", await _body(request))
    return no_content()


@routes.delete("/admin/v2/tenants/{tenant}")
async def delete_tenant(request: web.Request) -> web.Response:
    await run_verb(request, "tenants.delete", {"tenant": request.match_info["tenant"]})
    return no_content()
