"""Soak benchmark (issue 23): is the broker's memory flat under a steady load?

Starts a fresh ``minipulsar standalone`` (2 bookies + broker, journal sync on)
in a temporary directory, runs ``minipulsar-perf e2e`` (one producer and one
acknowledging consumer in one process, ``--size``-byte messages at ``--rate``
msg/s, 1 ms batching) for ``--duration`` seconds, and every ``--sample``
seconds records

* the RSS of every process (broker = the standalone process, its 2 bookies,
  the perf client), from ``/proc/<pid>/status``;
* inside the broker process (a probe thread, see below): the entry cache's
  bytes and entries, the garbage collector's pauses per generation in the
  interval (count, total, longest; wall time, and the collecting thread's CPU
  time, which a busy machine does not inflate; timed with ``gc.callbacks``)
  and the number of GC-tracked objects;
* the perf client's end-to-end latency per ``--latency-interval`` (60 s: one
  line per minute, p50/p99/p99.9/max).

The probe: the broker is started as ``python scripts/soak.py --probe FILE --
-m deploy.cli standalone ...``, which hooks ``gc.callbacks``, finds the
broker's ``EntryCacheManager`` object once (one scan of ``gc.get_objects()``
before the load starts) and appends one JSON line per sample to FILE. It works
with any checkout of minipulsar (``--repo``), so the same script measures an
older commit as the baseline::

    git worktree add /tmp/wt-cache <commit>
    .venv/bin/python scripts/soak.py --repo /tmp/wt-cache --runs 3 --duration 240 --rate 2000

Output: a table per run on stderr, and on stdout one JSON line per run plus a
summary line (median and range over the runs) of: broker RSS at minute 2 and
at the end and the growth in between, p99 of the first and the last minute
and their ratio, cache entries at the end, longest full (gen 2) GC pause in
the first and the last minute. ``--scenario idle`` instead measures the broker
memory per idle topic (``--topics`` topics, each loaded by one send, then
idle) and per connected idle consumer (``--consumers`` consumers on one Shared
subscription); ``--scenario gc`` the CPU time of a full garbage collection in
this process with ``--entries`` entries cached with Position keys (the layout
before issue 23) and in the EntryCache.

    .venv/bin/python scripts/soak.py                      # the issue's run: 10 min at 5,000 msg/s, x3
    .venv/bin/python scripts/soak.py --duration 240 --rate 2000 --runs 3
    .venv/bin/python scripts/soak.py --broker-config extra.toml     # e.g. eviction settings
    .venv/bin/python scripts/soak.py --stall-watch                  # + which process stalled, per interval
    .venv/bin/python scripts/soak.py --no-journal-sync              # bookies without fsync
    .venv/bin/python scripts/soak.py --scenario idle --topics 500 --consumers 500
    .venv/bin/python scripts/soak.py --scenario gc --entries 200000   # CPU of a full GC, cache layouts
    .venv/bin/python scripts/soak.py --aggregate runs-*.jsonl       # median/range per --label of saved runs

``--scenario mixed`` (issue 16, :mod:`soak_mixed`) instead runs every subscription type with
acks and nacks on a 3-bookie cluster replicating one topic to a second cluster, with one
fault every ``--fault-every`` s (kill -9 / restart of a bookie and of the broker, SIGSTOP of a
bookie, the geo link cut), and prints throughput, p99, faults survived, messages lost and
duplicated (must be 0) and the RSS and open fds of every process at the start and the end::

    .venv/bin/python scripts/soak.py --scenario mixed --runs 1 --duration 1800 --fault-every 45 --rate 300
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def progress(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- the probe (inside the broker)
def run_probe(out_file: str, sample_s: float, argv: list[str]) -> None:
    """Run ``python <argv>`` (``-m module args`` only) in this process with the GC
    and cache probe; never returns normally (the module's exit status is ours)."""
    import gc
    import runpy

    # generation -> [count, total s, longest s, CPU total s, CPU longest s] this interval. Wall time is
    # what the event loop waits; the collecting thread's CPU time is what the collection costs
    # (on a busy machine the wall time also counts the time the process waited for a core).
    pauses = {g: [0, 0.0, 0.0, 0.0, 0.0] for g in range(3)}
    state = {"t0": 0.0, "c0": 0.0}

    def on_gc(phase, info):
        if phase == "start":
            state["t0"] = time.perf_counter()
            state["c0"] = time.thread_time()
            return
        dt = time.perf_counter() - state["t0"]
        ct = time.thread_time() - state["c0"]
        p = pauses[min(info.get("generation", 2), 2)]
        p[0] += 1
        p[1] += dt
        p[3] += ct
        if dt > p[2]:
            p[2] = dt
        if ct > p[4]:
            p[4] = ct

    gc.callbacks.append(on_gc)
    found = {}

    def find_manager():
        if "manager" not in found:
            for o in gc.get_objects():
                if type(o).__name__ == "EntryCacheManager" and type(o).__module__.endswith("entry_cache"):
                    found["manager"] = o
                    break
        return found.get("manager")

    def sampler():
        start = time.monotonic()
        n = 0
        while True:
            n += 1
            time.sleep(max(0.0, start + n * sample_s - time.monotonic()))
            manager = find_manager()
            cache_bytes = cache_entries = None
            if manager is not None:
                caches = list(manager._caches)
                cache_bytes = manager.total
                cache_entries = sum(len(c) for c in caches)
            snap = {g: list(v) for g, v in pauses.items()}
            for v in pauses.values():
                v[:] = [0, 0.0, 0.0, 0.0, 0.0]
            line = {"t": round(time.monotonic() - start, 1), "cache_bytes": cache_bytes,
                    "cache_entries": cache_entries, "tracked_objects": len(gc.get_objects()),
                    "gc": {str(g): {"count": c, "total_ms": round(s * 1000, 2), "max_ms": round(m * 1000, 2),
                                    "cpu_total_ms": round(cs * 1000, 2), "cpu_max_ms": round(cm * 1000, 2)}
                           for g, (c, s, m, cs, cm) in snap.items()}}
            with open(out_file, "a") as f:
                f.write(json.dumps(line) + "\n")

    threading.Thread(target=sampler, name="soak-probe", daemon=True).start()
    if len(argv) < 2 or argv[0] != "-m":
        raise SystemExit("--probe expects: -- -m MODULE [ARGS...]")
    sys.argv = [argv[1], *argv[2:]]
    sys.path.insert(0, os.getcwd())
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


# ---------------------------------------------------------------------------- processes
def rss_mb(pid: int) -> float | None:
    """Resident set size of ``pid`` in MiB (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def write_bytes(pid: int) -> int | None:
    """Bytes ``pid`` caused to be written to the storage layer (``write_bytes`` of
    ``/proc/<pid>/io``; counted when a page is dirtied), None when it is gone."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def bookie_pids(data_dir: Path) -> list[int]:
    """The bookie processes whose command line names a dir under ``data_dir``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"bookie" in cmd and any(str(data_dir).encode() in a for a in cmd):
            out.append(int(d.name))
    return sorted(out)


STALLWATCH = REPO / "scripts" / "stallwatch"


def env_for(repo: Path, stall_dir: Path | None = None) -> dict:
    """The environment of a process of checkout ``repo``; with ``stall_dir``, under the
    stall watch (``scripts/stallwatch``: its ``sitecustomize`` first on PYTHONPATH)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    first = [str(STALLWATCH)] if stall_dir is not None else []
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*first, str(repo), env.get("PYTHONPATH")]))
    if stall_dir is not None:
        env["STALLWATCH_DIR"] = str(stall_dir)
    return env


