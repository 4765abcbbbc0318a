"""Broker faults under a running SDK workload (dedup on): kill -9 of the broker (a new
broker process on the same port recovers the topic's ledger, fencing it, and the SDK
reconnects and resends its pending messages), of the broker while a bookie is down,
and kill -9 of bookies and the broker in turn for 60 s. A killed process is started
again at once, as a supervisor would. The checks and the figures row:
``tests/faults/harness.py``.

Pulsar/BookKeeper rules exercised: ledger recovery on topic load fences the previous
writer's ledger (``LedgerRecoveryOp``; fencing); the producer reconnects and resends
its pending messages in order, and the broker's deduplication drops those already
stored (``MessageDeduplication``: the last sequence id is recovered from the
snapshot plus a replay of the ledger).
"""
from __future__ import annotations

import asyncio
import random
import time

import pytest

from tests.faults.harness import Workload

pytestmark = pytest.mark.timeout(150)


async def test_broker_killed(fault_cluster):
    cluster = fault_cluster(3)
    await cluster.create_namespace()
    w = await Workload(cluster.service_url).start()
    try:
        await w.run_for(2.0)
        w.fault("kill -9 broker")
        cluster.kill_broker()
        await asyncio.to_thread(cluster.restart_broker)
        await w.run_for(4.0)
        w.details["broker_start_s"] = cluster.restart_times_s
        await w.finish("broker killed", "1 x SIGKILL broker, restarted at once (recovery, fencing, resend)",
                       serve_bound_s=45)
    finally:
        await w.close()


async def test_broker_killed_while_a_bookie_is_down(fault_cluster):
    cluster = fault_cluster(3)
    await cluster.create_namespace()
    w = await Workload(cluster.service_url).start()
    try:
        await w.run_for(2.0)
        bookie = (await cluster.open_ledger_ensemble(w.topic))[0]
        t = w.fault(f"kill -9 bookie-{bookie}")
        cluster.kill_bookie(bookie)
        await w.wait_serving(t, 30)
        await w.run_for(1.0)
        w.fault("kill -9 broker (bookie still down)")
        cluster.kill_broker()
        await asyncio.to_thread(cluster.restart_broker)  # recovers the open ledger with one of its bookies gone
        await w.run_for(4.0)
        await asyncio.to_thread(cluster.restart_bookie, bookie)
        await w.run_for(1.0)
        w.details["broker_start_s"] = cluster.restart_times_s
        await w.finish("broker killed while a bookie is down",
                       "SIGKILL bookie, then SIGKILL broker; bookie back after ~6 s", serve_bound_s=45)
    finally:
        await w.close()


LOOP_S = 60.0


@pytest.mark.timeout(240)
async def test_repeated_kills_for_60_seconds(fault_cluster):
    """In turn, kill -9 the broker (started again at once) and a random bookie (started
    again 1 s later); after each fault, wait until the system serves again, then 2-4 s
    (seeded)."""
    rnd = random.Random(16)
    cluster = fault_cluster(3)
    await cluster.create_namespace()
    w = await Workload(cluster.service_url).start()
    kills = {"broker": 0, "bookie": 0}
    try:
        await w.run_for(2.0)
        end = time.monotonic() + LOOP_S
        while time.monotonic() < end:
            if (kills["broker"] + kills["bookie"]) % 2 == 0:
                kills["broker"] += 1
                t = w.fault("kill -9 broker")
                cluster.kill_broker()
                await asyncio.to_thread(cluster.restart_broker)
            else:
                i = rnd.randrange(len(cluster.bookies))
                kills["bookie"] += 1
                t = w.fault(f"kill -9 bookie-{i}")
                cluster.kill_bookie(i)
                await asyncio.sleep(1.0)
                await asyncio.to_thread(cluster.restart_bookie, i)
            await w.wait_serving(t, 45)
            await w.run_for(rnd.uniform(2.0, 4.0))
        w.details["broker_start_s"] = cluster.restart_times_s
        await w.finish(f"repeated kills for {LOOP_S:.0f} s",
                       f"{kills['broker']} x SIGKILL broker + {kills['bookie']} x SIGKILL bookie, in turn",
                       serve_bound_s=45, drain_timeout_s=120)
    finally:
        await w.close()
