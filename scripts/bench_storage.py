"""Storage-layer benchmark: ManagedLedger appends and a cursor with many ack holes.

Starts 3 real bookie processes (``python -m bookie --port 0``, via
``tests/procs.py``) and a SqliteMetadataStore in a temporary directory, and
prints ONE JSON line per scenario on stdout (progress goes to stderr):

* ``ml_append`` -- ManagedLedger appends of ``--size``-byte entries with E=3,
  Qw=2, Qa=2 and ``--window`` adds in flight (pipelined like a broker under
  load): entries/s, MB/s and p50/p99/max add latency in ms (HdrHistogram).
  Run with journal_sync on and then off (unless ``--sync``/``--no-sync``).
* ``cursor_holes`` -- ``--cursor-entries`` tiny entries (sync off unless
  ``--sync``), every other one acknowledged individually: bytes of hole state
  in memory (``AckRangeSet.memory_bytes()``), bytes persisted
  (``cursor.last_persist_bytes``) and persist time, then a crash (nothing
  closed) and a reopen with a new factory: ManagedCursor recovery time, and a
  check that no acknowledged entry is delivered again (every position checked
  with ``is_acknowledged``, and everything read back through the recovered
  cursor).

    .venv/bin/python scripts/bench_storage.py [--entries 200000] [--size 1024]
        [--window 1000] [--cursor-entries 1000000] [--sync | --no-sync] [--quick]
        [--scenario append|cursor|all]

No figure is asserted here; targets (sync on >= 20,000 entries/s; hole state
<= 256 KB; cursor recovery <= 1 s) are reported as ``*_target_met`` flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from hdrh.histogram import HdrHistogram  # noqa: E402

from bookie.client import BookKeeper  # noqa: E402
from broker.ledger.managed_cursor import ManagedCursor  # noqa: E402
from broker.ledger.factory import ManagedLedgerFactory  # noqa: E402
from broker.ledger.ml_config import ManagedLedgerConfig  # noqa: E402
from broker.ledger.position import Position  # noqa: E402
from broker.metadata import SqliteMetadataStore  # noqa: E402
from tests.procs import ProcessTracker, start_bookie  # noqa: E402

APPEND_TARGET_ENTRIES_PER_S = 20_000
HOLES_TARGET_MEMORY_BYTES = 256 * 1024
RECOVERY_TARGET_S = 1.0


def proc_cpu_seconds(pid: int) -> float | None:
    """user+system CPU seconds of a process (Linux /proc), None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def progress(msg: str) -> None:
    print(f"[bench_storage {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Cluster:
    """3 bookie processes (one journal_sync mode) + a SQLite metadata store in ``tmp``."""

    def __init__(self, tmp: str, journal_sync: bool, n_bookies: int = 3):
        self.tmp = tmp
        self.journal_sync = journal_sync
        self.n_bookies = n_bookies
        self.tracker = ProcessTracker()
        self.bookies = []
        self.meta = None

    async def __aenter__(self) -> "Cluster":
        mode = "sync" if self.journal_sync else "nosync"
        for i in range(self.n_bookies):
            self.bookies.append(start_bookie(os.path.join(self.tmp, f"bookie-{mode}-{i}"), self.journal_sync,
                                             ("--log-level", "WARNING"), tracker=self.tracker))
        self.meta = await SqliteMetadataStore.open(os.path.join(self.tmp, f"metadata-{mode}.db"))
        progress(f"started {self.n_bookies} bookies (journal_sync={self.journal_sync}): "
                 f"{', '.join(self.addresses)}")
        return self

    @property
    def addresses(self) -> list[str]:
        return [b.address for b in self.bookies]

    async def __aexit__(self, *exc) -> None:
        if self.meta is not None:
            await self.meta.close()
        for b in self.bookies:
            try:
                b.terminate(timeout_s=20)
            except Exception:
                b.kill()
        self.tracker.kill_all()


async def pump(ml, n: int, data: bytes, window: int, hist=None) -> float:
    """Append ``n`` entries keeping ``window`` adds outstanding; returns elapsed seconds.
    Records each add's latency (microseconds) in ``hist``."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    state = {"issued": 0, "completed": 0, "error": None}
    perf = time.perf_counter
    record = hist.record_value if hist is not None else None
    report_every = max(1, n // 10)

    def issue() -> None:
        t0 = perf()
        state["issued"] += 1
        fut = ml.add_entry_nowait(data)
        fut.add_done_callback(lambda f: on_done(f, t0))

    def on_done(f, t0) -> None:
        if f.exception() is not None:
            if state["error"] is None:
                state["error"] = f.exception()
                if not done.done():
                    done.set_exception(f.exception())
            return
        if record is not None:
            record(max(1, int((perf() - t0) * 1e6)))
        state["completed"] += 1
        if state["completed"] % report_every == 0:
            progress(f"  {state['completed']}/{n} appended")
        if state["issued"] < n and state["error"] is None:
            issue()
        elif state["completed"] == n and not done.done():
            done.set_result(None)

    start = perf()
    for _ in range(min(window, n)):
        issue()
    await done
    return perf() - start


async def bench_append(tmp: str, journal_sync: bool, args) -> dict:
    async with Cluster(tmp, journal_sync) as cluster:
        cfg = ManagedLedgerConfig(managed_ledger_default_ensemble_size=3,
                                  managed_ledger_default_write_quorum=2,
                                  managed_ledger_default_ack_quorum=2)
        bk = BookKeeper(cluster.meta, cluster.addresses)
        factory = ManagedLedgerFactory(cluster.meta, bk, cfg)
        try:
            ml = await factory.open(f"public/default/persistent/bench-append-{int(journal_sync)}")
            data = os.urandom(args.size)
            warmup = min(args.entries // 10, 5000)
            if warmup:
                await pump(ml, warmup, data, args.window)
            hist = HdrHistogram(1, 60 * 1_000_000, 3)
            progress(f"appending {args.entries} entries of {args.size} B, window {args.window}, "
                     f"journal_sync={journal_sync}")
            bookie_cpu0 = [proc_cpu_seconds(b.pid) for b in cluster.bookies]
            cpu0 = time.process_time()
            elapsed = await pump(ml, args.entries, data, args.window, hist)
            client_cpu = time.process_time() - cpu0
            bookie_cpu1 = [proc_cpu_seconds(b.pid) for b in cluster.bookies]
            bookie_cpu = None if None in bookie_cpu0 + bookie_cpu1 else \
                sum(bookie_cpu1) - sum(bookie_cpu0)
            rate = args.entries / elapsed
            return {
                "scenario": "ml_append",
                "journal_sync": journal_sync,
                "entries": args.entries,
                "entry_bytes": args.size,
                "ensemble": 3, "write_quorum": 2, "ack_quorum": 2,
                "window": args.window,
                "seconds": round(elapsed, 3),
                "entries_per_s": round(rate),
                "mb_per_s": round(rate * args.size / 1e6, 2),
                "latency_ms_p50": round(hist.get_value_at_percentile(50) / 1000, 3),
                "latency_ms_p99": round(hist.get_value_at_percentile(99) / 1000, 3),
                "latency_ms_max": round(hist.get_max_value() / 1000, 3),
                "client_cpu_us_per_entry": round(client_cpu / args.entries * 1e6, 1),
                "bookies_cpu_us_per_entry": None if bookie_cpu is None else round(bookie_cpu / args.entries * 1e6, 1),
                "ledgers": len(ml.ledgers),
                "target_entries_per_s": APPEND_TARGET_ENTRIES_PER_S if journal_sync else None,
                "target_met": (rate >= APPEND_TARGET_ENTRIES_PER_S) if journal_sync else None,
            }
        finally:
            await factory.close()
            await bk.close()


async def bench_cursor(tmp: str, journal_sync: bool, args) -> dict:
    n = args.cursor_entries
    per_ledger = max(1, args.cursor_entries_per_ledger)
    async with Cluster(tmp, journal_sync) as cluster:
        ens_size, qw, qa = args.cursor_quorums
        cfg = ManagedLedgerConfig(managed_ledger_default_ensemble_size=ens_size,
                                  managed_ledger_default_write_quorum=qw,
                                  managed_ledger_default_ack_quorum=qa,
                                  managed_ledger_max_entries_per_ledger=per_ledger,
                                  managed_ledger_min_ledger_rollover_time_minutes=0,
                                  managed_ledger_cache_size_mb=8)
        name = "public/default/persistent/bench-holes"
        bk = BookKeeper(cluster.meta, cluster.addresses)
        factory = ManagedLedgerFactory(cluster.meta, bk, cfg)
        ml = await factory.open(name)
        cursor = await ml.open_cursor("sub", initial_position="earliest")
        progress(f"cursor scenario: appending {n} tiny entries (journal_sync={journal_sync}, "
                 f"{per_ledger} per ledger)")
        t0 = time.perf_counter()
        await pump(ml, n, b"e", args.window)
        append_s = time.perf_counter() - t0
        # The positions, in order: entries 0..k-1 of every non-empty ledger.
        positions = [Position(lid, e) for lid in sorted(ml.ledgers) for e in range(ml.ledger_entries(lid))]
        assert len(positions) == n, (len(positions), n)
        ledgers = sorted({p.ledger_id for p in positions})
        progress(f"  appended in {append_s:.1f}s over {len(ledgers)} ledgers; acknowledging every other entry")
        # Every other entry acknowledged (odd ones: entry 0 stays unacked, so the
        # mark-delete position cannot move and all holes stay), in broker-sized chunks.
        acked = positions[1::2]
        t0 = time.perf_counter()
        futs = [cursor.delete_nowait(acked[i:i + args.ack_chunk]) for i in range(0, len(acked), args.ack_chunk)]
        ack_s = time.perf_counter() - t0
        memory_before = cursor.individual_deleted.memory_bytes()
        t0 = time.perf_counter()
        await asyncio.gather(*futs)
        await cursor.flush()
        persist_s = time.perf_counter() - t0
        persist_bytes = cursor.last_persist_bytes
        memory_bytes = cursor.individual_deleted.memory_bytes()
        # One more ack: what a follow-up persist writes.
        t0 = time.perf_counter()
        extra = positions[(n - 1) // 2 * 2]  # the last entry with an even index: not acked yet
        await cursor.delete([extra])
        incr_s = time.perf_counter() - t0
        incr_bytes = cursor.last_persist_bytes
        acked_set_size = cursor.individual_deleted.size()
        md_before = cursor.mark_delete_position
        ranges_before = {lid: cursor.individual_deleted.serialize_ledger(lid)
                         for lid in cursor.individual_deleted.ledger_ids()}
        progress(f"  {len(acked)} acks: {memory_bytes} B in memory, {persist_bytes} B persisted "
                 f"in {persist_s * 1000:.0f} ms; crashing and reopening")
        # Crash: the first "broker" just loses its bookie connections.
        await bk.close()
        ml.cache.clear()
        del ml, cursor, factory

        recover_times: list[float] = []
        orig_recover = ManagedCursor.recover.__func__

        async def timed_recover(cls, ml_, name_, *args, **kwargs):
            t = time.perf_counter()
            try:
                return await orig_recover(cls, ml_, name_, *args, **kwargs)
            finally:
                recover_times.append(time.perf_counter() - t)

        bk2 = BookKeeper(cluster.meta, cluster.addresses)
        factory2 = ManagedLedgerFactory(cluster.meta, bk2, cfg)
        ManagedCursor.recover = classmethod(timed_recover)
        try:
            t0 = time.perf_counter()
            ml2 = await factory2.open(name)
            reopen_s = time.perf_counter() - t0
        finally:
            ManagedCursor.recover = classmethod(orig_recover)
        try:
            c2 = ml2.cursors["sub"]
            recovery_s = recover_times[0]
            progress(f"  reopened in {reopen_s:.2f}s (cursor recovery {recovery_s * 1000:.0f} ms); verifying")
            state_equal = (c2.mark_delete_position == md_before
                           and c2.individual_deleted.size() == acked_set_size
                           and {lid: c2.individual_deleted.serialize_ledger(lid)
                                for lid in c2.individual_deleted.ledger_ids()} == ranges_before)
            # Every position: acknowledged exactly when it was acked before the crash.
            expect_acked = set(acked)
            expect_acked.add(extra)
            t0 = time.perf_counter()
            wrong = sum(1 for p in positions if c2.is_acknowledged(p) != (p in expect_acked))
            check_s = time.perf_counter() - t0
            # Read everything back through the recovered cursor.
            t0 = time.perf_counter()
            delivered = 0
            redelivered_acked = 0
            expected_iter = iter(p for p in positions if p not in expect_acked)
            order_ok = True
            while True:
                entries = await c2.read_entries(5000)
                if not entries:
                    break
                for e in entries:
                    delivered += 1
                    if e.position in expect_acked:
                        redelivered_acked += 1
                    elif next(expected_iter, None) != e.position:
                        order_ok = False
            missing = sum(1 for _ in expected_iter)
            read_s = time.perf_counter() - t0
            verified = state_equal and wrong == 0 and redelivered_acked == 0 and missing == 0 and order_ok
            progress(f"  read back {delivered} unacknowledged entries in {read_s:.1f}s; verified={verified}")
            return {
                "scenario": "cursor_holes",
                "journal_sync": journal_sync,
                "entries": n,
                "acked": len(expect_acked),
                "ledgers": len(ledgers),
                "ensemble": ens_size, "write_quorum": qw, "ack_quorum": qa,
                "append_seconds": round(append_s, 3),
                "ack_seconds": round(ack_s, 3),
                "memory_bytes": memory_bytes,
                "memory_bytes_before_persist": memory_before,
                "persist_bytes": persist_bytes,
                "persist_ms": round(persist_s * 1000, 1),
                "incremental_persist_bytes": incr_bytes,
                "incremental_persist_ms": round(incr_s * 1000, 1),
                "ml_reopen_ms": round(reopen_s * 1000, 1),
                "recovery_ms": round(recovery_s * 1000, 1),
                "state_equal_after_recovery": state_equal,
                "is_acknowledged_mismatches": wrong,
                "is_acknowledged_check_ms": round(check_s * 1000, 1),
                "delivered_after_recovery": delivered,
                "redelivered_acked": redelivered_acked,
                "missing_unacked": missing,
                "read_back_seconds": round(read_s, 3),
                "verified": verified,
                "memory_target_met": memory_bytes <= HOLES_TARGET_MEMORY_BYTES,
                "recovery_target_met": recovery_s <= RECOVERY_TARGET_S,
            }
        finally:
            await factory2.close()
            await bk2.close()


async def main_async(args) -> int:
    modes = [True, False] if args.sync is None else [args.sync]
    cursor_sync = False if args.sync is None else args.sync
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
        if args.scenario in ("append", "all"):
            for sync in modes:
                print(json.dumps(await bench_append(tmp, sync, args)), flush=True)
        if args.scenario in ("cursor", "all"):
            print(json.dumps(await bench_cursor(tmp, cursor_sync, args)), flush=True)
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000, help="appends measured per journal_sync mode")
    ap.add_argument("--size", type=int, default=1024, help="entry size in bytes for the append scenario")
    ap.add_argument("--window", type=int, default=1000, help="outstanding adds (count)")
    ap.add_argument("--cursor-entries", type=int, default=1_000_000, help="entries of the cursor scenario")
    ap.add_argument("--cursor-entries-per-ledger", type=int, default=250_000,
                    help="managed_ledger_max_entries_per_ledger of the cursor scenario")
    ap.add_argument("--cursor-quorums", type=lambda s: tuple(int(x) for x in s.split(",")), default=(2, 2, 2),
                    metavar="E,QW,QA", help="ensemble, write and ack quorum of the cursor scenario (default 2,2,2: "
                    "every bookie of the ensemble holds every entry, so reading back is one range read per "
                    "256 entries; striped ensembles (E > Qw) read Qw entries per bookie request)")
    ap.add_argument("--ack-chunk", type=int, default=1000, help="positions per delete_nowait call")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--sync", dest="sync", action="store_true", default=None,
                       help="only journal_sync on (for every scenario)")
    group.add_argument("--no-sync", dest="sync", action="store_false",
                       help="only journal_sync off (for every scenario)")
    ap.add_argument("--scenario", choices=["append", "cursor", "all"], default="all")
    ap.add_argument("--quick", action="store_true",
                    help="small run for a smoke test (5,000 appends, 20,000 cursor entries)")
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop")
    args = ap.parse_args()
    if args.quick:
        args.entries = min(args.entries, 5_000)
        args.cursor_entries = min(args.cursor_entries, 20_000)
        args.cursor_entries_per_ledger = min(args.cursor_entries_per_ledger, 8_000)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.uvloop:
        import uvloop
        sys.exit(uvloop.run(main_async(args)))
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
