"""``/metrics``: the Prometheus text of ``broker.metrics`` (Pulsar's metrics servlet)."""
from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

REGISTRY_KEY = web.AppKey("metrics_registry", object)


async def metrics(request: web.Request) -> web.Response:
    """The registry's families in the Prometheus text format (collected on the event loop:
    the collectors only copy numbers)."""
    body = generate_latest(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
