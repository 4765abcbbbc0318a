"""``/admin/v2/clusters[/{cluster}]`` (Pulsar's ``ClustersBase``): list, get, create
(PUT), update (POST), delete. The body and answer are Pulsar's ``ClusterData``
(``brokerServiceUrl``, ``brokerServiceUrlTls``, ``authenticationPlugin``,
``authenticationParameters``); ``serviceUrl`` (Pulsar's HTTP URL) is accepted as
the broker service URL when ``brokerServiceUrl`` is absent. The answer never
carries ``authenticationParameters`` (the replicators' credentials)."""
from __future__ import annotations

from aiohttp import web

from proto.errors import InvalidArgument

from .edge import json_response, no_content, read_json, run_verb

routes = web.RouteTableDef()


def cluster_data(stored: dict) -> dict:
    """Pulsar's ClusterData JSON of a stored cluster dict (``service_url``, ...)."""
    out = {"brokerServiceUrl": stored.get("service_url"), "brokerServiceUrlTls": stored.get("service_url_tls")}
    if stored.get("authentication_plugin"):
        out["authenticationPlugin"] = stored["authentication_plugin"]
    return out


def _verb_body(name: str, data) -> dict:
    if not isinstance(data, dict):
        raise InvalidArgument("the body must be ClusterData: {\"brokerServiceUrl\": \"minipulsar://host:port\"}")
    return {"name": name, "service_url": data.get("brokerServiceUrl") or data.get("serviceUrl"),
            "service_url_tls": data.get("brokerServiceUrlTls"),
            "authentication_plugin": data.get("authenticationPlugin"),
            "authentication_parameters": data.get("authenticationParameters")}


@routes.get("/admin/v2/clusters")
async def list_clusters(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "clusters.list"))


@routes.get("/admin/v2/clusters/{cluster}")
async def get_cluster(request: web.Request) -> web.Response:
    return json_response(cluster_data(await run_verb(request, "clusters.get", {"name": request.match_info["cluster"]})))


@routes.put("/admin/v2/clusters/{cluster}")
async def create_cluster(request: web.Request) -> web.Response:
    await run_verb(request, "clusters.create", _verb_body(request.match_info["cluster"], await read_json(request)))
    return no_content()


@routes.post("/admin/v2/clusters/{cluster}")
async def update_cluster(request: web.Request) -> web.Response:
    await run_verb(request, "clusters.update", _verb_body(request.match_info["cluster"], await read_json(request)))
    return no_content()


@routes.delete("/admin/v2/clusters/{cluster}")
async def delete_cluster(request: web.Request) -> web.Response:
    await run_verb(request, "clusters.delete", {"name": request.match_info["cluster"]})
    return no_content()
