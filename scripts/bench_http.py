"""Figures of the HTTP side (issue 37): the REST admin API beside the gRPC admin, the
live dashboard's update latency, and what an open dashboard costs the brokers.

A broker cluster on free loopback ports (one etcd, two bookies, two brokers; load
reports every 5 s as Pulsar's default) and, beside it, ``minipulsar geo dashboard
--cluster`` on both brokers' web ports. Each run (``--runs``, default 3) measures:

1. **admin latency**: ``--requests`` (default 500) calls of each verb, interleaved
   round by round in the same run, one at a time, on kept-alive connections to the
   topic's owner: REST ``GET /admin/v2/persistent/{t}/{ns}/{topic}/stats`` and
   ``GET /lookup/v2/topic/persistent/{t}/{ns}/{topic}`` (aiohttp) beside the gRPC
   admin's ``topics.stats`` and ``topics.lookup`` (``client.admin.AdminClient``);
   also REST stats asked of the other broker (307 to the owner, followed). p50 / p99
   in ms.
2. **dashboard update latency**: ``--events`` (default 10) times, one message is
   published to a topic and, from the send's receipt, the time until a server-sent
   event shows the topic's published count (``msg_in``) grown, read at once from the
   other broker's ``/dashboard/events`` (its snapshot asks the owner for its topics)
   and from the geo dashboard's ``/dashboard/events`` (it asks a broker for the
   cluster snapshot), both at the default interval (1 s), and from the other broker's
   stream at ``?interval=0.2``. Median and max in ms.
3. **broker CPU, dashboard closed vs open**: ``--topics`` (default 20) topics with a
   subscription each and ``--rate`` msg/s (default 200) spread over them; the two
   brokers' CPU (utime + stime of ``/proc/<pid>/stat``, % of one core) over
   windows of ``--window`` seconds (default 10): no page open, one page open on the
   first broker's ``/dashboard/events`` (what a browser on ``/dashboard`` reads),
   twice each, alternating; the mean per broker and mode. Then the CPU each broker
   spends per snapshot (ms): ``--snapshots`` (default 500) ``/dashboard/cluster`` asked of
   the first broker back to back, less the closed-page baseline over that time (an open
   page costs one snapshot a second).

Prints each run's line and the median [min-max] over the runs; ``--json`` adds one
JSON line.

    .venv/bin/python scripts/bench_http.py [--runs 3] [--requests 500] [--events 10]
                                           [--topics 20] [--rate 200] [--window 10]
                                           [--snapshots 500] [--json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from tests.cluster import BrokerCluster  # noqa: E402
from tests.procs import ProcessTracker, ensure_namespace  # noqa: E402

NS = "public/default"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (s), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def web(b) -> str:
    return f"http://127.0.0.1:{b.http_port}"


async def admin_latency(cluster, topic: str, requests: int) -> dict:
    """p50 / p99 (ms) of REST and gRPC stats / lookup on the owner (module doc, 1)."""
    from client.admin import AdminClient

    local = topic.split("://", 1)[1]
    owner = await owner_of(cluster, topic)
    other = next(b for b in cluster.brokers if b is not owner)
    rest = {"rest stats": f"{web(owner)}/admin/v2/persistent/{local}/stats",
            "rest lookup": f"{web(owner)}/lookup/v2/topic/persistent/{local}",
            "rest stats via 307": f"{web(other)}/admin/v2/persistent/{local}/stats"}
    times: dict[str, list[float]] = {k: [] for k in ("rest stats", "grpc stats", "rest lookup", "grpc lookup",
                                                     "rest stats via 307")}
    async with aiohttp.ClientSession() as session, AdminClient(owner.service_url) as admin:
        async def rest_call(url: str) -> None:
            async with session.get(url) as r:
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status} {await r.text()}")
                await r.read()
        grpc = {"grpc stats": lambda: admin.get_stats(topic), "grpc lookup": lambda: admin.lookup_topic(topic)}
        for i in range(requests + 50):             # the first 50 rounds warm up, not counted
            for name in times:
                t = time.perf_counter()
                if name in rest:
                    await rest_call(rest[name])
                else:
                    await grpc[name]()
                if i >= 50:
                    times[name].append((time.perf_counter() - t) * 1000)
    return {name: {"p50": pct(v, 0.5), "p99": pct(v, 0.99)} for name, v in times.items()}


async def sse_snapshots(session: aiohttp.ClientSession, url: str, queue: asyncio.Queue) -> None:
    """Put ``(arrival time, snapshot)`` of every server-sent event of ``url`` in ``queue``."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=None, sock_read=30)) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status}")
        async for line in r.content:
            if line.startswith(b"data: "):
                await queue.put((time.perf_counter(), json.loads(line[6:])))


