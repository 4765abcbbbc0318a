"""Bookie add throughput benchmark: prints one JSON line.

Starts a real bookie process (``python -m bookie --port 0``) on a temporary
data dir (or uses ``--address``), then drives AddEntry over ``--streams``
bidirectional streams, each with up to ``--inflight`` request messages of
``--adds-per-message`` adds of ``--entry-bytes`` bytes in flight. Request
messages are serialized before the clock starts, so the client costs little
CPU. Output: adds/s and MB/s of acknowledged adds, per-message latency
(ms from write to response) percentiles, and the bookie's CPU seconds per add
and per request message (``--adds-per-message 1 --inflight 1 --streams 1``
measures the cost of one trickling add, as a lightly loaded broker sends them).

    .venv/bin/python scripts/bench_bookie.py [--adds 200000] [--no-journal-sync]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from proto import bookie_pb2 as pb  # noqa: E402

OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def start_bookie(data_dir: str, journal_sync: bool) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "bookie", "--port", "0", "--data-dir", data_dir, "--log-level", "WARNING"]
    if not journal_sync:
        cmd.append("--no-journal-sync")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    line = proc.stdout.readline()
    if not line.startswith("BOOKIE_READY"):
        proc.kill()
        raise RuntimeError(f"bookie did not start: {line!r}")
    return proc, int(line.split("port=")[1].split()[0])


def _cpu_seconds(pid: int) -> float:
    """user+system CPU seconds of a live process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def build_requests(ledger_id: int, n_adds: int, per_msg: int, entry_bytes: int) -> list[bytes]:
    payload = os.urandom(entry_bytes)
    key = b"bench-key"
    msgs = []
    for start in range(0, n_adds, per_msg):
        req = pb.AddEntriesRequest(adds=[
            pb.AddEntryRequest(ledger_id=ledger_id, entry_id=e, master_key=key, payload=payload,
                               last_add_confirmed=e - 1)
            for e in range(start, min(n_adds, start + per_msg))
        ])
        msgs.append(req.SerializeToString())
    return msgs


async def drive_stream(channel, msgs: list[bytes], inflight: int, latencies: list[float]) -> int:
    call = channel.stream_stream(
        "/minipulsar.bookie.Bookie/AddEntry",
        request_serializer=lambda b: b,
        response_deserializer=pb.AddEntriesResponse.FromString,
    )()
    window = asyncio.Semaphore(inflight)
    sent_at: list[float] = []

    async def writer():
        for m in msgs:
            await window.acquire()
            sent_at.append(time.perf_counter())
            await call.write(m)
        await call.done_writing()

    w = asyncio.create_task(writer())
    acked = 0
    n = 0
    async for resp in call:
        latencies.append(time.perf_counter() - sent_at[n])
        n += 1
        for r in resp.results:
            if r.status != pb.EOK:
                raise RuntimeError(f"add failed: {r}")
        acked += len(resp.results)
        window.release()
    await w
    return acked


async def run(args) -> dict:
    requests = [build_requests(1000 + s, args.adds // args.streams, args.adds_per_message, args.entry_bytes)
                for s in range(args.streams)]
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(args.address, options=OPTIONS) as channel:
        await channel.channel_ready()
        t0 = time.perf_counter()
        acked = sum(await asyncio.gather(*(drive_stream(channel, r, args.inflight, latencies) for r in requests)))
        dt = time.perf_counter() - t0
    latencies.sort()

    def pct(p):
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2)

    return {
        "bench": "bookie_add",
        "journal_sync": not args.no_journal_sync,
        "entry_bytes": args.entry_bytes,
        "adds": acked,
        "streams": args.streams,
        "adds_per_message": args.adds_per_message,
        "inflight_messages_per_stream": args.inflight,
        "seconds": round(dt, 3),
        "adds_per_s": round(acked / dt),
        "mb_per_s": round(acked * args.entry_bytes / dt / 1e6, 1),
        "msg_latency_ms_p50": pct(0.50),
        "msg_latency_ms_p99": pct(0.99),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adds", type=int, default=200_000, help="total adds (count)")
    ap.add_argument("--entry-bytes", type=int, default=1024)
    ap.add_argument("--adds-per-message", type=int, default=100)
    ap.add_argument("--inflight", type=int, default=16, help="request messages in flight per stream")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--no-journal-sync", action="store_true")
    ap.add_argument("--address", help="use a running bookie host:port instead of starting one")
    args = ap.parse_args()
    proc = None
    with tempfile.TemporaryDirectory(prefix="bench-bookie-") as tmp:
        try:
            if not args.address:
                proc, port = start_bookie(tmp, not args.no_journal_sync)
                args.address = f"127.0.0.1:{port}"
            cpu0 = _cpu_seconds(proc.pid) if proc is not None else None
            result = asyncio.run(run(args))
            if proc is not None:
                cpu = _cpu_seconds(proc.pid) - cpu0
                result["bookie_cpu_s"] = round(cpu, 3)
                result["bookie_cpu_us_per_add"] = round(cpu / max(1, result["adds"]) * 1e6, 1)
                result["bookie_cpu_us_per_message"] = round(
                    cpu / max(1, result["adds"] / args.adds_per_message) * 1e6, 1)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
