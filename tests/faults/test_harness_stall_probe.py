"""The fault harness's own stall probe (``Workload._probe_stall``), which a failed
scenario runs when acknowledged messages are still undelivered at the end: it must tell
a consumer stream that works from one that is stuck. A real broker and bookies; the
consumer's connection goes through a TCP proxy that the test holds (nothing forwarded,
nothing closed: what a stream stuck between the broker's writer and the SDK looks like)."""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.faults.harness import Workload
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(120)


async def test_stall_probe_tells_a_stuck_consumer_stream_from_a_working_one(fault_cluster):
    cluster = fault_cluster(2)
    await cluster.create_namespace()
    proxy = await TcpProxy.to_service_url(cluster.service_url).start()
    w = await Workload(cluster.service_url, consume_url=proxy.service_url, rate=50).start()
    try:
        await w.run_for(1.0)
        working = await w._probe_stall(wait_s=15)
        assert working["probe_delivered"] and working["missing_after"] == 0, working

        proxy.hold()
        await w.run_for(1.0)              # stored and acknowledged to the producer, stuck at the proxy
        stuck = await w._probe_stall(wait_s=2)
        assert stuck["missing_before"] > 0, stuck
        assert not stuck["probe_delivered"] and stuck["missing_after"] == stuck["missing_before"], stuck

        proxy.release()                   # the same stream goes on: everything arrives
        deadline = time.monotonic() + 45
        while not w._all_delivered():
            assert time.monotonic() < deadline, f"not delivered after the release: {w._client_view()}"
            await asyncio.sleep(0.1)
        assert all(state["run_task"] == "running" for state in w._client_view())
    finally:
        await w.close()
        await proxy.close()