def msg_in_of(snapshot: dict, topic: str) -> int:
    return max((t["msg_in"] for c in snapshot.get("clusters", []) for t in c.get("topics", []) if t["name"] == topic),
               default=-1)


async def owner_of(cluster, topic: str):
    """The BrokerProcess owning ``topic`` (gRPC lookup)."""
    from client.admin import AdminClient
    async with AdminClient(cluster.service_url) as admin:
        return cluster.broker_by_url((await admin.lookup_topic(topic))["broker_url"])


async def update_latency(cluster, dashboard_url: str, topic: str, events: int) -> dict:
    """ms from a send's receipt until its count shows in each stream (module doc, 2)."""
    from client import AsyncClient
    from client.admin import AdminClient

    async with AsyncClient(cluster.service_url) as client:
        producer = await client.create_producer(topic)
        await producer.send(b"first")
        owner = await owner_of(cluster, topic)
        other = next(b for b in cluster.brokers if b is not owner)
        async with AdminClient(owner.service_url) as admin:
            count = (await admin.get_stats(topic))["msgInCounter"]
        streams = {"broker page": f"{web(other)}/dashboard/events", "geo dashboard": f"{dashboard_url}/events",
                   "broker page 0.2 s": f"{web(other)}/dashboard/events?interval=0.2"}
        out: dict[str, list[float]] = {k: [] for k in streams}
        async with aiohttp.ClientSession() as session:
            queues = {k: asyncio.Queue() for k in streams}
            readers = [asyncio.create_task(sse_snapshots(session, url, queues[k])) for k, url in streams.items()]
            try:
                for _ in range(events):
                    await asyncio.sleep(random.uniform(0.2, 1.2))         # any phase of the 1 s ticks
                    for q in queues.values():                             # forget what came before the send
                        while not q.empty():
                            q.get_nowait()
                    await producer.send(b"an event")
                    sent = time.perf_counter()
                    count += 1
                    for name, q in queues.items():
                        while True:
                            at, snap = await asyncio.wait_for(q.get(), 10)
                            if msg_in_of(snap, topic) >= count:
                                out[name].append(max(0.0, (at - sent) * 1000))
                                break
            finally:
                for r in readers:
                    r.cancel()
                await asyncio.gather(*readers, return_exceptions=True)
        await producer.close()
    return {name: {"median": statistics.median(v), "max": max(v)} for name, v in out.items()}


async def cpu_open_closed(cluster, topics: int, rate: float, window: float, snapshots: int) -> dict:
    """Brokers' CPU (% of one core) with no page open and with one page open (module doc, 3)."""
    from client import AsyncClient

    names = [f"persistent://{NS}/bench-http-load-{i}" for i in range(topics)]
    async with AsyncClient(cluster.service_url) as client:
        producers = [await client.create_producer(n) for n in names]
        consumers = [await client.subscribe(n, "load") for n in names]
        stop = asyncio.Event()

        async def produce() -> None:
            i = 0
            start = time.perf_counter()
            while not stop.is_set():
                producers[i % len(producers)].send_async(b"x" * 100, lambda *_: None)
                i += 1
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))

        async def consume(c) -> None:
            while not stop.is_set():
                try:
                    msg = await c.receive(timeout_millis=500)
                except Exception:  # noqa: BLE001 - timeout: look at stop again
                    continue
                c.acknowledge(msg)

        tasks = [asyncio.create_task(produce())] + [asyncio.create_task(consume(c)) for c in consumers]
        pids = [b.pid for b in cluster.brokers]

        async def measure() -> list[float]:
            before = [cpu_seconds(p) for p in pids]
            t = time.perf_counter()
            await asyncio.sleep(window)
            dt = time.perf_counter() - t
            return [100 * (cpu_seconds(p) - b) / dt for p, b in zip(pids, before)]

        try:
            await asyncio.sleep(2)                                   # the load settles
            closed, opened = [], []
            async with aiohttp.ClientSession() as session:
                for _ in range(2):                                   # closed, open, closed, open
                    closed.append(await measure())
                    queue: asyncio.Queue = asyncio.Queue()
                    reader = asyncio.create_task(sse_snapshots(
                        session, f"{web(cluster.brokers[0])}/dashboard/events", queue))
                    await asyncio.sleep(1)
                    opened.append(await measure())
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
                    if queue.qsize() < window * 0.8:
                        raise RuntimeError(f"the open page got {queue.qsize()} events in {window + 1} s")
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            for p in producers:
                await p.close()
    closed = [statistics.mean(x) for x in zip(*closed)]
    opened = [statistics.mean(x) for x in zip(*opened)]
    per_snapshot = await snapshot_cpu(cluster, closed, snapshots)
    return {"closed": {"page broker": closed[0], "other broker": closed[1]},
            "open": {"page broker": opened[0], "other broker": opened[1]},
            "per snapshot": {"page broker": per_snapshot[0], "other broker": per_snapshot[1]}}