class Standalone:
    """A standalone of checkout ``repo`` started under the probe."""

    def __init__(self, repo: Path, base: Path, sample_s: float, broker_config: str | None,
                 stall_dir: Path | None = None, journal_sync: bool = True):
        self.repo, self.base, self.sample_s = repo, base, sample_s
        self.data = base / "data"
        self.probe_file = base / "probe.jsonl"
        self.log = base / "standalone.log"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", str(self.probe_file),
               "--probe-sample", str(sample_s), "--", "-m", "deploy.cli", "standalone", "--port", "0", "--pulsar-port", "0",
               "--http-port", "0", "--data-dir", str(self.data)]
        if broker_config:
            cmd += ["--broker-config", broker_config]
        if not journal_sync:
            cmd.append("--no-journal-sync")
        self.popen = subprocess.Popen(cmd, cwd=str(repo), env=env_for(repo, stall_dir), stdout=subprocess.PIPE,
                                      stderr=open(self.log, "ab"), stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            line = self.popen.stdout.readline().decode(errors="replace")
            m = re.match(r"STANDALONE_READY port=(\d+) pid=(\d+) http_port=(-?\d+)", line)
            if m:
                self.port, self.pid, self.http_port = int(m.group(1)), int(m.group(2)), int(m.group(3))
                break
            if not line or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"standalone did not start; see {self.log}")
        self.service_url = f"minipulsar://127.0.0.1:{self.port}"
        self.bookies = bookie_pids(self.data)

    def probe_lines(self) -> list[dict]:
        try:
            return [json.loads(x) for x in self.probe_file.read_text().splitlines() if x.strip()]
        except OSError:
            return []

    def stop(self) -> None:
        stop_standalone(self.popen, self.data)


