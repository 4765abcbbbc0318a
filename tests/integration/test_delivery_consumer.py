"""Delivery guarantees of the consumer against REAL standalone clusters (broker +
bookie processes), with connection faults from a TCP proxy (tests/tcp_proxy.py):

- a Reader keeps what it had queued across a cut / broker restart
  (Pulsar's ConsumerImpl.clearReceiverQueue);
- no acknowledged message is redelivered after a negative ack on
  Exclusive/Failover (PIP-84 consumer epoch);
- specific redeliveries on Exclusive/Failover (dropped chunks, a failed
  dead-letter publish) do not loop (redeliverUnacknowledgedMessages(Set));
- acknowledging a chunked message by its id acknowledges every chunk
  (ChunkMessageIdImpl);
- acks waiting in the group window survive connection cuts
  (AcknowledgmentsGroupingTracker: pending acks kept across reconnects);
- dead-lettering after max_redeliver_count redeliveries, as Pulsar.
"""
from __future__ import annotations

import asyncio
import collections
import os
import time
import uuid

import pytest

from client.admin import AdminClient
from client.client import AsyncClient
from client.consumer import ConsumerType, DeadLetterPolicy, InitialPosition
from client.errors import InvalidArgument, Timeout
from client.message_id import MessageId
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(180)


