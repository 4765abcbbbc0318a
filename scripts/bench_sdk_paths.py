"""Per-message CPU cost of the SDK's pure paths (no I/O): prints one JSON line.

Measures, for batches of ``--batch`` messages of ``--size`` bytes: building a
batch entry (``BatchMessageContainer.add`` + ``build`` + ``encode_entry``),
splitting it on the consumer side (``EntrySplitter.split``: decode, parse the
batch, build ``Message``/``MessageId`` objects) and grouping one individual ack
per message (``AcknowledgmentsGroupingTracker.add_individual`` + ``flush``).
Figures are microseconds per message (best of ``--repeat`` runs).

    .venv/bin/python scripts/bench_sdk_paths.py [--batch 1000] [--size 100] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from client.ack_grouping import AcknowledgmentsGroupingTracker  # noqa: E402
from client.batching import BatchMessageContainer, PendingMessage  # noqa: E402
from client.entry_format import encode_entry  # noqa: E402
from client.entry_splitter import EntrySplitter  # noqa: E402
from proto.broker_pb2 import EntryMessage, Position  # noqa: E402


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1000, help="messages per batch (count)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = args.batch
    payload = os.urandom(args.size)
    state = {}

    def produce():
        c = BatchMessageContainer(max_messages=n, max_bytes=0)
        for i in range(n):
            c.add(PendingMessage(payload, i))
        md, body, _ = c.build("perf-producer", publish_time_ms=1)
        state["entry"] = encode_entry(md, body)

    t_produce = best(produce, args.repeat)
    entry = EntryMessage(position=Position(ledger_id=7, entry_id=3), headers_and_payload=state["entry"])

    def split():
        tracker = AcknowledgmentsGroupingTracker()
        splitter = EntrySplitter("persistent://public/default/t", tracker=tracker)
        state["msgs"] = splitter.split(entry, 0).messages
        state["tracker"] = tracker
        assert len(state["msgs"]) == n

    t_split = best(split, args.repeat)

    def ack():
        split()
        tracker = state["tracker"]
        t = time.perf_counter()
        for m in state["msgs"]:
            tracker.add_individual(m.message_id(), 0, m._chunk_ids)
        frames = tracker.flush()
        state["ack_s"] = time.perf_counter() - t
        assert frames

    ack_times = []
    for _ in range(args.repeat):
        ack()
        ack_times.append(state["ack_s"])
    us = 1e6 / n
    print(json.dumps({
        "bench": "sdk_paths", "batch": n, "size": args.size,
        "produce_us_per_msg": round(t_produce * us, 2),
        "split_us_per_msg": round(t_split * us, 2),
        "ack_us_per_msg": round(min(ack_times) * us, 2),
    }))


if __name__ == "__main__":
    main()
