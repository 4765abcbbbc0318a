"""Consumers and readers against a REAL standalone cluster (broker + bookies
processes): subscription types, acks, redelivery, dead letters, seek,
readers, multi-topic and pattern consumers."""
from __future__ import annotations

import asyncio
import random
import re
import time
import uuid

import pytest

from client.admin import AdminClient
from client.client import AsyncClient
from client.consumer import ConsumerType, DeadLetterPolicy, InitialPosition
from client.errors import ConsumerBusy, NotAllowed, Timeout
from client.message_id import MessageId

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def client(standalone):
    c = AsyncClient(standalone.service_url, operation_timeout_seconds=10)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def admin(standalone):
    a = AdminClient(standalone.service_url)
    try:
        yield a
    finally:
        await a.close()


@pytest.fixture
def topic():
    return f"persistent://public/default/consumer-it-{uuid.uuid4().hex[:10]}"


async def produce(client, topic, payloads, batched=False, **send_kw):
    """Publish ``payloads`` (bytes); batched=True puts them in as few entries as possible."""
    producer = await client.create_producer(topic, batching_enabled=batched, batching_max_publish_delay_ms=50,
                                            batching_max_messages=len(payloads) or 1)
    try:
        if batched:
            futs = []
            for p in payloads:
                fut = asyncio.get_running_loop().create_future()
                producer.send_async(p, lambda e, mid, f=fut: f.set_exception(e) if e else f.set_result(mid), **send_kw)
                futs.append(fut)
            await producer.flush()
            return await asyncio.gather(*futs)
        return [await producer.send(p, **send_kw) for p in payloads]
    finally:
        await producer.close()


async def drain(consumer, timeout_ms=500, ack=True):
    """Receive until nothing arrives for ``timeout_ms``; returns the messages."""
    out = []
    while True:
        try:
            msg = await consumer.receive(timeout_millis=timeout_ms)
        except Timeout:
            return out
        out.append(msg)
        if ack:
            consumer.acknowledge(msg)


async def test_exclusive_receive_ack_and_second_consumer_busy(client, topic):
    c1 = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive)
    assert c1.is_active() and c1.topic() == topic and c1.subscription_name() == "sub"
    with pytest.raises(ConsumerBusy):
        await client.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive)
    ids = await produce(client, topic, [b"m%d" % i for i in range(5)], properties={"k": "v"})
    msgs = [await c1.receive(timeout_millis=5000) for _ in range(5)]
    assert [m.data() for m in msgs] == [b"m%d" % i for i in range(5)]
    assert [m.message_id() for m in msgs] == ids
    assert msgs[0].properties() == {"k": "v"} and msgs[0].redelivery_count() == 0
    assert msgs[0].topic_name() == topic and msgs[0].publish_timestamp() > 0
    for m in msgs:
        await c1.acknowledge_and_wait(m)
    with pytest.raises(Timeout):
        await c1.receive(timeout_millis=200)
    await c1.close()
    c2 = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive)  # free again
    with pytest.raises(Timeout):
        await c2.receive(timeout_millis=300)  # everything was acknowledged
    await c2.close()


async def test_receive_timeout_batch_receive_and_async_for(client, topic):
    c = await client.subscribe(topic, "sub")
    t0 = time.monotonic()
    with pytest.raises(Timeout):
        await c.receive(timeout_millis=150)
    assert time.monotonic() - t0 >= 0.14
    assert await c.batch_receive() == []  # 100 ms policy, nothing published
    await produce(client, topic, [b"%d" % i for i in range(150)], batched=True)
    first = await c.batch_receive()
    while not first:
        first = await c.batch_receive()
    rest = []
    while len(first) + len(rest) < 150:
        rest += await c.batch_receive()
    assert len(first) <= 100  # the policy's max messages
    got = [m.data() for m in first + rest]
    assert got == [b"%d" % i for i in range(150)]
    for m in first + rest:
        c.acknowledge(m)
    await produce(client, topic, [b"x", b"y"])
    seen = []
    async for m in c:
        seen.append(m.data())
        c.acknowledge(m)
        if len(seen) == 2:
            break
    assert seen == [b"x", b"y"]
    await c.close()