def unique(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def client(standalone):
    c = AsyncClient(standalone.service_url, operation_timeout_seconds=10)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def proxy(standalone):
    p = await TcpProxy.to_service_url(standalone.service_url).start()
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture(scope="module")
def small_standalone(tmp_path_factory):
    """A cluster whose broker accepts messages of at most 20,000 bytes, so that
    100 KB messages are chunked."""
    from tests.procs import ProcessTracker, start_standalone

    data = tmp_path_factory.mktemp("small-standalone")
    config = data / "broker.toml"
    config.write_text("max_message_size = 20000\n")
    tracker = ProcessTracker()
    proc = start_standalone(data / "cluster", ["--broker-config", str(config)], tracker=tracker)
    try:
        yield proc
    finally:
        proc.terminate()
        tracker.kill_all()


async def produce(client, topic, payloads, batched=False, batch_size=1000, **send_kw):
    """Publish ``payloads`` pipelined; batched=True packs them into entries of up to ``batch_size``."""
    producer = await client.create_producer(topic, batching_enabled=batched, batching_max_publish_delay_ms=20,
                                            batching_max_messages=max(1, min(batch_size, len(payloads))),
                                            block_if_queue_full=True)
    try:
        loop = asyncio.get_running_loop()
        futs = []
        for p in payloads:
            fut = loop.create_future()
            producer.send_async(p, lambda e, mid, f=fut: f.set_exception(e) if e else f.set_result(mid), **send_kw)
            futs.append(fut)
            if len(futs) % 500 == 0:
                await asyncio.sleep(0)
        await producer.flush()
        return await asyncio.gather(*futs)
    finally:
        await producer.close()


async def until(cond, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not met within {timeout} s"
        await asyncio.sleep(0.02)


def count_disconnections(impl) -> list:
    """Wrap ``impl._on_disconnected`` (the consumer noticed a broken stream and
    cleared its queue); returns a list that grows by one per call."""
    calls: list = []
    original = impl._on_disconnected

    def on_disconnected(error):
        calls.append(error)
        original(error)
    impl._on_disconnected = on_disconnected
    return calls


async def backlog(admin: AdminClient, topic: str, sub: str) -> int:
    stats = await admin.get_stats(topic)
    return stats["subscriptions"][sub]["msgBacklog"]


# ---------------------------------------------------------------- 3. Reader queue
async def test_reader_at_latest_keeps_its_queued_messages_across_a_connection_cut(client, proxy):
    """ConsumerImpl.clearReceiverQueue: a non-durable consumer restarts from the
    first message it dropped, never from "latest" again (before: the 10 queued
    unread messages were lost, read_next timed out)."""
    topic = unique("delivery-reader-cut")
    reader_client = AsyncClient(proxy.service_url, operation_timeout_seconds=10)
    try:
        reader = await reader_client.create_reader(topic, MessageId.latest)
        await produce(client, topic, [b"s%d" % i for i in range(4)])               # 4 entries
        await produce(client, topic, [b"b%d" % i for i in range(6)], batched=True)  # 1 batch entry
        await until(lambda: len(reader._impl.queue) == 10, what="10 messages queued")
        disconnections = count_disconnections(reader._impl)
        assert proxy.cut() >= 1
        await until(lambda: disconnections, what="the cut noticed")  # the queue was cleared
        got = [(await reader.read_next(timeout_millis=10000)).data() for _ in range(10)]
        assert got == [b"s%d" % i for i in range(4)] + [b"b%d" % i for i in range(6)]
        # second cut with part of a batch read: resumes inside the batch at the first dropped message
        await produce(client, topic, [b"c%d" % i for i in range(6)], batched=True)
        await until(lambda: len(reader._impl.queue) == 6, what="6 messages queued")
        assert [(await reader.read_next(timeout_millis=5000)).data() for _ in range(2)] == [b"c0", b"c1"]
        proxy.cut()
        await until(lambda: len(disconnections) == 2, what="the second cut noticed")
        rest = [(await reader.read_next(timeout_millis=10000)).data() for _ in range(4)]
        assert rest == [b"c2", b"c3", b"c4", b"c5"]
        with pytest.raises(Timeout):
            await reader.read_next(timeout_millis=300)
        await reader.close()
    finally:
        await reader_client.close()


async def test_reader_at_latest_keeps_its_queued_messages_across_a_broker_restart(standalone_factory):
    cluster = standalone_factory()
    topic = unique("delivery-reader-restart")
    client = AsyncClient(cluster.service_url, operation_timeout_seconds=10)
    try:
        reader = await client.create_reader(topic, MessageId.latest)
        await produce(client, topic, [b"%d" % i for i in range(10)])
        await until(lambda: len(reader._impl.queue) == 10, what="10 messages queued")
        disconnections = count_disconnections(reader._impl)
        cluster.kill()
        await until(lambda: disconnections, what="the broker's death noticed")  # the queue was cleared
        cluster = cluster.restart(same_port=True)
        got = [(await reader.read_next(timeout_millis=15000)).data() for _ in range(10)]
        assert got == [b"%d" % i for i in range(10)]
        await reader.close()
    finally:
        await client.close()


# ---------------------------------------------------------------- 5. consumer epoch
@pytest.mark.parametrize("sub_type", [ConsumerType.Exclusive, ConsumerType.Failover])
async def test_negative_ack_redelivers_no_acknowledged_message(client, sub_type):
    """PIP-84: the redeliver-all of a negative ack carries a new consumer epoch;
    entries the broker pushed before it are dropped by the client (before:
    ~200 of 20,000 acknowledged messages were delivered again)."""
    topic = unique("delivery-epoch")
    n = 20_000
    consumer = await client.subscribe(topic, "sub", consumer_type=sub_type, negative_ack_redelivery_delay_ms=50)
    await produce(client, topic, [b"%d" % i for i in range(n)])  # one entry each: acks are per entry
    acked: set[int] = set()
    nacked: set[int] = set()
    again_after_ack = 0
    while len(acked) < n:
        msg = await consumer.receive(timeout_millis=15000)
        value = int(msg.data())
        if value in acked:
            again_after_ack += 1
            continue
        if value in (5_000, 12_000) and value not in nacked:
            consumer.negative_acknowledge(msg)  # redelivered after 50 ms with everything unacknowledged
            nacked.add(value)
            continue
        consumer.acknowledge(msg)
        acked.add(value)
    assert again_after_ack == 0
    await consumer.close()


# ---------------------------------------------------------------- 6. no redelivery loops
async def test_failed_dead_letter_publish_on_exclusive_does_not_loop(client):
    """A dead letter that cannot be published is redelivered like a negative
    ack: on Exclusive that is a redeliver-all with the queue cleared (before:
    a redelivery of its position every few ms, each one re-sending everything
    unacknowledged into the uncleared queue)."""
    topic = unique("delivery-dlq-fails")
    policy = DeadLetterPolicy(max_redeliver_count=1, dead_letter_topic="persistent://no-such-tenant/no-ns/dlq")
    consumer = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive,
                                      negative_ack_redelivery_delay_ms=500, dead_letter_policy=policy)
    impl = consumer._impl
    publish_attempts = 0
    original_publish = impl._dead_letter.publish

    async def counting_publish(msg):
        nonlocal publish_attempts
        publish_attempts += 1
        await original_publish(msg)
    impl._dead_letter.publish = counting_publish

    await produce(client, topic, [b"poison"])
    deliveries = collections.Counter()
    acked: set[bytes] = set()
    again_after_ack = 0

    async def produce_goods():
        for i in range(20):
            await produce(client, topic, [b"good-%d" % i])
            await asyncio.sleep(0.1)

    producing = asyncio.create_task(produce_goods())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            msg = await consumer.receive(timeout_millis=200)
        except Timeout:
            continue
        deliveries[msg.data()] += 1
        if msg.data() == b"poison":
            consumer.negative_acknowledge(msg)
            continue
        if msg.data() in acked:
            again_after_ack += 1
        consumer.acknowledge(msg)
        acked.add(msg.data())
        await asyncio.sleep(0.02)  # a slow application
    await producing
    # attempts come one negative-ack delay apart (500 ms), not in a tight loop
    assert 1 <= publish_attempts <= 12, publish_attempts
    assert again_after_ack == 0, deliveries
    assert acked == {b"good-%d" % i for i in range(20)}
    assert deliveries[b"poison"] == 2  # redelivery counts 0 and 1 (= max); then dead-letter attempts
    await consumer.close()


@pytest.mark.parametrize("ack_timeout_ms", [None, 1000])
async def test_dropped_chunks_on_exclusive_do_not_loop(small_standalone, ack_timeout_ms):
    """Chunks dropped by the consumer (here: the subscription starts at the
    second chunk of a chunked message, so chunks 1..5 come without chunk 0) go
    to ack-timeout tracking, not to an immediate redelivery (before: each
    dropped chunk asked for a redelivery, which on Exclusive rewinds the
    cursor and resends the same chunks: a redelivery loop that also
    duplicated the messages after them in the uncleared queue)."""
    topic = unique("delivery-chunk-loop")
    client = AsyncClient(small_standalone.service_url, operation_timeout_seconds=10)
    admin = AdminClient(small_standalone.service_url)
    try:
        await (await client.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive)).close()
        producer = await client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
        big = os.urandom(100_000)  # incompressible: 6 chunks
        last_chunk = await producer.send(big)
        await producer.close()
        await produce(client, topic, [b"good-%d" % i for i in range(20)])
        await admin.reset_cursor(topic, "sub", MessageId(last_chunk.ledger_id, last_chunk.entry_id - 4))

        consumer = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive,
                                          unacked_messages_timeout_ms=ack_timeout_ms)
        impl = consumer._impl
        redelivers = 0
        original_write = impl._write

        async def counting_write(req):
            nonlocal redelivers
            if req.WhichOneof("request") == "redeliver":
                redelivers += 1
            await original_write(req)
        impl._write = counting_write

        deliveries = collections.Counter()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                msg = await consumer.receive(timeout_millis=200)
            except Timeout:
                continue
            deliveries[msg.data()] += 1
            consumer.acknowledge(msg)
            await asyncio.sleep(0.01)  # a slow application
        assert big not in deliveries
        assert dict(deliveries) == {b"good-%d" % i: 1 for i in range(20)}
        if ack_timeout_ms is None:
            assert redelivers == 0  # they wait for a reconnection (or their expiry), as in Pulsar
        else:
            assert 1 <= redelivers <= 3, redelivers  # one redeliver-all per ack timeout
        await consumer.close()
    finally:
        await admin.close()
        await client.close()


