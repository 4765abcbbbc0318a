"""Producer, client and admin against a REAL standalone cluster (bookies +
broker processes).  Messages are read back with the raw Consume stream, so
these tests only depend on the broker and the producer side of the SDK."""
from __future__ import annotations

import asyncio
import os
import random
import uuid

import pytest

from client import AsyncClient, Client, SyncAdminClient
from client.admin import AdminClient
from client.batching import is_batched, parse_batch
from client.chunking import ChunkedMessageAssembler, is_chunk
from client.compression import CompressionType, decompress
from client.entry_format import decode_entry
from client.errors import (AlreadyClosed, AlreadyExists, InvalidConfiguration, MessageTooBig, NotFound,
                           ProducerBusy, ProducerQueueIsFull, TopicNotFound)
from client.message_id import MessageId
from client.routing import murmur3_32_hash
from proto import broker_pb2 as pb

pytestmark = pytest.mark.timeout(180)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def read_messages(client: AsyncClient, topic: str, count: int, timeout: float = 30.0):
    """Read ``count`` messages from the start of ``topic`` with a raw Consume
    stream; returns ``[(MessageId, payload, MessageMetadata, SingleMessageMetadata|None)]``
    with batches split and chunks joined (MessageId of a chunked message = its last chunk)."""
    call = client.stub.Consume()
    await call.write(pb.ConsumerRequest(subscribe=pb.Subscribe(
        topic=topic, subscription=unique("reader"), sub_type=pb.Exclusive, durable=False,
        initial_position=pb.Earliest, start_message_id=pb.Position(ledger_id=-1, entry_id=-1))))
    await call.write(pb.ConsumerRequest(flow=pb.Flow(permits=1_000_000)))
    out = []
    asm = ChunkedMessageAssembler()
    try:
        async with asyncio.timeout(timeout):
            while len(out) < count:
                resp = await call.read()
                assert resp is not None
                if resp.WhichOneof("response") != "messages":
                    continue
                for e in resp.messages.entries:
                    md, payload = decode_entry(e.headers_and_payload)
                    mid = MessageId(e.position.ledger_id, e.position.entry_id)
                    if is_chunk(md):
                        done = asm.add(md, payload, mid, 0)
                        if done is not None:
                            data = decompress(md.compression, done.payload, md.uncompressed_size)
                            out.append((done.message_ids[-1], data, md, None))
                        continue
                    data = decompress(md.compression, payload, md.uncompressed_size)
                    if is_batched(md):
                        n = md.num_messages_in_batch
                        for i, (smm, p) in enumerate(parse_batch(md, data)):
                            out.append((MessageId(mid.ledger_id, mid.entry_id, -1, i, n), p, md, smm))
                    else:
                        out.append((mid, data, md, None))
    finally:
        call.cancel()
    return out


def same_position(a: MessageId, b: MessageId) -> bool:
    return (a.ledger_id, a.entry_id, a.batch_index) == (b.ledger_id, b.entry_id, b.batch_index)


@pytest.fixture
async def client(standalone):
    async with AsyncClient(standalone.service_url, operation_timeout_seconds=20) as c:
        yield c


@pytest.fixture
async def admin(standalone):
    async with AdminClient(standalone.service_url) as a:
        yield a


# ------------------------------------------------------------------ produce + read back
@pytest.mark.parametrize("compression", [CompressionType.NONE, CompressionType.LZ4, CompressionType.ZLIB,
                                         CompressionType.ZSTD])
@pytest.mark.parametrize("batching", [True, False])
async def test_produce_and_read_back(client, compression, batching):
    topic = unique(f"prod-{compression.name}-{batching}")
    producer = await client.create_producer(topic, compression_type=compression, batching_enabled=batching,
                                            batching_max_messages=7)
    payloads = [(b"message-%d-" % i) * (i % 5 + 1) for i in range(40)]
    ids = await asyncio.gather(*(producer.send(p, properties={"i": str(i)}, partition_key=f"k{i % 3}",
                                               event_timestamp=1000 + i)
                                 for i, p in enumerate(payloads)))
    assert ids == sorted(ids) and len(set(ids)) == 40
    if batching:
        assert any(m.batch_index > 0 for m in ids) and all(m.batch_size > 0 for m in ids)
    else:
        assert all(m.batch_index == -1 for m in ids)
    got = await read_messages(client, topic, 40)
    assert [p for _, p, _, _ in got] == payloads
    for (mid, _, md, smm), sent_id, i in zip(got, ids, range(40)):
        assert same_position(mid, sent_id)
        meta = smm if smm is not None else md
        assert {kv.key: kv.value for kv in meta.properties} == {"i": str(i)}
        assert meta.partition_key == f"k{i % 3}" and meta.event_time == 1000 + i
        if compression is not CompressionType.NONE:
            assert md.compression == compression
    assert producer.last_sequence_id() == 39
    await producer.close()


