#!/usr/bin/env python3
"""Broker clusters under partial failure (issue 33): the stall a producer and a consumer see
when the owner of their topic is paused (SIGSTOP) past its session, cut off from etcd (its
etcd link held by a TCP proxy: nothing forwarded, nothing closed), or killed (kill -9); and
the three counts that must stay 0: acknowledged sends lost, payloads stored twice,
confirmed acknowledgments undone (a message delivered again after its
``acknowledge_and_wait`` returned).

Each run starts real processes: one etcd, 2 bookies, 3 brokers (broker 0's etcd link
through the proxy; it owns the etcd-cut topic), session timeout ``--session-timeout-ms``.
Per fault kind a fresh topic (dedup on): a producer sends one numbered message at a time
(``send_timeout_millis=0``: the SDK resends across reconnects), a Shared consumer
acknowledges each message with ``acknowledge_and_wait``; the client's service URL lists the
3 brokers, ``keep_alive_interval_seconds=1``, ``connection_timeout_ms=1000``. The fault
lasts ``--fault-s`` seconds (kill -9: the broker stays dead). Stall = the longest gap
between two consecutive acknowledged sends from the fault on. Then the subscription is
drained and the topic read back from the earliest position.

Prints per run and a summary (median and range of ``--runs`` runs) on stdout::

    .venv/bin/python scripts/bench_partial_failure.py [--runs 3] [--session-timeout-ms 5000]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from bench_cluster import admin, progress  # noqa: E402  (scripts/ is sys.path[0])

FAULTS = ("etcd cut", "paused owner", "kill -9")   # etcd cut first: broker 0 still owns its topic


class Workload:
    """One producer and one acknowledging consumer on ``topic`` (see the module doc)."""

    def __init__(self, client, topic: str):
        self.client, self.topic = client, topic
        self.acked: dict[int, float] = {}      # payload number -> monotonic time its send was acknowledged
        self.confirmed: dict[int, float] = {}  # payload number -> time acknowledge_and_wait returned
        self.undone: set[int] = set()
        self.received: set[int] = set()
        self.errors: list[str] = []
        self._stop = False

    async def start(self) -> "Workload":
        from client import InitialPosition
        from client.consumer_config import ConsumerType

        self.consumer = await self.client.subscribe(self.topic, "sub", consumer_type=ConsumerType.Shared,
                                                    initial_position=InitialPosition.Earliest)
        self.producer = await self.client.create_producer(self.topic, producer_name="bench-p", send_timeout_millis=0,
                                                          batching_enabled=False)
        self.tasks = [asyncio.ensure_future(self._produce()), asyncio.ensure_future(self._consume())]
        return self

    async def _produce(self) -> None:
        n = 0
        while not self._stop:
            try:
                await self.producer.send(str(n).encode())
                self.acked[n] = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - counted; the SDK resends by itself otherwise
                self.errors.append(f"send {n}: {exc}")
            n += 1
            await asyncio.sleep(0.02)

    async def _consume(self) -> None:
        while True:
            try:
                msg = await self.consumer.receive(timeout_millis=1000)
            except Exception:  # noqa: BLE001 - Timeout: nothing yet
                if self._stop and self._all_received():
                    return
                continue
            n = int(msg.data())
            if n in self.confirmed:
                self.undone.add(n)
            self.received.add(n)
            try:
                await self.consumer.acknowledge_and_wait(msg)
                self.confirmed.setdefault(n, time.monotonic())
            except Exception:  # noqa: BLE001 - not confirmed: may come again legitimately
                pass

    def _all_received(self) -> bool:
        return set(self.acked) <= self.received

    def stall_since(self, t: float) -> float:
        times = sorted([t] + [a for a in self.acked.values() if a >= t])
        return max(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else float("inf")

    async def finish(self, drain_s: float = 60.0) -> dict:
        self._stop = True
        await asyncio.wait_for(self.tasks[0], 120)
        try:
            await asyncio.wait_for(self.tasks[1], drain_s)
        except asyncio.TimeoutError:
            self.tasks[1].cancel()
        from client import MessageId
        reader = await self.client.create_reader(self.topic, MessageId.earliest)
        stored = []
        while await reader.has_message_available():
            stored.append(int((await reader.read_next(timeout_millis=10000)).data()))
        await reader.close()
        lost = set(self.acked) - set(stored) - self.received
        twice = len(stored) - len(set(stored))
        return {"lost": len(lost), "stored_twice": twice, "acks_undone": len(self.undone),
                "send_errors": len(self.errors), "sent": len(self.acked)}


async def one_fault(kind: str, cluster, b0, proxy, url: str, topic: str, fault_s: float) -> dict:
    from client import AsyncClient

    async with AsyncClient(url, operation_timeout_seconds=60, keep_alive_interval_seconds=1,
                           connection_timeout_ms=1000) as client:
        w = await Workload(client, topic).start()
        await asyncio.sleep(2.0)
        owner = (await admin(cluster.brokers[1].port, "topics.lookup", {"topic": topic}))["broker_url"]
        victim = cluster.broker_by_url(owner)
        if kind == "etcd cut":
            assert victim is b0, f"{topic} should be owned by broker 0, is {owner}"
        t0 = time.monotonic()
        if kind == "paused owner":
            cluster.pause(victim)
        elif kind == "etcd cut":
            proxy.hold()
        else:
            victim.kill()
        await asyncio.sleep(fault_s)
        if kind == "paused owner":
            cluster.resume(victim)
        elif kind == "etcd cut":
            proxy.release()
        await asyncio.sleep(3.0)
        stall = w.stall_since(t0)
        progress(f"{kind}: fault over, stall {stall:.1f} s; draining")
        counts = await asyncio.wait_for(w.finish(), 240)
    return {"stall_s": stall, **counts}


async def one_run(root: Path, tracker, session_ms: int, fault_s: float, run: int, kinds=FAULTS) -> dict:
    from client import AsyncClient
    from tests.cluster import BrokerCluster

    config = {"metadata_store_session_timeout_millis": session_ms,
              "load_balancer_report_update_min_interval_millis": 1000}
    c = BrokerCluster(root / f"run-{run}", tracker, brokers=0, bookies=2, config=config).start()
    b0, proxy = c.start_broker_behind_etcd_proxy(0)
    try:
        await admin(b0.port, "namespaces.set_deduplication", {"namespace": "public/default", "enabled": True})
        topics = {k: f"persistent://public/default/{k.replace(' ', '-').replace('-9', '9')}-{os.getpid()}-{run}"
                  for k in FAULTS}
        async with AsyncClient(b0.service_url) as setup:       # b0 alone: it owns the etcd-cut topic
            await (await setup.create_producer(topics["etcd cut"])).close()
        for i in (1, 2):
            c.brokers.append(c.start_broker(i))
        url = "minipulsar://" + ",".join(f"127.0.0.1:{b.port}" for b in c.brokers)
        out = {}
        for kind in kinds:
            out[kind] = await one_fault(kind, c, b0, proxy, url, topics[kind], fault_s)
            progress(f"run {run + 1} {kind}: {out[kind]}")
        return out
    finally:
        proxy.close()
        tracker.kill_all()


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--session-timeout-ms", type=int, default=5000)
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated: " + ", ".join(FAULTS))
    p.add_argument("--fault-s", type=float, default=None, help="fault length (default: session + 5 s)")
    args = p.parse_args()
    kinds = [k for k in FAULTS if k in args.faults.split(",")]
    fault_s = args.fault_s if args.fault_s is not None else args.session_timeout_ms / 1000 + 5

    from tests.procs import ProcessTracker

    root = Path(tempfile.mkdtemp(prefix="bench-partial-"))
    runs = []
    for run in range(args.runs):
        tracker = ProcessTracker()
        progress(f"run {run + 1}/{args.runs} ({', '.join(kinds)}): etcd, 2 bookies, 3 brokers in {root} "
                 f"(session {args.session_timeout_ms} ms, faults of {fault_s:g} s)")
        runs.append(asyncio.run(one_run(root, tracker, args.session_timeout_ms, fault_s, run, kinds)))
    print(f"\nbroker cluster under partial failure: median (min-max) of {args.runs} runs, session timeout "
          f"{args.session_timeout_ms} ms, faults of {fault_s:g} s ({os.cpu_count()} cores, shared)")
    print(f"  {'fault':14s} {'stall s':18s} {'lost':>5s} {'twice':>6s} {'undone':>7s} {'send errors':>12s} {'sent':>6s}")
    for kind in kinds:
        rows = [r[kind] for r in runs]
        print(f"  {kind:14s} {summary([r['stall_s'] for r in rows]):18s} "
              f"{sum(r['lost'] for r in rows):5d} {sum(r['stored_twice'] for r in rows):6d} "
              f"{sum(r['acks_undone'] for r in rows):7d} {sum(r['send_errors'] for r in rows):12d} "
              f"{sum(r['sent'] for r in rows):6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
