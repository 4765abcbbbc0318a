"""The official ``pulsar-client`` against minipulsar beside our own SDK (issue 35,
Figures), on the same broker in the same run: publish msgs/s (100-byte messages,
batching on, as fast as the producer is acknowledged), end-to-end msgs/s (a consumer
in the same process, every message acknowledged) and end-to-end latency p50 / p99 at
5,000 msg/s.

One bookie (Qw = Qa = E = 1, journal without fsync) and one broker on free loopback
ports. Each run alternates the two clients; our SDK is measured by
``minipulsar-perf e2e`` (-r 0 and -r 5000), ``pulsar-client`` by the same loop
written with its API (``--official-side``, in a subprocess so each client has a
process of its own). Prints one line per run and the median [min-max] of each
figure per client.

    .venv/bin/python scripts/bench_pulsar_client.py [--runs 3] [--duration 6] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZE = 100


def official_side(url: str, topic: str, rate: int, duration: float, warmup: float) -> dict:
    """pulsar-client: produce ``rate`` msg/s (0 = as fast as acknowledged, at most 10,000
    in flight) for ``warmup`` + ``duration`` s while a consumer acknowledges everything;
    returns {"publish": msg/s, "e2e": msg/s, "p50_ms", "p99_ms"} over the measured part."""
    import pulsar

    client = pulsar.Client(url, operation_timeout_seconds=30)
    consumer = client.subscribe(topic, "bench", receiver_queue_size=5000)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1,
                                      batching_max_messages=1000, max_pending_messages=10_000,
                                      block_if_queue_full=True)
    start = time.monotonic()
    measure_from = start + warmup
    end = measure_from + duration
    acked = [0]
    latencies: list[float] = []
    received = [0]
    done = threading.Event()

    def consume():
        while not done.is_set():
            try:
                msg = consumer.receive(200)
            except pulsar.Timeout:
                continue
            now = time.monotonic()
            sent = float(msg.data()[:20])
            consumer.acknowledge(msg)
            if measure_from <= sent and now <= end:
                received[0] += 1
                latencies.append((now - sent) * 1000)

    def on_ack(res, _mid):
        if res == pulsar.Result.Ok and time.monotonic() >= measure_from:
            acked[0] += 1

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    pad = b"x" * (SIZE - 20)
    n = 0
    while True:
        now = time.monotonic()
        if now >= end:
            break
        if rate:
            due = start + n / rate
            if due > now:
                time.sleep(min(due - now, 0.001))
                continue
        producer.send_async(f"{now:<20.6f}".encode()[:20] + pad, on_ack)
        n += 1
    producer.flush()
    time.sleep(0.5)
    done.set()
    reader.join()
    client.close()
    latencies.sort()

    def pct(q):
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")
    return {"publish": acked[0] / duration, "e2e": received[0] / duration, "p50_ms": pct(0.50), "p99_ms": pct(0.99)}


def sdk_side(url: str, topic: str, rate: int, duration: float, warmup: float) -> dict:
    cmd = [sys.executable, "-m", "client.perf", "e2e", topic, "--service-url", url, "-r", str(rate), "-s", str(SIZE),
           "-d", str(duration), "--warmup", str(warmup), "--json", "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"perf failed: {out.stderr[-2000:]}")
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    lat = doc["consume"]["latency_ms"]
    return {"publish": doc["publish"]["msg_per_s"], "e2e": doc["consume"]["msg_per_s"],
            "p50_ms": lat["p50"], "p99_ms": lat["p99"]}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} [{min(values):,.1f}-{max(values):,.1f}]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration", type=float, default=6.0, help="measured seconds of each side")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--official-side", nargs=3, metavar=("URL", "TOPIC", "RATE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.official_side:
        url, topic, rate = args.official_side
        print(json.dumps(official_side(url, topic, int(rate), args.duration, args.warmup)))
        return 0

    from tests.procs import ProcessTracker, ensure_namespace, start_bookie, start_broker
    import asyncio

    tracker = ProcessTracker()
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-pulsar-client-") as tmp:
            base = Path(tmp)
            bookie = start_bookie(base / "bookie", journal_sync=False, tracker=tracker)
            conf = base / "broker.toml"
            conf.write_text("managed_ledger_default_ensemble_size = 1\nmanaged_ledger_default_write_quorum = 1\n"
                            "managed_ledger_default_ack_quorum = 1\n")
            broker = start_broker(base / "broker", [bookie.address], config_file=conf, tracker=tracker)
            asyncio.run(ensure_namespace(broker.service_url))
            for run in range(args.runs):
                for side in ("pulsar-client", "our SDK"):
                    for rate in (0, 5000):
                        topic = f"persistent://public/default/bench-{side[:3]}-{rate}-{run}-{time.time_ns()}"
                        if side == "our SDK":
                            fig = sdk_side(broker.service_url, topic, rate, args.duration, args.warmup)
                        else:
                            out = subprocess.run(
                                [sys.executable, __file__, "--duration", str(args.duration), "--warmup",
                                 str(args.warmup), "--official-side", broker.pulsar_url, topic, str(rate)],
                                capture_output=True, text=True, timeout=args.duration + 120, cwd=ROOT)
                            if out.returncode != 0:
                                raise RuntimeError(out.stderr[-2000:])
                            fig = json.loads(out.stdout.strip().splitlines()[-1])
                        key = f"{side} r={rate or 'max'}"
                        for name, value in fig.items():
                            results.setdefault(key, {}).setdefault(name, []).append(value)
                        print(f"run {run + 1} {key:>20}: publish {fig['publish']:,.0f} msg/s, end to end "
                              f"{fig['e2e']:,.0f} msg/s, p50 {fig['p50_ms']:.2f} ms, p99 {fig['p99_ms']:.2f} ms",
                              flush=True)
    finally:
        tracker.kill_all()
    print(f"\nmedian [min-max] over {args.runs} runs (100-byte messages, batching on):")
    for key, figs in results.items():
        line = f"  {key:>20}: publish {spread(figs['publish'])} msg/s, end to end {spread(figs['e2e'])} msg/s"
        if "5000" in key:
            line += f", p50 {spread(figs['p50_ms'])} ms, p99 {spread(figs['p99_ms'])} ms"
        print(line)
    if args.json:
        print(json.dumps(results, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