async def test_send_async_flush_and_delayed_messages(client):
    topic = unique("async")
    producer = await client.create_producer(topic, batching_max_publish_delay_ms=1000)
    results = []
    for i in range(10):
        producer.send_async(b"a%d" % i, lambda exc, mid: results.append((exc, mid)))
    assert results == []  # still in the open batch (1 s delay)
    await producer.flush()
    assert len(results) == 10 and all(exc is None for exc, _ in results)
    import datetime
    mid = await producer.send(b"later", deliver_after=datetime.timedelta(seconds=1))
    assert mid.batch_index == -1  # delayed messages are never batched
    got = await read_messages(client, topic, 11)
    assert got[-1][2].deliver_at_time > 0
    await producer.close()
    with pytest.raises(AlreadyClosed):
        await producer.send(b"x")


async def test_replication_fields(client):
    topic = unique("repl")
    producer = await client.create_producer(topic)
    await producer.send(b"a", replication_clusters=["c1", "c2"])
    await producer.send(b"b", disable_replication=True)
    got = await read_messages(client, topic, 2)
    assert list(got[0][2].replicate_to) == ["c1", "c2"] and list(got[1][2].replicate_to) == ["__local__"]
    await producer.close()


# ------------------------------------------------------------------ big messages
async def test_20mb_message_goes_through_chunking(client):
    topic = unique("chunks")
    producer = await client.create_producer(topic, chunking_enabled=True, batching_enabled=False,
                                            compression_type=CompressionType.NONE)
    big = random.Random(3).randbytes(20 * 1024 * 1024)
    mid = await producer.send(big)
    small = await producer.send(b"after")
    assert small > mid
    got = await read_messages(client, topic, 2, timeout=60)
    assert got[0][1] == big and same_position(got[0][0], mid)
    assert got[1][1] == b"after"
    await producer.close()


async def test_chunking_with_batching_on_keeps_order(client):
    topic = unique("chunks-batched")
    producer = await client.create_producer(topic, chunking_enabled=True)  # LZ4, batching on
    big = random.Random(4).randbytes(7 * 1024 * 1024)
    ids = await asyncio.gather(producer.send(b"before"), producer.send(big), producer.send(b"after"))
    assert ids == sorted(ids)
    got = await read_messages(client, topic, 3, timeout=60)
    assert [p for _, p, _, _ in got] == [b"before", big, b"after"]
    await producer.close()


@pytest.mark.parametrize("batching", [True, False])
async def test_message_too_big_without_chunking_keeps_producer_usable(client, batching):
    topic = unique("too-big")
    producer = await client.create_producer(topic, batching_enabled=batching, compression_type="NONE")
    with pytest.raises(MessageTooBig):
        await producer.send(os.urandom(6 * 1024 * 1024))
    results = []
    producer.send_async(os.urandom(6 * 1024 * 1024), lambda exc, mid: results.append(exc))
    mid = await producer.send(b"still works")
    assert isinstance(results[0], MessageTooBig)
    got = await read_messages(client, topic, 1)
    assert got[0][1] == b"still works" and same_position(got[0][0], mid)
    await producer.close()


# ------------------------------------------------------------------ names and sequence ids
async def test_producer_busy_for_a_duplicate_name(client):
    topic = unique("busy")
    first = await client.create_producer(topic, producer_name="the-one")
    assert first.producer_name() == "the-one"
    with pytest.raises(ProducerBusy):
        await client.create_producer(topic, producer_name="the-one")
    await first.send(b"x")
    await first.close()
    again = await client.create_producer(topic, producer_name="the-one")  # name released on close
    await again.send(b"y")
    await again.close()


async def test_generated_names_are_unique(client):
    topic = unique("names")
    a = await client.create_producer(topic)
    b = await client.create_producer(topic)
    assert a.producer_name() and b.producer_name() and a.producer_name() != b.producer_name()


