"""Bookie faults under a running SDK workload (dedup on): kill -9 of a bookie of the open
ledger's ensemble, of two bookies one after the other, a bookie SIGSTOPped for longer
than the add timeout, a bookie whose disk fills up, a bookie whose database file is
corrupted or truncated. The checks and the figures row: ``tests/faults/harness.py``.

BookKeeper rules exercised: a failed or silent bookie is replaced in the ensemble of
the open ledger (ensemble change, ``LedgerHandle.handleBookieFailure``; an add that is
not answered within ``addEntryTimeout`` counts as a failure); a bookie whose disk is
full turns read-only (``LedgerDirsManager`` -> read-only mode) and its adds fail over;
entries are readable while one replica of their write set lives.
"""
from __future__ import annotations

import asyncio

import pytest

from client.admin import AdminClient
from tests.faults.harness import Workload, bookie_info, bookie_last_entry, bookie_read
from tests.procs import start_bookie

pytestmark = pytest.mark.timeout(150)


async def test_bookie_of_the_open_ledger_killed(fault_cluster):
    cluster = fault_cluster(3)
    await cluster.create_namespace()
    w = await Workload(cluster.service_url).start()
    try:
        await w.run_for(2.0)
        victim = (await cluster.open_ledger_ensemble(w.topic))[0]
        w.fault(f"kill -9 bookie-{victim}")
        cluster.kill_bookie(victim)
        await w.run_for(4.0)
        await w.finish("bookie of the open ledger killed", "1 x SIGKILL bookie (ensemble change to the spare)",
                       serve_bound_s=30)
    finally:
        await w.close()


async def test_two_bookies_killed_one_after_the_other(fault_cluster):
    cluster = fault_cluster(4)
    await cluster.create_namespace()
    w = await Workload(cluster.service_url).start()
    try:
        await w.run_for(2.0)
        first = (await cluster.open_ledger_ensemble(w.topic))[0]
        t = w.fault(f"kill -9 bookie-{first}")
        cluster.kill_bookie(first)
        await w.wait_serving(t, 30)
        await w.run_for(1.0)
        second = next(i for i in await cluster.open_ledger_ensemble(w.topic) if i != first)
        w.fault(f"kill -9 bookie-{second}")
        cluster.kill_bookie(second)      # two of four bookies down: the two left form the ensemble
        await w.run_for(4.0)
        # both come back (a supervisor restarts a killed process): entries whose two replicas
        # were on the killed pair are readable again
        await asyncio.to_thread(cluster.restart_bookie, first)
        await asyncio.to_thread(cluster.restart_bookie, second)
        await w.run_for(1.0)
        await w.finish("two bookies killed in turn", "2 x SIGKILL bookie (both down at once), restarted after 4 s",
                       serve_bound_s=30)
    finally:
        await w.close()


async def test_slow_bookie_paused_longer_than_the_add_timeout(fault_cluster):
    """SIGSTOP for 3 x the add timeout: the writer replaces the bookie (ensemble change);
    then SIGCONT: the bookie comes back holding entries the ledger no longer counts on it."""
    cluster = fault_cluster(3, bookkeeper_client_timeout_in_seconds=1.0)
    await cluster.create_namespace()
    w = await Workload(cluster.service_url).start()
    try:
        await w.run_for(2.0)
        victim = (await cluster.open_ledger_ensemble(w.topic))[0]
        w.fault(f"SIGSTOP bookie-{victim} 3 s")
        cluster.pause_bookie(victim)
        await w.run_for(3.0)
        cluster.resume_bookie(victim)
        await w.run_for(3.0)
        await w.finish("slow bookie (SIGSTOP > add timeout)", "SIGSTOP 3 s / SIGCONT, add timeout 1 s",
                       serve_bound_s=30)
    finally:
        await w.close()