async def test_failover_active_by_priority_then_name_and_takeover_on_close(client, topic):
    b = await client.subscribe(topic, "fo", consumer_type=ConsumerType.Failover, consumer_name="b", priority_level=1)
    a = await client.subscribe(topic, "fo", consumer_type=ConsumerType.Failover, consumer_name="a", priority_level=1)
    c = await client.subscribe(topic, "fo", consumer_type=ConsumerType.Failover, consumer_name="c", priority_level=0)
    await asyncio.sleep(0.3)
    assert (c.is_active(), a.is_active(), b.is_active()) == (True, False, False)  # priority first
    await produce(client, topic, [b"%d" % i for i in range(10)])
    got = [await c.receive(timeout_millis=5000) for _ in range(10)]
    assert [m.data() for m in got] == [b"%d" % i for i in range(10)]
    await c.acknowledge_cumulative_and_wait(got[3])  # mark-delete after message 3
    assert await drain(a, 200) == [] and await drain(b, 200) == []
    await c.close()
    await asyncio.sleep(0.3)
    assert a.is_active() and not b.is_active()  # same priority: by name
    taken = await drain(a, 1000, ack=False)
    assert [m.data() for m in taken] == [b"%d" % i for i in range(4, 10)]  # from the mark-delete position on
    await a.acknowledge_cumulative_and_wait(taken[-1])
    await a.close()
    await asyncio.sleep(0.3)
    assert b.is_active() and await drain(b, 300) == []
    await b.close()


async def test_shared_three_consumers_each_message_once(client, topic):
    consumers = [await client.subscribe(topic, "shared", consumer_type=ConsumerType.Shared, receiver_queue_size=10)
                 for _ in range(3)]
    n = 300
    await produce(client, topic, [b"%d" % i for i in range(n)])
    results = await asyncio.gather(*(drain(c, 1000) for c in consumers))
    counts = [len(r) for r in results]
    all_payloads = sorted(int(m.data()) for r in results for m in r)
    assert all_payloads == list(range(n)), counts  # each delivered (and acked) exactly once in total
    assert all(c > 0 for c in counts), counts
    with pytest.raises(NotAllowed):
        consumers[0].acknowledge_cumulative(results[0][0])  # local check, as Pulsar
    for c in consumers:
        await c.close()
    again = await client.subscribe(topic, "shared", consumer_type=ConsumerType.Shared)
    assert await drain(again, 300) == []
    await again.close()


async def test_key_shared_each_key_on_one_consumer_in_order(client, topic):
    consumers = [await client.subscribe(topic, "ks", consumer_type=ConsumerType.KeyShared) for _ in range(3)]
    producer = await client.create_producer(topic, batching_enabled=False)
    keys = [f"key-{k}" for k in range(12)]
    for i in range(120):
        await producer.send(b"%d" % i, partition_key=keys[i % len(keys)])
    await producer.close()
    results = await asyncio.gather(*(drain(c, 1000) for c in consumers))
    owner: dict[str, int] = {}
    for ci, msgs in enumerate(results):
        per_key: dict[str, list[int]] = {}
        for m in msgs:
            k = m.partition_key()
            assert owner.setdefault(k, ci) == ci, f"key {k} on two consumers"
            per_key.setdefault(k, []).append(int(m.data()))
        for seq in per_key.values():
            assert seq == sorted(seq)  # in order per key
    assert sum(len(r) for r in results) == 120
    assert len(set(owner.values())) > 1  # keys spread over consumers
    for c in consumers:
        await c.close()


async def test_cumulative_ack_then_resubscribe(client, topic):
    c = await client.subscribe(topic, "cum", initial_position=InitialPosition.Earliest)
    await produce(client, topic, [b"%d" % i for i in range(10)])
    msgs = [await c.receive(timeout_millis=5000) for _ in range(10)]
    c.acknowledge_cumulative(msgs[5])  # grouped, flushed at close
    await c.close()
    c = await client.subscribe(topic, "cum")
    rest = await drain(c, 500)
    assert [m.data() for m in rest] == [b"%d" % i for i in range(6, 10)]
    await c.close()


