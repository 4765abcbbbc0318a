"""Geo-replication under faults and policy changes (private clusters per test)."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.geo import connect_clusters, produce_raw, read_all, start_clusters
from tests.integration.test_geo_replication import check_exactly_once_in_order


@pytest.fixture
def pair(tmp_path, process_tracker):
    return start_clusters(tmp_path, ["a", "b"], process_tracker)


def new_topic(ns: str) -> str:
    return f"persistent://{ns}/t-{uuid.uuid4().hex[:8]}"


async def test_kill9_source_mid_replication_no_duplicates_no_loss(pair):
    a, b = pair
    await connect_clusters(pair, "geo", "ns", ["a", "b"])
    topic = new_topic("geo/ns")
    await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(3000)], window=500)
    a.proc.kill()                       # kill -9 the whole source cluster while replicating
    a.proc = a.proc.restart()           # same data dir and port
    await a.close()
    got = await read_all(b, topic, 3000, timeout_s=60)
    check_exactly_once_in_order(got, {"pa": 3000})


async def test_remote_down_under_load_then_backlog_drains(pair):
    a, b = pair
    await connect_clusters(pair, "geo", "ns", ["a", "b"])
    topic = new_topic("geo/ns")
    await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(200)])
    b.proc.terminate()
    await b.close()
    await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(200, 1200)], start_seq=200)
    stats = await a.admin("topics.stats", topic=topic)
    assert stats["replication"]["b"]["connected"] is False
    assert stats["replication"]["b"]["replicationBacklog"] > 0
    b.proc = b.proc.restart()
    check_exactly_once_in_order(await read_all(b, topic, 1200, timeout_s=60), {"pa": 1200})
    for _ in range(50):
        stats = await a.admin("topics.stats", topic=topic)
        if stats["replication"]["b"]["replicationBacklog"] == 0:
            break
        await asyncio.sleep(0.1)
    assert stats["replication"]["b"]["replicationBacklog"] == 0


async def test_ttl_expired_not_replicated_and_removed_cluster_stops_receiving(pair):
    a, b = pair
    await connect_clusters(pair, "geo", "ns", ["a"])
    await a.admin("namespaces.set_message_ttl", namespace="geo/ns", ttl_seconds=1)
    topic = new_topic("geo/ns")
    await produce_raw(a, topic, "old", [b"o-%d" % i for i in range(20)])
    await asyncio.sleep(1.5)
    for cl in pair:  # each cluster keeps its own policies: configure both
        await cl.admin("namespaces.set_clusters", namespace="geo/ns", clusters=["a", "b"])
    await produce_raw(a, topic, "new", [b"n-%d" % i for i in range(20)])
    check_exactly_once_in_order(await read_all(b, topic, 20), {"new": 20})
    stats = await a.admin("topics.stats", topic=topic)
    assert stats["replication"]["b"]["msgExpiredCounter"] == 20
    # remove b: the replicator stops, later messages stay in a
    await a.admin("namespaces.set_clusters", namespace="geo/ns", clusters=["a"])
    await asyncio.sleep(0.3)
    await produce_raw(a, topic, "late", [b"l-%d" % i for i in range(10)])
    await asyncio.sleep(1.0)
    check_exactly_once_in_order(await read_all(b, topic, 20, timeout_s=3), {"new": 20})


async def test_partitioned_topic_gets_same_partitions_remotely(pair):
    a, b = pair
    await connect_clusters(pair, "geo", "ns", ["a", "b"])
    topic = new_topic("geo/ns")
    await a.admin("topics.create_partitioned", topic=topic, partitions=3)
    await produce_raw(a, topic + "-partition-2", "pa", [b"a-%d" % i for i in range(10)])
    check_exactly_once_in_order(await read_all(b, topic + "-partition-2", 10), {"pa": 10})
    assert (await b.admin("topics.partitioned_metadata", topic=topic))["partitions"] == 3


async def test_replication_resumes_as_soon_as_a_restarted_remote_is_ready(pair):
    """The remote is down for 14 s, long enough for the replicator's backoff to grow past 10 s;
    once the remote is back, the backlog must flow within a few seconds (the replicator watches
    the channel and retries when it is READY), not after the grown backoff (before: up to 30 s)."""
    a, b = pair
    await connect_clusters(pair, "geo", "ns", ["a", "b"])
    topic = new_topic("geo/ns")
    await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(10)])
    await read_all(b, topic, 10, timeout_s=30)
    b.proc.terminate()
    await b.close()
    await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(10, 20)], start_seq=10)
    await asyncio.sleep(14)
    b.proc = b.proc.restart()
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await read_all(b, topic, 20, timeout_s=60)
    waited = loop.time() - started
    check_exactly_once_in_order(got, {"pa": 20})
    assert waited < 6.0, f"replication resumed {waited:.1f} s after the remote was ready"
