"""Replicated subscriptions whose acknowledgments travel by origin id (issue 15),
between real clusters: bursts with no snapshot at all, cumulative, individual
and batch-index acknowledgments, subscriptions existing in B beforehand or not,
messages from a third cluster, and a restart of B's broker while acknowledged
entries are still on their way."""
from __future__ import annotations

import asyncio
import time
import uuid

import grpc

from proto import broker_pb2 as pb
from tests.geo import RawConsumer, connect_clusters, produce_raw, read_all, start_clusters
from tests.tcp_proxy import TcpProxy

# No PIP-33 snapshot ever completes during a test: acknowledgments must travel without them.
NO_SNAPSHOTS = ("replicated_subscriptions_snapshot_frequency_millis = 600000\n"
                "replicated_subscriptions_update_interval_millis = 100\n")


def new_topic(ns: str) -> str:
    return f"persistent://{ns}/t-{uuid.uuid4().hex[:8]}"


def batch_entry(producer: str, seq: int, payloads: list[bytes]) -> bytes:
    """One entry holding ``payloads`` as a batch (sequence ids seq, seq+1, ...)."""
    from client.batching import BatchMessageContainer, PendingMessage
    from client.entry_format import encode_entry

    c = BatchMessageContainer()
    for i, p in enumerate(payloads):
        c.add(PendingMessage(payload=p, sequence_id=seq + i))
    md, data, _ = c.build(producer, publish_time_ms=int(time.time() * 1000))
    return encode_entry(md, data)


async def produce_batches(cluster, topic: str, producer: str, batches: list[list[bytes]]) -> None:
    """Send each list of payloads as one batch entry."""
    call = cluster.stub().Produce()
    await call.write(pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name=producer)))
    assert (await call.read()).HasField("success")
    seq = 0
    sends = []
    for payloads in batches:
        sends.append(pb.Send(sequence_id=seq, highest_sequence_id=seq + len(payloads) - 1,
                             num_messages=len(payloads), headers_and_payload=batch_entry(producer, seq, payloads)))
        seq += len(payloads)
    await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=sends)))
    got = 0
    while got < len(sends):
        resp = await call.read()
        assert resp.HasField("receipts"), resp
        got += len(resp.receipts.receipts)
    await call.done_writing()
    call.cancel()


class IndexedConsumer(RawConsumer):
    """RawConsumer whose messages are (position, batch index, batch size, payload)."""

    async def _pump(self):
        from client.batching import parse_batch
        from client.entry_format import decode_entry

        try:
            while True:
                resp = await self.call.read()
                if resp is grpc.aio.EOF:
                    return
                if resp.HasField("messages"):
                    for e in resp.messages.entries:
                        md, payload = decode_entry(e.headers_and_payload)
                        msgs = list(parse_batch(md, bytes(payload)))
                        for i, (_, data) in enumerate(msgs):
                            self.queue.put_nowait((e.position, i, len(msgs), data))
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            return

    async def ack_indexes(self, position, batch_size: int, indexes: list[int]):
        self._req += 1
        await self.call.write(pb.ConsumerRequest(ack=pb.Ack(ack_type=pb.Individual, request_id=self._req, positions=[
            pb.AckPosition(ledger_id=position.ledger_id, entry_id=position.entry_id, batch_size=batch_size,
                           batch_indexes=indexes)])))


async def receive_all(cluster, topic: str, sub: str, timeout_s: float = 3.0) -> list[bytes]:
    """Every message a consumer of ``sub`` in ``cluster`` receives until nothing more
    comes for ``timeout_s`` (the consumer stays unacknowledging, then leaves)."""
    c = await IndexedConsumer(cluster, topic, sub).start()
    out = []
    while True:
        got = await c.receive(1000, timeout_s=timeout_s)
        if not got:
            break
        out += [d for _, _, _, d in got]
    c.close()
    return out


async def wait_until(predicate, timeout_s: float = 20.0, step_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = await predicate()
            if value:
                return value
        except Exception:   # noqa: BLE001 - not there yet
            pass
        await asyncio.sleep(step_s)
    return None


async def backlog(cluster, topic: str, sub: str):
    stats = await cluster.admin("topics.stats", topic=topic)
    return stats["subscriptions"].get(sub, {}).get("msgBacklog")


async def metrics(cluster) -> str:
    """The text of ``cluster``'s /metrics."""
    import urllib.request

    port = int(cluster.proc.stdout_log.read_text().split("http_port=")[-1].split()[0])
    return await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode())