async def test_cumulative_ack_inside_batch(client, topic):
    c = await client.subscribe(topic, "cumb")
    await produce(client, topic, [b"%d" % i for i in range(6)], batched=True)
    msgs = [await c.receive(timeout_millis=5000) for _ in range(6)]
    assert msgs[0].message_id().batch_index == 0 and msgs[0].message_id().batch_size == 6
    await c.acknowledge_cumulative_and_wait(msgs[2])  # without batch-index ack: the previous entry
    await c.close()
    c = await client.subscribe(topic, "cumb")
    assert len(await drain(c, 500)) == 6  # whole batch comes back, as Pulsar
    await c.close()


async def test_batch_index_ack(client, topic):
    c = await client.subscribe(topic, "bia", consumer_type=ConsumerType.Shared, batch_index_ack_enabled=True)
    await produce(client, topic, [b"%d" % i for i in range(8)], batched=True)
    msgs = [await c.receive(timeout_millis=5000) for _ in range(8)]
    assert len({(m.message_id().ledger_id, m.message_id().entry_id) for m in msgs}) == 1  # one entry
    for m in msgs[::2]:
        c.acknowledge(m)
    await c.acknowledge_and_wait(msgs[1])
    await c.close()
    c = await client.subscribe(topic, "bia", consumer_type=ConsumerType.Shared, batch_index_ack_enabled=True)
    rest = await drain(c, 500, ack=False)
    assert [m.data() for m in rest] == [b"3", b"5", b"7"]  # acked indexes skipped (broker ack set)
    for m in rest:
        await c.acknowledge_and_wait(m)
    await c.close()
    c = await client.subscribe(topic, "bia", consumer_type=ConsumerType.Shared, batch_index_ack_enabled=True)
    assert await drain(c, 300) == []
    await c.close()


async def test_negative_ack_redelivers_with_count(client, topic):
    c = await client.subscribe(topic, "nack", consumer_type=ConsumerType.Shared,
                               negative_ack_redelivery_delay_ms=200)
    await produce(client, topic, [b"a", b"b"])
    first = [await c.receive(timeout_millis=5000) for _ in range(2)]
    a = next(m for m in first if m.data() == b"a")
    c.acknowledge(next(m for m in first if m.data() == b"b"))
    t0 = time.monotonic()
    c.negative_acknowledge(a)
    again = await c.receive(timeout_millis=5000)
    assert again.data() == b"a" and again.redelivery_count() == 1 and time.monotonic() - t0 >= 0.15
    c.negative_acknowledge(again)
    third = await c.receive(timeout_millis=5000)
    assert third.data() == b"a" and third.redelivery_count() == 2
    c.acknowledge(third)
    assert await drain(c, 500) == []
    await c.close()


async def test_ack_timeout_redelivers(client, topic):
    c = await client.subscribe(topic, "ackto", consumer_type=ConsumerType.Shared, unacked_messages_timeout_ms=1000)
    await produce(client, topic, [b"x", b"y"])
    x = await c.receive(timeout_millis=5000)
    y = await c.receive(timeout_millis=5000)
    c.acknowledge(y)
    t0 = time.monotonic()
    again = await c.receive(timeout_millis=5000)
    assert again.data() == x.data() and again.redelivery_count() == 1 and time.monotonic() - t0 >= 0.8
    c.acknowledge(again)
    assert await drain(c, 1500) == []
    await c.close()


