"""The fault harness's own stall probe (``Workload._probe_stall``), which ``finish`` runs
when acknowledged messages are still undelivered at the end of the drain: it must tell a
consumer stream that works from one that is stuck, and the scenario must fail whatever
the probe brings afterwards. A real broker and bookies; the consumer's connection goes
through a TCP proxy that the test holds (nothing forwarded, nothing closed: what a stream
stuck between the broker's writer and the SDK looks like)."""
from __future__ import annotations

import asyncio

import pytest

from tests.faults import harness
from tests.faults.harness import Workload
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(150)


async def test_stall_probe_tells_a_stuck_consumer_stream_from_a_working_one(fault_cluster, monkeypatch):
    rows = []
    monkeypatch.setattr(harness, "record", rows.append)    # not a scenario: keep it out of the fault table
    cluster = fault_cluster(2)
    await cluster.create_namespace()
    proxy = await TcpProxy.to_service_url(cluster.service_url).start()
    w = await Workload(cluster.service_url, consume_url=proxy.service_url, rate=50,
                       admin_url=cluster.service_url).start()
    w.probe_wait_s = 2.0
    try:
        await w.run_for(1.0)
        working = await w._probe_stall(wait_s=15)
        assert working["probe_delivered"] and working["missing_after"] == 0, working

        proxy.hold()
        await w.run_for(1.0)              # stored and acknowledged to the producer, stuck at the proxy

        async def release_after_the_probe():
            while "stall_probe" not in w.details:
                await asyncio.sleep(0.05)
            proxy.release()               # the reading back of the stored topic goes through it too

        releaser = asyncio.create_task(release_after_the_probe())
        with pytest.raises(AssertionError, match="acknowledged messages never delivered"):
            await w.finish("harness self-test", "consumer link held", drain_timeout_s=3.0)
        await releaser
        details = rows[0].details
        stuck = details["stall_probe"]
        assert stuck["missing_before"] > 0 and not stuck["probe_delivered"], stuck
        assert stuck["missing_after"] == stuck["missing_before"], stuck
        before = details["before_probe"]
        assert before["client_consumer"][0]["run_task"] == "running", before
        # where the harness's consumer waits: in the SDK's receive, for the queue
        where = before["consume_task"]
        assert where["state"] == "running" and any("receiver_queue.py" in f for f in where["stack"]), where
        # the broker pushed what the consumer never got: its view says so
        assert before["work_subscription"]["consumers"][0]["msgOutCounter"] > \
            before["client_consumer"][0]["entries_received"], before
        assert rows[0].lost >= stuck["missing_before"]
        # nothing was lost: once the link works, a new consumer gets what the stuck one did not
        assert stuck["missing_after_resubscribe"] == 0, stuck
    finally:
        proxy.release()
        await w.close()
        await proxy.close()


async def test_the_consumer_keeps_receiving_while_sends_are_still_pending_at_the_end(fault_cluster, monkeypatch):
    """The harness's own consumer must not stop while sends are still unanswered: when the
    last sends are slow to be stored (a paused bookie, an ensemble change, a busy machine),
    every message acknowledged SO FAR can be delivered while more acknowledgments are yet
    to come. Before, the consume loop returned at that moment (a receive timeout after the
    stop, with everything acknowledged so far delivered), and the messages acknowledged
    afterwards were left in the SDK's queue: reported as never delivered. Here the
    producer's link is held through a proxy at the end, so its last sends stay pending for
    2 s after the stop."""
    rows = []
    monkeypatch.setattr(harness, "record", rows.append)
    cluster = fault_cluster(2)
    await cluster.create_namespace()
    proxy = await TcpProxy.to_service_url(cluster.service_url).start()
    w = await Workload(proxy.service_url, consume_url=cluster.service_url, rate=50).start()
    try:
        await w.run_for(1.0)
        proxy.hold()                      # sends from now on stay pending
        await w.run_for(1.0)

        async def release_later():
            await asyncio.sleep(2.0)      # the stop comes first, then 2 s without any delivery
            proxy.release()

        releaser = asyncio.create_task(release_later())
        row = await w.finish("harness self-test", "producer link held at the end")
        await releaser
        assert row.lost == 0 and "consumer_task_error" not in row.details, row.details
        assert row.acknowledged == len(w.sent_at) > 60, (row.acknowledged, len(w.sent_at))
    finally:
        proxy.release()
        await w.close()
        await proxy.close()