def metric(text: str, name: str) -> float:
    """The value of the (single-series) metric ``name`` in a /metrics text."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


async def prepare(clusters, topic, existing_in_b):
    for cl in existing_in_b:   # the subscription exists there beforehand (created by a consumer)
        c = await RawConsumer(cl, topic, "sub").start()
        c.close()
        await wait_until(lambda: backlog(cl, topic, "sub"))   # noqa: B023


async def test_burst_two_clusters_cumulative_and_individual(tmp_path, process_tracker):
    """A burst of 40 messages, no snapshot between them (none at all); in A a
    cumulative ack of the first 12 and individual acks of a scattered third of
    the rest: B's consumer receives exactly the others, each once, whether B's
    subscription existed before or is created by the first update."""
    a, b = start_clusters(tmp_path, ["a", "b"], process_tracker, NO_SNAPSHOTS)
    await connect_clusters([a, b], "geo", "ns", ["a", "b"])
    for existing in (True, False):
        topic = new_topic("geo/ns")
        await a.admin("topics.create", topic=topic)
        if existing:
            await prepare([b], topic, [b])
        consumer = await IndexedConsumer(a, topic, "sub").start()
        payloads = [b"m-%02d" % i for i in range(40)]
        await produce_raw(a, topic, "p", payloads)
        got = await consumer.receive(40)
        assert [d for *_, d in got] == payloads
        await consumer.ack_cumulative(got[11][0])
        individually = [got[i] for i in range(12, 40) if i % 3 == 0 or i in (13, 14, 39)]
        await consumer.ack([g[0] for g in individually])
        acked = {g[3] for g in got[:12]} | {g[3] for g in individually}
        expected = [p for p in payloads if p not in acked]
        assert await wait_until(lambda: _backlog_is(b, topic, "sub", len(expected))), \
            (existing, await backlog(b, topic, "sub"))
        consumer.close()
        assert await receive_all(b, topic, "sub") == expected, f"existing in b: {existing}"
        # markers stay invisible: A's backlog is exactly the unacknowledged messages
        assert await backlog(a, topic, "sub") == len(expected)


async def _backlog_is(cluster, topic, sub, n):
    return await backlog(cluster, topic, sub) == n


async def test_batch_index_acks_two_clusters(tmp_path, process_tracker):
    """Four batch entries of 10 messages; in A some batch indexes of two entries
    and one entry whole are acknowledged: B delivers exactly the rest."""
    a, b = start_clusters(tmp_path, ["a", "b"], process_tracker, NO_SNAPSHOTS)
    await connect_clusters([a, b], "geo", "ns", ["a", "b"])
    for existing in (True, False):
        topic = new_topic("geo/ns")
        await a.admin("topics.create", topic=topic)
        if existing:
            await prepare([b], topic, [b])
        consumer = await IndexedConsumer(a, topic, "sub").start()
        batches = [[b"e%d-m%d" % (e, i) for i in range(10)] for e in range(4)]
        await produce_batches(a, topic, "p", batches)
        got = await consumer.receive(40)
        assert len(got) == 40
        pos = [got[10 * e][0] for e in range(4)]
        await consumer.ack_indexes(pos[0], 10, [0, 1, 2, 7])
        await consumer.ack_indexes(pos[2], 10, [9])
        await consumer.ack([pos[1]])
        acked = {b"e0-m%d" % i for i in (0, 1, 2, 7)} | {b"e2-m9"} | set(batches[1])
        expected = [m for bt in batches for m in bt if m not in acked]
        await asyncio.sleep(1.5)   # the update interval plus the replication lag, several times
        consumer.close()
        # B redelivers the partially acknowledged entries with their ack sets: the SDK (here the
        # test) skips acknowledged indexes; the raw stream carries the ack set
        assert await receive_unacked_messages(b, topic, "sub") == expected, f"existing in b: {existing}"


async def receive_unacked_messages(cluster, topic, sub, timeout_s: float = 3.0) -> list[bytes]:
    """Messages delivered to a consumer of ``sub`` minus the batch indexes the broker's
    ack set marks as acknowledged (what the SDK hands to the application)."""
    from client.batching import parse_batch
    from client.entry_format import decode_entry

    call = cluster.stub().Consume()
    await call.write(pb.ConsumerRequest(subscribe=pb.Subscribe(
        topic=topic, subscription=sub, sub_type=pb.Exclusive, initial_position=pb.Earliest, durable=True,
        replicate_subscription_state=True)))
    assert (await call.read()).HasField("subscribed")
    await call.write(pb.ConsumerRequest(flow=pb.Flow(permits=10000)))
    out = []
    try:
        while True:
            try:
                resp = await asyncio.wait_for(call.read(), timeout_s)
            except asyncio.TimeoutError:
                break
            if resp is grpc.aio.EOF:
                break
            if not resp.HasField("messages"):
                continue
            for e in resp.messages.entries:
                md, payload = decode_entry(e.headers_and_payload)
                words = list(e.ack_set)
                for i, (_, data) in enumerate(parse_batch(md, bytes(payload))):
                    if words and not (words[i // 64] >> (i % 64)) & 1:
                        continue   # acknowledged index (set bit = not acknowledged)
                    out.append(data)
    finally:
        call.cancel()
    return out


async def test_three_clusters_origins_from_c_consumed_in_a_then_b(tmp_path, process_tracker):
    """Messages produced in all three clusters, most of them in C; consumed and
    acknowledged in A (cumulatively, then individually); a consumer in B and one
    in C then receive exactly the unacknowledged ones, each once."""
    clusters = start_clusters(tmp_path, ["a", "b", "c"], process_tracker, NO_SNAPSHOTS)
    a, b, c = clusters
    await connect_clusters(clusters, "geo", "ns", ["a", "b", "c"])
    topic = new_topic("geo/ns")
    await a.admin("topics.create", topic=topic)
    await prepare(clusters, topic, [c])        # exists in C beforehand, not in B
    consumer = await IndexedConsumer(a, topic, "sub").start()
    await produce_raw(c, topic, "pc", [b"c-%02d" % i for i in range(30)])
    await produce_raw(a, topic, "pa", [b"a-%02d" % i for i in range(5)])
    await produce_raw(b, topic, "pb", [b"b-%02d" % i for i in range(5)])
    await produce_raw(c, topic, "pc", [b"c-%02d" % i for i in range(30, 40)], start_seq=30)
    got = await consumer.receive(50)
    assert len(got) == 50
    in_a_order = [g[3] for g in got]
    await consumer.ack_cumulative(got[19][0])
    individually = [g for i, g in enumerate(got[20:], 20) if i % 2 == 0]
    await consumer.ack([g[0] for g in individually])
    acked = set(in_a_order[:20]) | {g[3] for g in individually}
    expected = sorted(set(in_a_order) - acked)
    assert await wait_until(lambda: _backlog_is(b, topic, "sub", len(expected)))
    assert await wait_until(lambda: _backlog_is(c, topic, "sub", len(expected)))
    consumer.close()
    for cl in (b, c):
        got_there = await receive_all(cl, topic, "sub")
        assert sorted(got_there) == expected and len(got_there) == len(set(got_there)), cl.name


async def proxied(clusters, src, dst):
    """Route ``src``'s replication to ``dst`` through a TcpProxy (returned, started)."""
    proxy = await TcpProxy.to_service_url(dst.url).start()
    await src.admin("clusters.update", name=dst.name, service_url=f"minipulsar://{proxy.address}")
    return proxy