async def test_dead_letter_topic(client, topic):
    policy = DeadLetterPolicy(max_redeliver_count=2, initial_subscription_name="dlq-sub")
    c = await client.subscribe(topic, "dl", consumer_type=ConsumerType.Shared, negative_ack_redelivery_delay_ms=100,
                               dead_letter_policy=policy)
    ids = await produce(client, topic, [b"poison", b"fine"], properties={"p": "1"})
    counts = []
    while True:
        try:
            m = await c.receive(timeout_millis=1500)
        except Timeout:
            break
        if m.data() == b"fine":
            c.acknowledge(m)
        else:
            counts.append(m.redelivery_count())
            c.negative_acknowledge(m)
    assert counts == [0, 1, 2]  # as Pulsar: count 2 = max still delivered, count 3 > max dead-lettered
    dlq = await client.subscribe(f"{topic}-dl-DLQ", "dlq-sub")
    dead = await dlq.receive(timeout_millis=5000)
    assert dead.data() == b"poison"
    assert dead.properties() == {"p": "1", "REAL_TOPIC": topic, "ORIGIN_MESSAGE_ID": str(ids[0])}
    dlq.acknowledge(dead)
    await dlq.close()
    await c.close()
    c = await client.subscribe(topic, "dl", consumer_type=ConsumerType.Shared)
    assert await drain(c, 300) == []  # the dead letter was acknowledged on the original topic
    await c.close()


async def test_seek_by_message_id_and_by_time(client, topic):
    # Contract: the broker answers the Seek (CommandSuccess) BEFORE it pushes any
    # entry from the new position; the client drops what it received before the
    # success (in flight from the old position), as Pulsar's client does.
    c = await client.subscribe(topic, "seek")
    ids = await produce(client, topic, [b"%d" % i for i in range(5)])
    await asyncio.sleep(0.05)
    t_mid = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    ids += await produce(client, topic, [b"%d" % i for i in range(5, 10)])
    assert len(await drain(c, 500)) == 10
    await c.seek(ids[3])
    assert [m.data() for m in await drain(c, 500)] == [b"%d" % i for i in range(3, 10)]
    await c.seek(t_mid)
    assert [m.data() for m in await drain(c, 500)] == [b"%d" % i for i in range(5, 10)]
    await c.seek(MessageId.earliest)
    assert len(await drain(c, 500)) == 10
    await c.close()


async def test_seek_inside_batch(client, topic):
    c = await client.subscribe(topic, "seekb")
    ids = await produce(client, topic, [b"%d" % i for i in range(5)], batched=True)
    assert len(await drain(c, 500)) == 5
    await c.seek(ids[2])
    assert [m.data() for m in await drain(c, 500)] == [b"2", b"3", b"4"]
    await c.close()


async def test_reader_from_earliest_and_from_message_id(client, topic):
    ids = await produce(client, topic, [b"%d" % i for i in range(6)])
    r = await client.create_reader(topic, MessageId.earliest)
    assert await r.has_message_available()
    got = []
    while await r.has_message_available():
        got.append((await r.read_next(timeout_millis=5000)).data())
    assert got == [b"%d" % i for i in range(6)]
    await r.close()
    r = await client.create_reader(topic, ids[2])
    assert (await r.read_next(timeout_millis=5000)).data() == b"3"  # exclusive by default
    await r.close()
    r = await client.create_reader(topic, ids[2], start_message_id_inclusive=True)
    assert (await r.read_next(timeout_millis=5000)).data() == b"2"
    await r.seek(ids[4])
    assert (await r.read_next(timeout_millis=5000)).data() == b"4"
    await r.close()
    r = await client.create_reader(topic, MessageId.latest)
    assert not await r.has_message_available()
    await produce(client, topic, [b"new"])
    assert (await r.read_next(timeout_millis=5000)).data() == b"new"
    assert not await r.has_message_available()
    await r.close()
    # a reader does not create a durable subscription
    stats_subs = await client.subscribe(topic, "probe")
    await stats_subs.close()


async def test_reader_from_id_inside_batch(client, topic):
    ids = await produce(client, topic, [b"%d" % i for i in range(4)], batched=True)
    r = await client.create_reader(topic, ids[1])
    got = []
    async for m in r:
        got.append(m.data())
        if not await r.has_message_available():
            break
    assert got == [b"2", b"3"]
    await r.close()


