"""Faults on the link between two clusters, under a running SDK workload: the producer
(dedup on) publishes in cluster a, the consumer reads the replicated copies in cluster b.
Cluster a knows b through a fault-injecting TCP proxy (``tests/tcp_proxy.py``), so its
replicator's connection to b's broker is what gets cut, slowed (200 ms each way) or
flapped. The checks and the figures row: ``tests/faults/harness.py``; "time to serve
again" is here the time until a message published after the fault is readable in b.

Besides the four checks: replication resumes exactly once (no copy stored twice in b,
the replicator's producer resends what it had in flight and b's deduplication drops
what it had stored: Pulsar's ``GeoPersistentReplicator`` with the source position as
sequence id), the replication backlog drains back to 0 (lag recovers), and a's topic
stats show the replicator disconnected while the link is down.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.faults.harness import Workload
from tests.geo import connect_clusters, start_clusters
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(150)

DEDUP = "broker_deduplication_enabled = true\n"


@pytest.fixture
async def linked(tmp_path, process_tracker):
    """Clusters a and b (standalone processes, dedup on); a reaches b through a proxy."""
    (a,), (b,) = await asyncio.gather(*(asyncio.to_thread(start_clusters, tmp_path, [name], process_tracker, DEDUP)
                                        for name in ("a", "b")))      # in parallel
    await connect_clusters([a, b], "geo", "ns", ["a", "b"])
    proxy = await TcpProxy.to_service_url(b.url).start()
    await a.admin("clusters.update", name="b", service_url=proxy.service_url)
    try:
        yield a, b, proxy
    finally:
        await proxy.close()
        await a.close()
        await b.close()


async def _replication(a, topic: str) -> dict:
    return (await a.admin("topics.stats", topic=topic))["replication"]["b"]


async def _wait_disconnected(a, topic: str, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await _replication(a, topic)
        if stats["connected"] is False:
            return stats
        assert time.monotonic() < deadline, f"a's stats never showed the link down: {stats}"
        await asyncio.sleep(0.1)


async def _wait_caught_up(a, topic: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await _replication(a, topic)
        if stats["connected"] and stats["replicationBacklog"] == 0:
            return stats
        assert time.monotonic() < deadline, f"the replication lag did not recover: {stats}"
        await asyncio.sleep(0.2)


def _workload(a, b) -> Workload:
    import uuid
    return Workload(a.url, f"persistent://geo/ns/link-{uuid.uuid4().hex[:8]}", consume_url=b.url)


async def test_link_cut(linked):
    a, b, proxy = linked
    w = await _workload(a, b).start()
    try:
        await w.run_for(2.0)
        w.fault("link a->b cut, refused 3 s")
        proxy.cut()
        proxy.refuse(True)
        stats = await _wait_disconnected(a, w.topic)
        await w.run_for(max(0.0, 3.0 - 0.1))
        proxy.refuse(False)
        await w.run_for(2.0)
        row = await w.finish("geo link cut", "replicator link reset, refused for 3 s", serve_bound_s=45)
        caught_up = await _wait_caught_up(a, w.topic)
        print(f"link down: connected={stats['connected']} backlog={stats['replicationBacklog']}; "
              f"after: {caught_up}")
        assert row.lost == 0
    finally:
        await w.close()


async def test_link_slowed(linked):
    a, b, proxy = linked
    w = await _workload(a, b).start()
    try:
        await w.run_for(2.0)
        w.fault("link a->b slowed by 200 ms each way for 5 s")
        proxy.delay_s = 0.2
        await w.run_for(5.0)
        during = await _replication(a, w.topic)
        proxy.delay_s = 0.0
        await w.run_for(2.0)
        await w.finish("geo link slowed", "200 ms added each way for 5 s", serve_bound_s=45)
        after = await _wait_caught_up(a, w.topic)
        print(f"slow link: during {during}; after {after}")
    finally:
        await w.close()


async def test_link_flapping(linked):
    a, b, proxy = linked
    w = await _workload(a, b).start()
    try:
        await w.run_for(2.0)
        flapping = asyncio.create_task(proxy.flap(1.0, 1.5, 4, on_down=lambda: w.fault("link a->b down 1 s")))
        await _wait_disconnected(a, w.topic)
        await flapping
        await w.run_for(2.0)
        await w.finish("geo link flapping", "4 x (reset + refused 1 s, up 1.5 s)", serve_bound_s=45)
        await _wait_caught_up(a, w.topic)
        assert proxy.cuts >= 4
    finally:
        await w.close()
