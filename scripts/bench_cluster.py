#!/usr/bin/env python3
"""Broker-cluster benchmarks (issue 13 §7), on real processes: one etcd, 2 bookies and
3 brokers on this machine.

* takeover: kill -9 of the broker that owns a topic while a producer sends; time from
  the kill to the first send acknowledged through the new owner (p50/p99 over --kills
  kills; the killed broker is restarted on its port between kills). Target: session
  timeout + 1 s (Pulsar's default ZooKeeper session timeout alone is 30 s).
* lookup: Lookup RPC latency, uncached (a new topic: leader redirect + assignment +
  ownership node) and cached (an owned topic), p50/p99 in ms.
* metadata: etcd operations per second (puts, ranges, deletes, txns from etcd's own
  /metrics) while producing at a steady rate: no etcd write per message.
* throughput: msgs/s of a 4-partition topic through the 3-broker cluster vs a
  standalone (one broker, 2 bookies, SQLite) on the same machine, and the CPU seconds
  per 1,000 messages of the server processes.

Each figure: median and range of --runs runs. Prints progress on stderr and a
summary table on stdout.

    .venv/bin/python scripts/bench_cluster.py [--kills 10] [--runs 3] [--session-timeout-ms 5000]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import grpc  # noqa: E402

from bench_replication import proc_cpu_seconds as cpu_seconds  # noqa: E402  (scripts/ is sys.path[0])
from proto import broker_pb2 as pb  # noqa: E402
from proto.broker_pb2_grpc import PulsarBrokerStub  # noqa: E402


def progress(msg: str) -> None:
    print(f"[bench_cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))]


def summary(values: list[float]) -> str:
    if not values:
        return "n/a"
    def fmt(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"

    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


async def admin(port: int, method: str, body: dict):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = await PulsarBrokerStub(ch).Admin(pb.AdminRequest(method=method, body_json=json.dumps(body)),
                                                timeout=30)
    return json.loads(resp.body_json)


def etcd_ops(client_port: int) -> float:
    """Total etcd KV operations so far (puts + deletes + ranges + txns), from /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{client_port}/metrics", timeout=5).read().decode()
    total = 0.0
    for name in ("etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_range_total", "etcd_mvcc_txn_total"):
        for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M):
            total += float(m.group(1))
    return total


# ---- takeover ----------------------------------------------------------------------
async def takeover_once(cluster, client, k: int) -> float:
    topic = f"persistent://public/default/takeover-{k}-{os.getpid()}"
    producer = await client.create_producer(topic, send_timeout_millis=0)
    await producer.send(b"warm")
    owner = (await admin(cluster.live_brokers[0].port, "topics.lookup", {"topic": topic}))["broker_url"]
    victim = cluster.broker_by_url(owner)
    t0 = time.monotonic()
    victim.kill()
    await producer.send(b"after-kill")
    elapsed = time.monotonic() - t0
    await producer.close()
    index = cluster.brokers.index(victim)
    cluster.brokers[index] = victim.restart(same_port=True)
    return elapsed


async def bench_takeover(cluster, kills: int) -> list[float]:
    from client import AsyncClient

    times = []
    async with AsyncClient(cluster.service_url, operation_timeout_seconds=120) as client:
        for k in range(kills):
            t = await takeover_once(cluster, client, k)
            times.append(t)
            progress(f"takeover {k + 1}/{kills}: {t:.2f} s")
    return times


# ---- lookup ------------------------------------------------------------------------
async def bench_lookup(cluster, run: int, n: int = 200) -> tuple[list[float], list[float]]:
    port = cluster.live_brokers[0].port
    tag = f"{os.getpid()}-{run}"
    uncached, cached = [], []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = PulsarBrokerStub(ch)
        for i in range(n):
            topic = f"persistent://public/lookup-{tag}-{i % 50}/t{i}"
            if i < 50:
                await admin(port, "namespaces.create", {"namespace": f"public/lookup-{tag}-{i}"})
            t0 = time.perf_counter()
            resp = await stub.Lookup(pb.LookupRequest(topic=topic), timeout=30)
            hops = 0
            while resp.response == pb.LookupResponse.REDIRECT and hops < 5:
                async with grpc.aio.insecure_channel(resp.broker_service_url.split("://")[1]) as ch2:
                    resp = await PulsarBrokerStub(ch2).Lookup(
                        pb.LookupRequest(topic=topic, authoritative=resp.authoritative), timeout=30)
                hops += 1
            first = (time.perf_counter() - t0) * 1000
            t1 = time.perf_counter()
            await stub.Lookup(pb.LookupRequest(topic=topic), timeout=30)
            cached.append((time.perf_counter() - t1) * 1000)
            if i < 50:  # a fresh namespace: its bundle is unowned (leader, redirect, ownership node)
                uncached.append(first)
    return uncached, cached


# ---- steady state metadata ops and throughput ------------------------------------------
async def produce_for(service_url: str, topic: str, seconds: float, rate: float | None = None) -> int:
    from client import AsyncClient

    sent = 0
    async with AsyncClient(service_url, operation_timeout_seconds=60) as client:
        producer = await client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5,
                                                max_pending_messages=5000, block_if_queue_full=True)
        done = asyncio.Event()
        outstanding = 0
        deadline = time.monotonic() + seconds
        payload = b"x" * 100

        def cb(exc, mid):
            nonlocal outstanding, sent
            outstanding -= 1
            if exc is None:
                sent += 1
            if outstanding == 0 and time.monotonic() > deadline:
                done.set()

        t0 = time.monotonic()
        while time.monotonic() < deadline:
            if rate is not None:
                ahead = sent + outstanding - rate * (time.monotonic() - t0)
                if ahead > 0:
                    await asyncio.sleep(ahead / rate)
                    continue
            while outstanding > 4000:
                await asyncio.sleep(0.001)
            outstanding += 1
            producer.send_async(payload, cb)
            if outstanding % 200 == 0:
                await asyncio.sleep(0)
        await producer.flush()
        if outstanding:
            await asyncio.wait_for(done.wait(), 60)
        await producer.close()
    return sent


