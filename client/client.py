"""``AsyncClient``: the asyncio entry point of the SDK (Pulsar's PulsarClientImpl).

Connections (Pulsar's ConnectionPool and lookup service): the service URL
(``minipulsar://host:port``, or several hosts of one cluster
``minipulsar://h1:p1,h2:p2``) answers lookups, partition metadata and
namespace topics; each topic's producer, consumer and reader streams go to the
broker that owns the topic, found by a lookup (``client.lookup``), on one
channel per broker shared by the whole client (``client.connection_pool``).
A standalone broker answers that the service URL itself serves every topic.
Lookups and unary calls take ``operation_timeout_seconds`` at most.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, Optional

import grpc

from client.connection import map_rpc_error, parse_service_url
from client.connection_pool import ConnectionPool, ServiceNameResolver, call_any_host, is_connection_failure, \
    tls_connection_problem, wait_settled
from client.errors import AlreadyClosed, ConnectError, InvalidConfiguration, PulsarException, ServiceNotReady, \
    Timeout
from client.lookup import DEFAULT_MAX_LOOKUP_REDIRECTS, LookupResult, LookupService
from client.message_id import MessageId
from client.producer_config import ProducerConfig
from client.auth import with_client_authentication
from client.tls import TLS_OPTION_NAMES, tls_channel_security
from client.topic_name import TopicName
from proto import broker_pb2 as pb
from proto.broker_pb2_grpc import PulsarBrokerStub

__all__ = ["AsyncClient"]

log = logging.getLogger(__name__)


class AsyncClient:
    """Asyncio client of a minipulsar broker (official pulsar-client ``Client``
    API, awaitable).

    ``service_url``: ``minipulsar://host:port``, or several hosts of one cluster
    ``minipulsar://h1:p1,h2:p2`` (any live one answers; a host that refuses
    connections is skipped); ``operation_timeout_seconds``: timeout of lookups
    and producer/consumer creation (seconds); ``connection_timeout_ms``: cap of
    the channels' reconnect backoff and the time a host of a multi-host URL
    gets to accept a connection (ms), and a looked-up owner to complete it;
    ``keep_alive_interval_seconds``: HTTP/2 keepalive pings while streams are open,
    a connection whose ping is not answered within that interval is closed (its
    producers and consumers look their topics up again); ``max_lookup_redirects``: REDIRECT
    answers one lookup follows at most (Pulsar's maxLookupRedirects, 20).
    TLS (``client.tls``): a ``minipulsar+ssl://`` URL (or ``use_tls=True``)
    with ``tls_trust_certs_file_path`` (PEM CA bundle; default the system
    roots), optionally ``tls_certificate_file_path`` / ``tls_key_file_path``
    (client certificate); ``tls_allow_insecure_connection`` /
    ``tls_validate_hostname`` are accepted, gRPC always verifies both;
    ``authentication``: a ``client.auth.Authentication`` such as
    ``AuthenticationToken(token or callable)`` (Pulsar's ``authentication``), its
    metadata sent on every call and stream.
    Construct inside a running event loop (or use it from one before the first
    call); use as ``async with AsyncClient(url) as client:``.  Raises
    ``InvalidConfiguration`` for a bad URL, timeout or redirect limit.

    Attributes used by producers/consumers: ``lookup_topic`` / ``broker_stub`` /
    ``stub_for_topic`` / ``invalidate_lookup`` (where a topic's streams go),
    ``stub`` (``PulsarBrokerStub`` of the service URL: lookups, metadata,
    admin), ``operation_timeout_seconds`` (float), ``loop``.
    """

    def __init__(self, service_url: str, operation_timeout_seconds: float = 30,
                 connection_timeout_ms: int = 10000, keep_alive_interval_seconds: float = 30,
                 max_lookup_redirects: int = DEFAULT_MAX_LOOKUP_REDIRECTS, authentication: Any = None,
                 **unsupported: Any):
        tls_options = {key: unsupported.pop(key) for key in TLS_OPTION_NAMES if key in unsupported}
        for key in ("io_threads", "message_listener_threads", "concurrent_lookup_requests",
                    "log_conf_file_path", "logger", "listener_name", "stats_interval_in_seconds"):
            if unsupported.pop(key, None) not in (None, False):
                log.warning("client option %s is not supported by minipulsar and is ignored", key)
        if unsupported:
            raise InvalidConfiguration(f"unknown client option(s): {', '.join(sorted(unsupported))}")
        self.service_url = parse_service_url(service_url)
        if not operation_timeout_seconds or operation_timeout_seconds <= 0:
            raise InvalidConfiguration(f"operation_timeout_seconds must be > 0, got {operation_timeout_seconds!r}")
        self.operation_timeout_seconds = float(operation_timeout_seconds)
        self.connection_timeout_ms = int(connection_timeout_ms)
        self.keep_alive_interval_seconds = keep_alive_interval_seconds
        # proto.channels.ChannelSecurity of every channel of this client (None: plaintext, no credentials)
        self.security = with_client_authentication(tls_channel_security(self.service_url, **tls_options),
                                                   authentication)
        self._resolver = ServiceNameResolver(self.service_url)
        self._lookups = LookupService(self._ask_lookup, self.operation_timeout_seconds, max_lookup_redirects)
        self._pool: ConnectionPool | None = None
        self._channel: grpc.aio.Channel | None = None  # the first host's (a single-host URL's only channel)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handles: list = []
        self._closed = False
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # bind on first use inside a loop
        self._bind()

    # -- channel ------------------------------------------------------------------
    def _bind(self) -> None:
        if self._channel is not None:
            return
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise InvalidConfiguration("AsyncClient must be used from a running asyncio event loop; "
                                       "use client.Client for synchronous code") from None
        self._pool = ConnectionPool(self.keep_alive_interval_seconds, self.connection_timeout_ms, self.security)
        self._channel = self._pool.channel(self.service_url.target)

    @property
    def stub(self) -> PulsarBrokerStub:
        """The broker stub of the service URL (``proto.broker_pb2_grpc``): its live
        host for a multi-host URL (the host that last answered).  Lookups,
        partition metadata, namespace topics and admin go there; a topic's
        streams go to ``stub_for_topic(topic)``."""
        self._bind()
        return self._pool.stub(self._resolver.current)

    @property
    def pool(self) -> ConnectionPool:
        """The client's ``ConnectionPool`` (one channel per broker ``host:port``)."""
        self._bind()
        return self._pool

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this client (and its channel) belongs to."""
        self._bind()
        return self._loop

    def _check_open(self) -> None:
        """Raise ``AlreadyClosed`` after ``close()``."""
        if self._closed:
            raise AlreadyClosed("the client is closed; create a new one")

    def _register(self, handle) -> None:
        """Remember a producer/consumer/reader (anything with ``async close()``)
        so that ``close()`` closes it."""
        if handle not in self._handles:
            self._handles.append(handle)

    def _unregister(self, handle) -> None:
        """Forget a handle (called by the handle's own close); unknown ones are ignored."""
        try:
            self._handles.remove(handle)
        except ValueError:
            pass

    async def _service_rpc(self, method: str, request, what: str):
        """Unary RPC ``method`` (``PulsarBrokerStub`` attribute name) on the service
        URL, waiting up to ``operation_timeout_seconds`` for a broker: a
        single-host URL waits for its channel (``wait_for_ready``); a multi-host
        URL asks its hosts in turn (``call_any_host``).  Raises the broker's error,
        ``ConnectError``, ``Timeout``, ``AlreadyClosed``."""
        self._check_open()
        self._bind()
        if not self.service_url.is_multi_host:
            return await self._unary(getattr(self.stub, method), request, what)
        response, _ = await call_any_host(self._pool, self._resolver, method, request,
                                          timeout=self.operation_timeout_seconds, what=what,
                                          connect_timeout=self.connection_timeout_ms / 1000,
                                          retry_for=self.operation_timeout_seconds)
        return response

    async def _unary(self, rpc, request, what: str):
        self._check_open()
        started = time.monotonic()
        try:
            if self._channel is not None and \
                    self._channel.get_state(try_to_connect=False) != grpc.ChannelConnectivity.READY:
                response = await self._first_try(rpc, request, what)
                if response is not None:
                    return response
            remaining = max(0.001, self.operation_timeout_seconds - (time.monotonic() - started))
            return await rpc(request, timeout=remaining, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            err = map_rpc_error(exc, what)
            if isinstance(err, Timeout) and self._channel is not None:
                state = self._channel.get_state(try_to_connect=False)
                if state != grpc.ChannelConnectivity.READY:
                    hint = getattr(self, "_tls_hint", None)
                    raise ConnectError(f"{what}: cannot connect to the broker at {self.service_url} within "
                                       f"{self.operation_timeout_seconds:g}s (channel {state.name}); "
                                       + (f"{hint}" if hint else "check the service URL and that the broker "
                                                                 "is running")) from None
            raise err from None

    async def _first_try(self, rpc, request, what: str):
        """While the service URL's channel is not connected: once it has settled
        (connected or failed, within ``connection_timeout_ms``), one fail-fast try of
        ``rpc``, so that a TLS mismatch (``proto.tls_errors``: a plaintext client at
        a TLS port, a wrong CA, ...) raises a clear, non-retriable ``ConnectError``
        at once instead of a timeout. Returns the response, or None to go on
        waiting for the broker (it may just be starting)."""
        started = time.monotonic()
        timeout = min(self.connection_timeout_ms / 1000, self.operation_timeout_seconds)
        if not await wait_settled(self._channel, timeout) or \
                self._channel.get_state(try_to_connect=False) != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return None
        try:
            return await rpc(request, timeout=max(0.001, self.operation_timeout_seconds - (time.monotonic() - started)),
                             wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            if not is_connection_failure(exc):
                raise
            problem = await tls_connection_problem(self.security, self.service_url.target, exc)
            if problem is not None and problem[1]:
                error = ConnectError(f"{what}: {problem[0]}")
                error.retriable = error.retriable_at_creation = False
                error.tls_problem = True
                raise error from None
            self._tls_hint = problem[0] if problem is not None else None
            return None

    # -- producers, consumers, readers ---------------------------------------------------
    async def create_producer(self, topic: str, producer_name: str | None = None, **options):
        """Create a producer (``Producer``, or ``PartitionedProducer`` for a
        partitioned topic); options: ``client.producer_config.ProducerConfig``
        (official pulsar-client names).  Raises ``InvalidTopicName``,
        ``InvalidConfiguration``, ``ProducerBusy``, ``TopicNotFound``,
        ``ConnectError``/``Timeout``, ``AlreadyClosed``."""
        from client.partitioned_producer import PartitionedProducer
        from client.producer import Producer
        self._check_open()
        self._bind()
        name = str(TopicName.get(topic))
        conf = ProducerConfig.from_options(producer_name=producer_name, **options)
        partitions = await self.get_partitioned_topic_metadata(name)
        if partitions > 0:
            producer = await PartitionedProducer(self, name, partitions, conf)._start()
        else:
            producer = await Producer(self, name, conf)._start()
        if self._closed:
            await producer.close()
            raise AlreadyClosed("the client was closed while the producer was being created")
        self._register(producer)
        return producer

    async def subscribe(self, topic: str | list[str] | re.Pattern, subscription_name: str, **options):
        """Subscribe (official ``Client.subscribe``): ``topic`` is one topic, a
        list, or a compiled regex over a namespace.  Delegates to
        ``client.consumer.create_consumer``."""
        self._check_open()
        self._bind()
        from client import consumer
        return await consumer.create_consumer(self, topic, subscription_name, **options)

    async def create_reader(self, topic: str, start_message_id: MessageId, **options):
        """Create a reader (official ``Client.create_reader``) starting at
        ``start_message_id`` (``MessageId.earliest``/``latest`` or an id).
        Delegates to ``client.reader.create_reader``."""
        self._check_open()
        self._bind()
        from client import reader
        return await reader.create_reader(self, topic, start_message_id, **options)

    # -- where topics are served (Pulsar's lookup service and connection pool) -------
    async def lookup_topic(self, topic: str) -> LookupResult:
        """Which broker serves ``topic`` (one topic or one partition, full name):
        the cached answer or a ``Lookup`` on the service URL following redirects
        (``client.lookup.LookupService``).  Raises ``ConnectError`` (no broker
        reachable; fail-fast: a stream (re)connection retries with its own
        backoff), ``Timeout``, ``ServiceNotReady`` (no owner yet, too many
        redirects), the broker's error, ``AlreadyClosed``."""
        self._check_open()
        self._bind()
        return await self._lookups.lookup(topic)

    def broker_stub(self, result: LookupResult) -> PulsarBrokerStub:
        """The stub of the pooled channel to the broker of a lookup answer
        (``result.target``; the service URL's host for a proxy-through answer)."""
        self._check_open()
        self._bind()
        return self._pool.stub(result.target)

    async def connected_stub(self, result: LookupResult) -> PulsarBrokerStub:
        """``broker_stub(result)`` once its channel is connected: a broker that does not
        complete the connection within ``connection_timeout_ms`` (a paused process: the
        kernel accepts, nobody answers) raises ``ConnectError`` and counts as unresponsive,
        so the next lookup starts at another host (Pulsar's connectionTimeoutMs)."""
        from client.connection_pool import wait_settled
        from client.errors import ConnectError

        stub = self.broker_stub(result)
        if not await wait_settled(self._pool.channel(result.target), self.connection_timeout_ms / 1000):
            self.mark_host_unresponsive(result.target)
            raise ConnectError(f"broker {result.broker_url} did not complete the connection within "
                               f"connection_timeout_ms={self.connection_timeout_ms}; looking up again")
        return stub

    async def stub_for_topic(self, topic: str) -> PulsarBrokerStub:
        """The ``PulsarBrokerStub`` to open ``topic``'s streams on (Pulsar's
        ``getConnection(topic)``): ``lookup_topic`` then the pooled channel of the
        owner.  Raises as ``lookup_topic``."""
        return self.broker_stub(await self.lookup_topic(topic))

    def mark_host_unresponsive(self, target: str) -> None:
        """``target`` (``"host:port"``) left a stream unanswered (send or ack timeout, a
        paused broker): the next lookups start at the following host of the service URL."""
        self._resolver.mark_failed(target)

    def invalidate_lookup(self, topic: str) -> None:
        """Forget ``topic``'s cached lookup answer (its stream failed, was refused
        as not served there, or the connection dropped): the next
        ``lookup_topic`` asks again."""
        self._lookups.invalidate(topic)

    async def _ask_lookup(self, target: Optional[str], request: pb.LookupRequest,
                          timeout: float) -> tuple[Optional[pb.LookupResponse], str]:
        """One LookupRequest (``client.lookup.AskLookup``): to any live host of the
        service URL when ``target`` is None, else to that broker; fail-fast (a
        refused connection raises ``ConnectError`` at once).  UNIMPLEMENTED (a
        broker without Lookup) returns ``(None, target)``."""
        what = f"lookup of {request.topic}"
        try:
            if target is None:
                return await call_any_host(self._pool, self._resolver, "Lookup", request, timeout=timeout,
                                           what=what, connect_timeout=self.connection_timeout_ms / 1000,
                                           map_errors=False)
            return await self._pool.stub(target).Lookup(request, timeout=timeout, wait_for_ready=False), target
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None, target or self._resolver.current  # call_any_host made the host that answered current
            raise map_rpc_error(exc, f"{what} at {target or self.service_url}") from None

    async def _topic_rpc(self, topic: str, method: str, request, what: str):
        """Unary RPC ``method`` for ``topic`` on the broker that serves it
        (``lookup_topic``), within ``operation_timeout_seconds``.  A proxy-through
        answer sends it on the service URL as ``_service_rpc``.  Retried with
        backoff (0.1 s doubling to 1 s), after forgetting the lookup, while the
        lookup finds no broker (``ConnectError``, ``ServiceNotReady``) or the
        looked-up owner refuses (``ServiceNotReady``: not served there) or is
        unreachable (``ConnectError``).  Raises the last error at the deadline,
        or the broker's other errors at once."""
        from client.connection import Backoff
        loop = self.loop
        deadline = loop.time() + self.operation_timeout_seconds
        backoff = Backoff(0.1, 1.0)
        while True:
            result = None
            try:
                result = await self.lookup_topic(topic)
                if result.proxy_through_service_url:
                    return await self._service_rpc(method, request, what)
                remaining = max(0.001, deadline - loop.time())
                try:
                    return await getattr(self.broker_stub(result), method)(request, timeout=remaining,
                                                                           wait_for_ready=False)
                except grpc.aio.AioRpcError as exc:
                    raise map_rpc_error(exc, f"{what} at {result.broker_url}") from None
            except (ConnectError, ServiceNotReady) as exc:
                self.invalidate_lookup(topic)
                if result is not None and result.proxy_through_service_url:
                    raise  # the service URL itself serves the topic: as before lookups
                delay = backoff.next()
                if loop.time() + delay >= deadline:
                    raise
                log.debug("[%s] %s: %s; looking the topic up again in %.2fs", topic, what, exc, delay)
                await asyncio.sleep(delay)

    # -- lookups ---------------------------------------------------------------------
    async def get_partitioned_topic_metadata(self, topic: str) -> int:
        """Number of partitions of ``topic`` (0 = not partitioned).  Raises
        ``InvalidTopicName``, ``ConnectError``/``Timeout``, ``AlreadyClosed``."""
        name = str(TopicName.get(topic))
        resp = await self._service_rpc("GetPartitionedTopicMetadata", pb.TopicRequest(topic=name),
                                       f"partition metadata of {name}")
        return int(resp.partitions)

    async def get_topic_partitions(self, topic: str) -> list[str]:
        """Partition names of ``topic`` (``[topic]`` when not partitioned), as the
        official ``Client.get_topic_partitions``."""
        tn = TopicName.get(topic)
        n = await self.get_partitioned_topic_metadata(str(tn))
        return [str(tn.partition(i)) for i in range(n)] if n > 0 else [str(tn)]

    async def get_last_message_id(self, topic: str) -> MessageId:
        """Id of the last entry of ``topic`` (one topic or partition), ``MessageId(-1, -1)``
        (== ``MessageId.earliest``) when empty, asked to the broker that serves the
        topic.  Raises ``TopicNotFound`` etc."""
        name = str(TopicName.get(topic))
        resp = await self.last_message_id_response(name)
        pos = resp.last_message_id
        partition = TopicName.get(name).partition_index
        if pos.ledger_id < 0 or pos.entry_id < 0:
            return MessageId(-1, -1)
        return MessageId(pos.ledger_id, pos.entry_id, partition)

    async def last_message_id_response(self, topic: str) -> pb.LastMessageIdResponse:
        """The raw ``GetLastMessageId`` answer for ``topic`` (full name of one topic or
        partition: last and first entry, -1:-1 when empty), from the broker that
        serves it (``_topic_rpc``).  Raises ``TopicNotFound``, ``ConnectError``,
        ``Timeout``, ``AlreadyClosed``..."""
        self._check_open()
        return await self._topic_rpc(topic, "GetLastMessageId", pb.TopicRequest(topic=topic),
                                     f"last message id of {topic}")

    async def get_topics_of_namespace(self, namespace: str) -> list[str]:
        """Topics of ``tenant/namespace`` (partitions listed individually)."""
        if not isinstance(namespace, str) or namespace.count("/") != 1:
            raise InvalidConfiguration(f"invalid namespace {namespace!r}: expected tenant/namespace")
        resp = await self._service_rpc("GetTopicsOfNamespace", pb.NamespaceRequest(namespace=namespace),
                                       f"topics of {namespace}")
        return list(resp.topics)

    # -- closing -------------------------------------------------------------------
    async def close(self) -> None:
        """Close every producer, consumer and reader, then every channel of the
        connection pool.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        handles, self._handles = list(self._handles), []
        results = await asyncio.gather(*(h.close() for h in handles), return_exceptions=True)
        for h, r in zip(handles, results):
            if isinstance(r, BaseException) and not isinstance(r, PulsarException):
                log.warning("closing %r failed: %r", h, r)
        self._lookups.close()
        if self._pool is not None:
            await self._pool.close()

    async def __aenter__(self) -> "AsyncClient":
        self._bind()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncClient {self.service_url}{' closed' if self._closed else ''}>"