async def replicator_connected(cluster, topic, remote) -> bool:
    stats = await cluster.admin("topics.stats", topic=topic)
    return bool(stats["replication"].get(remote, {}).get("connected"))


async def test_cumulative_ack_never_covers_what_the_acker_had_not_received(tmp_path, process_tracker):
    """C's messages reach B but not yet A (C -> A held); A acknowledges
    cumulatively everything it has: in B those C messages stay unacknowledged,
    and both A and B deliver them later."""
    clusters = start_clusters(tmp_path, ["a", "b", "c"], process_tracker, NO_SNAPSHOTS)
    a, b, c = clusters
    await connect_clusters(clusters, "geo", "ns", ["a", "b", "c"])
    topic = new_topic("geo/ns")
    proxy = await proxied(clusters, c, a)
    try:
        await c.admin("topics.create", topic=topic)
        assert await wait_until(lambda: replicator_connected(c, topic, "a"))
        consumer = await IndexedConsumer(a, topic, "sub").start()
        await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(5)])
        got = await consumer.receive(5)
        proxy.refuse(True)
        proxy.cut()
        await produce_raw(c, topic, "pc", [b"c-%d" % i for i in range(5)])   # reaches B only
        await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(5, 10)], start_seq=5)
        got += await consumer.receive(5)
        assert [g[3] for g in got] == [b"a-%d" % i for i in range(10)]
        await consumer.ack_cumulative(got[-1][0])
        # B: the subscription follows A (created by the update) but keeps C's five messages
        assert await wait_until(lambda: _backlog_is(b, topic, "sub", 5)), await backlog(b, topic, "sub")
        await asyncio.sleep(0.5)
        assert await backlog(b, topic, "sub") == 5
        proxy.refuse(False)
        late = await consumer.receive(5, timeout_s=30)
        assert sorted(g[3] for g in late) == [b"c-%d" % i for i in range(5)]
        consumer.close()
        assert sorted(await receive_all(b, topic, "sub")) == [b"c-%d" % i for i in range(5)]
    finally:
        await proxy.close()


