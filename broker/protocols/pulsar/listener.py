"""The Pulsar-protocol listener of a broker: an asyncio server on
``broker_service_port_pulsar`` (Pulsar's brokerServicePort, default 6650; 0 = any free
port, -1 = off), or with ``tls_enabled`` (every port of the broker serves TLS only) on
``broker_service_port_pulsar_tls`` (brokerServicePortTls, default 6651) with the
broker's TLS certificate and key (mutual TLS with ``tls_require_trusted_client_cert_on_connect``),
each connection served by a :class:`PulsarConnection`.
In a broker cluster it registers its URLs (``registry``) for the other brokers' lookups."""
from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Optional

from .connection import PulsarConnection
from .registry import register

log = logging.getLogger(__name__)

class PulsarListener:
    """Start/stop the Pulsar-protocol servers of ``service`` (a BrokerService; its
    ``config`` gives ports, addresses and TLS files). After :meth:`start`: ``port`` and
    ``tls_port`` (None when off), ``url`` / ``url_tls`` ("" when off)."""

    def __init__(self, service):
        self.service = service
        self.config = service.config
        self.port: Optional[int] = None
        self.tls_port: Optional[int] = None
        self.url = ""
        self.url_tls = ""
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Bind the configured ports (OSError when one is in use) and register the URLs
        in a shared metadata store."""
        c = self.config
        if c.broker_service_port_pulsar >= 0 and not c.tls_enabled:
            server = await asyncio.start_server(self._serve, c.bind_address, c.broker_service_port_pulsar,
                                                limit=1 << 20)
            self._servers.append(server)
            self.port = server.sockets[0].getsockname()[1]
            self.url = f"pulsar://{c.advertised_address}:{self.port}"
        if c.tls_enabled and c.broker_service_port_pulsar_tls >= 0:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(c.tls_certificate_file_path, c.tls_key_file_path)
            if c.tls_trust_certs_file_path:
                ctx.load_verify_locations(c.tls_trust_certs_file_path)
                if c.tls_require_trusted_client_cert_on_connect:
                    ctx.verify_mode = ssl.CERT_REQUIRED
            server = await asyncio.start_server(self._serve, c.bind_address, c.broker_service_port_pulsar_tls,
                                                ssl=ctx, limit=1 << 20)
            self._servers.append(server)
            self.tls_port = server.sockets[0].getsockname()[1]
            self.url_tls = f"pulsar+ssl://{c.advertised_address}:{self.tls_port}"
        store = self.service.metadata
        if self._servers and getattr(store, "shared", False):
            await register(store, self.service.service_url, self.url, self.url_tls)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tls = writer.get_extra_info("sslcontext") is not None
        conn = PulsarConnection(self.service, reader, writer, self.url, self.url_tls)
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            await conn.run()
        except Exception:  # noqa: BLE001 - one connection's failure never stops the listener
            log.exception("[%s] Pulsar-protocol connection failed%s", conn.peer, " (TLS)" if tls else "")
        finally:
            self._connections.discard(task)
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    async def stop(self) -> None:
        """Stop accepting, close every connection."""
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        for server in self._servers:
            try:
                await asyncio.wait_for(server.wait_closed(), 2)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass
        self._servers.clear()
