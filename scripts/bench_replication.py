"""Geo-replication benchmark (issue 4): replication lag and replicator throughput, a -> b.

Starts two real clusters in a temporary directory (each ``python -m deploy.cli
standalone``: 2 bookies + 1 broker, ``--cluster-name a``/``b``; bookies fsync
before acknowledging unless ``--no-sync``), registers them with each other and
creates namespace ``bench/repl`` replicated a -> b only (b lists only itself,
so nothing flows back and b runs no replicator). Progress goes to stderr and
ONE JSON line per scenario to stdout:

* ``replication_lag`` (once per ``--rates`` value, default 1,000 and 10,000
  msg/s): a rate-limited SDK producer in its own process publishes
  ``--size``-byte messages to a (batching on, ``batching_max_publish_delay_ms``
  = ``--batch-delay-ms``, no compression) for ``--warmup`` + ``--duration``
  seconds; a receiver in another process reads the topic on b over the raw
  Consume stream and, for every entry, records ``now - publish_time`` once per
  message of the entry (a batch shares its publish_time). Messages published
  during the warm-up are left out. Lag = from the publish time stamped by
  the producer in a (when its batch is closed) to the moment the entry reaches
  the reader in b: store in a, replicator read, send to b, store in b,
  dispatch in b. p50/p99/p99.9/max in ms (HdrHistogram; publish_time has 1 ms
  resolution, so values carry up to +1 ms). Target: p99 <= 50 ms at 10,000 msg/s.
* ``replication_throughput`` (batching on, then 1 message per entry): the
  topic's replication is turned off (topic policy ``[a]``), ``--messages``
  (default 1,000,000, in entries of ``--tput-batch-max-messages`` = 100: a
  producer at full speed would otherwise fill 1,000-message batches) or
  ``--unbatched-messages`` (default 50,000) messages are produced into a, a
  receiver attaches to b, then the topic policy becomes ``[a, b]``: a new
  replicator drains the whole backlog. msgs/s and entries/s = what arrived in b between the first
  and the last arrival; also the time from enabling replication to the last
  message.

Every scenario also reports the CPU seconds each process used during it
(``cpu_s``: a's broker, a's bookies, b's broker, b's bookies, producer,
receiver), which shows where the time goes on a 2-CPU machine.

    .venv/bin/python scripts/bench_replication.py [--quick] [--no-sync]
        [--rates 1000,10000] [--duration 15] [--warmup 2] [--size 100]
        [--messages 1000000] [--unbatched-messages 50000] [--tput-batch-max-messages 100]
        [--scenario lag|throughput|all] [--keep]

Figures are never asserted; ``target_met`` says whether p99 <= 50 ms (lag
scenarios at >= 10,000 msg/s). The worker roles (``--role producer|receiver``)
are internal.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

LAG_TARGET_P99_MS = 50.0
LAG_TARGET_RATE = 10_000
TENANT, NAMESPACE = "bench", "repl"
GRPC_OPTIONS = [("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024)]
RECEIVER_PERMITS = 200_000


def progress(msg: str, tag: str = "bench_replication") -> None:
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- processes and CPU accounting --------------------------------------------------------
def proc_cpu_seconds(pid: int) -> float:
    """user+system CPU seconds of a live process (Linux /proc); 0.0 when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (the standalone's bookies run in their own session
    but stay its children)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(d.name))
    return out


class CpuMeter:
    """CPU seconds used by named groups of processes between ``start()`` and ``stop()``."""

    def __init__(self, groups: dict[str, list[int]]):
        self.groups = groups
        self._start: dict[str, float] = {}

    def _sample(self) -> dict[str, float]:
        return {name: sum(proc_cpu_seconds(p) for p in pids) for name, pids in self.groups.items()}

    def start(self) -> "CpuMeter":
        self._start = self._sample()
        self._t0 = time.monotonic()
        self.wall_s = 0.0
        return self

    def stop(self) -> dict[str, float]:
        now = self._sample()
        self.wall_s = time.monotonic() - self._t0
        return {name: round(now[name] - self._start.get(name, 0.0), 2) for name in self.groups}


