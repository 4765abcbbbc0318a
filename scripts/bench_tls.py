"""The cost of TLS (issue 17, Figures): end-to-end msgs/s and latency at a
fixed rate, plaintext vs TLS, alternating in the same run.

Starts two standalones side by side (2 bookies + a broker each, bookies
without fsync so that disk noise does not hide the TLS cost): one plain, one
whose broker serves TLS only (``tls_enabled``, certificates from
``deploy.tls_certs``). Then, ``--runs`` times, runs ``minipulsar-perf e2e``
against each (order swapped every run): ``--rate`` msg/s of ``--size`` bytes
for ``--duration`` s after a warm-up, a fresh topic each time. Prints one
line per measurement and a summary table: median and [min..max] of the
achieved end-to-end rate (msgs/s received), end-to-end p50/p99 and publish p99
(ms), and CPU microseconds per message of the broker process and of the client
(a figure that stays meaningful on a loaded machine, where latencies do not).

    .venv/bin/python scripts/bench_tls.py [--runs 3] [--rate 5000] [--size 100] [--duration 20] [--json]

Only the client -> broker link is TLS here (replicators and bookies keep
their plaintext links); each process idles while the other is measured.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from deploy.tls_certs import create_ca, create_cert  # noqa: E402
from tests.procs import ProcessTracker, StandaloneProcess  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def perf_e2e(url: str, args, ca: str | None) -> dict:
    """One ``minipulsar-perf e2e`` run; its JSON summary with ``client_cpu_s`` (the perf
    process's CPU seconds) added. Raises RuntimeError on failure."""
    cmd = [sys.executable, "-m", "client.perf", "e2e", f"persistent://public/default/bench-tls-{uuid.uuid4().hex[:8]}",
           "--service-url", url, "-r", str(args.rate), "-s", str(args.size), "-d", str(args.duration),
           "--warmup", str(args.warmup), "--json", "-q"]
    if ca:
        cmd += ["--tls-trust-certs-file-path", ca]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.duration + args.warmup + 120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"perf failed ({done.returncode}): {done.stderr[-2000:]}")
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    doc["client_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return doc


def figures(doc: dict, broker_cpu_s: float) -> dict:
    """The figures of one perf e2e summary: e2e rate (msg/s received), e2e p50/p99 and
    publish p99 (ms), messages not received, and CPU microseconds per message of the
    broker process (the standalone's main process: its bookies are other processes)
    and of the client (the perf process, producer and consumer), over the whole run
    (warm-up included) divided by the messages published."""
    e2e, pub = doc["consume"], doc["publish"]
    total = max(1.0, (pub["messages"] / max(pub["duration_s"], 1e-9)) * (doc["config"]["duration"] +
                                                                          doc["config"]["warmup"]))
    return {"rate": e2e["msg_per_s"], "e2e_p50_ms": e2e["latency_ms"]["p50"], "e2e_p99_ms": e2e["latency_ms"]["p99"],
            "publish_p99_ms": pub["latency_ms"]["p99"], "not_received": doc.get("not_received", 0),
            "broker_us_per_msg": broker_cpu_s / total * 1e6, "client_us_per_msg": doc["client_cpu_s"] / total * 1e6}


def spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return f"{statistics.median(values):,.2f} [{min(values):,.2f}..{max(values):,.2f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=5000, help="msg/s offered (default 5000)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--duration", type=float, default=20, help="measured seconds per run (default 20)")
    ap.add_argument("--warmup", type=float, default=3, help="seconds before measuring (default 3)")
    ap.add_argument("--json", action="store_true", help="print every measurement as JSON too")
    args = ap.parse_args()
    tracker = ProcessTracker()
    results: dict[str, list[dict]] = {"plain": [], "tls": []}
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        base = Path(tmp)
        ca = create_ca(str(base / "certs"))
        cert = create_cert(str(base / "certs"), "broker", ["127.0.0.1", "localhost"])
        cfg = base / "tls.toml"
        cfg.write_text(f'tls_enabled = true\ntls_certificate_file_path = "{cert.cert}"\n'
                       f'tls_key_file_path = "{cert.key}"\n')
        try:
            plain = StandaloneProcess(base / "plain", ["--no-journal-sync"], tracker).start()
            tls = StandaloneProcess(base / "tls", ["--no-journal-sync", "--broker-config", str(cfg)], tracker).start()
            targets = {"plain": (plain.service_url, None), "tls": (f"minipulsar+ssl://127.0.0.1:{tls.port}", ca.cert)}
            procs = {"plain": plain, "tls": tls}
            for run in range(args.runs):
                order = ["plain", "tls"] if run % 2 == 0 else ["tls", "plain"]
                for mode in order:
                    url, trust = targets[mode]
                    broker_pid = procs[mode].pid
                    cpu0 = cpu_seconds(broker_pid)
                    doc = perf_e2e(url, args, trust)
                    f = figures(doc, cpu_seconds(broker_pid) - cpu0)
                    results[mode].append(f)
                    print(f"run {run + 1} {mode:5}: e2e {f['rate']:,.0f} msg/s, e2e p50 {f['e2e_p50_ms']:.2f} ms, "
                          f"p99 {f['e2e_p99_ms']:.2f} ms, publish p99 {f['publish_p99_ms']:.2f} ms, "
                          f"not received {f['not_received']}, CPU us/msg broker {f['broker_us_per_msg']:.1f} "
                          f"client {f['client_us_per_msg']:.1f}", flush=True)
                    if args.json:
                        print(json.dumps({"run": run + 1, "mode": mode, **f, "raw": doc}), flush=True)
        finally:
            tracker.kill_all()
    print(f"\n{args.runs} runs each, {args.rate:g} msg/s offered, {args.size} B, {args.duration:g} s measured; "
          "median [min..max]")
    keys = ("rate", "e2e_p50_ms", "e2e_p99_ms", "publish_p99_ms", "broker_us_per_msg", "client_us_per_msg")
    names = ("e2e msg/s", "e2e p50 ms", "e2e p99 ms", "publish p99 ms", "broker CPU us/msg", "client CPU us/msg")
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for mode, rows in results.items():
        print(f"| {mode} | " + " | ".join(spread([r[k] for r in rows]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
