"""One broker process: metadata store, bookie client, BrokerService, the gRPC
server and the HTTP metrics endpoint (Pulsar's ``PulsarService``)."""
from __future__ import annotations

import logging
import os
from typing import Optional

import grpc

from bookie.client import BookKeeper
from broker.config import BrokerConfig
from broker.metadata import open_metadata_store
from proto import broker_pb2_grpc
from proto.channels import ChannelSecurity, ServerSecurity, add_server_port
from proto.common import grpc_message_size_options
from proto.frame_errors import InvalidFrameInterceptor
from proto.metadata_url import parse_metadata_store_url

from . import tls_security
from .grpc_servicer import PulsarBrokerServicer
from .service.broker_service import BrokerService
from .service.errors import AlreadyExists

log = logging.getLogger(__name__)

GRPC_SERVER_OPTIONS = [
    *grpc_message_size_options(),
    ("grpc.so_reuseport", 0),
    # Clients ping every keep_alive_interval_seconds (Pulsar's keepAliveIntervalSeconds, 30 s) while
    # their streams are idle. gRPC servers by default accept such pings only every 5 min and answer
    # more with GOAWAY "too_many_pings", which drops every stream of the connection; accept 1/s.
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
]


def service_class():
    """The broker service class: ``GeoBrokerService`` (a ``BrokerService`` with the
    geo-replication controller and replicators, Pulsar's ``PersistentTopic`` replicators)."""
    from broker.replication.geo_service import GeoBrokerService
    return GeoBrokerService


# the broker's data-dir lock file (an flock naming the holder's pid, see proto.data_dir_lock)
BROKER_LOCK_FILE_NAME = "broker.lock"