async def test_multi_topic_list(client, topic):
    t1, t2 = topic + "-a", topic + "-b"
    c = await client.subscribe([t1, t2], "multi")
    await produce(client, t1, [b"a0", b"a1"])
    await produce(client, t2, [b"b0"])
    msgs = await drain(c, 700)
    assert sorted(m.data() for m in msgs) == [b"a0", b"a1", b"b0"]
    assert {m.topic_name() for m in msgs} == {t1, t2}
    await c.close()
    c = await client.subscribe([t1, t2], "multi")
    assert await drain(c, 300) == []
    await c.close()


async def test_partitioned_topic(client, admin, topic):
    await admin.create_partitioned_topic(topic, 3)
    c = await client.subscribe(topic, "parts", consumer_type=ConsumerType.Shared)
    producer = await client.create_producer(topic, batching_enabled=False)
    for i in range(30):
        await producer.send(b"%d" % i, partition_key=f"k{i}")
    await producer.close()
    msgs = await drain(c, 700, ack=False)
    assert sorted(int(m.data()) for m in msgs) == list(range(30))
    assert {m.message_id().partition for m in msgs} == {0, 1, 2}
    for m in msgs:
        assert m.topic_name() == f"{topic}-partition-{m.message_id().partition}"
        c.acknowledge(m.message_id())  # by id: routed to its partition
    await c.close()
    c = await client.subscribe(topic, "parts", consumer_type=ConsumerType.Shared)
    assert await drain(c, 300) == []
    await c.close()


async def test_pattern_subscribe_and_discovery(client, topic):
    base = topic.rsplit("/", 1)[1]
    await produce(client, topic + "-p1", [b"before"])
    c = await client.subscribe(re.compile(f"persistent://public/default/{base}-p.*"), "pat",
                               initial_position=InitialPosition.Earliest, pattern_auto_discovery_period=1)
    await produce(client, topic + "-other", [b"no"])
    assert [m.data() for m in await drain(c, 500)] == [b"before"]
    await produce(client, topic + "-p2", [b"new topic"])  # created after subscribing
    deadline = time.monotonic() + 10
    got = []
    while not got and time.monotonic() < deadline:
        got = await drain(c, 500)
    assert [m.data() for m in got] == [b"new topic"]
    await c.close()


async def test_reconnect_after_broker_restart(standalone_factory):
    cluster = standalone_factory()
    topic = f"persistent://public/default/consumer-it-restart-{uuid.uuid4().hex[:6]}"
    client = AsyncClient(cluster.service_url, operation_timeout_seconds=10)
    try:
        c = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
        r = await client.create_reader(topic, MessageId.earliest)
        await produce(client, topic, [b"%d" % i for i in range(6)])
        got = [await c.receive(timeout_millis=5000) for _ in range(6)]
        for m in got[:3]:
            await c.acknowledge_and_wait(m)
        read = [(await r.read_next(timeout_millis=5000)).data() for _ in range(2)]
        cluster.kill()
        cluster = cluster.restart(same_port=True)
        # the consumer re-subscribes by itself; the broker redelivers what was not acknowledged
        again = await drain(c, 3000)
        assert sorted(m.data() for m in again) == [b"3", b"4", b"5"]
        assert c.is_connected()
        # the reader resumes right after the last message it handed out
        rest = [(await r.read_next(timeout_millis=10000)).data() for _ in range(4)]
        assert read + rest == [b"%d" % i for i in range(6)]
        await produce(client, topic, [b"after"])
        assert (await c.receive(timeout_millis=5000)).data() == b"after"
    finally:
        await client.close()


async def test_unsubscribe_and_close_semantics(client, topic):
    from client.errors import AlreadyClosed
    c = await client.subscribe(topic, "unsub", initial_position=InitialPosition.Earliest)
    await produce(client, topic, [b"1"])
    assert (await c.receive(timeout_millis=5000)).data() == b"1"
    await c.unsubscribe()
    with pytest.raises(AlreadyClosed):
        await c.receive(timeout_millis=100)
    with pytest.raises(AlreadyClosed):
        c.acknowledge(MessageId(1, 1))
    c = await client.subscribe(topic, "unsub", initial_position=InitialPosition.Earliest)  # a new subscription
    assert (await c.receive(timeout_millis=5000)).data() == b"1"
    await client.close()  # closes the consumer too
    with pytest.raises(AlreadyClosed):
        await c.receive(timeout_millis=100)