async def test_sequence_ids_continue_after_recreation_with_dedup(client, admin):
    ns = f"{unique('seq')}/ns"
    await admin.create_tenant(ns.split("/")[0])
    await admin.create_namespace(ns)
    await admin.set_deduplication(ns, True)
    topic = f"persistent://{ns}/t"
    p = await client.create_producer(topic, producer_name="seq-producer")
    for i in range(5):
        await p.send(b"m%d" % i)
    assert p.last_sequence_id() == 4
    await p.close()
    p = await client.create_producer(topic, producer_name="seq-producer")
    assert p.last_sequence_id() == 4
    mid = await p.send(b"m5")
    assert mid.ledger_id >= 0
    dup = await p.send(b"again", sequence_id=2)  # the broker drops it
    assert dup == MessageId(-1, -1)
    got = await read_messages(client, topic, 6)
    seqs = [smm.sequence_id if smm is not None else md.sequence_id for _, _, md, smm in got]
    assert seqs == [0, 1, 2, 3, 4, 5] and got[-1][1] == b"m5"
    await p.close()
    p = await client.create_producer(topic, producer_name="seq-producer", initial_sequence_id=99)
    await p.send(b"m100")
    got = await read_messages(client, topic, 7)
    assert (got[-1][3] or got[-1][2]).sequence_id == 100
    await p.close()


async def test_reconnect_after_unload_resends_in_order_without_duplicates(client, admin, caplog):
    caplog.set_level("INFO", logger="client.producer")
    ns = f"{unique('unload')}/ns"
    await admin.create_tenant(ns.split("/")[0])
    await admin.create_namespace(ns)
    await admin.set_deduplication(ns, True)
    topic = f"persistent://{ns}/t"
    producer = await client.create_producer(topic, batching_max_messages=20, max_pending_messages=5000)
    sends = []
    for i in range(600):
        sends.append(asyncio.ensure_future(producer.send(b"%d" % i)))
        if i in (150, 400):
            while not producer.is_connected():  # reconnected after the previous unload
                await asyncio.sleep(0.02)
            await admin.unload_topic(topic)
        if i % 50 == 0:
            await asyncio.sleep(0.01)
    ids = await asyncio.gather(*sends)
    # a send resolves with its message id, or with -1:-1 only when the producer found it stored
    # before a reconnect (its receipt lost: Pulsar's duplicate receipt); each such one is counted
    assert all(m.ledger_id >= 0 or m == MessageId(-1, -1) for m in ids)
    settled_as_stored = sum(int(r.getMessage().split(" pending send")[0].rsplit(" ", 1)[-1])
                            for r in caplog.records if "were stored before the reconnect" in r.getMessage())
    assert sum(m == MessageId(-1, -1) for m in ids) == settled_as_stored
    got = await read_messages(client, topic, 600, timeout=60)
    assert [p for _, p, _, _ in got] == [b"%d" % i for i in range(600)]
    assert sum("reconnecting" in r.getMessage() for r in caplog.records) >= 2
    await producer.close()


async def test_queue_full_and_blocking(client):
    topic = unique("queue")
    producer = await client.create_producer(topic, max_pending_messages=10, batching_max_publish_delay_ms=200)
    futs = [asyncio.ensure_future(producer.send(b"x")) for _ in range(10)]
    await asyncio.sleep(0)
    with pytest.raises(ProducerQueueIsFull):
        await producer.send(b"too many")
    await asyncio.gather(*futs)
    blocking = await client.create_producer(topic, max_pending_messages=3, block_if_queue_full=True)
    ids = await asyncio.gather(*(blocking.send(b"%d" % i) for i in range(30)))
    assert ids == sorted(ids)