async def test_b_restarted_between_the_update_and_the_entries_loses_nothing(tmp_path, process_tracker):
    """C -> B is held; C's messages reach A, A acknowledges all of them and some
    of its own; the update reaches B, whose subscription keeps them pending.
    B's broker restarts; then C's messages arrive at B: they are acknowledged
    from the pending set restored from the cursor, and B's consumer receives
    exactly the unacknowledged messages, each once."""
    clusters = start_clusters(tmp_path, ["a", "b", "c"], process_tracker, NO_SNAPSHOTS)
    a, b, c = clusters
    await connect_clusters(clusters, "geo", "ns", ["a", "b", "c"])
    topic = new_topic("geo/ns")
    proxy = await proxied(clusters, c, b)
    try:
        await c.admin("topics.create", topic=topic)
        assert await wait_until(lambda: replicator_connected(c, topic, "b"))
        consumer = await IndexedConsumer(a, topic, "sub").start()
        await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(4)])
        got = await consumer.receive(4)
        proxy.refuse(True)
        proxy.cut()
        await produce_raw(c, topic, "pc", [b"c-%d" % i for i in range(20)])   # reaches A only
        got += await consumer.receive(20)
        await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(4, 8)], start_seq=4)
        got += await consumer.receive(4)
        assert len(got) == 28
        # acknowledge all of C's messages and a-0, a-1, a-5 (a mix of cumulative and individual)
        await consumer.ack_cumulative(got[1][0])
        await consumer.ack([g[0] for g in got if g[3].startswith(b"c-") or g[3] == b"a-5"])
        expected = sorted([b"a-2", b"a-3", b"a-4", b"a-6", b"a-7"])
        # B applied the update: its subscription exists with A's and B's messages... and
        # C's acknowledged ones pending (they are not in B yet)
        assert await wait_until(lambda: _backlog_is(b, topic, "sub", 5)), await backlog(b, topic, "sub")
        consumer.close()
        b.proc.terminate()
        b.proc.wait(30)
        await b.close()
        b.proc = b.proc.restart()
        proxy.refuse(False)
        # C's twenty messages arrive at B and are acknowledged there at once, from the
        # pending set restored from the subscription's cursor
        assert len(await read_all(b, topic, 28, timeout_s=60)) == 28
        await asyncio.sleep(0.5)
        text = await metrics(b)
        assert metric(text, "pulsar_replicated_subscriptions_pending_restored_total") >= 1
        assert metric(text, "pulsar_replicated_subscriptions_acked_on_arrival_total") == 20
        assert metric(text, "pulsar_replicated_subscriptions_pending_acks") == 0
        assert await backlog(b, topic, "sub") == 5
        got_b = await receive_all(b, topic, "sub")
        assert sorted(got_b) == expected and len(got_b) == len(expected)
    finally:
        await proxy.close()


async def test_failover_without_snapshots_redelivers_only_the_last_moments(tmp_path, process_tracker):
    """200 msg/s into A, acknowledged cumulatively in A as they come, no snapshot
    at all; A is killed (kill -9) under load and the consumer moves to B: B
    redelivers only what was acknowledged within about the update interval plus
    the replication lag before the kill (PIP-33 alone: everything acknowledged,
    there being no snapshot), and after A returns nothing is lost."""
    a, b = start_clusters(tmp_path, ["a", "b"], process_tracker, NO_SNAPSHOTS)
    await connect_clusters([a, b], "geo", "ns", ["a", "b"])
    topic = new_topic("geo/ns")
    await a.admin("topics.create", topic=topic)
    consumer = await IndexedConsumer(a, topic, "sub").start()
    rate, batch = 200, 10
    produced: list[bytes] = []
    acked: set[bytes] = set()

    async def load():
        i = 0
        while True:
            await produce_raw(a, topic, "p", [b"m-%d" % k for k in range(i, i + batch)], start_seq=i)
            produced.extend(b"m-%d" % k for k in range(i, i + batch))
            i += batch
            await asyncio.sleep(batch / rate)

    producer = asyncio.create_task(load())
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        got = await consumer.receive(batch, timeout_s=1)
        if got:
            await consumer.ack_cumulative(got[-1][0])
            acked.update(g[3] for g in got)
    a.proc.kill()
    producer.cancel()
    consumer.close()
    in_b = await IndexedConsumer(b, topic, "sub").start()
    received = [g[3] for g in await in_b.receive(10_000, timeout_s=3)]
    a.proc = a.proc.restart()       # what A had not replicated yet arrives
    await a.close()
    received += [g[3] for g in await in_b.receive(10_000, timeout_s=5)]
    in_b.close()
    assert len(received) == len(set(received))
    duplicates = [d for d in received if d in acked]
    lost = set(produced) - acked - set(received)
    print(f"failover without snapshots: {len(produced)} produced, {len(acked)} acked in A, "
          f"{len(duplicates)} redelivered in B, {len(lost)} lost")
    assert not lost
    # the update interval (100 ms) plus the replication lag, at 200 msg/s, with room for a busy machine
    assert len(duplicates) <= rate * 0.5, len(duplicates)
