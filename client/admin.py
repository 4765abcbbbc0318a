"""Admin client (the role of Pulsar's ``pulsar-admin`` / PulsarAdmin Java API):
one Python method per broker admin verb, sent as ``Admin(AdminRequest{method,
body_json})`` and answered with JSON.

``AdminClient`` is asyncio; ``SyncAdminClient`` wraps it for scripts and the
``minipulsar-admin`` CLI.  Errors come back as gRPC status ``"ClassName:
message"`` and are raised as the matching ``client.errors`` class
(``NotFound``, ``AlreadyExists``, ``PreconditionFailed``, ``InvalidArgument``,
``TopicNotFound``, ...).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc

from client.connection import create_channel, map_rpc_error, parse_service_url
from client.connection_pool import ConnectionPool, ServiceNameResolver, call_any_host, connection_failure_reason, \
    tls_connection_problem
from client.errors import AlreadyClosed, ConnectError, InvalidConfiguration
from client.loop_thread import LoopThread
from client.message_id import MessageId
from client.auth import with_client_authentication
from client.tls import tls_channel_security
from proto import broker_pb2 as pb
from proto.broker_pb2_grpc import PulsarBrokerStub

__all__ = ["AdminClient", "SyncAdminClient"]


class AdminClient:
    """Asyncio admin client of one cluster's broker (``minipulsar://host:port``),
    or of any live host of a multi-host URL (``minipulsar://h1:p1,h2:p2``:
    a host that refuses connections is skipped for the next one, as Pulsar's
    admin client with several hosts).

    Every call takes ``operation_timeout_seconds`` at most and returns the
    broker's decoded JSON answer (dict/list).  Raises the broker's error class
    (see module doc), ``ConnectError``/``Timeout`` when the broker is unreachable,
    ``AlreadyClosed`` after ``close()``.  Construct and use inside one event loop.
    TLS: a ``minipulsar+ssl://`` URL with the client's ``tls_*`` options (``client.tls``).
    """

    def __init__(self, service_url: str, operation_timeout_seconds: float = 30,
                 connect_timeout_seconds: float = 2, *, tls_trust_certs_file_path: str | None = None,
                 tls_certificate_file_path: str | None = None, tls_key_file_path: str | None = None,
                 tls_allow_insecure_connection: bool = False, tls_validate_hostname: bool | None = None,
                 use_tls: bool = False, authentication: Any = None):
        self.service_url = parse_service_url(service_url)
        if operation_timeout_seconds <= 0:
            raise InvalidConfiguration("operation_timeout_seconds must be > 0")
        if connect_timeout_seconds <= 0:
            raise InvalidConfiguration("connect_timeout_seconds must be > 0")
        self.operation_timeout_seconds = float(operation_timeout_seconds)
        self.connect_timeout_seconds = float(connect_timeout_seconds)
        self._channel: grpc.aio.Channel | None = None
        self._stub: PulsarBrokerStub | None = None
        self._pool: ConnectionPool | None = None  # multi-host URL: one channel per host
        self._resolver = ServiceNameResolver(self.service_url)
        self._connected = False
        self._closed = False
        # proto.channels.ChannelSecurity of the admin's channels (None: plaintext, no credentials)
        self.security = with_client_authentication(
            tls_channel_security(self.service_url, use_tls, tls_trust_certs_file_path, tls_allow_insecure_connection,
                                 tls_validate_hostname, tls_certificate_file_path, tls_key_file_path),
            authentication)   # Pulsar's PulsarAdmin authentication: a client.auth.Authentication

    async def call(self, method: str, **body: Any) -> Any:
        """Send admin verb ``method`` (e.g. ``"topics.stats"``) with JSON ``body``;
        returns the decoded answer.  Fields whose value is None are left out.

        The first call fails fast when nothing listens at the service URL: the
        broker gets ``connect_timeout_seconds`` to accept the connection (a
        broker that is just starting), then ``ConnectError`` names the URL (its
        ``unreachable`` attribute is ``(service_url, reason)``).
        Once connected, a call waits up to the operation timeout for a broker
        that restarts."""
        if self._closed:
            raise AlreadyClosed("the admin client is closed")
        request = pb.AdminRequest(method=method,
                                  body_json=json.dumps({k: v for k, v in body.items() if v is not None}))
        if self.service_url.is_multi_host:
            resp = await self._call_any_host(method, request)
            return json.loads(resp.body_json) if resp.body_json else None
        if self._channel is None:
            self._channel = create_channel(self.service_url, security=self.security)
            self._stub = PulsarBrokerStub(self._channel)
        try:
            if self._connected:
                resp = await self._stub.Admin(request, timeout=self.operation_timeout_seconds, wait_for_ready=True)
            else:
                resp = await self._first_call(request)
        except grpc.aio.AioRpcError as exc:
            raise map_rpc_error(exc, f"admin {method}") from None
        return json.loads(resp.body_json) if resp.body_json else None

    async def _first_call(self, request: pb.AdminRequest) -> pb.AdminResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.operation_timeout_seconds
        try:
            # not wait_for_ready: a refused connection fails this call at once instead of
            # being retried (with backoff) until the operation timeout
            resp = await self._stub.Admin(request, timeout=self.operation_timeout_seconds, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            if type(map_rpc_error(exc)) is not ConnectError:
                raise                                          # the broker answered (e.g. ServiceNotReady)
            tls_problem = await tls_connection_problem(self.security, self.service_url.target, exc)
            if tls_problem is not None and tls_problem[1]:     # a TLS misconfiguration: waiting cannot help
                error = ConnectError(f"admin {request.method}: {tls_problem[0]}")
                error.retriable = error.retriable_at_creation = False
                error.tls_problem = True
                raise error from None
            wait = min(self.connect_timeout_seconds, max(0.0, deadline - loop.time()))
            try:
                await asyncio.wait_for(self._channel.channel_ready(), wait)
            except asyncio.TimeoutError:
                error = ConnectError(f"cannot connect to the broker at {self.service_url} ({_reason(exc)}); "
                                     f"check that the broker is running and that the service URL is right")
                error.unreachable = (str(self.service_url), _reason(exc))
                raise error from None
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise
            resp = await self._stub.Admin(request, timeout=remaining, wait_for_ready=True)
        self._connected = True
        return resp

    async def _call_any_host(self, method: str, request: pb.AdminRequest) -> pb.AdminResponse:
        """A multi-host URL's call: its hosts in turn (``call_any_host``), each given
        ``connect_timeout_seconds`` to accept a connection.  Before the first
        answer, hosts are retried for ``connect_timeout_seconds`` (then
        ``ConnectError`` naming every host, ``unreachable`` set); afterwards for
        the whole operation timeout (a cluster whose brokers restart)."""
        if self._pool is None:
            self._pool = ConnectionPool(security=self.security)
        retry_for = self.operation_timeout_seconds if self._connected else self.connect_timeout_seconds
        resp, _ = await call_any_host(self._pool, self._resolver, "Admin", request,
                                      timeout=self.operation_timeout_seconds, what=f"admin {method}",
                                      connect_timeout=self.connect_timeout_seconds, retry_for=retry_for)
        self._connected = True
        return resp

    async def close(self) -> None:
        """Close the channel(s).  Idempotent."""
        self._closed = True
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def __aenter__(self) -> "AdminClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- clusters -----------------------------------------------------------------
    async def create_cluster(self, name: str, service_url: str, service_url_tls: str | None = None,
                             authentication_plugin: str | None = None, authentication_parameters: str | None = None):
        """Register cluster ``name`` reachable at ``service_url`` (``minipulsar://host:port``)
        and, over TLS, ``service_url_tls`` (``minipulsar+ssl://``, Pulsar's brokerServiceUrlTls);
        ``authentication_parameters`` (``token:<jwt>`` or ``file:///path``): the credentials
        replicators use towards it (Pulsar's ClusterData authenticationParameters)."""
        return await self.call("clusters.create", name=name, service_url=service_url, service_url_tls=service_url_tls,
                               authentication_plugin=authentication_plugin,
                               authentication_parameters=authentication_parameters)

    async def list_clusters(self) -> list[str]:
        """Names of the registered clusters."""
        return await self.call("clusters.list")

    async def get_cluster(self, name: str) -> dict:
        """Cluster data (``service_url``, ...).  Raises ``NotFound``."""
        return await self.call("clusters.get", name=name)

    async def update_cluster(self, name: str, service_url: str, service_url_tls: str | None = None,
                             authentication_plugin: str | None = None, authentication_parameters: str | None = None):
        """Change the service URL of cluster ``name`` (and, when given, its TLS service URL
        and the replicators' credentials towards it: they reconnect with them)."""
        return await self.call("clusters.update", name=name, service_url=service_url, service_url_tls=service_url_tls,
                               authentication_plugin=authentication_plugin,
                               authentication_parameters=authentication_parameters)

    async def delete_cluster(self, name: str):
        """Remove cluster ``name`` from the registry."""
        return await self.call("clusters.delete", name=name)

    # -- tenants ----------------------------------------------------------------
    async def create_tenant(self, tenant: str, allowed_clusters: list[str] | None = None,
                            admin_roles: list[str] | None = None):
        """Create ``tenant``; ``allowed_clusters`` defaults to the broker's cluster;
        ``admin_roles``: the roles administering it (Pulsar's TenantInfo adminRoles)."""
        return await self.call("tenants.create", tenant=tenant, allowed_clusters=allowed_clusters,
                               admin_roles=list(admin_roles) if admin_roles is not None else None)

    async def update_tenant(self, tenant: str, allowed_clusters: list[str], admin_roles: list[str] | None = None):
        """Replace the clusters ``tenant`` may use (and its ``admin_roles`` when given)."""
        return await self.call("tenants.update", tenant=tenant, allowed_clusters=list(allowed_clusters),
                               admin_roles=list(admin_roles) if admin_roles is not None else None)

    async def list_tenants(self) -> list[str]:
        """Names of all tenants."""
        return await self.call("tenants.list")

    async def get_tenant(self, tenant: str) -> dict:
        """Tenant info (``allowed_clusters``).  Raises ``NotFound``."""
        return await self.call("tenants.get", tenant=tenant)

    async def delete_tenant(self, tenant: str):
        """Delete ``tenant`` (raises ``PreconditionFailed`` while it has namespaces)."""
        return await self.call("tenants.delete", tenant=tenant)

    # -- namespaces --------------------------------------------------------------
    async def create_namespace(self, namespace: str):
        """Create ``tenant/namespace``."""
        return await self.call("namespaces.create", namespace=namespace)

    async def list_namespaces(self, tenant: str) -> list[str]:
        """Namespaces of ``tenant`` as ``tenant/ns``.  Raises ``NotFound``."""
        return await self.call("namespaces.list", tenant=tenant)

    async def get_policies(self, namespace: str) -> dict:
        """The namespace's policies (dedup, clusters, TTL, retention, ...)."""
        return await self.call("namespaces.policies", namespace=namespace)

    async def delete_namespace(self, namespace: str):
        """Delete an empty namespace (``PreconditionFailed`` while it has topics)."""
        return await self.call("namespaces.delete", namespace=namespace)

    async def set_deduplication(self, namespace: str, enabled: bool) -> dict:
        """Turn broker-side message deduplication on/off; returns the policies."""
        return await self.call("namespaces.set_deduplication", namespace=namespace, enabled=bool(enabled))

    async def set_namespace_clusters(self, namespace: str, clusters: list[str]) -> dict:
        """Set the namespace's replication clusters (geo-replication)."""
        return await self.call("namespaces.set_clusters", namespace=namespace, clusters=list(clusters))

    async def set_message_ttl(self, namespace: str, ttl_seconds: int) -> dict:
        """Message TTL in seconds (0 = none)."""
        return await self.call("namespaces.set_message_ttl", namespace=namespace, ttl_seconds=int(ttl_seconds))

    async def set_retention(self, namespace: str, retention_time_minutes: int, retention_size_mb: int) -> dict:
        """Retention of acknowledged messages: minutes and MB (-1 = infinite, 0 = none)."""
        return await self.call("namespaces.set_retention", namespace=namespace,
                               retention_time_minutes=int(retention_time_minutes),
                               retention_size_mb=int(retention_size_mb))

    # -- topics --------------------------------------------------------------------
    async def create_topic(self, topic: str):
        """Create a non-partitioned topic (``AlreadyExists`` if it exists)."""
        return await self.call("topics.create", topic=topic)

    async def create_partitioned_topic(self, topic: str, partitions: int):
        """Create a partitioned topic with ``partitions`` partitions."""
        return await self.call("topics.create_partitioned", topic=topic, partitions=int(partitions))

    async def update_partitioned_topic(self, topic: str, partitions: int) -> dict:
        """Raise the number of partitions of a partitioned topic to ``partitions``
        (Pulsar's updatePartitionedTopic; never fewer: ``InvalidArgument``;
        ``NotFound`` when ``topic`` is not partitioned).  Returns
        ``{"partitions": N, "previous": M}``."""
        return await self.call("topics.update_partitioned", topic=topic, partitions=int(partitions))

    async def get_partitioned_topic_metadata(self, topic: str) -> int:
        """Number of partitions (0 = not partitioned)."""
        return int((await self.call("topics.partitioned_metadata", topic=topic))["partitions"])

    async def list_topics(self, namespace: str) -> list[str]:
        """Topics of ``tenant/namespace`` (partitions individually)."""
        return await self.call("topics.list", namespace=namespace)

    async def list_partitioned_topics(self, namespace: str) -> list[str]:
        """Partitioned topics of ``tenant/namespace``."""
        return await self.call("topics.list_partitioned", namespace=namespace)

    async def get_stats(self, topic: str) -> dict:
        """Topic stats (Pulsar's TopicStats names: msgInCounter, subscriptions, ...)."""
        return await self.call("topics.stats", topic=topic)

    async def get_internal_stats(self, topic: str) -> dict:
        """Managed-ledger internal stats (ledgers, cursors)."""
        return await self.call("topics.internal_stats", topic=topic)

    async def delete_topic(self, topic: str, force: bool = False):
        """Delete ``topic`` (``force``: even with connected clients/subscriptions)."""
        return await self.call("topics.delete", topic=topic, force=bool(force))

    async def unload_topic(self, topic: str):
        """Unload ``topic`` from the broker (clients reconnect)."""
        return await self.call("topics.unload", topic=topic)

    async def get_subscriptions(self, topic: str) -> list[str]:
        """Subscription names of ``topic`` (sorted)."""
        return await self.call("topics.subscriptions", topic=topic)

    async def unsubscribe(self, topic: str, subscription: str):
        """Delete ``subscription`` of ``topic`` (``NotFound`` if absent)."""
        return await self.call("topics.unsubscribe", topic=topic, subscription=subscription)

    async def create_subscription(self, topic: str, subscription: str, message_id: MessageId | str = "latest",
                                  is_excluded: bool = False) -> dict:
        """Create the durable ``subscription`` (Pulsar's createSubscription) whose
        next message is ``message_id`` (``MessageId``, ``"ledger:entry"``,
        ``"earliest"`` or ``"latest"``), or the one after it with ``is_excluded``;
        on every partition of a partitioned topic.  Raises ``AlreadyExists``."""
        if isinstance(message_id, MessageId):
            message_id = f"{message_id.ledger_id}:{message_id.entry_id}"
        return await self.call("topics.create_subscription", topic=topic, subscription=subscription,
                               message_id=str(message_id), is_excluded=bool(is_excluded) or None)

    async def reset_cursor(self, topic: str, subscription: str, message_id: MessageId | str | None = None,
                           timestamp_ms: int | None = None, is_excluded: bool = False) -> dict:
        """Move ``subscription`` to ``message_id`` (``MessageId`` or ``"ledger:entry"``;
        the next message delivered, or the one after it with ``is_excluded``, as
        Pulsar's resetCursor) or to the first message published at/after
        ``timestamp_ms`` (ms since epoch); exactly one of them."""
        if (message_id is None) == (timestamp_ms is None):
            raise InvalidConfiguration("reset_cursor needs exactly one of message_id or timestamp_ms")
        if isinstance(message_id, MessageId):
            message_id = f"{message_id.ledger_id}:{message_id.entry_id}"
        return await self.call("topics.reset_cursor", topic=topic, subscription=subscription,
                               message_id=message_id,
                               timestamp_ms=int(timestamp_ms) if timestamp_ms is not None else None,
                               is_excluded=True if is_excluded and message_id is not None else None)

    async def set_replication_clusters(self, topic: str, clusters: list[str]) -> dict:
        """Topic-level replication clusters (override the namespace's)."""
        return await self.call("topics.set_replication_clusters", topic=topic, clusters=list(clusters))

    # -- permissions (Pulsar's namespaces/topics grant-permission, revoke-permission, permissions)
    async def grant_namespace_permission(self, namespace: str, role: str, actions: list[str]) -> dict:
        """Grant ``actions`` (``produce``, ``consume``; ``functions`` ignored) on ``namespace``
        to ``role``; returns the namespace's ``{role: [actions]}``."""
        return await self.call("namespaces.grant_permission", namespace=namespace, role=role, actions=list(actions))

    async def revoke_namespace_permission(self, namespace: str, role: str) -> dict:
        """Revoke ``role``'s actions on ``namespace`` (its connected producers/consumers are ended)."""
        return await self.call("namespaces.revoke_permission", namespace=namespace, role=role)

    async def get_namespace_permissions(self, namespace: str) -> dict:
        """``{role: [actions]}`` granted on ``namespace``."""
        return await self.call("namespaces.permissions", namespace=namespace)

    async def grant_subscription_permission(self, namespace: str, subscription: str, roles: list[str]) -> dict:
        """Reserve ``subscription`` (on the namespace's topics) to ``roles`` (added to its roles)."""
        return await self.call("namespaces.grant_subscription_permission", namespace=namespace,
                               subscription=subscription, roles=list(roles))

    async def revoke_subscription_permission(self, namespace: str, subscription: str, role: str) -> dict:
        """Remove ``role`` from ``subscription``'s roles."""
        return await self.call("namespaces.revoke_subscription_permission", namespace=namespace,
                               subscription=subscription, role=role)

    async def grant_topic_permission(self, topic: str, role: str, actions: list[str]) -> dict:
        """Grant ``actions`` on one topic to ``role``; returns the topic's own grants."""
        return await self.call("topics.grant_permission", topic=topic, role=role, actions=list(actions))

    async def revoke_topic_permission(self, topic: str, role: str) -> dict:
        """Revoke ``role``'s topic-level actions on ``topic``."""
        return await self.call("topics.revoke_permission", topic=topic, role=role)

    async def get_topic_permissions(self, topic: str) -> dict:
        """``{role: [actions]}`` on ``topic`` (namespace and topic grants merged)."""
        return await self.call("topics.permissions", topic=topic)

    async def health(self) -> dict:
        """The broker's health answer (``ok``, ``cluster``, ``topics``)."""
        return await self.call("brokers.health")

    # -- broker clusters (Pulsar's brokers list / leader-broker, topics lookup, namespace bundles)
    async def list_brokers(self) -> list[dict]:
        """The cluster's live brokers with their load reports (``service_url``, ``bundles``,
        ``topics``, ``msg_rate_in``/``_out`` msgs/s, ``cpu`` %, ``leader``)."""
        return await self.call("brokers.list")

    async def leader_broker(self) -> dict:
        """``{"service_url": ...}`` of the cluster's leader broker (its load manager)."""
        return await self.call("brokers.leader_broker")

    async def lookup_topic(self, topic: str) -> dict:
        """``{"broker_url": ..., "bundle": ...}``: the broker serving ``topic`` (assigned when unowned)."""
        return await self.call("topics.lookup", topic=topic)

    async def get_bundles(self, namespace: str) -> dict:
        """The namespace's bundles: ``boundaries`` (hex strings), ``numBundles``, ``owners``
        (``{range: service URL or None}``)."""
        return await self.call("namespaces.bundles", namespace=namespace)

    async def unload_namespace(self, namespace: str, bundle: str | None = None) -> dict:
        """Unload every bundle of ``namespace``, or the one named ``0xLOWER_0xUPPER``:
        ``{"unloaded": {range: topics closed}}``; the topics move on their next lookup."""
        return await self.call("namespaces.unload", namespace=namespace, bundle=bundle)

    async def split_bundle(self, namespace: str, bundle: str) -> dict:
        """Split the bundle ``0xLOWER_0xUPPER`` of ``namespace`` in two: ``{"bundles": [r1, r2]}``."""
        return await self.call("namespaces.split_bundle", namespace=namespace, bundle=bundle)


def _reason(exc: grpc.aio.AioRpcError) -> str:
    """Why the connection failed, short: 'connection refused', 'name not resolved', ..."""
    return connection_failure_reason(exc)


class SyncAdminClient:
    """Blocking wrapper of ``AdminClient`` (same methods, not awaitable; a
    multi-host service URL as there; the same TLS options), with its own event loop thread.  Use as a context
    manager or call ``close()``."""

    def __init__(self, service_url: str, operation_timeout_seconds: float = 30,
                 connect_timeout_seconds: float = 2, *, tls_trust_certs_file_path: str | None = None,
                 tls_certificate_file_path: str | None = None, tls_key_file_path: str | None = None,
                 tls_allow_insecure_connection: bool = False, tls_validate_hostname: bool | None = None,
                 use_tls: bool = False, authentication: Any = None):
        parse_service_url(service_url)  # fail early, in the caller's thread
        self._lt = LoopThread("minipulsar-admin")
        self._admin = AdminClient(service_url, operation_timeout_seconds, connect_timeout_seconds,
                                  tls_trust_certs_file_path=tls_trust_certs_file_path,
                                  tls_certificate_file_path=tls_certificate_file_path,
                                  tls_key_file_path=tls_key_file_path,
                                  tls_allow_insecure_connection=tls_allow_insecure_connection,
                                  tls_validate_hostname=tls_validate_hostname, use_tls=use_tls,
                                  authentication=authentication)

    def __getattr__(self, name: str):
        attr = getattr(self._admin, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def blocking(*args, **kwargs):
            return self._lt.run(attr(*args, **kwargs))
        blocking.__name__ = name
        blocking.__doc__ = attr.__doc__
        return blocking

    def close(self) -> None:
        """Close the admin client and stop its thread.  Idempotent."""
        if self._lt.running:
            self._lt.run(self._admin.close())
            self._lt.stop()

    def __enter__(self) -> "SyncAdminClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
