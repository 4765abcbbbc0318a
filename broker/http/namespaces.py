"""``/admin/v2/namespaces/{tenant}[/{namespace}[/...]]`` (Pulsar's ``NamespacesBase``):
list, policies, create (PUT), delete; ``replication``, ``deduplication``,
``retention``, ``messageTTL`` (GET / POST), ``permissions`` (GET) and
``permissions/{role}`` (POST grant / DELETE revoke), ``bundles``, ``unload`` and
``{bundle}/unload`` (PUT), ``topics``. Bodies and answers have Pulsar's JSON
shapes (``Policies``, ``RetentionPolicies``, ``BundlesData``)."""
from __future__ import annotations

from aiohttp import web

from proto.errors import InvalidArgument

from .edge import json_response, no_content, read_json, run_verb

routes = web.RouteTableDef()
NS = "/admin/v2/namespaces/{tenant}/{namespace}"


def _ns(request: web.Request) -> str:
    return f"{request.match_info['tenant']}/{request.match_info['namespace']}"


def retention_policies(policies: dict):
    """Pulsar's RetentionPolicies JSON, or None when the broker default applies."""
    if policies.get("retention_time_in_minutes") is None and policies.get("retention_size_in_mb") is None:
        return None
    return {"retentionTimeInMinutes": policies.get("retention_time_in_minutes"),
            "retentionSizeInMB": policies.get("retention_size_in_mb")}


def pulsar_policies(policies: dict) -> dict:
    """Pulsar's ``Policies`` JSON of our stored policies (``Policies`` dataclass as a dict)."""
    auth = policies.get("auth_policies") or {}
    return {"replication_clusters": policies.get("replication_clusters", []),
            "deduplicationEnabled": policies.get("deduplication_enabled"),
            "message_ttl_in_seconds": policies.get("message_ttl_in_seconds") or None,
            "retention_policies": retention_policies(policies),
            "auth_policies": {"namespace_auth": auth.get("namespace_auth", {}),
                              "destination_auth": auth.get("destination_auth", {}),
                              "subscription_auth_roles": auth.get("subscription_auth_roles", {})}}


@routes.get("/admin/v2/namespaces/{tenant}")
async def list_namespaces(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "namespaces.list", {"tenant": request.match_info["tenant"]}))


@routes.get(NS)
async def get_policies(request: web.Request) -> web.Response:
    return json_response(pulsar_policies(await run_verb(request, "namespaces.policies", {"namespace": _ns(request)})))


@routes.put(NS)
async def create_namespace(request: web.Request) -> web.Response:
    await run_verb(request, "namespaces.create", {"namespace": _ns(request)})
    body = await read_json(request, {})
    if isinstance(body, dict) and body.get("replication_clusters"):   # Pulsar's Policies body, the part we keep
        await run_verb(request, "namespaces.set_clusters",
                       {"namespace": _ns(request), "clusters": body["replication_clusters"]})
    return no_content()


@routes.delete(NS)
async def delete_namespace(request: web.Request) -> web.Response:
    await run_verb(request, "namespaces.delete", {"namespace": _ns(request)})
    return no_content()


@routes.get(NS + "/topics")
async def list_topics(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "topics.list", {"namespace": _ns(request)}))


# ---- replication, deduplication, retention, TTL --------------------------------
@routes.get(NS + "/replication")
async def get_replication(request: web.Request) -> web.Response:
    policies = await run_verb(request, "namespaces.policies", {"namespace": _ns(request)})
    return json_response(policies.get("replication_clusters", []))


@routes.post(NS + "/replication")
async def set_replication(request: web.Request) -> web.Response:
    await run_verb(request, "namespaces.set_clusters", {"namespace": _ns(request), "clusters": await read_json(request)})
    return no_content()


@routes.get(NS + "/deduplication")
async def get_deduplication(request: web.Request) -> web.Response:
    policies = await run_verb(request, "namespaces.policies", {"namespace": _ns(request)})
    return json_response(policies.get("deduplication_enabled"))


@routes.post(NS + "/deduplication")
async def set_deduplication(request: web.Request) -> web.Response:
    await run_verb(request, "namespaces.set_deduplication",
                   {"namespace": _ns(request), "enabled": await read_json(request)})
    return no_content()


@routes.get(NS + "/retention")
async def get_retention(request: web.Request) -> web.Response:
    return json_response(retention_policies(await run_verb(request, "namespaces.policies",
                                                           {"namespace": _ns(request)})))


@routes.post(NS + "/retention")
async def set_retention(request: web.Request) -> web.Response:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidArgument('the body must be RetentionPolicies: {"retentionTimeInMinutes": N, '
                              '"retentionSizeInMB": N}')
    await run_verb(request, "namespaces.set_retention", {
        "namespace": _ns(request), "retention_time_minutes": body.get("retentionTimeInMinutes"),
        "retention_size_mb": body.get("retentionSizeInMB")})
    return no_content()


@routes.get(NS + "/messageTTL")
async def get_ttl(request: web.Request) -> web.Response:
    policies = await run_verb(request, "namespaces.policies", {"namespace": _ns(request)})
    return json_response(policies.get("message_ttl_in_seconds") or None)


@routes.post(NS + "/messageTTL")
async def set_ttl(request: web.Request) -> web.Response:
    await run_verb(request, "namespaces.set_message_ttl",
                   {"namespace": _ns(request), "ttl_seconds": await read_json(request)})
    return no_content()


# ---- permissions -----------------------------------------------------------------
@routes.get(NS + "/permissions")
async def get_permissions(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "namespaces.permissions", {"namespace": _ns(request)}))


@routes.post(NS + "/permissions/{role}")
async def grant_permission(request: web.Request) -> web.Response:
    await run_verb(request, "namespaces.grant_permission", {
        "namespace": _ns(request), "role": request.match_info["role"], "actions": await read_json(request)})
    return no_content()


@routes.delete(NS + "/permissions/{role}")
async def revoke_permission(request: web.Request) -> web.Response:
    await run_verb(request, "namespaces.revoke_permission",
                   {"namespace": _ns(request), "role": request.match_info["role"]})
    return no_content()


# ---- bundles ---------------------------------------------------------------------
@routes.get(NS + "/bundles")
async def get_bundles(request: web.Request) -> web.Response:
    """Pulsar's BundlesData (``boundaries``, ``numBundles``) plus ``owners`` (ours:
    ``{range: owner service URL}``)."""
    return json_response(await run_verb(request, "namespaces.bundles", {"namespace": _ns(request)}))


@routes.put(NS + "/unload")
async def unload_namespace(request: web.Request) -> web.Response:
    await run_verb(request, "namespaces.unload", {"namespace": _ns(request)})
    return no_content()


@routes.put(NS + "/{bundle}/unload")
async def unload_bundle(request: web.Request) -> web.Response:
    await run_verb(request, "namespaces.unload", {"namespace": _ns(request), "bundle": request.match_info["bundle"]})
    return no_content()