# ------------------------------------------------------------------ partitioned topics
async def test_partitioned_key_routing_keeps_each_key_on_one_partition(client, admin):
    topic = f"persistent://public/default/{unique('parted')}"
    await admin.create_partitioned_topic(topic, 4)
    assert await client.get_partitioned_topic_metadata(topic) == 4
    assert await client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(4)]
    producer = await client.create_producer(topic)
    keys = [f"key-{i}" for i in range(12)]
    sent = {}
    for round_ in range(5):
        ids = await asyncio.gather(*(producer.send(f"{k}:{round_}".encode(), partition_key=k) for k in keys))
        for k, mid in zip(keys, ids):
            sent.setdefault(k, set()).add(mid.partition)
    for k, parts in sent.items():
        assert parts == {murmur3_32_hash(k) % 4}, k
    names = set()
    seen = {}
    for i in range(4):
        n = sum(1 for k in keys if murmur3_32_hash(k) % 4 == i) * 5
        for _, payload, md, _ in await read_messages(client, f"{topic}-partition-{i}", n):
            seen.setdefault(payload.decode().split(":")[0], set()).add(i)
            names.add(md.producer_name)
    assert seen == sent and names == {producer.producer_name()}
    # keyless messages spread over partitions (round robin per batch window)
    ids = []
    for _ in range(8):
        ids += await asyncio.gather(*(producer.send(b"nokey") for _ in range(5)))
        await asyncio.sleep(0.11)
    assert len({m.partition for m in ids}) > 1
    await producer.close()


async def test_lazy_partitioned_producer_and_ordering_key(client, admin):
    topic = f"persistent://public/default/{unique('lazy')}"
    await admin.create_partitioned_topic(topic, 3)
    producer = await client.create_producer(topic, producer_name=unique("lazy-p"),
                                            lazy_start_partitioned_producers=True)
    assert producer.partition_producers == {}
    mid = await producer.send(b"x", ordering_key=b"ok")
    assert mid.partition == murmur3_32_hash(b"ok") % 3
    assert list(producer.partition_producers) == [mid.partition]
    await producer.flush()
    await producer.close()


# ------------------------------------------------------------------ client and admin
async def test_lookups_and_errors(client, standalone):
    topic = unique("lookup")
    with pytest.raises(InvalidConfiguration):
        AsyncClient("pulsar://localhost:6650")
    producer = await client.create_producer(topic)
    mid = await producer.send(b"x")
    last = await client.get_last_message_id(topic)
    assert (last.ledger_id, last.entry_id) == (mid.ledger_id, mid.entry_id)
    assert f"persistent://public/default/{topic}" in await client.get_topics_of_namespace("public/default")
    await client.close()
    with pytest.raises(AlreadyClosed):
        await client.create_producer(topic)
    with pytest.raises(AlreadyClosed):
        await producer.send(b"closed with the client")


async def test_unreachable_broker_fails_within_operation_timeout():
    async with AsyncClient("minipulsar://127.0.0.1:1", operation_timeout_seconds=1.5) as c:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises((Exception,)) as e:
            await c.create_producer("nowhere")
        assert type(e.value).__name__ in ("ConnectError", "Timeout")
        assert loop.time() - start < 10


async def test_admin_verbs(admin):
    tenant = unique("tenant")
    assert "standalone" in await admin.list_clusters() or await admin.list_clusters()
    await admin.create_tenant(tenant)
    with pytest.raises(AlreadyExists):
        await admin.create_tenant(tenant)
    assert tenant in await admin.list_tenants()
    assert (await admin.get_tenant(tenant))["allowed_clusters"]
    ns = f"{tenant}/ns1"
    await admin.create_namespace(ns)
    assert ns in await admin.list_namespaces(tenant)
    policies = await admin.set_message_ttl(ns, 60)
    assert policies["message_ttl_in_seconds"] == 60
    await admin.set_retention(ns, 10, 100)
    assert (await admin.get_policies(ns))["retention_time_in_minutes"] == 10
    topic = f"persistent://{ns}/t1"
    await admin.create_topic(topic)
    with pytest.raises(AlreadyExists):
        await admin.create_topic(topic)
    await admin.create_partitioned_topic(f"persistent://{ns}/p1", 2)
    assert await admin.get_partitioned_topic_metadata(f"persistent://{ns}/p1") == 2
    assert topic in await admin.list_topics(ns)
    assert "msgInCounter" in await admin.get_stats(topic)
    assert await admin.get_internal_stats(topic)
    assert await admin.get_subscriptions(topic) == []
    with pytest.raises(NotFound):
        await admin.unsubscribe(topic, "nope")
    with pytest.raises(InvalidConfiguration):
        await admin.reset_cursor(topic, "s")
    with pytest.raises((NotFound, TopicNotFound)):
        await admin.get_tenant(unique("missing"))
    await admin.delete_topic(topic)
    assert (await admin.health())["ok"]