async def test_negative_ack_on_exclusive_redelivers_all_unacked_in_order(client, topic):
    c = await client.subscribe(topic, "nackx", negative_ack_redelivery_delay_ms=100)
    await produce(client, topic, [b"a", b"b", b"c"])
    a, b, _ = [await c.receive(timeout_millis=5000) for _ in range(3)]
    await c.acknowledge_and_wait(a)
    c.negative_acknowledge(b)
    again = await drain(c, 700)
    assert [(m.data(), m.redelivery_count()) for m in again] == [(b"b", 1), (b"c", 1)]
    await c.close()


async def test_chunked_message_reassembled(standalone_factory, tmp_path):
    config = tmp_path / "broker.toml"
    config.write_text("max_message_size = 20000\n")
    cluster = standalone_factory(extra_args=["--broker-config", str(config)])
    topic = f"persistent://public/default/consumer-it-chunks-{uuid.uuid4().hex[:6]}"
    client = AsyncClient(cluster.service_url, operation_timeout_seconds=10)
    try:
        c = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
        producer = await client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
        big = bytes(random.getrandbits(8) for _ in range(100_000))  # incompressible: ~6 chunks
        mid = await producer.send(big, properties={"big": "1"})
        await producer.send(b"small")
        await producer.close()
        m = await c.receive(timeout_millis=5000)
        assert m.data() == big and m.properties() == {"big": "1"}
        assert m.message_id() == mid
        assert len(m._entry_positions()) > 1
        await c.acknowledge_and_wait(m)  # acknowledges every chunk
        small = await c.receive(timeout_millis=5000)
        assert small.data() == b"small"
        await c.acknowledge_and_wait(small)
        await c.close()
        c = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
        assert await drain(c, 300) == []
    finally:
        await client.close()


def test_sync_client_consumer_and_reader(standalone):
    from client import Client, ConsumerType as CT
    topic = f"persistent://public/default/consumer-it-sync-{uuid.uuid4().hex[:6]}"
    client = Client(standalone.service_url)
    try:
        consumer = client.subscribe(topic, "sync", consumer_type=CT.Shared)
        producer = client.create_producer(topic)
        ids = [producer.send(b"s%d" % i) for i in range(3)]
        msgs = [consumer.receive(timeout_millis=5000) for _ in range(3)]
        assert [m.data() for m in msgs] == [b"s0", b"s1", b"s2"]
        consumer.acknowledge(msgs[0])  # plain method, run on the client's loop
        consumer.acknowledge_and_wait(msgs[1])
        consumer.negative_acknowledge(msgs[2])
        assert consumer.batch_receive() == []  # the nacked one comes back only after 60 s
        reader = client.create_reader(topic, ids[0], start_message_id_inclusive=True)
        assert reader.has_message_available()
        assert reader.read_next(timeout_millis=5000).data() == b"s0"
        reader.close()
        consumer.close()
    finally:
        client.close()