# ---------------------------------------------------------------- 7. chunked message ids
@pytest.mark.parametrize("multi_topic", [False, True])
async def test_acknowledging_a_chunked_message_by_id_acknowledges_every_chunk(small_standalone, multi_topic):
    """ChunkMessageIdImpl: the id of a chunked message carries its chunks; an
    ack by that id covers every chunk's entry (before: only the last chunk's,
    the backlog kept the other chunks)."""
    topic = unique("delivery-chunk-ack")
    client = AsyncClient(small_standalone.service_url, operation_timeout_seconds=10)
    admin = AdminClient(small_standalone.service_url)
    try:
        consumer = await client.subscribe([topic] if multi_topic else topic, "sub",
                                          consumer_type=ConsumerType.Shared)
        producer = await client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
        payloads = [os.urandom(50_000), os.urandom(50_000)]
        sent = [await producer.send(p) for p in payloads]
        await producer.close()
        msgs = [await consumer.receive(timeout_millis=5000) for _ in range(2)]
        assert [m.data() for m in msgs] == payloads
        ids = [m.message_id() for m in msgs]
        for cid in ids:
            consumer.acknowledge(cid)  # by id, not by Message
        await consumer.close()
        assert await backlog(admin, topic, "sub") == 0
        for cid, mid in zip(ids, sent):
            assert cid == mid  # equals the id the producer got (the last chunk's)
            assert cid.first_chunk_message_id < cid and len(cid.chunk_message_ids) >= 3
        again = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
        with pytest.raises(Timeout):
            await again.receive(timeout_millis=500)
        await again.close()
    finally:
        await admin.close()
        await client.close()


