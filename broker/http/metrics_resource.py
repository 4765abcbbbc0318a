"""``/metrics``: the Prometheus text of ``broker.metrics`` (Pulsar's metrics servlet).

With ``authenticate_metrics_endpoint`` on (Pulsar's ``authenticateMetricsEndpoint``,
off by default) the caller must send ``Authorization: Bearer <token>`` of a superuser
role (the figures name every tenant's topics): 401 without a valid token, 403 for
another role (``BrokerSecurity.check_metrics``)."""
from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .edge import service_of

REGISTRY_KEY = web.AppKey("metrics_registry", object)


async def metrics(request: web.Request) -> web.Response:
    """The registry's families in the Prometheus text format (collected on the event loop:
    the collectors only copy numbers), once the caller passed ``check_metrics``."""
    security = getattr(service_of(request), "security", None)
    if security is not None:
        header = request.headers.get("Authorization")
        security.check_metrics([("authorization", header)] if header is not None else [])
    body = generate_latest(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
