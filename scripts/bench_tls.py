"""The cost of TLS (issue 17, Figures): end-to-end msgs/s and latency at a
fixed rate, plaintext vs TLS, alternating in the same run.

Starts two standalones side by side (2 bookies + a broker each, bookies
without fsync so that disk noise does not hide the TLS cost): one plain, one
whose broker serves TLS only (``tls_enabled``, certificates from
``deploy.tls_certs``). Then, ``--runs`` times, runs ``minipulsar-perf e2e``
against each (order swapped every run): ``--rate`` msg/s of ``--size`` bytes
for ``--duration`` s after a warm-up, a fresh topic each time. Prints one
line per measurement and a summary: median and [min..max] of the achieved
end-to-end rate (msgs/s received), end-to-end p50/p99 and publish p99 (ms).

    .venv/bin/python scripts/bench_tls.py [--runs 3] [--rate 5000] [--size 100] [--duration 20] [--json]

Only the client -> broker link is TLS here (replicators and bookies keep
their plaintext links); each process idles while the other is measured.
"""
from __future__ import annotations

import argparse
import json
import os
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


def perf_e2e(url: str, args, ca: str | None) -> dict:
    """One ``minipulsar-perf e2e`` run; its JSON summary (raises RuntimeError on failure)."""
    cmd = [sys.executable, "-m", "client.perf", "e2e", f"persistent://public/default/bench-tls-{uuid.uuid4().hex[:8]}",
           "--service-url", url, "-r", str(args.rate), "-s", str(args.size), "-d", str(args.duration),
           "--warmup", str(args.warmup), "--json", "-q"]
    if ca:
        cmd += ["--tls-trust-certs-file-path", ca]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.duration + args.warmup + 120)
    if done.returncode != 0:
        raise RuntimeError(f"perf failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def figures(doc: dict) -> dict:
    """The figures of one perf e2e summary: e2e rate (msg/s received), e2e p50/p99 and
    publish p99 (ms), messages not received."""
    e2e, pub = doc["consume"], doc["publish"]
    return {"rate": e2e["msg_per_s"], "e2e_p50_ms": e2e["latency_ms"]["p50"], "e2e_p99_ms": e2e["latency_ms"]["p99"],
            "publish_p99_ms": pub["latency_ms"]["p99"], "not_received": doc.get("not_received", 0)}


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
            for run in range(args.runs):
                order = ["plain", "tls"] if run % 2 == 0 else ["tls", "plain"]
                for mode in order:
                    url, trust = targets[mode]
                    doc = perf_e2e(url, args, trust)
                    f = figures(doc)
                    results[mode].append(f)
                    print(f"run {run + 1} {mode:5}: e2e {f['rate']:,.0f} msg/s, e2e p50 {f['e2e_p50_ms']:.2f} ms, "
                          f"p99 {f['e2e_p99_ms']:.2f} ms, publish p99 {f['publish_p99_ms']:.2f} ms, "
                          f"not received {f['not_received']}", flush=True)
                    if args.json:
                        print(json.dumps({"run": run + 1, "mode": mode, **f, "raw": doc}), flush=True)
        finally:
            tracker.kill_all()
    print(f"\n{args.runs} runs each, {args.rate:g} msg/s offered, {args.size} B, {args.duration:g} s measured; "
          "median [min..max]")
    print(f"{'':6}{'e2e msg/s':>28}{'e2e p50 ms':>24}{'e2e p99 ms':>24}{'publish p99 ms':>24}")
    for mode, rows in results.items():
        print(f"{mode:6}" + "".join(f"{spread([r[k] for r in rows]):>24}" if k != "rate" else
                                    f"{spread([r[k] for r in rows]):>28}"
                                    for k in ("rate", "e2e_p50_ms", "e2e_p99_ms", "publish_p99_ms")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
