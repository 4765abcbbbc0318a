"""The geo demo's figures on broker clusters (issue 14): ``geo up`` time, full
replay throughput, replicator lag, takeover inside a cluster, redeliveries,
peak memory per process kind.

Each run uses a fresh data dir and a copy of ``deploy/geo.toml`` on free ports
(same layout: per cluster an etcd, three bookies, two brokers; one
configuration-store etcd; 19 processes), exactly as a user runs the demo:

* ``replay`` runs: ``minipulsar geo up`` (wall time of the command, fresh data),
  ``minipulsar geo demo`` replaying all 336,776 flights (or ``--limit``) at full
  speed (its ``--json``: flights/s over the whole replay, replicator delay
  p50/p99 per cluster pair as the demo samples it every second from topic stats,
  publish -> remote-board delivery p50/p99), then the peak resident memory
  (``VmHWM`` of ``/proc/<pid>/status``) of every process, grouped by kind
  (etcd, bookie, broker) and of the demo process itself (its ``ru_maxrss``),
  then ``geo up`` again after ``geo down`` (resume time), ``geo down --purge``.
* ``failover`` runs: the same, with ``geo demo --failover`` (the broker owning
  the most partitions in us-east killed -9 at half of us-east's replay, not
  restarted): takeover times (kill -> first send acknowledged through the new
  owner; -> lookups name a live owner for every moved partition; -> every moved
  partition took a send again) and redelivered messages (board deliveries of a
  flight already counted).

One JSON line per run on stdout, progress on stderr, and at the end a summary
(median and range over the runs of each figure) as JSON on stdout:

    .venv/bin/python scripts/bench_geo.py [--runs 3] [--failover-runs 3] [--limit N] [--rate R] [--keep]

Figures are never asserted. The machine's load average is recorded with each run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def geo(*args: str, timeout: float = 1800) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "deploy.cli", "geo", *args], cwd=str(REPO_ROOT), env=env,
                          capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"geo {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return proc, took


def peak_memory(data: Path) -> dict[str, list[float]]:
    """kind -> [peak RSS MiB of each running process of that kind] (VmHWM)."""
    from deploy.geo import resolve_topology
    from deploy.geo_processes import _memory, plan_processes

    out: dict[str, list[float]] = {}
    for p in plan_processes(resolve_topology(None, data), data):
        pid = p.running_pid()
        if pid is None:
            continue
        _, peak = _memory(pid)
        if peak:
            out.setdefault(p.kind, []).append(round(peak / 2**20, 1))
    return out


def one_run(kind: str, limit: int | None, keep: bool, rate: float = 0.0) -> dict:
    from tests.e2e.geo_helpers import write_topology

    tmp = Path(tempfile.mkdtemp(prefix=f"bench-geo-{kind}-"))
    topo, data, result_file = tmp / "geo.toml", tmp / "data", tmp / "demo.json"
    write_topology(topo)
    run: dict = {"kind": kind, "load_before": os.getloadavg(), "limit": limit, "rate": rate}
    try:
        _, run["up_s"] = geo("up", "--topology", str(topo), "--data-dir", str(data))
        say(f"  geo up: {run['up_s']:.1f}s")
        args = ["demo", "--data-dir", str(data), "--plain", "--json", str(result_file)]
        if limit:
            args += ["--limit", str(limit)]
        if rate:
            args += ["--rate", str(rate)]
        if kind == "failover":
            args += ["--failover"]
        t0 = time.monotonic()
        geo(*args)
        run["demo_s"] = round(time.monotonic() - t0, 1)
        run["load_after"] = os.getloadavg()
        demo = json.loads(result_file.read_text())
        run["flights"] = demo["flights"]
        run["replay_s"] = demo["replay_seconds"]
        run["flights_per_s"] = demo["total_throughput"]
        pairs = {k: v for k, v in demo["lag"].items() if k.split("->")[0] != k.split("->")[1]}
        run["replicator_p50_s"] = max(v["replicator_delay_p50_s"] or 0.0 for v in pairs.values())
        run["replicator_p99_s"] = max(v["replicator_delay_p99_s"] or 0.0 for v in pairs.values())
        run["delivery_p50_ms"] = [min(v["p50_ms"] for v in pairs.values()), max(v["p50_ms"] for v in pairs.values())]
        run["delivery_p99_ms"] = [min(v["p99_ms"] for v in pairs.values()), max(v["p99_ms"] for v in pairs.values())]
        run["ok"] = demo["ok"]
        run["demo_peak_mb"] = demo["demo_peak_memory_mb"]
        run["partition_owners"] = demo.get("partition_owners")
        if kind == "failover":
            f = demo["failover"]
            run.update({k: f.get(k) for k in ("first_publish_s", "owners_live_s", "all_partitions_published_s",
                                               "redelivered", "partitions_moved", "at_flight")})
        run["peak_mb"] = peak_memory(data)
        geo("down", "--data-dir", str(data))
        _, run["resume_up_s"] = geo("up", "--data-dir", str(data))
        say(f"  resumed: {run['resume_up_s']:.1f}s")
    finally:
        try:
            geo("down", "--data-dir", str(data), "--purge", "--timeout", "10")
        except Exception as exc:   # noqa: BLE001
            say(f"  down failed: {exc}")
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return run


def summary(runs: list[dict]) -> dict:
    def stat(values):
        values = [v for v in values if v is not None]
        if not values:
            return None
        return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values),
                "n": len(values)}

    out: dict = {}
    for kind in ("replay", "failover"):
        rs = [r for r in runs if r["kind"] == kind]
        if not rs:
            continue
        s = {k: stat([r.get(k) for r in rs]) for k in ("up_s", "resume_up_s", "flights_per_s", "replay_s",
                                                      "replicator_p50_s", "replicator_p99_s", "demo_peak_mb")}
        s["delivery_p50_ms"] = stat([x for r in rs for x in r.get("delivery_p50_ms", [])])
        s["delivery_p99_ms"] = stat([x for r in rs for x in r.get("delivery_p99_ms", [])])
        if kind == "failover":
            for k in ("first_publish_s", "owners_live_s", "all_partitions_published_s", "redelivered"):
                s[k] = stat([r.get(k) for r in rs])
        kinds = sorted({k for r in rs for k in r.get("peak_mb", {})})
        s["peak_mb"] = {k: stat([x for r in rs for x in r["peak_mb"].get(k, [])]) for k in kinds}
        s["ok"] = [r.get("ok") for r in rs]
        s["load"] = [r["load_before"][0] for r in rs]
        out[kind] = s
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="full replays (default 3)")
    p.add_argument("--failover-runs", type=int, default=3, help="replays with --failover (default 3)")
    p.add_argument("--limit", type=int, default=None, help="flights per replay (default all 336,776)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="flights/s per cluster (default 0 = full speed; the demo's --rate)")
    p.add_argument("--keep", action="store_true", help="keep each run's temp dir")
    args = p.parse_args()
    runs = []
    plan = ["replay"] * args.runs + ["failover"] * args.failover_runs
    for i, kind in enumerate(plan):
        say(f"run {i + 1}/{len(plan)}: {kind} (load {os.getloadavg()[0]:.1f})")
        try:
            run = one_run(kind, args.limit, args.keep, args.rate)
        except Exception as exc:   # noqa: BLE001 - recorded, the next run goes on
            run = {"kind": kind, "error": str(exc)[-2000:]}
            say(f"  FAILED: {str(exc)[-500:]}")
        print(json.dumps(run), flush=True)
        runs.append(run)
    print(json.dumps({"summary": summary([r for r in runs if "error" not in r])}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