# ---------------------------------------------------------------- 8. acks across reconnects
@pytest.mark.parametrize("batch_index_ack", [False, True])
async def test_acks_in_the_group_window_survive_connection_cuts(standalone, client, proxy, batch_index_ack):
    """Acks flushed into a stream that broke before anyone noticed stay in
    flight until the broker confirms them: they keep filtering the broker's
    redeliveries and are sent again, before the first Flow, on the new
    connection (before: ~300 acknowledged messages delivered again over 4 cuts)."""
    topic = unique("delivery-ack-cuts")
    n = 3000
    consumer_client = AsyncClient(proxy.service_url, operation_timeout_seconds=10)
    try:
        consumer = await consumer_client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared,
                                                   receiver_queue_size=200, batch_index_ack_enabled=batch_index_ack)
        # without batch-index acks, one entry per message: a batch partly acknowledged comes back
        # whole (as Pulsar), with them batches of 100
        await produce(client, topic, [b"%d" % i for i in range(n)], batched=batch_index_ack, batch_size=100)
        acked: set[int] = set()
        again_after_ack = 0
        cuts = 0
        while len(acked) < n:
            if cuts < 4 and len(acked) >= (cuts + 1) * n // 5:
                # stall the link, let the application ack what it has queued (the acks are
                # flushed into the stalled stream), then cut it
                proxy.hold()
                while True:
                    try:
                        msg = consumer._queue.get_nowait()
                    except IndexError:
                        break
                    msg._consumer.on_dequeued(msg)
                    value = int(msg.data())
                    again_after_ack += value in acked
                    consumer.acknowledge(msg)
                    acked.add(value)
                await asyncio.sleep(0.4)  # > ack_group_time_ms: the acks leave into the stalled stream
                proxy.cut()
                proxy.release()
                cuts += 1
                continue
            msg = await consumer.receive(timeout_millis=20000)
            value = int(msg.data())
            if value in acked:
                again_after_ack += 1
            consumer.acknowledge(msg)
            acked.add(value)
        assert cuts == 4
        assert again_after_ack == 0
        await consumer.close()
        admin = AdminClient(standalone.service_url)
        try:
            assert await backlog(admin, topic, "sub") == 0
        finally:
            await admin.close()
    finally:
        await consumer_client.close()