def stop_standalone(popen: subprocess.Popen, data_dir: Path) -> None:
    """SIGTERM a standalone started with ``start_new_session`` (SIGKILL its group
    after 30 s), then SIGKILL any bookie of ``data_dir`` left running."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
    for pid in bookie_pids(data_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------------------- the soak run
_LINE = re.compile(r"^\[e2e\]\s+([\d.]+) s:\s+([\d.]+) msg/s .*latency ms p50 ([\d.]+) p99 ([\d.]+) "
                   r"p99\.9 ([\d.]+) max ([\d.]+)")


def soak_once(args, run: int) -> dict:
    base = Path(tempfile.mkdtemp(prefix=f"soak-{run}-"))
    repo = Path(args.repo).resolve()
    stall_dir = None
    if args.stall_watch:
        stall_dir = base / "stalls"
        stall_dir.mkdir()
    sa = Standalone(repo, base, args.sample, args.broker_config, stall_dir, args.journal_sync)
    progress(f"run {run}: standalone pid {sa.pid} (bookies {sa.bookies}) from {repo}; "
             f"{args.rate:g} msg/s of {args.size} B for {args.duration:g} s")
    try:
        # the probe's first line (it located the cache manager) before the load starts
        deadline = time.monotonic() + args.sample + 10
        while not sa.probe_lines() and time.monotonic() < deadline:
            time.sleep(0.2)
        probe_offset = len(sa.probe_lines())
        topic = f"persistent://public/default/soak-{run}-{os.getpid()}"
        perf_cmd = [sys.executable, "-c", "import sys; from client.perf import main; sys.exit(main())",
                    "e2e", topic, "--service-url", sa.service_url, "-r", str(args.rate), "-s", str(args.size),
                    "--batch-delay-ms", str(args.batch_delay_ms), "-d", str(args.duration), "--warmup", "0",
                    "-i", str(args.latency_interval), "--json"]
        perf_started = time.time()
        perf = subprocess.Popen(perf_cmd, cwd=str(repo), env=env_for(repo, stall_dir), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        latency: list[dict] = []

        def read_stderr():
            for raw in perf.stderr:
                m = _LINE.match(raw.decode(errors="replace"))
                if m:
                    latency.append({"t": float(m.group(1)), "rate": float(m.group(2)), "p50": float(m.group(3)),
                                    "p99": float(m.group(4)), "p99.9": float(m.group(5)),
                                    "max": float(m.group(6))})

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        t0 = time.monotonic()
        rss: list[dict] = []
        n = 0
        while perf.poll() is None:
            n += 1
            wake = t0 + n * args.sample
            while perf.poll() is None and time.monotonic() < wake:
                time.sleep(0.2)
            if perf.poll() is not None:
                break
            sample = {"t": round(time.monotonic() - t0, 1), "broker": rss_mb(sa.pid), "perf": rss_mb(perf.pid)}
            for i, pid in enumerate(sa.bookies):
                sample[f"bookie-{i}"] = rss_mb(pid)
                sample[f"wbytes-{i}"] = write_bytes(pid)
            rss.append(sample)
            probe = sa.probe_lines()[-1] if sa.probe_lines() else {}
            g2 = probe.get("gc", {}).get("2", {})
            progress(f"run {run} t={sample['t']:6.0f}s  RSS MiB broker {sample['broker']:.1f} "
                     f"bookies {' / '.join(f'{sample[k]:.1f}' for k in sample if k.startswith('bookie'))} "
                     f"perf {sample['perf'] or 0:.1f} | cache {probe.get('cache_entries')} entries "
                     f"{(probe.get('cache_bytes') or 0) / 1e6:.2f} MB | tracked {probe.get('tracked_objects')} | "
                     f"gen2 GCs {g2.get('count')} max {g2.get('max_ms')} ms")
        out, _ = perf.communicate()
        reader.join(5)
        summary_line = out.decode(errors="replace").strip().splitlines()
        perf_summary = json.loads(summary_line[-1]) if summary_line else {}
        time.sleep(0.5)
        probes = sa.probe_lines()[probe_offset:]
    finally:
        sa.stop()
    amplification = bookie_write_amplification(rss, args.rate * args.size)
    if amplification:
        progress(f"run {run}: bookie bytes written to disk per payload byte: "
                 + ", ".join(f"{k} {v:.1f}" for k, v in amplification.items()))
    result = {"run": run, "repo": str(repo), "rate": args.rate, "size": args.size, "duration_s": args.duration,
              "sample_s": args.sample, "journal_sync": args.journal_sync, "rss_mb": rss, "probe": probes,
              "latency": latency,
              "perf_summary": {k: perf_summary.get(k) for k in ("publish", "consume", "not_received")},
              "summary": {**summarize(rss, probes, latency, args.sample),
                          **{f"{k}_write_bytes_per_payload_byte": round(v, 2) for k, v in amplification.items()}}}
    if stall_dir is not None:
        result["stalls"] = report_stalls(run, stall_dir, perf_started, args.latency_interval, latency)
    return result


def bookie_write_amplification(samples: list[dict], payload_bytes_per_s: float) -> dict[str, float]:
    """{"bookie-<i>": bytes written to the disk per payload byte} between the first and
    the last sample (``write_bytes`` of /proc/<pid>/io over the payload offered at the
    run's rate: each bookie stores every message once with E=Qw=2), {} without two samples."""
    out = {}
    if len(samples) < 2 or payload_bytes_per_s <= 0:
        return out
    first, last = samples[0], samples[-1]
    seconds = last["t"] - first["t"]
    for key in sorted(k for k in last if k.startswith("wbytes-")):
        if first.get(key) is None or last.get(key) is None or seconds <= 0:
            continue
        out["bookie-" + key.split("-", 1)[1]] = (last[key] - first[key]) / (payload_bytes_per_s * seconds)
    return out


def report_stalls(run: int, stall_dir: Path, start: float, interval_s: float, latency: list[dict]) -> dict:
    """Print, per latency line, its p99 beside each process's main-thread stalls in that
    interval (scripts/stallwatch); returns the stall summary."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("stallwatch_report", STALLWATCH / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    stalls = report.summarize(stall_dir, start, interval_s)
    for name, p in sorted(stalls["processes"].items()):
        progress(f"run {run} stalls {name}: {p['stalls']} over 80 ms, longest {p['longest_ms']} ms, "
                 f"{p['stalled_ms']} ms in all, mostly at {p['top']}")
    for i, line in enumerate(latency):
        during = stalls["per_minute"][i] if i < len(stalls["per_minute"]) else {}
        progress(f"run {run} interval {i + 1:2d}: p99 {line['p99']:8.1f} ms | stalls "
                 + (", ".join(f"{n} {c} (max {m} ms)" for n, (c, m) in sorted(during.items())) or "none"))
    return stalls


def summarize(rss: list[dict], probes: list[dict], latency: list[dict], sample_s: float) -> dict:
    """The figures the issue asks for, from one run's samples: broker RSS at
    minute 2, at the end, growth in between; p99 of the first and the last
    latency line; cache entries; full-GC (generation 2) pauses in the first and
    the last two minutes (longest and mean) and GC pause time per second."""
    def at(samples, t):
        best = [s for s in samples if s["t"] <= t + 1]
        return best[-1] if best else None

    warm = at(rss, 120.0) or (rss[0] if rss else None)
    last = rss[-1] if rss else None
    out = {}
    if warm and last:
        out["broker_rss_mb_min2"] = round(warm["broker"], 1)
        out["broker_rss_mb_end"] = round(last["broker"], 1)
        out["broker_rss_growth_mb_after_min2"] = round(last["broker"] - warm["broker"], 1)
        out["broker_rss_mb_max"] = round(max(s["broker"] for s in rss), 1)
        for key in sorted(k for k in last if k.startswith("bookie") or k == "perf"):
            out[f"{key}_rss_mb_end"] = round(last[key], 1)
    if latency:
        out["p99_ms_first_minute"] = latency[0]["p99"]
        out["p99_ms_last_minute"] = latency[-1]["p99"]
        out["p99_ratio_last_to_first"] = round(latency[-1]["p99"] / latency[0]["p99"], 2) if latency[0]["p99"] else None
        out["p50_ms_first_minute"] = latency[0]["p50"]
        out["p50_ms_last_minute"] = latency[-1]["p50"]
        out["rate_first_minute"] = latency[0]["rate"]
        out["rate_last_minute"] = latency[-1]["rate"]
    if probes:
        out["cache_entries_end"] = probes[-1].get("cache_entries")
        out["cache_bytes_end"] = probes[-1].get("cache_bytes")
        out["cache_entries_max"] = max((p.get("cache_entries") or 0) for p in probes)
        out["tracked_objects_min2"] = (at(probes, 120.0) or probes[0]).get("tracked_objects")
        out["tracked_objects_end"] = probes[-1].get("tracked_objects")
        two_min = max(1, int(round(120.0 / sample_s)))
        for name, part in (("first_2min", probes[:two_min]), ("last_2min", probes[-two_min:])):
            count = sum(p["gc"]["2"]["count"] for p in part)
            out[f"gen2_count_{name}"] = count
            out[f"gen2_max_pause_ms_{name}"] = max(p["gc"]["2"]["max_ms"] for p in part)
            out[f"gen2_mean_pause_ms_{name}"] = round(sum(p["gc"]["2"]["total_ms"] for p in part) / count, 2) \
                if count else None
            if all("cpu_total_ms" in p["gc"]["2"] for p in part):
                out[f"gen2_mean_cpu_ms_{name}"] = round(
                    sum(p["gc"]["2"]["cpu_total_ms"] for p in part) / count, 2) if count else None
            out[f"gc_pause_ms_per_s_{name}"] = round(
                sum(sum(g["total_ms"] for g in p["gc"].values()) for p in part) / (len(part) * sample_s), 2)
    return out


def aggregate(results: list[dict]) -> dict:
    """Median and [min, max] of every numeric summary figure over the runs."""
    keys = sorted({k for r in results for k in r["summary"]})
    out = {}
    for k in keys:
        vals = [r["summary"][k] for r in results if isinstance(r["summary"].get(k), (int, float))]
        if vals:
            out[k] = {"median": round(statistics.median(vals), 2), "min": min(vals), "max": max(vals), "n": len(vals)}
    return out


# ---------------------------------------------------------------------------- idle topics / consumers
def idle_once(args, run: int) -> dict:
    """Broker RSS per idle topic and per connected consumer (in this process's client)."""
    base = Path(tempfile.mkdtemp(prefix=f"soak-idle-{run}-"))
    sa = Standalone(Path(args.repo).resolve(), base, args.sample, args.broker_config)
    try:
        return asyncio.run(_idle(args, sa, run))
    finally:
        sa.stop()


async def _idle(args, sa: Standalone, run: int) -> dict:
    from client import AsyncClient, ConsumerType

    async def settle() -> float:
        await asyncio.sleep(args.settle)
        return rss_mb(sa.pid)

    out = {}
    async with AsyncClient(sa.service_url, operation_timeout_seconds=60) as client:
        # one topic first, so that per-process first-use costs are not counted per topic
        p = await client.create_producer(f"persistent://public/default/idle-warm-{run}")
        await p.send(b"x")
        await p.close()
        base = await settle()
        for i in range(args.topics):
            p = await client.create_producer(f"persistent://public/default/idle-{run}-{i}", batching_enabled=False)
            await p.send(b"x" * 100)
            await p.close()
        topics_rss = await settle()
        out["idle_topic_kib"] = round((topics_rss - base) * 1024 / args.topics, 1)
        topic = f"persistent://public/default/idle-{run}-0"
        consumers = [await client.subscribe(topic, "idle-sub", consumer_type=ConsumerType.Shared)]
        one = await settle()
        for _ in range(args.consumers - 1):
            consumers.append(await client.subscribe(topic, "idle-sub", consumer_type=ConsumerType.Shared))
        many = await settle()
        out["consumer_kib"] = round((many - one) * 1024 / max(1, args.consumers - 1), 1)
        out.update(topics=args.topics, consumers=args.consumers, broker_rss_mb_base=round(base, 1),
                   broker_rss_mb_topics=round(topics_rss, 1), broker_rss_mb_consumers=round(many, 1))
        for c in consumers:
            await c.close()
    progress(f"idle run {run}: {out}")
    return {"run": run, "repo": str(Path(args.repo).resolve()), "summary": out}


# ---------------------------------------------------------------------------- GC cost of the cache layout
def gc_cost(args) -> dict:
    """CPU time of one full collection (``gc.collect()``, median of 5) of this process
    with ``--entries`` cached entries of ``--size`` bytes in (a) an OrderedDict keyed
    by Position (the layout before issue 23) and (b) the EntryCache, and empty."""
    import collections
    import gc

    from broker.ledger.entry_cache import EntryCacheManager
    from broker.ledger.position import Position

    def full_gc_ms() -> float:
        times = []
        for _ in range(5):
            t0 = time.thread_time()
            gc.collect()
            times.append((time.thread_time() - t0) * 1000)
        return round(statistics.median(times), 2)

    out = {"entries": args.entries, "size": args.size, "empty_ms": full_gc_ms(),
           "tracked_objects_empty": len(gc.get_objects())}
    old: collections.OrderedDict = collections.OrderedDict()
    for i in range(args.entries):
        old[Position(7, i)] = b"%d" % i + bytes(args.size)
    out["position_keys_ms"] = full_gc_ms()
    out["tracked_objects_position_keys"] = len(gc.get_objects())
    del old
    cache = EntryCacheManager(1 << 40, eviction_interval_ms=0).new_cache("gc")
    for i in range(args.entries):
        cache.insert(Position(7, i), b"%d" % i + bytes(args.size))
    out["entry_cache_ms"] = full_gc_ms()
    out["tracked_objects_entry_cache"] = len(gc.get_objects())
    progress(f"full collection CPU ms: empty {out['empty_ms']}, {args.entries} Position keys "
             f"{out['position_keys_ms']}, EntryCache {out['entry_cache_ms']}")
    return {"summary": out}


# ---------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=["soak", "idle", "gc", "mixed"], default="soak",
                   help="mixed: every subscription type, acks, nacks, a geo pair and a fault every "
                        "--fault-every s; prints lost / duplicated (must be 0), RSS and fds (scripts/soak_mixed.py)")
    p.add_argument("--fault-every", type=float, default=45.0, help="mixed scenario: seconds between faults")
    p.add_argument("--mixed-topics", type=int, default=4,
                   help="mixed scenario: local topics (subscription types in turn), plus one geo-replicated")
    p.add_argument("--entries", type=int, default=200_000, help="gc scenario: cached entries (default 200,000)")
    p.add_argument("--repo", default=str(REPO), help="the minipulsar checkout to run (default: this one)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate", type=float, default=None, help="msg/s (default 5000; mixed scenario: 300 in all)")
    p.add_argument("--size", type=int, default=100, help="message bytes (default 100)")
    p.add_argument("--batch-delay-ms", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load per run (default 600)")
    p.add_argument("--sample", type=float, default=30.0, help="seconds between samples (default 30)")
    p.add_argument("--latency-interval", type=float, default=60.0, help="seconds per latency line (default 60)")
    p.add_argument("--broker-config", default=None, metavar="FILE.toml", help="extra broker settings")
    p.add_argument("--no-journal-sync", dest="journal_sync", action="store_false", default=True,
                   help="bookies without fsync (takes the disk's fsync latency out of the figures)")
    p.add_argument("--stall-watch", action="store_true",
                   help="run every process under scripts/stallwatch and print, per latency line, which "
                        "process's main thread was held (> 80 ms) and where")
    p.add_argument("--topics", type=int, default=500, help="idle scenario: topics (default 500)")
    p.add_argument("--consumers", type=int, default=500, help="idle scenario: consumers (default 500)")
    p.add_argument("--settle", type=float, default=5.0, help="idle scenario: seconds before each RSS reading")
    p.add_argument("--label", default="", help="a name for this series in the JSON output")
    p.add_argument("--aggregate", nargs="+", metavar="FILE", default=None,
                   help="only summarize: the per-run JSON lines of earlier runs (stdout saved to files), "
                        "median and range per --label")
    return p


def aggregate_files(paths: list[str]) -> None:
    """Print one summary JSON line per label found in the per-run lines of ``paths``."""
    by_label: dict[str, list[dict]] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            doc = json.loads(line) if line.strip().startswith("{") else {}
            if "summary" in doc:
                if "rss_mb" in doc:    # recompute: the figures of this version of the script
                    doc["summary"] = summarize(doc["rss_mb"], doc["probe"], doc["latency"], doc["sample_s"])
                by_label.setdefault(doc.get("label", ""), []).append(doc)
    for label, results in sorted(by_label.items()):
        agg = aggregate(results)
        print(json.dumps({"label": label, "runs": len(results), "aggregate": agg}, sort_keys=True), flush=True)
        for k, v in agg.items():
            progress(f"{label} {k}: median {v['median']} (range {v['min']} - {v['max']}, n={v['n']})")


def mixed(args) -> int:
    """``--scenario mixed`` (scripts/soak_mixed.py), ``--runs`` times: one JSON line per run
    (without the raw samples unless --label ends with ``+samples``), then the aggregate line.
    Exit status 1 when a run lost or duplicated a message or did not survive a fault."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import soak_mixed

    results, ok = [], True
    for run in range(1, args.runs + 1):
        res = asyncio.run(soak_mixed.run_mixed(args))
        soak_mixed.print_report(res)
        res["run"], res["label"] = run, args.label
        if not args.label.endswith("+samples"):
            res.pop("samples")
        ok = ok and res["summary"]["ok"]
        results.append(res)
        print(json.dumps(res, sort_keys=True), flush=True)
    print(json.dumps({"label": args.label, "scenario": "mixed", "runs": len(results), "aggregate": aggregate(results)},
                     sort_keys=True), flush=True)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--probe":
        # --probe FILE --probe-sample S -- -m MODULE ARGS...
        sep = argv.index("--")
        run_probe(argv[1], float(argv[3]), argv[sep + 1:])
        return 0
    args = build_parser().parse_args(argv)
    if args.aggregate:
        aggregate_files(args.aggregate)
        return 0
    sys.path.insert(0, str(REPO))
    if args.rate is None:
        args.rate = 300.0 if args.scenario == "mixed" else 5000.0
    if args.scenario == "mixed":
        return mixed(args)
    results = []
    for run in range(1, args.runs + 1):
        res = {"soak": soak_once, "idle": idle_once, "gc": lambda a, r: gc_cost(a)}[args.scenario](args, run)
        res["label"] = args.label
        results.append(res)
        print(json.dumps(res, sort_keys=True), flush=True)
    agg = aggregate(results)
    print(json.dumps({"label": args.label, "scenario": args.scenario, "runs": len(results), "aggregate": agg},
                     sort_keys=True), flush=True)
    for k, v in agg.items():
        progress(f"{args.label or 'result'} {k}: median {v['median']} (range {v['min']} - {v['max']}, n={v['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