# ---- clusters ---------------------------------------------------------------------------
class Clusters:
    """Real clusters (one standalone process each) in ``base``; ``journal_sync`` for
    their bookies and an optional broker config (TOML text)."""

    def __init__(self, base: Path, names: list[str], journal_sync: bool, broker_config: str = ""):
        from tests.procs import ProcessTracker

        self.base, self.names, self.journal_sync, self.broker_config = base, names, journal_sync, broker_config
        self.tracker = ProcessTracker()
        self.clusters = []

    def start(self) -> list:
        from tests.geo import Cluster
        from tests.procs import StandaloneProcess

        def one(name: str):
            extra = ["--cluster-name", name]
            if not self.journal_sync:
                extra.append("--no-journal-sync")
            if self.broker_config:
                cfg = self.base / f"{name}-broker.toml"
                cfg.write_text(self.broker_config)
                extra += ["--broker-config", str(cfg)]
            return StandaloneProcess(self.base / name, extra, self.tracker).start()

        t0 = time.monotonic()
        with ThreadPoolExecutor(len(self.names)) as ex:
            procs = list(ex.map(one, self.names))
        self.clusters = [Cluster(n, p) for n, p in zip(self.names, procs)]
        progress(f"started clusters {', '.join(f'{c.name}={c.url}' for c in self.clusters)} "
                 f"(journal_sync={self.journal_sync}) in {time.monotonic() - t0:.1f}s")
        return self.clusters

    def cpu_groups(self) -> dict[str, list[int]]:
        groups = {}
        for c in self.clusters:
            groups[f"{c.name}_broker"] = [c.proc.popen.pid]
            groups[f"{c.name}_bookies"] = child_pids(c.proc.popen.pid)
        return groups

    async def close(self) -> None:
        for c in self.clusters:
            await c.close()
        self.tracker.kill_all()   # SIGKILL: the data dir is thrown away anyway


async def register(clusters, tenant: str, namespace: str, replication: dict[str, list[str]]) -> None:
    """Register every cluster everywhere, create tenant/namespace and set each
    cluster's own replication clusters (``replication[name]``)."""
    from tests.geo import connect_clusters

    names = [c.name for c in clusters]
    await connect_clusters(clusters, tenant, namespace, names)
    for c in clusters:
        await c.admin("namespaces.set_clusters", namespace=f"{tenant}/{namespace}", clusters=replication[c.name])


# ---- workers (separate processes) -----------------------------------------------------------
class Worker:
    """A ``--role`` subprocess of this script: JSON lines on stdout, commands on stdin."""

    def __init__(self, role: str, args: list[str], script: str = __file__):
        self.role, self.args, self.script = role, args, script
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> "Worker":
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, self.script, "--role", self.role, *self.args, cwd=REPO_ROOT, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=16 * 1024 * 1024)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def line(self, timeout_s: float = 120.0) -> dict:
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not raw:
            rc = await self.proc.wait()
            raise RuntimeError(f"{self.role} worker exited ({rc}) without a result")
        return json.loads(raw)

    async def send(self, obj: dict) -> None:
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        await self.proc.stdin.drain()

    async def wait(self, timeout_s: float = 30.0) -> int:
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            self.kill()
            return await self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def cancel_on_sigterm() -> None:
    """SIGTERM cancels the running main task, so its ``finally`` stops the clusters."""
    import signal

    task = asyncio.current_task()
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    except (NotImplementedError, RuntimeError):
        pass


def per_entry_us(cpu: dict[str, float], entries: int) -> dict[str, float]:
    """CPU microseconds per replicated entry, per process group."""
    return {k: round(v * 1e6 / max(1, entries), 1) for k, v in cpu.items()}