# ---------------------------------------------------------------- ack receipts across reconnects
async def test_acknowledge_and_wait_while_reconnecting_waits_for_the_brokers_answer(standalone, client, proxy):
    """``acknowledge_and_wait`` called while the consumer is reconnecting returns only
    once the broker answered the flush that carried its ack -- here the one sent on the
    new connection before the first Flow -- and raises the broker's refusal (Pulsar's
    ack receipt). Before, it found its ack already taken by that flush and returned at
    once: an ack the broker refused (one for an entry that does not exist) looked
    confirmed, and a confirmed-looking ack could be lost when the topic was unloaded
    again before applying it (the delivery model's open finding, issue 20)."""
    topic = unique("delivery-ack-receipt")
    consumer_client = AsyncClient(proxy.service_url, operation_timeout_seconds=10)
    admin = AdminClient(standalone.service_url)
    try:
        consumer = await consumer_client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared,
                                                   initial_position=InitialPosition.Earliest)
        await produce(client, topic, [b"a", b"b"])
        first = await consumer.receive(timeout_millis=10000)
        await consumer.receive(timeout_millis=10000)
        impl = consumer._resolve(first)[0]
        answers: list = []
        original = impl._ack_answered

        def spy(*args):   # (request_id, error): the broker answered an ack frame
            was_ack = original(*args)
            if was_ack:
                answers.append(args[-1])
            return was_ack
        impl._ack_answered = spy

        async def ack_while_reconnecting(mid):
            proxy.refuse(True)
            proxy.cut()
            await until(lambda: impl._call is None, what="the consumer noticed the cut")
            task = asyncio.create_task(consumer.acknowledge_and_wait(mid))
            await asyncio.sleep(0.3)
            assert not task.done(), "acknowledge_and_wait returned while disconnected"
            proxy.refuse(False)
            return task

        # 1. refused: the flush sent on reconnection gets InvalidArgument, and so does the caller
        bogus = MessageId(first.message_id().ledger_id, 1_000_000)
        task = await ack_while_reconnecting(bogus)
        with pytest.raises(InvalidArgument):
            await asyncio.wait_for(task, 30)
        assert answers and isinstance(answers[-1], InvalidArgument)

        # 2. applied: done only after the broker confirmed it, so the backlog shows it at once
        answered_before = len(answers)
        task = await ack_while_reconnecting(first.message_id())
        await asyncio.wait_for(task, 30)
        assert len(answers) > answered_before and answers[-1] is None
        assert await backlog(admin, topic, "sub") == 1
    finally:
        await admin.close()
        await consumer_client.close()


# ---------------------------------------------------------------- 9. dead-letter count
@pytest.mark.parametrize("sub_type", [ConsumerType.Shared, ConsumerType.Exclusive])
async def test_dead_letter_after_max_redeliveries_as_pulsar(client, sub_type):
    """Pulsar's ConsumerImpl delivers a message whose redelivery count equals
    max_redeliver_count and dead-letters it once the count exceeds it (before:
    dead-lettered at count == max, one delivery early)."""
    topic = unique("delivery-dlq-count")
    policy = DeadLetterPolicy(max_redeliver_count=2, initial_subscription_name="dlq-sub")
    consumer = await client.subscribe(topic, "dl", consumer_type=sub_type, negative_ack_redelivery_delay_ms=100,
                                      dead_letter_policy=policy)
    await produce(client, topic, [b"poison"])
    counts = []
    while True:
        try:
            msg = await consumer.receive(timeout_millis=1500)
        except Timeout:
            break
        counts.append(msg.redelivery_count())
        consumer.negative_acknowledge(msg)
    assert counts == [0, 1, 2]
    dlq = await client.subscribe(f"{topic}-dl-DLQ", "dlq-sub")
    assert (await dlq.receive(timeout_millis=5000)).data() == b"poison"
    await dlq.close()
    await consumer.close()