async def bench_metadata_ops(cluster, seconds: float = 10.0, rate: float = 2000) -> tuple[float, float]:
    """etcd ops/s while idle and while producing ``rate`` msgs/s."""
    port = cluster.etcd.client_port
    a = etcd_ops(port)
    await asyncio.sleep(seconds)
    idle = (etcd_ops(port) - a) / seconds
    topic = f"persistent://public/default/steady-{os.getpid()}"
    await produce_for(cluster.service_url, topic, 2.0, rate)  # load the topic first
    a, t0 = etcd_ops(port), time.monotonic()
    sent = await produce_for(cluster.service_url, topic, seconds, rate)
    busy = (etcd_ops(port) - a) / (time.monotonic() - t0)
    progress(f"etcd ops/s idle {idle:.1f}, while producing {sent / seconds:.0f} msgs/s: {busy:.1f}")
    return idle, busy


async def bench_throughput(service_url: str, pids: list[int], topic: str, seconds: float) -> tuple[float, float]:
    cpu0 = sum(cpu_seconds(p) for p in pids)
    t0 = time.monotonic()
    sent = await produce_for(service_url, topic, seconds)
    wall = time.monotonic() - t0
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0
    return sent / wall, cpu / max(1, sent) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0, help="length of each throughput run")
    p.add_argument("--session-timeout-ms", type=int, default=5000)
    p.add_argument("--skip", default="", help="comma-separated parts to skip: takeover,lookup,metadata,throughput")
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    from tests.cluster import BrokerCluster
    from tests.procs import ProcessTracker, start_standalone

    tracker = ProcessTracker()
    root = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    results: dict[str, str] = {}
    try:
        config = {"metadata_store_session_timeout_millis": args.session_timeout_ms,
                  "load_balancer_report_update_min_interval_millis": 1000}
        progress(f"starting etcd, 2 bookies, 3 brokers in {root} (session timeout {args.session_timeout_ms} ms)")
        cluster = BrokerCluster(root / "cluster", tracker, brokers=3, bookies=2, config=config).start()
        if "takeover" not in skip:
            times = asyncio.run(bench_takeover(cluster, args.kills))
            results["takeover after kill -9 (s)"] = (f"p50 {pct(times, 50):.2f}, p99 {pct(times, 99):.2f}, "
                                                    f"min {min(times):.2f}, max {max(times):.2f} over {len(times)}")
        if "lookup" not in skip:
            un_all, ca_all = [], []
            for run in range(args.runs):
                un, ca = asyncio.run(bench_lookup(cluster, run))
                un_all.append(pct(un, 99))
                ca_all.append(pct(ca, 99))
                progress(f"lookup run {run + 1}: uncached p50 {pct(un, 50):.2f} p99 {pct(un, 99):.2f} ms; "
                         f"cached p50 {pct(ca, 50):.2f} p99 {pct(ca, 99):.2f} ms")
            results["lookup p99 uncached (ms)"] = summary(un_all)
            results["lookup p99 cached (ms)"] = summary(ca_all)
        if "metadata" not in skip:
            idle, busy = [], []
            for _ in range(args.runs):
                i, b = asyncio.run(bench_metadata_ops(cluster))
                idle.append(i)
                busy.append(b)
            results["etcd ops/s idle"] = summary(idle)
            results["etcd ops/s producing 2,000 msgs/s"] = summary(busy)
        if "throughput" not in skip:
            standalone = start_standalone(root / "standalone", tracker=tracker)
            sa_pids = [standalone.pid] + [int(x) for x in os.popen(f"pgrep -f {root / 'standalone'}").read().split()]
            cl_pids = [b.pid for b in cluster.live_brokers] + [b.pid for b in cluster.bookies] + [cluster.etcd.pid]
            for name, url, pids in (("standalone", standalone.service_url, sorted(set(sa_pids))),
                                    ("3-broker cluster", cluster.service_url, cl_pids)):
                topic = f"persistent://public/default/tput-{name[0]}-{os.getpid()}"
                asyncio.run(admin(int(url.split(",")[0].rsplit(":", 1)[1]), "topics.create_partitioned",
                                  {"topic": topic, "partitions": 4}))
            rates = {"standalone": [], "3-broker cluster": []}
            cpus = {"standalone": [], "3-broker cluster": []}
            for run in range(args.runs):  # interleaved, so both see the same machine noise
                for name, url, pids in (("standalone", standalone.service_url, sorted(set(sa_pids))),
                                        ("3-broker cluster", cluster.service_url, cl_pids)):
                    topic = f"persistent://public/default/tput-{name[0]}-{os.getpid()}"
                    r, c = asyncio.run(bench_throughput(url, pids, topic, args.seconds))
                    rates[name].append(r)
                    cpus[name].append(c)
                    progress(f"throughput run {run + 1} {name}: {r:,.0f} msgs/s, {c:.3f} CPU s per 1,000 msgs")
            for name in rates:
                results[f"{name}: msgs/s (4 partitions, 100 B)"] = summary(rates[name])
                results[f"{name}: server CPU s per 1,000 msgs"] = summary(cpus[name])
    finally:
        tracker.kill_all()
    print("\nbroker cluster benchmarks (median (min-max) of "
          f"{args.runs} runs; this machine: {os.cpu_count()} cores, shared)")
    for key, value in results.items():
        print(f"  {key:48s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