def loadavg() -> float:
    """1-minute load average: the machine is shared, so every result says how busy it was."""
    try:
        return float(open("/proc/loadavg").read().split()[0])
    except (OSError, ValueError):
        return -1.0


async def stdin_lines():
    """Async iterator over JSON lines on stdin."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        raw = await reader.readline()
        if not raw:
            return
        yield json.loads(raw)


async def role_producer(args) -> None:
    """Publish ``--size``-byte messages at ``--rate`` msg/s (0 = as fast as
    possible, at most ``--max-outstanding`` unacknowledged) for ``--seconds`` or
    ``--count`` messages; prints READY, then one JSON line with the figures."""
    from client import AsyncClient
    from client.perf_stats import LatencyRecorder

    client = AsyncClient(args.url)
    producer = await client.create_producer(
        args.topic, batching_enabled=not args.unbatched, batching_max_publish_delay_ms=args.batch_delay_ms,
        batching_max_messages=args.batch_max_messages, compression_type="NONE", max_pending_messages=0,
        send_timeout_millis=0)
    emit({"ready": True})
    payload = os.urandom(args.size)
    lat = LatencyRecorder()
    state = {"acked": 0, "errors": 0}
    perf = time.perf_counter
    total_s = args.warmup + args.seconds

    def callback(t0):
        def done(exc, _msg_id):
            if exc is not None:
                state["errors"] += 1
            else:
                state["acked"] += 1
                lat.record(int((perf() - t0) * 1e6))
        return done

    send = producer.send_async
    sent = 0
    start_wall_ms = time.time() * 1000
    start = perf()
    measure_start_ms = start_wall_ms + args.warmup * 1000
    pad = payload[8:]
    if args.rate > 0:
        while True:
            elapsed = perf() - start
            if elapsed >= total_s:
                break
            due = int(args.rate * elapsed)
            t0 = perf()
            while sent < due:
                # --indexed: the message's number (0, 1, ...) in its first 8 bytes
                send(sent.to_bytes(8, "big") + pad if args.indexed else payload, callback(t0))
                sent += 1
            await asyncio.sleep(0.001)
    else:
        while sent < args.count:
            if sent - state["acked"] - state["errors"] >= args.max_outstanding:
                await asyncio.sleep(0.001)
                continue
            t0 = perf()
            for _ in range(min(500, args.count - sent)):
                send(payload, callback(t0))
                sent += 1
            await asyncio.sleep(0)
    end_wall_ms = time.time() * 1000
    await producer.flush()
    elapsed = perf() - start
    await producer.close()
    await client.close()
    p = lat.total()
    emit({"cpu_s": round(time.process_time(), 2), "sent": sent, "acked": state["acked"], "errors": state["errors"],
          "seconds": round(elapsed, 3),
          "start_ms": start_wall_ms, "measure_start_ms": measure_start_ms, "end_ms": end_wall_ms,
          "publish_latency_ms": {"p50": p["p50"], "p99": p["p99"], "max": p["max"]}})


async def role_receiver(args) -> None:
    """Read ``--topic`` on ``--url`` from the earliest entry (raw Consume stream,
    non-durable). Prints READY, then waits for {"expect": N, "from_ms": T0,
    "to_ms": T1} on stdin (or ``--expect``) and ends once N messages arrived (or
    ``--timeout`` passed): one JSON line with lag percentiles for entries
    published in [T0, T1] and the arrival times of the first/last message."""
    import grpc

    from client.entry_format import peek_metadata
    from client.perf_stats import LatencyRecorder
    from proto import broker_pb2 as pb
    from proto import broker_pb2_grpc

    target = args.url[len("minipulsar://"):]
    channel = grpc.aio.insecure_channel(target, options=GRPC_OPTIONS)
    stub = broker_pb2_grpc.PulsarBrokerStub(channel)
    call = stub.Consume()
    await call.write(pb.ConsumerRequest(subscribe=pb.Subscribe(
        topic=args.topic, subscription=f"bench-reader-{uuid.uuid4().hex[:8]}", sub_type=pb.Exclusive,
        initial_position=pb.Earliest, durable=False)))
    first = await call.read()
    if first is grpc.aio.EOF or not first.HasField("subscribed"):
        raise RuntimeError(f"subscribe failed: {first}")
    await call.write(pb.ConsumerRequest(flow=pb.Flow(permits=RECEIVER_PERMITS)))
    emit({"ready": True})

    expect = {"n": args.expect if args.expect > 0 else None, "from_ms": 0.0, "to_ms": float("inf")}

    async def commands():
        async for cmd in stdin_lines():
            expect.update(n=cmd["expect"], from_ms=cmd.get("from_ms", 0.0), to_ms=cmd.get("to_ms", float("inf")))

    cmd_task = asyncio.create_task(commands())
    records: list[tuple[int, int, int]] = []     # (publish_ms, messages, arrival us)
    st = {"messages": 0, "entries": 0, "markers": 0, "first_us": 0, "last_us": 0, "first_frame": 0}
    done = asyncio.Event()

    def check_done() -> None:
        if expect["n"] is not None and st["messages"] >= expect["n"]:
            done.set()

    async def pump() -> None:
        # never cancel call.read() (that cancels the whole call): read in one task
        req_id = 0
        unflowed = unacked = 0
        last_ack = time.monotonic()
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                done.set()
                return
            if not resp.HasField("messages"):
                continue
            now_us = time.time_ns() // 1000
            got = 0
            last_pos = None
            for e in resp.messages.entries:
                last_pos = e.position
                md = peek_metadata(e.headers_and_payload)
                if md.HasField("marker_type"):
                    st["markers"] += 1
                    continue
                n = max(1, md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 1)
                records.append((md.publish_time, n, now_us))
                got += n
                st["entries"] += 1
            if got:
                if not st["first_us"]:
                    st["first_us"], st["first_frame"] = now_us, got
                st["last_us"] = now_us
                st["messages"] += got
            if last_pos is not None:
                # Like the SDK: permits go back at half the window, and a cumulative
                # ack at most every 100 ms (the broker stops pushing at
                # max_unacked_messages_per_consumer), so measuring adds few frames to b.
                unflowed += got
                unacked += got
                if unflowed >= RECEIVER_PERMITS // 2:
                    await call.write(pb.ConsumerRequest(flow=pb.Flow(permits=unflowed)))
                    unflowed = 0
                now = time.monotonic()
                if now - last_ack >= 0.1 or unacked >= 20_000:
                    req_id += 1
                    await call.write(pb.ConsumerRequest(ack=pb.Ack(
                        ack_type=pb.Cumulative, request_id=req_id,
                        positions=[pb.AckPosition(ledger_id=last_pos.ledger_id, entry_id=last_pos.entry_id)])))
                    last_ack, unacked = now, 0
            check_done()

    pump_task = asyncio.create_task(pump())
    deadline = time.monotonic() + args.timeout
    try:
        while not done.is_set():
            check_done()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                progress(f"receiver timed out with {st['messages']} messages", "receiver")
                break
            try:
                await asyncio.wait_for(done.wait(), min(remaining, 0.2))
            except asyncio.TimeoutError:
                pass
        if pump_task.done() and pump_task.exception() is not None:
            raise pump_task.exception()
    finally:
        pump_task.cancel()
        call.cancel()
        cmd_task.cancel()
        await channel.close()
    messages, entries, markers = st["messages"], st["entries"], st["markers"]
    first_us, last_us, first_frame_msgs = st["first_us"], st["last_us"], st["first_frame"]
    lat = LatencyRecorder()
    lo, hi = expect["from_ms"], expect["to_ms"]
    measured = 0
    for publish_ms, n, at_us in records:
        if lo <= publish_ms <= hi:
            lat.record_many(max(1, at_us - publish_ms * 1000), n)
            measured += n
    p = lat.total()
    emit({"cpu_s": round(time.process_time(), 2), "messages": messages, "entries": entries, "markers": markers,
          "measured_messages": measured,
          "first_arrival_ms": first_us / 1000.0, "last_arrival_ms": last_us / 1000.0,
          "first_frame_messages": first_frame_msgs,
          "lag_ms": {"mean": p["mean"], "p50": p["p50"], "p99": p["p99"], "p99.9": p["p99.9"], "max": p["max"]}})


# ---- scenarios ----------------------------------------------------------------------------
async def scenario_lag(a, b, cpu_groups, rate: int, args) -> dict:
    topic = f"persistent://{TENANT}/{NAMESPACE}/lag-{rate}-{uuid.uuid4().hex[:6]}"
    await a.admin("topics.create", topic=topic)
    receiver = await Worker("receiver", ["--url", b.url, "--topic", topic, "--timeout",
                                         str(args.warmup + args.duration + 120)]).start()
    producer = None
    try:
        await receiver.line(60)
        producer = await Worker("producer", ["--url", a.url, "--topic", topic, "--rate", str(rate), "--seconds",
                                             str(args.duration), "--warmup", str(args.warmup), "--size",
                                             str(args.size), "--batch-delay-ms", str(args.batch_delay_ms),
                                             "--batch-max-messages", str(args.batch_max_messages)]).start()
        await producer.line(60)
        meter = CpuMeter({k: list(v) for k, v in cpu_groups.items()}).start()
        progress(f"lag @ {rate} msg/s: producing {args.warmup:g}s warm-up + {args.duration:g}s into {topic}")
        prod = await producer.line(args.warmup + args.duration + 120)
        await receiver.send({"expect": prod["acked"], "from_ms": prod["measure_start_ms"], "to_ms": prod["end_ms"]})
        recv = await receiver.line(180)
        cpu = meter.stop()
        cpu.update(producer=prod["cpu_s"], receiver=recv["cpu_s"])
    finally:
        for w in (producer, receiver):
            if w is not None:
                w.kill()
                await w.wait(5)
    measured_s = (prod["end_ms"] - prod["measure_start_ms"]) / 1000.0
    result = {
        "scenario": "replication_lag", "journal_sync": args.sync, "rate": rate, "message_bytes": args.size,
        "batch_delay_ms": args.batch_delay_ms, "warmup_s": args.warmup, "duration_s": args.duration,
        "sent": prod["sent"], "publish_errors": prod["errors"], "received_in_b": recv["messages"],
        "entries_in_b": recv["entries"], "measured_messages": recv["measured_messages"],
        "achieved_rate": round(prod["sent"] / max(1e-9, prod["seconds"]), 1),
        "messages_per_entry": round(recv["messages"] / max(1, recv["entries"]), 2),
        "lag_ms_p50": recv["lag_ms"]["p50"], "lag_ms_p99": recv["lag_ms"]["p99"],
        "lag_ms_p999": recv["lag_ms"]["p99.9"], "lag_ms_max": recv["lag_ms"]["max"],
        "lag_ms_mean": recv["lag_ms"]["mean"],
        "publish_latency_ms_p50": prod["publish_latency_ms"]["p50"],
        "publish_latency_ms_p99": prod["publish_latency_ms"]["p99"],
        "batch_max_messages": args.batch_max_messages, "loadavg_1m": loadavg(),
        "cpu_s": cpu, "cpu_us_per_entry": per_entry_us(cpu, recv["entries"]),
        "cluster_cores_busy": round(sum(v for k, v in cpu.items() if k[0] in "ab") / max(1e-9, meter.wall_s), 2),
        "target_p99_ms": LAG_TARGET_P99_MS,
        "target_met": (recv["lag_ms"]["p99"] <= LAG_TARGET_P99_MS) if rate >= LAG_TARGET_RATE else None,
    }
    progress(f"lag @ {rate} msg/s: p50 {result['lag_ms_p50']} ms, p99 {result['lag_ms_p99']} ms, "
             f"max {result['lag_ms_max']} ms ({result['received_in_b']}/{result['sent']} in b, "
             f"{result['messages_per_entry']} msgs/entry)")
    return result


async def scenario_throughput(a, b, cpu_groups, batched: bool, n: int, args) -> dict:
    topic = f"persistent://{TENANT}/{NAMESPACE}/tput-{'batched' if batched else 'single'}-{uuid.uuid4().hex[:6]}"
    await a.admin("topics.set_replication_clusters", topic=topic, clusters=["a"])
    await a.admin("topics.create", topic=topic)
    t0 = time.monotonic()
    prod_args = ["--url", a.url, "--topic", topic, "--rate", "0", "--count", str(n), "--size", str(args.size),
                 "--batch-delay-ms", str(args.batch_delay_ms),
                 "--batch-max-messages", str(args.tput_batch_max_messages)]
    if not batched:
        prod_args.append("--unbatched")
    producer = await Worker("producer", prod_args).start()
    try:
        await producer.line(60)
        prod = await producer.line(600)
    finally:
        producer.kill()
        await producer.wait(5)
    stats = await a.admin("topics.internal_stats", topic=topic)
    backlog_entries = stats["numberOfEntries"]
    progress(f"throughput ({'batched' if batched else '1 msg/entry'}): {n} messages in {backlog_entries} entries "
             f"stored in a in {time.monotonic() - t0:.1f}s; enabling replication a -> b")
    receiver = await Worker("receiver", ["--url", b.url, "--topic", topic, "--expect", str(prod["acked"]),
                                         "--timeout", "900"]).start()
    try:
        await receiver.line(60)
        meter = CpuMeter({k: list(v) for k, v in cpu_groups.items()}).start()
        enabled_ms = time.time() * 1000
        await a.admin("topics.set_replication_clusters", topic=topic, clusters=["a", "b"])
        recv = await receiver.line(900)
        cpu = meter.stop()
        cpu.update(receiver=recv["cpu_s"])
    finally:
        receiver.kill()
        await receiver.wait(5)
    span_s = max(1e-6, (recv["last_arrival_ms"] - recv["first_arrival_ms"]) / 1000.0)
    total_s = max(1e-6, (recv["last_arrival_ms"] - enabled_ms) / 1000.0)
    msgs_in_span = recv["messages"] - recv["first_frame_messages"]
    entries_per_msg = recv["entries"] / max(1, recv["messages"])
    result = {
        "scenario": "replication_throughput", "journal_sync": args.sync, "batching": batched,
        "message_bytes": args.size, "messages": n, "produced": prod["acked"],
        "entries_in_a": backlog_entries, "received_in_b": recv["messages"], "entries_in_b": recv["entries"],
        "messages_per_entry": round(recv["messages"] / max(1, recv["entries"]), 2),
        "seconds_first_to_last": round(span_s, 3),
        "seconds_enable_to_last": round(total_s, 3),
        "seconds_enable_to_first": round((recv["first_arrival_ms"] - enabled_ms) / 1000.0, 3),
        # None when everything arrived in one frame (too few entries to time)
        "msgs_per_s": round(msgs_in_span / span_s, 1) if msgs_in_span else None,
        "entries_per_s": round(msgs_in_span * entries_per_msg / span_s, 1) if msgs_in_span else None,
        "msgs_per_s_incl_startup": round(recv["messages"] / total_s, 1),
        "mb_per_s": round(msgs_in_span * args.size / span_s / 1e6, 2) if msgs_in_span else None,
        "produce_seconds": prod["seconds"],
        "batch_max_messages": args.tput_batch_max_messages if batched else 1,
        "cpu_s": cpu, "cpu_us_per_entry": per_entry_us(cpu, recv["entries"]), "loadavg_1m": loadavg(),
        "cluster_cores_busy": round(sum(v for k, v in cpu.items() if k[0] in "ab") / max(1e-9, meter.wall_s), 2),
    }
    progress(f"throughput ({'batched' if batched else '1 msg/entry'}): {result['msgs_per_s']} msgs/s, "
             f"{result['entries_per_s']} entries/s over {span_s:.2f}s ({recv['messages']}/{n} in b)")
    return result


async def orchestrate(args) -> int:
    cancel_on_sigterm()
    base = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="bench_replication_"))
    base.mkdir(parents=True, exist_ok=True)
    cs = Clusters(base, ["a", "b"], args.sync)
    failed = False
    try:
        a, b = cs.start()
        await register([a, b], TENANT, NAMESPACE, {"a": ["a", "b"], "b": ["b"]})
        groups = cs.cpu_groups()
        if args.scenario in ("lag", "all"):
            for rate in args.rates:
                emit(await scenario_lag(a, b, groups, rate, args))
        if args.scenario in ("throughput", "all"):
            emit(await scenario_throughput(a, b, groups, True, args.messages, args))
            emit(await scenario_throughput(a, b, groups, False, args.unbatched_messages, args))
    except Exception as exc:
        failed = True
        progress(f"failed: {type(exc).__name__}: {exc}")
        for c in cs.clusters:
            progress(f"{c.name} stderr tail:\n{c.proc.stderr_tail(2000)}")
        raise
    finally:
        await cs.close()
        if args.keep or failed:
            progress(f"data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few seconds per scenario (smoke test)")
    sync = p.add_mutually_exclusive_group()
    sync.add_argument("--sync", dest="sync", action="store_true", default=True, help="bookies fsync (default)")
    sync.add_argument("--no-sync", dest="sync", action="store_false", help="bookies do not fsync")
    p.add_argument("--scenario", choices=("lag", "throughput", "all"), default="all")
    p.add_argument("--rates", default=None, help="comma-separated msg/s for the lag scenarios (default 1000,10000)")
    p.add_argument("--duration", type=float, default=None, help="measured seconds per lag scenario (default 15)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up seconds, not measured (default 2)")
    p.add_argument("--size", type=int, default=100, help="message bytes (default 100)")
    p.add_argument("--batch-delay-ms", type=int, default=1, help="batching_max_publish_delay_ms (default 1)")
    p.add_argument("--batch-max-messages", type=int, default=1000,
                   help="batching_max_messages of the producer (default 1000, the client default)")
    p.add_argument("--messages", type=int, default=None,
                   help="throughput scenario, batched (default 1000000: 10,000 entries of 100 messages)")
    p.add_argument("--tput-batch-max-messages", type=int, default=100,
                   help="batching_max_messages in the batched throughput scenario (default 100: a producer at "
                        "full speed would otherwise pack 1000 messages per entry)")
    p.add_argument("--unbatched-messages", type=int, default=None,
                   help="throughput scenario, 1 message per entry (default 50000)")
    p.add_argument("--data-dir", default=None, help="where the clusters live (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the data dir")
    # internal worker roles
    p.add_argument("--role", choices=("producer", "receiver"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--topic", help=argparse.SUPPRESS)
    p.add_argument("--rate", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--unbatched", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--indexed", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--max-outstanding", type=int, default=20000, help=argparse.SUPPRESS)
    p.add_argument("--expect", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=600, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.role == "producer":
        args.warmup = args.warmup or 0.0
        asyncio.run(role_producer(args))
        return 0
    if args.role == "receiver":
        asyncio.run(role_receiver(args))
        return 0
    q = args.quick
    args.rates = [int(r) for r in args.rates.split(",")] if args.rates else [1000, 10000]
    if args.duration is None:
        args.duration = 1.0 if q else 15.0
    if args.warmup is None:
        args.warmup = 0.5 if q else 2.0
    if args.messages is None:
        args.messages = 5000 if q else 1_000_000
    if args.unbatched_messages is None:
        args.unbatched_messages = 2000 if q else 50_000
    try:
        return asyncio.run(orchestrate(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; clusters stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
