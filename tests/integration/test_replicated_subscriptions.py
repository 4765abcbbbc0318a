"""Replicated subscriptions (PIP-33) between real clusters."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.geo import RawConsumer, connect_clusters, produce_raw, start_clusters

CONFIG = "replicated_subscriptions_snapshot_frequency_millis = 200\n"


def new_topic(ns: str) -> str:
    return f"persistent://{ns}/t-{uuid.uuid4().hex[:8]}"


async def wait_for_backlog(cluster, topic, sub, expected, timeout_s=20.0):
    stats = None
    for _ in range(int(timeout_s / 0.2)):
        try:
            stats = await cluster.admin("topics.stats", topic=topic)
            if sub in stats["subscriptions"] and stats["subscriptions"][sub]["msgBacklog"] == expected:
                return stats
        except Exception:
            pass
        await asyncio.sleep(0.2)
    return stats


async def test_worked_example_two_clusters(tmp_path, process_tracker):
    a, b = start_clusters(tmp_path, ["a", "b"], process_tracker, CONFIG)
    await connect_clusters([a, b], "geo", "ns", ["a", "b"])
    topic = new_topic("geo/ns")
    consumer = await RawConsumer(a, topic, "sub").start()
    await produce_raw(a, topic, "p", [b"m-%d" % i for i in range(1, 11)])
    await asyncio.sleep(1.0)   # a few snapshot periods: SNAPSHOT markers after message 10
    await produce_raw(a, topic, "p", [b"m-%d" % i for i in range(11, 21)], start_seq=10)
    got = await consumer.receive(20)
    assert [d for _, _, d in got] == [b"m-%d" % i for i in range(1, 21)]
    await consumer.ack_cumulative(got[9][0])
    # B's copy of `sub` follows: backlog there drops to the 10 unacknowledged messages.
    stats = await wait_for_backlog(b, topic, "sub", 10)
    assert stats["subscriptions"]["sub"]["msgBacklog"] == 10, stats
    consumer.close()
    in_b = await RawConsumer(b, topic, "sub").start()
    first = await in_b.receive(10)
    assert [d for _, _, d in first] == [b"m-%d" % i for i in range(11, 21)]
    assert await in_b.receive(1, timeout_s=1.0) == []
    in_b.close()
    # markers are never delivered and not counted: backlog in A is exactly the unacked messages
    stats_a = await a.admin("topics.stats", topic=topic)
    assert stats_a["subscriptions"]["sub"]["msgBacklog"] == 10


async def test_three_clusters_two_rounds(tmp_path, process_tracker):
    clusters = start_clusters(tmp_path, ["a", "b", "c"], process_tracker, CONFIG)
    a, b, c = clusters
    await connect_clusters(clusters, "geo", "ns", ["a", "b", "c"])
    topic = new_topic("geo/ns")
    consumer = await RawConsumer(a, topic, "sub").start()
    for cl in clusters:
        await produce_raw(cl, topic, f"p-{cl.name}", [b"%s-%d" % (cl.name.encode(), i) for i in range(10)])
    got = await consumer.receive(30)
    assert len(got) == 30
    await asyncio.sleep(1.5)   # snapshots need two rounds with three clusters
    for cl in clusters:
        await produce_raw(cl, topic, f"p-{cl.name}", [b"%s-%d" % (cl.name.encode(), i) for i in range(10, 13)],
                          start_seq=10)
    got += await consumer.receive(9)
    await consumer.ack_cumulative(got[29][0])
    for cl in (b, c):
        stats = await wait_for_backlog(cl, topic, "sub", 9)
        assert stats["subscriptions"]["sub"]["msgBacklog"] <= 9 + 3, stats   # at most one period of slack
        assert stats["subscriptions"]["sub"]["msgBacklog"] < 39
    consumer.close()


async def _metrics(cluster) -> str:
    import urllib.request

    port = int(cluster.proc.stdout_log.read_text().split("http_port=")[-1].split()[0])
    return await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode())


async def test_cluster_down_stops_snapshots_and_markers_stay_hidden(tmp_path, process_tracker):
    a, b = start_clusters(tmp_path, ["a", "b"], process_tracker, CONFIG)
    await connect_clusters([a, b], "geo", "ns", ["a", "b"])
    topic = new_topic("geo/ns")
    consumer = await RawConsumer(a, topic, "sub").start()
    await produce_raw(a, topic, "p", [b"m-%d" % i for i in range(5)])
    await asyncio.sleep(1.0)
    text = await _metrics(a)
    assert "pulsar_replicated_subscriptions_pending_snapshots" in text
    b.proc.terminate()
    await b.close()
    await asyncio.sleep(0.6)   # the replicator notices the remote is gone
    stats = await a.admin("topics.internal_stats", topic=topic)
    entries_before = stats["numberOfEntries"]
    await produce_raw(a, topic, "p", [b"m-%d" % i for i in range(5, 10)], start_seq=5)
    await asyncio.sleep(1.5)   # several periods: no snapshot requests while b is down
    stats = await a.admin("topics.internal_stats", topic=topic)
    assert stats["numberOfEntries"] <= entries_before + 5 + 1   # the data, at most one in-flight request
    # no marker reaches the consumer, and the backlog counts only messages
    got = await consumer.receive(10)
    assert [d for _, _, d in got] == [b"m-%d" % i for i in range(10)]
    assert await consumer.receive(1, timeout_s=0.5) == []
    user_stats = await a.admin("topics.stats", topic=topic)
    assert user_stats["subscriptions"]["sub"]["msgBacklog"] == 10
    # b comes back: snapshots resume and the subscription follows there
    b.proc = b.proc.restart()
    await asyncio.sleep(1.5)
    await produce_raw(a, topic, "p", [b"m-%d" % i for i in range(10, 12)], start_seq=10)
    got += await consumer.receive(2)
    await consumer.ack_cumulative(got[-1][0])
    stats_b = await wait_for_backlog(b, topic, "sub", 0)
    assert stats_b["subscriptions"]["sub"]["msgBacklog"] == 0, stats_b
    consumer.close()


async def test_failover_after_source_broker_killed(tmp_path, process_tracker):
    """A consumer in A acknowledges cumulatively under steady load; A is killed
    (kill -9) while the load runs; the consumer re-subscribes in B. Count the
    duplicates it receives; after A returns, nothing is lost."""
    a, b = start_clusters(tmp_path, ["a", "b"], process_tracker, CONFIG)
    await connect_clusters([a, b], "geo", "ns", ["a", "b"])
    topic = new_topic("geo/ns")
    consumer = await RawConsumer(a, topic, "sub").start()
    rate, batch = 200, 10                      # steady 200 msg/s
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
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 3.0
    while loop.time() < deadline:
        got = await consumer.receive(batch, timeout_s=1)
        if got:
            await consumer.ack_cumulative(got[-1][0])
            acked.update(d for _, _, d in got)
    a.proc.kill()                              # kill -9 under load, right after the last ack
    producer.cancel()
    consumer.close()
    in_b = await RawConsumer(b, topic, "sub").start()
    received = [d for _, _, d in await in_b.receive(10_000, timeout_s=3)]
    a.proc = a.proc.restart()                  # A returns: what it had not replicated yet arrives
    received += [d for _, _, d in await in_b.receive(10_000, timeout_s=5)]
    in_b.close()
    duplicates = [d for d in received if d in acked]
    lost = set(produced) - acked - set(received)
    period_traffic = rate * 0.2
    print(f"failover: {len(produced)} produced, {len(acked)} acked in A, {len(duplicates)} redelivered in B "
          f"(one snapshot period = {period_traffic:.0f} messages), {len(lost)} lost")
    assert not lost
    assert len(duplicates) < period_traffic   # fewer than one snapshot period of traffic


async def test_markers_written_before_a_broker_restart_stay_out_of_backlogs(tmp_path, process_tracker):
    a, b = start_clusters(tmp_path, ["a", "b"], process_tracker, CONFIG)
    await connect_clusters([a, b], "geo", "ns", ["a", "b"])
    topic = new_topic("geo/ns")
    consumer = await RawConsumer(a, topic, "sub").start()
    for i in range(0, 20, 5):   # data interleaved with snapshot markers (several periods apart)
        await produce_raw(a, topic, "p", [b"m-%d" % k for k in range(i, i + 5)], start_seq=i)
        await asyncio.sleep(0.6)
    got = await consumer.receive(20)
    await consumer.ack_cumulative(got[4][0])
    consumer.close()
    stats = await wait_for_backlog(a, topic, "sub", 15)
    assert stats["subscriptions"]["sub"]["msgBacklog"] == 15, stats
    internal = await a.admin("topics.internal_stats", topic=topic)
    assert internal["numberOfEntries"] > 20 + 4   # markers are in there, between the messages
    a.proc.terminate()
    await a.close()
    a.proc = a.proc.restart()
    # after the restart the topic is loaded again: its backlog still counts messages only
    stats = await wait_for_backlog(a, topic, "sub", 15)
    assert stats["subscriptions"]["sub"]["msgBacklog"] == 15, stats
    in_a = await RawConsumer(a, topic, "sub").start()
    assert [d for _, _, d in await in_a.receive(15)] == [b"m-%d" % i for i in range(5, 20)]
    in_a.close()
