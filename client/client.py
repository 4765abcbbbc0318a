"""``AsyncClient``: the asyncio entry point of the SDK (Pulsar's PulsarClientImpl).

One gRPC channel per client; producers, consumers and readers open streams
on it.  Lookups (partition metadata, last message id, namespace topics) are
unary RPCs with ``operation_timeout_seconds``.
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import grpc

from client.connection import create_channel, map_rpc_error, parse_service_url
from client.errors import AlreadyClosed, ConnectError, InvalidConfiguration, PulsarException, Timeout
from client.message_id import MessageId
from client.producer_config import ProducerConfig
from client.topic_name import TopicName
from proto import broker_pb2 as pb
from proto.broker_pb2_grpc import PulsarBrokerStub

__all__ = ["AsyncClient"]

log = logging.getLogger(__name__)


class AsyncClient:
    """Asyncio client of a minipulsar broker (official pulsar-client ``Client``
    API, awaitable).

    ``service_url``: ``minipulsar://host:port``; ``operation_timeout_seconds``:
    timeout of lookups and producer/consumer creation (seconds);
    ``connection_timeout_ms``: cap of the channel's reconnect backoff (ms);
    ``keep_alive_interval_seconds``: HTTP/2 keepalive pings while streams are
    open.  Construct inside a running event loop (or use it from one before
    the first call); use as ``async with AsyncClient(url) as client:``.
    Raises ``InvalidConfiguration`` for a bad URL or timeout.

    Attributes used by producers/consumers: ``stub`` (``PulsarBrokerStub``),
    ``operation_timeout_seconds`` (float), ``loop``.
    """

    def __init__(self, service_url: str, operation_timeout_seconds: float = 30,
                 connection_timeout_ms: int = 10000, keep_alive_interval_seconds: float = 30,
                 **unsupported: Any):
        for key in ("authentication", "io_threads", "message_listener_threads", "concurrent_lookup_requests",
                    "log_conf_file_path", "use_tls", "tls_trust_certs_file_path", "tls_allow_insecure_connection",
                    "tls_validate_hostname", "logger", "listener_name", "stats_interval_in_seconds"):
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
        self._channel: grpc.aio.Channel | None = None
        self._stub: PulsarBrokerStub | None = None
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
        self._channel = create_channel(self.service_url, self.keep_alive_interval_seconds,
                                       self.connection_timeout_ms)
        self._stub = PulsarBrokerStub(self._channel)

    @property
    def stub(self) -> PulsarBrokerStub:
        """The broker stub on this client's channel (``proto.broker_pb2_grpc``)."""
        self._bind()
        return self._stub

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

    async def _unary(self, rpc, request, what: str):
        self._check_open()
        try:
            return await rpc(request, timeout=self.operation_timeout_seconds, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            err = map_rpc_error(exc, what)
            if isinstance(err, Timeout) and self._channel is not None:
                state = self._channel.get_state(try_to_connect=False)
                if state != grpc.ChannelConnectivity.READY:
                    raise ConnectError(f"{what}: cannot connect to the broker at {self.service_url} within "
                                       f"{self.operation_timeout_seconds:g}s (channel {state.name}); check the "
                                       "service URL and that the broker is running") from None
            raise err from None

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

    # -- lookups ---------------------------------------------------------------------
    async def get_partitioned_topic_metadata(self, topic: str) -> int:
        """Number of partitions of ``topic`` (0 = not partitioned).  Raises
        ``InvalidTopicName``, ``ConnectError``/``Timeout``, ``AlreadyClosed``."""
        name = str(TopicName.get(topic))
        resp = await self._unary(self.stub.GetPartitionedTopicMetadata, pb.TopicRequest(topic=name),
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
        (== ``MessageId.earliest``) when empty.  Raises ``TopicNotFound`` etc."""
        name = str(TopicName.get(topic))
        resp = await self._unary(self.stub.GetLastMessageId, pb.TopicRequest(topic=name),
                                 f"last message id of {name}")
        pos = resp.last_message_id
        partition = TopicName.get(name).partition_index
        if pos.ledger_id < 0 or pos.entry_id < 0:
            return MessageId(-1, -1)
        return MessageId(pos.ledger_id, pos.entry_id, partition)

    async def get_topics_of_namespace(self, namespace: str) -> list[str]:
        """Topics of ``tenant/namespace`` (partitions listed individually)."""
        if not isinstance(namespace, str) or namespace.count("/") != 1:
            raise InvalidConfiguration(f"invalid namespace {namespace!r}: expected tenant/namespace")
        resp = await self._unary(self.stub.GetTopicsOfNamespace, pb.NamespaceRequest(namespace=namespace),
                                 f"topics of {namespace}")
        return list(resp.topics)

    # -- closing -------------------------------------------------------------------
    async def close(self) -> None:
        """Close every producer, consumer and reader, then the channel.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        handles, self._handles = list(self._handles), []
        results = await asyncio.gather(*(h.close() for h in handles), return_exceptions=True)
        for h, r in zip(handles, results):
            if isinstance(r, BaseException) and not isinstance(r, PulsarException):
                log.warning("closing %r failed: %r", h, r)
        if self._channel is not None:
            await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        self._bind()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncClient {self.service_url}{' closed' if self._closed else ''}>"