async def test_bookie_disk_full(fault_cluster):
    """Bookie 0's database is capped (SQLite ``max_page_count``) and its disk monitor is
    out of the way (threshold 1.0, checks hourly; else it may turn the bookie read-only at
    100 % first): its adds hit SQLITE_FULL, it turns read-only, the writer replaces
    it; it still serves reads and nothing acknowledged is lost. Ledgers roll over every 200
    entries so that the small bookie is in some ensemble (E=2 of 3) early."""
    cluster = fault_cluster(3, bookie_args={0: ("--max-db-size-bytes", str(160 * 1024),
                                                "--disk-usage-threshold", "1.0",
                                                "--disk-usage-lwm-threshold", "1.0",
                                                "--disk-check-interval-s", "3600")},
                            managed_ledger_max_entries_per_ledger=200,
                            managed_ledger_min_ledger_rollover_time_minutes=0)
    await cluster.create_namespace()
    w = await Workload(cluster.service_url).start()
    full = cluster.bookies[0].address
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while not (await bookie_info(full)).read_only:
            assert asyncio.get_running_loop().time() < deadline, "the capped bookie never turned read-only"
            await asyncio.sleep(0.2)
        w.fault("bookie-0 disk full, read-only")   # first seen read-only (polled every 0.2 s)
        info = await bookie_info(full)
        assert "disk full" in info.read_only_reason, info.read_only_reason
        await w.run_for(3.0)
        # the read-only bookie still serves reads of the ledgers it holds
        async with AdminClient(cluster.service_url) as admin:
            ledgers = [lg["ledgerId"] for lg in (await admin.get_internal_stats(w.topic))["ledgers"]]
        held = [(lid, last) for lid in ledgers if (last := await bookie_last_entry(full, lid)) >= 0]
        assert held, "the capped bookie holds none of the topic's ledgers"
        for lid, last in held:
            assert len(await bookie_read(full, lid, 0, last)) == last + 1
        row = await w.finish("bookie disk full (SQLITE_FULL)", "database cap 160 KiB: read-only, adds fail over",
                             serve_bound_s=30)
        assert row.acknowledged > 0
        assert cluster.bookies[0].is_running()
    finally:
        await w.close()


@pytest.mark.parametrize("damage", ["corrupted", "truncated"])
async def test_bookie_database_damaged_at_start(fault_cluster, damage):
    """A bookie is killed, its database file damaged, and its restart refused with an
    error naming the file; the workload goes on (ensemble change), and every message is
    read back, those of ledgers whose other replica is the damaged bookie included."""
    cluster = fault_cluster(3)
    await cluster.create_namespace()
    w = await Workload(cluster.service_url).start()
    try:
        await w.run_for(2.0)
        victim = (await cluster.open_ledger_ensemble(w.topic))[0]
        w.fault(f"kill -9 bookie-{victim}, database {damage}")
        cluster.kill_bookie(victim)
        db = _ledger_db(cluster.bookies[victim].data_dir)
        _damage(db, damage)
        with pytest.raises(RuntimeError) as err:
            await asyncio.to_thread(start_bookie, cluster.bookies[victim].data_dir,
                                    extra_args=("--port", str(cluster.bookies[victim].port)), tracker=cluster.tracker)
        assert str(db) in str(err.value), err.value
        print(f"\nrefused start ({damage}): {str(err.value).strip().splitlines()[-1]}")
        await w.run_for(3.0)
        await w.finish(f"bookie database {damage} at start", f"SIGKILL + {damage} file: restart refused",
                       serve_bound_s=30)
    finally:
        await w.close()


def _ledger_db(data_dir):
    candidates = sorted(p for p in data_dir.iterdir() if p.suffix == ".db")
    assert candidates, f"no database file in {data_dir}: {list(data_dir.iterdir())}"
    return candidates[0]


def _damage(path, how: str) -> None:
    size = path.stat().st_size
    if how == "truncated":
        with open(path, "r+b") as f:
            f.truncate(size // 3 + 17)
    else:
        with open(path, "r+b") as f:
            f.seek(0)
            f.write(b"\xde\xad\xbe\xef" * 64)      # the header: "file is not a database"
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.unlink()
