"""``/admin/v2/brokers`` (Pulsar's ``BrokersBase``): ``/brokers`` and
``/brokers/{cluster}`` list the live brokers' ids (``host:port`` of their web
service, Pulsar's broker ids; the gRPC address for a broker without one),
``/brokers/leaderBroker`` answers Pulsar's ``BrokerInfo`` (``serviceUrl``,
``brokerId``), ``/brokers/health`` ``"ok"``."""
from __future__ import annotations

from aiohttp import web

from proto.errors import NotFound

from .edge import json_response, run_verb, service_of, web_service_url_of

routes = web.RouteTableDef()


def _broker_id(entry: dict) -> str:
    url = entry.get("web_service_url") or entry.get("service_url", "")
    return url.split("://", 1)[-1]


async def _web_url(service, service_url: str) -> str:
    if getattr(service, "namespace_service", None) is None:
        return getattr(service, "web_service_url", "") or service_url
    return await web_service_url_of(service, service_url) or service_url


@routes.get("/admin/v2/brokers/leaderBroker")
async def leader_broker(request: web.Request) -> web.Response:
    leader = (await run_verb(request, "brokers.leader_broker"))["service_url"]
    url = await _web_url(service_of(request), leader)
    return json_response({"serviceUrl": url, "brokerId": url.split("://", 1)[-1]})


@routes.get("/admin/v2/brokers/health")
async def health(request: web.Request) -> web.Response:
    await run_verb(request, "brokers.health")
    return web.Response(text="ok")


@routes.get("/admin/v2/brokers")
async def active_brokers(request: web.Request) -> web.Response:
    service = service_of(request)
    entries = await run_verb(request, "brokers.list")
    if getattr(service, "namespace_service", None) is None:
        entries = [{**e, "web_service_url": getattr(service, "web_service_url", "")} for e in entries]
    return json_response(sorted(_broker_id(e) for e in entries))


@routes.get("/admin/v2/brokers/{cluster}")
async def active_brokers_of(request: web.Request) -> web.Response:
    cluster = request.match_info["cluster"]
    if cluster != service_of(request).config.cluster_name:
        await run_verb(request, "clusters.get", {"name": cluster})          # 404 for an unknown cluster
        raise NotFound(f"cluster {cluster} is served by other brokers; ask one of them (this broker is of "
                       f"cluster {service_of(request).config.cluster_name})")
    return await active_brokers(request)