async def test_key_shared_consumer_joining_at_a_new_ledger_is_released_when_the_previous_one_is_acked(client, admin, topic):
    """A Key_Shared consumer that joins while the read position is entry 0 of a fresh ledger
    (everything of the previous ledger acknowledged, topic reloaded) is a recently joined
    consumer whose join position is right after the mark-delete position across the ledger
    boundary: it must be released at once (Pulsar's getNextValidPosition), not hold its keys
    and, behind them, the whole subscription forever."""
    first = await client.subscribe(topic, "ks", consumer_type=ConsumerType.KeyShared,
                                   initial_position=InitialPosition.Earliest)
    producer = await client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        await producer.send(b"%d" % i, partition_key=f"k{i}")
    for _ in range(10):
        await first.acknowledge_and_wait(await first.receive(timeout_millis=5000))
    await admin.unload_topic(topic)                 # reloaded: a new, empty current ledger
    await asyncio.sleep(1.0)                        # the first consumer reconnects (and reloads it)
    stats = await admin.get_internal_stats(topic)
    assert stats["cursors"]["ks"]["markDeletePosition"].endswith(":9"), stats
    assert stats["cursors"]["ks"]["readPosition"].endswith(":0"), stats
    second = await client.subscribe(topic, "ks", consumer_type=ConsumerType.KeyShared)
    # "k3" first: a key of the second consumer's half of the hash range, so the first entry
    # of the new ledger is one the recently joined consumer must not get before the release
    for i in range(10, 42):
        await producer.send(b"%d" % i, partition_key=f"k{(i - 7) % 16}")
    got = await asyncio.gather(drain(first, 3000), drain(second, 3000))
    assert sorted(int(m.data()) for msgs in got for m in msgs) == list(range(10, 42))
    assert got[0] and got[1], "keys spread over both consumers"
    await producer.close()
    for c in (first, second):
        await c.close()


async def test_consumers_subscribing_at_once_create_one_cursor_and_the_topic_stays_open(client, standalone):
    """Consumers subscribing to one new subscription at the same moment share one cursor
    creation (Pulsar's uninitializedCursors); the second creation used to find the node the
    first had written, took it for another owner's and closed the topic as fenced."""
    topics = []
    for _ in range(3):
        topic = f"persistent://public/default/consumer-it-race-{uuid.uuid4().hex[:10]}"
        topics.append(topic)
        consumers = await asyncio.gather(*(client.subscribe(topic, "race", consumer_type=ConsumerType.Shared,
                                                            initial_position=InitialPosition.Earliest)
                                           for _ in range(4)))
        await produce(client, topic, [b"%d" % i for i in range(20)])
        got = await asyncio.gather(*(drain(c, 1500) for c in consumers))
        assert sorted(int(m.data()) for msgs in got for m in msgs) == list(range(20))
        for c in consumers:
            await c.close()
    log = standalone.stderr_log.read_text(errors="replace")
    for topic in topics:
        name = topic.rsplit("/", 1)[1]
        bad = [line for line in log.splitlines() if name in line and ("fenced" in line or "taken over" in line)]
        assert not bad, bad


async def test_key_shared_consumer_that_stops_receiving_does_not_stall_the_others(client, topic):
    """One Key_Shared consumer stops calling receive (its permits run out, its keys' entries
    wait in the replay set); the other consumer still gets every message of its keys (Pulsar's
    isDispatcherStuckOnReplays: read on past the replay set), and when the slow one resumes it
    gets all of its keys; every key stays on one consumer, in order."""
    slow = await client.subscribe(topic, "ks", consumer_type=ConsumerType.KeyShared, receiver_queue_size=5)
    fast = await client.subscribe(topic, "ks", consumer_type=ConsumerType.KeyShared, receiver_queue_size=5)
    producer = await client.create_producer(topic, batching_enabled=False)
    for i in range(200):
        await producer.send(b"%d" % i, partition_key=f"k{i % 16}")
    fast_msgs = await drain(fast, 3000)
    fast_keys = {m.partition_key() for m in fast_msgs}
    assert fast_keys, "the fast consumer owns some keys"
    assert len(fast_msgs) == sum(1 for i in range(200) if f"k{i % 16}" in fast_keys), \
        f"the fast consumer got {len(fast_msgs)} messages of keys {sorted(fast_keys)} while the slow one waited"
    slow_msgs = await drain(slow, 3000)
    assert not fast_keys & {m.partition_key() for m in slow_msgs}, "a key on two consumers"
    assert sorted(int(m.data()) for m in fast_msgs + slow_msgs) == list(range(200))
    for msgs in (fast_msgs, slow_msgs):
        per_key: dict[str, list[int]] = {}
        for m in msgs:
            per_key.setdefault(m.partition_key(), []).append(int(m.data()))
        assert all(seq == sorted(seq) for seq in per_key.values()), "order per key"
    await producer.close()
    for c in (slow, fast):
        await c.close()