# ------------------------------------------------------------------ synchronous facade
def test_sync_client_producer(standalone):
    topic = unique("sync")
    with Client(standalone.service_url) as client:
        producer = client.create_producer(topic, block_if_queue_full=True, max_pending_messages=5)
        mid = producer.send(b"hello", properties={"a": "b"})
        assert isinstance(mid, MessageId) and mid.ledger_id >= 0
        results = []
        for i in range(50):
            producer.send_async(b"%d" % i, lambda exc, m: results.append((exc, m)))
        producer.flush()
        assert len(results) == 50 and all(exc is None for exc, _ in results)
        assert [m for _, m in results] == sorted(m for _, m in results)
        assert producer.last_sequence_id() == 50 and producer.topic().endswith(topic)
        assert client.get_topic_partitions(topic) == [f"persistent://public/default/{topic}"]
        producer.close()
        with pytest.raises(AlreadyClosed):
            producer.send(b"closed")
    with pytest.raises(AlreadyClosed):
        client.create_producer(topic)


def test_sync_admin(standalone):
    with SyncAdminClient(standalone.service_url) as admin:
        tenant = unique("synct")
        admin.create_tenant(tenant)
        assert tenant in admin.list_tenants()
        admin.delete_tenant(tenant)


# ------------------------------------------------------------------ broker failures (private clusters)
async def test_broker_restart_pending_messages_are_resent(standalone_factory):
    cluster = standalone_factory()
    topic = unique("restart")
    async with AsyncClient(cluster.service_url, operation_timeout_seconds=20) as client:
        producer = await client.create_producer(topic)
        before = await asyncio.gather(*(producer.send(b"before-%d" % i) for i in range(10)))
        cluster.kill()
        during = [asyncio.ensure_future(producer.send(b"during-%d" % i)) for i in range(20)]
        await asyncio.sleep(0.5)
        assert not any(f.done() for f in during) and not producer.is_connected()
        await asyncio.to_thread(cluster.restart)
        ids = await asyncio.wait_for(asyncio.gather(*during), 30)
        assert all(m.ledger_id > before[-1].ledger_id for m in ids)  # a new ledger after recovery
        got = await read_messages(client, topic, 30)
        assert [p for _, p, _, _ in got] == [b"before-%d" % i for i in range(10)] + [b"during-%d" % i
                                                                                    for i in range(20)]


async def test_send_timeout_fails_every_pending_message(standalone_factory):
    """Issue 33: as Pulsar's ProducerImpl (failPendingMessages), the first send timeout fails
    every pending message, later ones included, so none of them is stored after it."""
    from client.errors import Timeout
    cluster = standalone_factory()
    async with AsyncClient(cluster.service_url, operation_timeout_seconds=5) as client:
        producer = await client.create_producer(unique("timeout"), send_timeout_millis=2000)
        await producer.send(b"ok")
        cluster.kill()
        first = asyncio.ensure_future(producer.send(b"A"))
        await asyncio.sleep(1.0)
        second = asyncio.ensure_future(producer.send(b"B"))
        await asyncio.sleep(1.3)
        assert first.done() and isinstance(first.exception(), Timeout)
        assert second.done() and isinstance(second.exception(), Timeout)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await producer.close()
        assert loop.time() - start < 2


# ------------------------------------------------------------------ with the SDK's consumer and reader
def test_sync_round_trip_with_consumer_and_reader(standalone):
    from client import ConsumerType, InitialPosition
    topic = unique("roundtrip")
    with Client(standalone.service_url) as client:
        consumer = client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared,
                                    initial_position=InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_max_publish_delay_ms=5)
        sent = [producer.send(b"m%d" % i, properties={"i": str(i)}) for i in range(5)]
        for i in range(5, 20):
            producer.send_async(b"m%d" % i, None)
        producer.flush()
        got = []
        for msg in consumer:
            got.append(msg)
            consumer.acknowledge(msg)
            if len(got) == 20:
                break
        assert [m.data() for m in got] == [b"m%d" % i for i in range(20)]
        assert [m.message_id() for m in got[:5]] == sent
        assert got[3].properties() == {"i": "3"} and got[0].producer_name() == producer.producer_name()
        reader = client.create_reader(topic, MessageId.earliest)
        assert [reader.read_next(5000).data() for _ in range(20)] == [m.data() for m in got]
        reader.close()
        consumer.close()
