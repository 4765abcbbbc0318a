"""The broker's web service (Pulsar's ``WebService``): one aiohttp application on
``web_service_port`` serving the REST admin resources, the lookup v2 endpoint,
``/metrics`` and the dashboard; HTTPS only with the broker's TLS material when
``tls_enabled`` (Pulsar's ``webServicePortTls``)."""
from __future__ import annotations

import logging
import ssl
from typing import Optional

from aiohttp import web

from . import brokers, clusters, lookup, namespaces, persistent_topics
from .edge import SERVICE_KEY, error_middleware
from .metrics_resource import REGISTRY_KEY, metrics

__all__ = ["WebService", "build_app"]

log = logging.getLogger(__name__)



def build_app(service, registry) -> web.Application:
    """The application of ``service`` (a BrokerService): every resource module's
    routes, ``/metrics`` from ``registry`` (a prometheus CollectorRegistry), the
    dashboard, and the ``{"reason": ...}`` error middleware."""
    from . import dashboard, tenants

    app = web.Application(middlewares=[error_middleware],
                          client_max_size=max(1024, service.config.http_max_request_size))
    app[SERVICE_KEY] = service
    app[REGISTRY_KEY] = registry
    app.router.add_get("/metrics", metrics)
    for module in (clusters, tenants, namespaces, persistent_topics, brokers, lookup, dashboard):
        app.router.add_routes(module.routes)
    dashboard.setup(app)
    return app


def ssl_context(certfile: str, keyfile: str, trust_certs: str = "", require_client_cert: bool = False):
    """A server TLS context from PEM files (TLS 1.2+); with ``require_client_cert``
    only clients with a certificate signed by ``trust_certs`` connect."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile, keyfile)
    if trust_certs:
        ctx.load_verify_locations(trust_certs)
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


class WebService:
    """Start/stop the web service of a broker. ``start(host, port)`` returns the
    bound port (port 0: any free one; -1: disabled, returns -1). After ``start``:
    ``port``, ``url`` (``http(s)://<advertised>:<port>``)."""

    def __init__(self, service, registry, config):
        self.service = service
        self.registry = registry
        self.config = config
        self._runner: Optional[web.AppRunner] = None
        self.port = -1
        self.url = ""

    async def start(self, host: str, port: int) -> int:
        """Bind and serve. Raises OSError when the port cannot be bound."""
        if port < 0:
            return -1
        c = self.config
        ctx = None
        if c.tls_enabled:
            ctx = ssl_context(c.tls_certificate_file_path, c.tls_key_file_path, c.tls_trust_certs_file_path,
                              c.tls_require_trusted_client_cert_on_connect)
        # shutdown_timeout: open requests (dashboard streams) get 1 s, then are cancelled
        self._runner = web.AppRunner(build_app(self.service, self.registry), access_log=None,
                                     handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=ctx, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if ctx else 'http'}://{c.advertised_address}:{self.port}"
        return self.port

    async def stop(self) -> None:
        """Close the listener and running requests (dashboard streams end)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
