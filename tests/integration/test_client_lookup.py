"""The SDK's topic lookup, connection pool and multi-host service URLs against
REAL brokers (the session's standalone cluster, a private one where a test
unloads topics).

- a standalone broker answers Lookup with CONNECT + proxy_through_service_url:
  the streams stay on the service URL's connection (also through a TCP proxy,
  which the broker's own URL would bypass);
- ``minipulsar://<down>,<live>``: a service URL whose first host refuses
  connections works for produce, consume, read, metadata, admin;
- where the lookup says the topic is served, the streams really go: a
  lookup-only broker in this process (``LookupFront``: answers Lookup from a
  script, refuses streams for topics it does not serve with ServiceNotReady
  "not served by this broker", as a non-owner broker of a cluster does, and
  forwards metadata to the real broker) redirects, names another owner, or
  names itself until the owner changes; an owner that goes away (its TCP path
  cut) is looked up again.

Broker-cluster tests (real brokers redirecting to each other, owners dying)
belong with the broker side of lookups.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import pytest

from client import AsyncClient, Client, ConsumerType, InitialPosition
from client.admin import AdminClient, SyncAdminClient
from client.errors import ConnectError
from client.message_id import MessageId
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from tests.procs import free_port
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(180)


def unique(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"


async def produce(client: AsyncClient, topic: str, payloads: list[bytes]) -> list[MessageId]:
    producer = await client.create_producer(topic, batching_enabled=False)
    try:
        return [await producer.send(p) for p in payloads]
    finally:
        await producer.close()


async def consume(client: AsyncClient, topic: str, count: int, sub: str = "sub") -> list[bytes]:
    consumer = await client.subscribe(topic, sub, consumer_type=ConsumerType.Shared,
                                      initial_position=InitialPosition.Earliest)
    try:
        out = []
        for _ in range(count):
            msg = await consumer.receive(timeout_millis=20_000)
            out.append(msg.data())
            consumer.acknowledge(msg)
        return out
    finally:
        await consumer.close()


# ---------------------------------------------------------------------------- a standalone broker
async def test_standalone_answers_connect_proxy_through(standalone):
    topic = unique("lookup-raw")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{standalone.port}") as channel:
        answer = await broker_pb2_grpc.PulsarBrokerStub(channel).Lookup(pb.LookupRequest(topic=topic), timeout=10)
    assert answer.response == pb.LookupResponse.CONNECT and answer.proxy_through_service_url
    assert answer.broker_service_url == standalone.service_url

    async with AsyncClient(standalone.service_url, operation_timeout_seconds=20) as client:
        result = await client.lookup_topic(topic)
        assert result.proxy_through_service_url and result.target == f"127.0.0.1:{standalone.port}"
        assert await client.stub_for_topic(topic) is client.stub       # one channel for everything
        await produce(client, topic, [b"a", b"b"])
        assert await consume(client, topic, 2) == [b"a", b"b"]
        assert (await client.get_last_message_id(topic)).entry_id >= 1
        assert client.pool.targets == [f"127.0.0.1:{standalone.port}"]


async def test_proxy_through_keeps_the_streams_on_the_proxy(standalone):
    """The broker's own URL would bypass the proxy: proxy-through keeps the connection
    the lookup used, so a cut of the proxy is seen by the producer and it reconnects."""
    topic = unique("lookup-proxy")
    async with TcpProxy("127.0.0.1", standalone.port) as proxy:
        async with AsyncClient(proxy.service_url, operation_timeout_seconds=20) as client:
            result = await client.lookup_topic(topic)
            assert result.target == proxy.address and result.proxy_through_service_url
            producer = await client.create_producer(topic, batching_enabled=False)
            await producer.send(b"before")
            assert proxy.cut() >= 1
            await producer.send(b"after")             # reconnected through the proxy again
            assert client.pool.targets == [proxy.address]
            await producer.close()
            assert await consume(client, topic, 2) == [b"before", b"after"]


async def test_reconnect_after_an_unload_goes_through_a_new_lookup(standalone_factory):
    """An unloaded topic ends its streams (ServiceNotReady / connection dropped): the
    producer and consumer forget the lookup, look the topic up again, reconnect."""
    cluster = standalone_factory()
    topic = unique("lookup-unload")
    async with AsyncClient(cluster.service_url, operation_timeout_seconds=20) as client, \
            AdminClient(cluster.service_url) as admin:
        producer = await client.create_producer(topic, batching_enabled=False)
        consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
        await producer.send(b"1")
        lookups = client._lookups.lookups
        assert lookups >= 1 and client._lookups.cached(topic) is not None
        await admin.unload_topic(topic)
        await producer.send(b"2")
        got = []
        for _ in range(2):
            msg = await consumer.receive(timeout_millis=20_000)
            got.append(msg.data())
            consumer.acknowledge(msg)
        assert got == [b"1", b"2"]
        assert client._lookups.lookups > lookups       # reconnections looked the topic up again
        await producer.close()
        await consumer.close()


# ---------------------------------------------------------------------------- multi-host service URLs
async def test_multi_host_url_with_its_first_host_down(standalone):
    down = f"127.0.0.1:{free_port()}"
    url = f"minipulsar://{down},127.0.0.1:{standalone.port}"
    topic = unique("multi")
    started = time.monotonic()
    async with AsyncClient(url, operation_timeout_seconds=20) as client:
        assert str(client.service_url) == url
        ids = await produce(client, topic, [b"x", b"y", b"z"])
        assert await consume(client, topic, 3) == [b"x", b"y", b"z"]
        assert await client.get_last_message_id(topic) == MessageId(ids[-1].ledger_id, ids[-1].entry_id)
        reader = await client.create_reader(topic, MessageId.earliest)
        assert (await reader.read_next(20_000)).data() == b"x" and await reader.has_message_available()
        await reader.close()
        assert topic in await client.get_topics_of_namespace("public/default")
        # the live host became the service URL's current one: lookups, metadata and streams share it
        assert client.stub is client.pool.stub(f"127.0.0.1:{standalone.port}")
        assert (await client.lookup_topic(topic)).target == f"127.0.0.1:{standalone.port}"

        partitioned = unique("multi-part")
        async with AdminClient(url) as admin:
            await admin.create_partitioned_topic(partitioned, 3)
        producer = await client.create_producer(partitioned, batching_enabled=False)
        for i in range(6):
            await producer.send(b"%d" % i, partition_key=str(i))
        await producer.close()
        assert sorted(await consume(client, partitioned, 6)) == [b"%d" % i for i in range(6)]
    assert time.monotonic() - started < 60


def test_multi_host_url_in_the_blocking_client_and_admin(standalone):
    url = f"minipulsar://127.0.0.1:{free_port()},127.0.0.1:{standalone.port}"
    topic = unique("multi-sync")
    with SyncAdminClient(url) as admin:
        assert admin.health()["ok"] is True
        admin.create_topic(topic)
        assert topic in admin.list_topics("public/default")
    with Client(url, operation_timeout_seconds=20) as client:
        producer = client.create_producer(topic)
        producer.send(b"sync")
        producer.close()
        consumer = client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
        assert consumer.receive(timeout_millis=20_000).data() == b"sync"
        consumer.close()


async def test_admin_with_every_host_down_names_each_host():
    a, b = free_port(), free_port()
    url = f"minipulsar://127.0.0.1:{a},127.0.0.1:{b}"
    started = time.monotonic()
    async with AdminClient(url, operation_timeout_seconds=20, connect_timeout_seconds=1) as admin:
        with pytest.raises(ConnectError) as e:
            await admin.health()
    assert time.monotonic() - started < 10
    assert e.value.unreachable[0] == url
    assert f"127.0.0.1:{a}: connection refused" in str(e.value) and f"127.0.0.1:{b}: connection refused" in str(e.value)


async def test_client_with_every_host_down_fails_at_its_timeout():
    url = f"minipulsar://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    async with AsyncClient(url, operation_timeout_seconds=2) as client:
        started = time.monotonic()
        with pytest.raises(ConnectError, match="cannot connect to the broker at minipulsar://"):
            await client.create_producer("t")
        assert 1.5 < time.monotonic() - started < 10


# ---------------------------------------------------------------------------- streams go to the owner
class LookupFront(broker_pb2_grpc.PulsarBrokerServicer):
    """A broker that serves no topic: answers Lookup from ``answers`` (a list of
    callables ``(request) -> LookupResponse``, the last one repeating), refuses
    every stream and GetLastMessageId with ServiceNotReady "not served by this
    broker" (as a cluster's non-owner), forwards partition metadata and
    namespace topics to the real broker ``owner`` (``host:port``).  Records the
    lookups (topic, authoritative) and the refused calls."""

    def __init__(self, owner: str):
        self.owner = owner
        self.answers: list = []
        self.lookups: list[tuple[str, bool]] = []
        self.refused: list[str] = []

    async def start(self) -> "LookupFront":
        self.server = grpc.aio.server()
        broker_pb2_grpc.add_PulsarBrokerServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(self.owner)
        self.forward = broker_pb2_grpc.PulsarBrokerStub(self.channel)
        return self

    async def stop(self) -> None:
        await self.server.stop(0)
        await self.channel.close()

    @property
    def url(self) -> str:
        return f"minipulsar://127.0.0.1:{self.port}"

    async def Lookup(self, request, context):
        self.lookups.append((request.topic, request.authoritative))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return answer(request)

    async def _refuse(self, what, context):
        self.refused.append(what)
        await context.abort(grpc.StatusCode.UNAVAILABLE,
                            "ServiceNotReady: topic not served by this broker; look it up again")

    async def Produce(self, request_iterator, context):
        await self._refuse("Produce", context)

    async def Consume(self, request_iterator, context):
        await self._refuse("Consume", context)

    async def GetLastMessageId(self, request, context):
        await self._refuse("GetLastMessageId", context)

    async def GetPartitionedTopicMetadata(self, request, context):
        return await self.forward.GetPartitionedTopicMetadata(request, timeout=10)

    async def GetTopicsOfNamespace(self, request, context):
        return await self.forward.GetTopicsOfNamespace(request, timeout=10)


def connect_to(url: str):
    return lambda request: pb.LookupResponse(response=pb.LookupResponse.CONNECT, broker_service_url=url,
                                             authoritative=request.authoritative)


def redirect_to(url: str):
    return lambda request: pb.LookupResponse(response=pb.LookupResponse.REDIRECT, broker_service_url=url,
                                             authoritative=True)


@pytest.fixture
async def fronts(standalone):
    made = []

    async def make() -> LookupFront:
        front = await LookupFront(f"127.0.0.1:{standalone.port}").start()
        made.append(front)
        return front
    yield make
    for front in made:
        await front.stop()


async def test_redirect_then_connect_sends_the_streams_to_the_owner(standalone, fronts):
    """Service URL -> REDIRECT -> second broker (asked authoritative) -> CONNECT to the
    real broker: producer, consumer, reader and GetLastMessageId all go there."""
    first, second = await fronts(), await fronts()
    first.answers = [redirect_to(second.url)]
    second.answers = [connect_to(standalone.service_url)]
    topic = unique("owner")
    async with AsyncClient(first.url, operation_timeout_seconds=20) as client:
        await produce(client, topic, [b"1", b"2"])
        assert await consume(client, topic, 2) == [b"1", b"2"]
        reader = await client.create_reader(topic, MessageId.latest, start_message_id_inclusive=True)
        assert (await reader.read_next(20_000)).data() == b"2"
        assert not await reader.has_message_available()
        await reader.close()
        assert (await client.get_last_message_id(topic)).entry_id >= 1
        result = await client.lookup_topic(topic)
        assert result.broker_url == standalone.service_url and result.redirects == 1
        assert not result.proxy_through_service_url
        assert set(client.pool.targets) == {f"127.0.0.1:{p}" for p in (first.port, second.port, standalone.port)}
    assert first.lookups[0] == (topic, False) and set(first.lookups) == {(topic, False)}
    assert set(second.lookups) == {(topic, True)}           # a redirect is followed authoritatively
    assert first.refused == [] and second.refused == []      # no stream went to the fronts


async def test_a_stale_owner_refusal_makes_the_client_look_up_again(standalone, fronts):
    """The lookup names a broker that does not serve the topic (ownership moved since):
    its ServiceNotReady makes the producer and the consumer forget the answer and look
    the topic up again, at creation as on reconnection."""
    front = await fronts()
    topic = unique("stale")
    async with AsyncClient(front.url, operation_timeout_seconds=20) as client:
        front.answers = [connect_to(front.url), connect_to(standalone.service_url)]
        producer = await client.create_producer(topic, batching_enabled=False)
        assert front.refused == ["Produce"] and len(front.lookups) == 2
        front.answers = [connect_to(front.url), connect_to(standalone.service_url)]
        client.invalidate_lookup(topic)      # else the producer's answer, cached, is used
        consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
        assert front.refused == ["Produce", "Consume"] and len(front.lookups) == 4
        await producer.send(b"m")
        msg = await consumer.receive(timeout_millis=20_000)
        assert msg.data() == b"m"
        consumer.acknowledge(msg)
        front.answers = [connect_to(front.url), connect_to(standalone.service_url)]
        client.invalidate_lookup(topic)
        assert (await client.get_last_message_id(topic)).entry_id >= 0    # GetLastMessageId too
        assert front.refused[-1] == "GetLastMessageId"
        await producer.close()
        await consumer.close()


async def test_an_owner_that_goes_away_is_looked_up_again(standalone, fronts):
    """The owner's path is cut and refuses connections (a broker that died); the lookup
    now names another address of the topic's broker: producer and consumer reconnect
    there, and every message sent is received."""
    front = await fronts()
    topic = unique("moved")
    async with TcpProxy("127.0.0.1", standalone.port) as old_owner:
        front.answers = [connect_to(old_owner.service_url)]
        async with AsyncClient(front.url, operation_timeout_seconds=20) as client:
            producer = await client.create_producer(topic, batching_enabled=False)
            consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
            sent = [b"a%d" % i for i in range(5)]
            for p in sent:
                await producer.send(p)
            assert old_owner.connections >= 1
            front.answers = [connect_to(standalone.service_url)]
            old_owner.refuse(True)
            old_owner.cut()
            more = [b"b%d" % i for i in range(5)]
            for p in more:
                await producer.send(p)
            got = []
            while len(got) < len(sent) + len(more):
                msg = await consumer.receive(timeout_millis=20_000)
                got.append(msg.data())
                consumer.acknowledge(msg)
            assert sorted(got) == sorted(sent + more)
            assert (await client.lookup_topic(topic)).broker_url == standalone.service_url
            await producer.close()
            await consumer.close()