async def snapshot_cpu(cluster, baseline: list[float], n: int) -> list[float]:
    """CPU ms each broker spends per cluster snapshot: ``n`` ``/dashboard/cluster`` asked
    of the first broker one after the other, each broker's CPU over them less its
    ``baseline`` (% of a core with no page open, the same load running)."""
    pids = [b.pid for b in cluster.brokers]
    url = f"{web(cluster.brokers[0])}/dashboard/cluster"
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as r:
            snap = await r.json()
        if sorted(b["status"] for b in snap["brokers"]) != ["up"] * len(pids) or not snap["topics"]:
            raise RuntimeError(f"the snapshot does not show every broker up with topics: {snap}")
        before, t = [cpu_seconds(p) for p in pids], time.perf_counter()
        for _ in range(n):
            async with session.get(url) as r:
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status}")
                await r.read()
        dt = time.perf_counter() - t
        used = [cpu_seconds(p) - b for p, b in zip(pids, before)]
    return [1000 * (u - base / 100 * dt) / n for u, base in zip(used, baseline)]   # < 0: noise


def start_geo_dashboard(cluster, log: Path) -> tuple[subprocess.Popen, str]:
    """``minipulsar geo dashboard --cluster standalone=<both web URLs> --port 0``."""
    urls = ",".join(web(b) for b in cluster.brokers)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    out = open(log, "w+")
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "geo", "dashboard", "--cluster",
                             f"{cluster.cluster_name}={urls}", "--port", "0"], stdout=out, stderr=subprocess.STDOUT,
                            env=env, cwd=ROOT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out.seek(0)
        for line in out.read().splitlines():
            if line.startswith("DASHBOARD_READY port="):
                return proc, f"http://127.0.0.1:{int(line.split()[1].split('=')[1])}/dashboard"
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"geo dashboard not ready: {log.read_text()}")


async def one_run(cluster, dashboard_url: str, args, run: int) -> dict:
    from client import AsyncClient

    topic = f"persistent://{NS}/bench-http-{run}"
    async with AsyncClient(cluster.service_url) as client:
        producer = await client.create_producer(topic)
        await client.subscribe(topic, "backlog")
        for i in range(100):
            await producer.send(f"m{i}".encode())
        await producer.close()
    admin = await admin_latency(cluster, topic, args.requests)
    update = await update_latency(cluster, dashboard_url, topic, args.events)
    cpu = await cpu_open_closed(cluster, args.topics, args.rate, args.window, args.snapshots)
    return {"admin": admin, "update": update, "cpu": cpu}


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k} / "))
        else:
            out[f"{prefix}{k}"] = v
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--events", type=int, default=10)
    p.add_argument("--topics", type=int, default=20)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--snapshots", type=int, default=500)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if min(args.runs, args.requests, args.events, args.topics, args.snapshots) < 1 or args.rate <= 0 or args.window <= 0:
        p.error("--runs, --requests, --events, --topics, --snapshots must be >= 1; --rate, --window > 0")

    tracker = ProcessTracker()
    tmp = Path(tempfile.mkdtemp(prefix="bench-http-"))
    dash = None
    try:
        cluster = BrokerCluster(tmp, tracker, brokers=2, bookies=2,
                                config={"load_balancer_report_update_min_interval_millis": 5000}).start()
        asyncio.run(ensure_namespace(cluster.service_url, NS))
        dash, dash_url = start_geo_dashboard(cluster, tmp / "dashboard.log")
        runs = []
        for run in range(args.runs):
            result = flatten(asyncio.run(one_run(cluster, dash_url, args, run)))
            runs.append(result)
            print(f"run {run + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in result.items()), flush=True)
        print(f"\nmedian [min-max] of {args.runs} runs (load average {os.getloadavg()[0]:.1f}):")
        summary = {}
        for key in runs[0]:
            values = [r[key] for r in runs]
            summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
            unit = "ms of CPU" if "per snapshot" in key else "% of a core" if key.startswith("cpu") else "ms"
            print(f"  {key:40s} {statistics.median(values):9.2f} [{min(values):.2f}-{max(values):.2f}] {unit}")
        if args.json:
            print(json.dumps({"runs": runs, "summary": summary}))
    finally:
        if dash is not None:
            dash.terminate()
            dash.wait(10)
        tracker.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
