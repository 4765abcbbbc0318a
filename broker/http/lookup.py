"""``/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}`` (Pulsar's
``TopicLookupBase``): the broker serving a topic, assigning its bundle when
unowned, as Pulsar's ``LookupData``: ``brokerUrl`` / ``brokerUrlTls`` (the
owner's service URL), ``httpUrl`` / ``httpUrlTls`` (its web service URL),
``nativeUrl``. Needs the ``lookup`` permission (produce or consume)."""
from __future__ import annotations

from aiohttp import web

from .brokers import _web_url
from .edge import json_response, run_verb, service_of

routes = web.RouteTableDef()


@routes.get("/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}")
async def lookup(request: web.Request) -> web.Response:
    m = request.match_info
    topic = f"persistent://{m['tenant']}/{m['namespace']}/{m['topic']}"
    owner = (await run_verb(request, "topics.lookup", {"topic": topic}))["broker_url"]
    http = await _web_url(service_of(request), owner)
    tls_service, tls_http = owner.startswith("minipulsar+ssl://"), http.startswith("https://")
    return json_response({"brokerUrl": None if tls_service else owner, "brokerUrlTls": owner if tls_service else None,
                          "httpUrl": None if tls_http else http, "httpUrlTls": http if tls_http else None,
                          "nativeUrl": owner})
