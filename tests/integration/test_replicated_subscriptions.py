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