class BrokerServer:
    """Start/stop a broker. After ``start()``: ``port`` (gRPC), ``http_port``, ``service``."""

    def __init__(self, config: BrokerConfig):
        if not config.bookies and parse_metadata_store_url(config.metadata_store_url)[0] != "etcd":
            raise ValueError("the broker needs bookies: set bookies = ['host:port', ...] or --bookies "
                             "(or a shared metadata_store_url where bookies register)")
        self.config = config
        self.port: Optional[int] = None
        self.http_port: Optional[int] = None
        # proto.channels security of the broker's port, of its links to the bookies and of its
        # own links to other brokers (None: plaintext, no credentials)
        self.server_security: Optional[ServerSecurity] = tls_security.server_security(config)
        self.bookie_client_security: Optional[ChannelSecurity] = tls_security.bookie_client_security(config)
        self.broker_client_security: Optional[ChannelSecurity] = tls_security.broker_client_security(config)
        self.metadata = None
        # broker.security.broker_security.BrokerSecurity: authentication / authorization (set by start)
        self.security = None
        self.bk = None
        self.service: Optional[BrokerService] = None
        self._server = None
        self._http = None
        self.pulsar_listener = None   # broker.protocols.pulsar.listener.PulsarListener (set by start)
        self._lock_fd = None    # <data_dir>/broker.lock while started (proto.data_dir_lock)

    @property
    def pulsar_port(self) -> int:
        """The bound Pulsar-protocol port (``broker_service_port_pulsar``), -1 when off or not started."""
        listener = self.pulsar_listener
        return listener.port if listener is not None and listener.port is not None else -1

    @property
    def pulsar_url(self) -> str:
        """``pulsar://<advertised_address>:<pulsar_port>`` for the official Pulsar clients, or
        ``pulsar+ssl://...:<TLS port>`` with ``tls_enabled`` ("" when off)."""
        listener = self.pulsar_listener
        return "" if listener is None else (listener.url or listener.url_tls)

    @property
    def pulsar_tls_port(self) -> int:
        """The bound Pulsar-protocol TLS port (``broker_service_port_pulsar_tls``), -1 when off."""
        listener = self.pulsar_listener
        return listener.tls_port if listener is not None and listener.tls_port is not None else -1

    @property
    def service_url(self) -> str:
        """``minipulsar://<advertised_address>:<port>`` (the bound gRPC port, so valid after
        ``start``); registered as this cluster's URL (Pulsar's brokerServiceUrl);
        ``minipulsar+ssl://...`` when the port serves TLS (``tls_enabled``, Pulsar's brokerServiceUrlTls)."""
        scheme = "minipulsar+ssl" if self.config.tls_enabled else "minipulsar"
        return f"{scheme}://{self.config.advertised_address}:{self.port}"

    async def start(self) -> None:
        """Open the metadata store (``<data_dir>/metadata.db``) and the bookie client, bind the
        gRPC port, register this cluster's service URL, start the BrokerService, serve gRPC and
        the HTTP /metrics endpoint. Raises OSError (or grpc's RuntimeError "Failed to bind") when
        the port cannot be bound, :class:`proto.data_dir_lock.DataDirLocked` (an OSError naming
        the holder's pid) when another broker uses ``data_dir``; after a failure ``stop()``
        releases what was started."""
        c = self.config
        os.makedirs(c.data_dir, exist_ok=True)
        from proto.data_dir_lock import lock_data_dir
        # one broker per data dir (raises DataDirLocked, an OSError naming the holder's pid)
        self._lock_fd = lock_data_dir(c.data_dir, "broker", BROKER_LOCK_FILE_NAME)
        self.metadata = await open_metadata_store(c.metadata_store_url,
                                                  default_sqlite_path=os.path.join(c.data_dir, "metadata.db"),
                                                  session_timeout_ms=c.metadata_store_session_timeout_millis)
        if c.configuration_metadata_store_url and c.configuration_metadata_store_url != c.metadata_store_url:
            from broker.metadata.routed_store import RoutedMetadataStore
            try:
                configuration = await open_metadata_store(
                    c.configuration_metadata_store_url,
                    default_sqlite_path=os.path.join(c.data_dir, "configuration.db"),
                    session_timeout_ms=c.metadata_store_session_timeout_millis)
            except BaseException:
                await self.metadata.close()
                self.metadata = None
                raise
            self.metadata = RoutedMetadataStore(self.metadata, configuration)
        self._build_authentication_securities()
        self.bk = BookKeeper(self.metadata, c.bookies, max_entry_size_bytes=c.max_message_size + 64 * 1024,
                             add_entry_timeout_s=c.bookkeeper_client_timeout_in_seconds,
                             security=self.bookie_client_security)
        from broker.security.broker_security import BrokerSecurity
        self.security = BrokerSecurity(c, None)
        interceptors = [InvalidFrameInterceptor()]
        if self.security.authentication is not None:  # refuse calls without valid credentials first
            from broker.security.authentication import AuthenticationInterceptor
            interceptors.insert(0, AuthenticationInterceptor(self.security.authentication))
        self._server = grpc.aio.server(options=GRPC_SERVER_OPTIONS, interceptors=interceptors)
        self.port = add_server_port(self._server, f"{c.bind_address}:{c.broker_service_port}", self.server_security)
        if not self.port:
            raise OSError(f"cannot bind the broker port {c.bind_address}:{c.broker_service_port} (in use?)")
        self.service = service_class()(c, self.metadata, self.bk)
        self.service.service_url = self.service_url
        self.service.broker_client_security = self.broker_client_security
        self.security.bind(self.service.resources)
        self.service.security = self.security
        await self._register_own_cluster()
        if self.metadata.shared:
            await self._ensure_default_namespace()
        await self.service.start()
        self.security.start(self.service)
        broker_pb2_grpc.add_PulsarBrokerServicer_to_server(PulsarBrokerServicer(self.service), self._server)
        await self._server.start()
        await self._start_web_service()
        if self.metadata.shared:
            # a broker of a cluster: bundle ownership, lookup and the load manager
            from broker.ownership.namespace_service import NamespaceService
            ns = NamespaceService(self.service, self.metadata, c, self.service_url)
            self.service.namespace_service = ns
            await ns.start()
        from .protocols.pulsar.listener import PulsarListener
        self.pulsar_listener = PulsarListener(self.service)
        await self.pulsar_listener.start()
        log.info("broker of cluster %s serving %s (REST admin, metrics and dashboard on :%s)", c.cluster_name,
                 self.service_url, self.http_port)

    async def _start_web_service(self) -> None:
        """Serve the HTTP side (REST admin, lookup v2, /metrics, dashboard; ``broker.http``)
        on ``web_service_port``, HTTPS only with ``tls_enabled``; before the namespace
        service starts, so the first load report carries its URL (``web_service_url``)."""
        from .http.server import WebService
        from .metrics import metrics_registry

        c = self.config
        self._http = WebService(self.service, metrics_registry(self.service), c)
        self.http_port = await self._http.start(c.bind_address, c.web_service_port)
        self.service.web_service_url = self._http.url

    def _build_authentication_securities(self) -> None:
        """Add the broker's own credentials to its outgoing links (Pulsar's
        ``brokerClientAuthenticationPlugin`` / ``Parameters`` towards other brokers and
        remote clusters, ``bookkeeperClientAuthentication*`` towards the bookies), keeping
        whatever else those securities carry."""
        import dataclasses

        from proto.authentication import authentication_from_params

        c = self.config
        broker_auth = authentication_from_params(c.broker_client_authentication_plugin,
                                                 c.broker_client_authentication_parameters)
        if broker_auth is not None:
            self.broker_client_security = dataclasses.replace(self.broker_client_security or ChannelSecurity(),
                                                              authentication=broker_auth)
        bookie_auth = authentication_from_params(c.bookkeeper_client_authentication_plugin,
                                                 c.bookkeeper_client_authentication_parameters)
        if bookie_auth is not None:
            self.bookie_client_security = dataclasses.replace(self.bookie_client_security or ChannelSecurity(),
                                                              authentication=bookie_auth)

    async def _register_own_cluster(self) -> None:
        """Write this cluster's service URL at ``/admin/clusters/<cluster_name>``: this broker's
        URL for a standalone broker; for a broker of a cluster, one multi-host URL listing every
        broker's host (this one added). Compare-and-set, retried: brokers starting together
        neither fail nor drop each other's host."""
        import json

        from broker.metadata.store import BadVersion

        path = f"/admin/clusters/{self.config.cluster_name}"
        mine = self.service_url.split("://", 1)[1]
        for _ in range(50):
            got = await self.metadata.get(path)
            if got is None:
                wanted, version = self.service_url, -1
            else:
                try:
                    data = json.loads(got.value or b"{}")
                except ValueError:
                    data = {}
                url = data.get("service_url") or ""
                if self.metadata.shared:
                    hosts = [h for h in url.split("://", 1)[-1].split(",") if h] if url else []
                    if mine in hosts:
                        return
                    wanted = self.service_url.split("://", 1)[0] + "://" + ",".join(hosts + [mine])
                elif url == self.service_url:
                    return
                else:
                    wanted = self.service_url
                data["service_url"] = wanted
                version = got.version
            value = {"service_url": wanted} if version == -1 else data
            if self.config.tls_enabled:  # Pulsar's brokerServiceUrlTls: what TLS clients of other clusters use
                value["service_url_tls"] = wanted
            elif version != -1 and value.get("service_url_tls", "").split("://", 1)[-1] == url.split("://", 1)[-1]:
                value.pop("service_url_tls")  # this broker's own former TLS URL: TLS is off now
            value = json.dumps(value).encode()
            try:
                await self.metadata.put(path, value, version)
                return
            except BadVersion:
                continue  # another broker registered meanwhile: read again
        raise RuntimeError(f"could not register cluster {self.config.cluster_name}: {path} keeps changing")

    async def _ensure_default_namespace(self) -> None:
        """A broker cluster's first broker creates tenant ``public`` and namespace
        ``public/default`` (what Pulsar's ``initialize-cluster-metadata`` and the
        standalone do); idempotent, safe when brokers start together."""
        from broker.service.resources import Policies

        from broker.metadata.store import BadVersion

        res = self.service.resources
        cluster = self.config.cluster_name
        try:
            await res.create_tenant("public", [cluster])
        except (AlreadyExists, BadVersion):  # BadVersion: another broker created it just now
            pass
        try:
            await res.create_namespace("public/default", Policies(replication_clusters=[cluster]))
        except (AlreadyExists, BadVersion):
            pass

    async def stop(self) -> None:
        """Stop gRPC (1 s grace for running calls) and the web service, then close the service, the bookie client,
        the metadata store and the HTTP endpoint; safe after a partial ``start``."""
        if self.pulsar_listener is not None:
            await self.pulsar_listener.stop()
        if self._server is not None:
            await self._server.stop(grace=1.0)
        if self._http is not None:
            await self._http.stop()
        if self.security is not None:
            await self.security.close()
        if self.service is not None:
            await self.service.close()
        if self.bk is not None:
            await self.bk.close()
        if self.metadata is not None:
            await self.metadata.close()
        if self._lock_fd is not None:
            from proto.data_dir_lock import unlock_data_dir
            unlock_data_dir(self._lock_fd)
            self._lock_fd = None
