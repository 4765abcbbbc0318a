"""Storage layer against real bookie processes: bookie client (quorums, ensemble
change, fencing, recovery), ManagedLedger (rollover, restart, trimming) and
ManagedCursor (holes, batch indexes, PIP-81 segmented persistence, recovery)."""
from __future__ import annotations

import asyncio

import pytest

from bookie.client import BookKeeper
from bookie.errors import LedgerFencedError
from broker.ledger.factory import ManagedLedgerFactory
from broker.ledger.ml_config import ManagedLedgerConfig
from broker.ledger.position import Position
from broker.metadata import SqliteMetadataStore


def same_port(proc):
    """Restart a stopped bookie on the same port: ledger metadata names bookies by address."""
    from tests.procs import start_bookie

    return start_bookie(proc.data_dir, proc.journal_sync, ("--port", str(proc.port)), tracker=proc.tracker)


@pytest.fixture
async def meta(tmp_path):
    store = await SqliteMetadataStore.open(str(tmp_path / "metadata.db"))
    yield store
    await store.close()


async def test_e3_qw2_qa2_write_read(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(3)]
    bk = BookKeeper(meta, [b.address for b in bookies])
    try:
        lh = await bk.create_ledger(3, 2, 2)
        futures = [lh.add_entry_nowait(f"entry-{i}".encode() * 10) for i in range(300)]
        ids = await asyncio.gather(*futures)
        assert ids == list(range(300))
        assert lh.last_add_confirmed == 299
        data = await lh.read_entries(0, 299)
        assert data == [f"entry-{i}".encode() * 10 for i in range(300)]
        await lh.close()
        ro = await bk.open_ledger(lh.ledger_id)
        assert ro.last_add_confirmed == 299
        assert await ro.read_entries(290, 299) == data[290:]
        # Each entry lives on exactly its write set (striping over 3 bookies).
        for e in (0, 1, 2):
            assert len(set(ro.write_set(e))) == 2
    finally:
        await bk.close()


async def test_ensemble_change_when_a_bookie_is_killed(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(4)]
    bk = BookKeeper(meta, [b.address for b in bookies])
    try:
        lh = await bk.create_ledger(3, 2, 2)
        acked = {}
        for i in range(100):
            acked[await lh.add_entry(f"a{i}".encode())] = f"a{i}".encode()
        victim = next(b for b in bookies if b.address == lh.ensemble[0])
        victim.kill()
        futures = [lh.add_entry_nowait(f"b{i}".encode()) for i in range(200)]
        for i, f in enumerate(futures):
            acked[await f] = f"b{i}".encode()
        assert len(lh.metadata.fragments) == 2
        assert victim.address not in lh.ensemble
        await lh.close()
        ro = await bk.open_ledger(lh.ledger_id)
        got = await ro.read_entries(0, ro.last_add_confirmed)
        assert {i: d for i, d in enumerate(got)} == acked
    finally:
        await bk.close()


async def test_fencing_cuts_off_the_old_writer(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(2)]
    addrs = [b.address for b in bookies]
    writer, recoverer = BookKeeper(meta, addrs), BookKeeper(meta, addrs)
    try:
        lh = await writer.create_ledger(2, 2, 2)
        for i in range(10):
            await lh.add_entry(b"x%d" % i)
        ro = await recoverer.open_ledger(lh.ledger_id, recovery=True)
        assert ro.last_add_confirmed == 9
        assert ro.metadata.state == ro.metadata.CLOSED
        with pytest.raises(LedgerFencedError):
            await lh.add_entry(b"after fence")
        assert await ro.read_entries(0, 9) == [b"x%d" % i for i in range(10)]
    finally:
        await writer.close()
        await recoverer.close()


async def test_recovery_after_bookie_restart_keeps_every_acked_entry(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(2)]
    bk = BookKeeper(meta, [b.address for b in bookies])
    lh = await bk.create_ledger(2, 2, 2)
    ids = await asyncio.gather(*(lh.add_entry_nowait(b"e%d" % i) for i in range(500)))
    await bk.close()  # the writer "crashes": the ledger stays OPEN
    for b in bookies:
        b.kill()
    restarted = [same_port(b) for b in bookies]
    bk2 = BookKeeper(meta, [b.address for b in restarted])
    try:
        ro = await bk2.open_ledger(lh.ledger_id, recovery=True)
        assert ro.last_add_confirmed == max(ids)
        assert await ro.read_entries(0, 499) == [b"e%d" % i for i in range(500)]
    finally:
        await bk2.close()


def small_config(**kw) -> ManagedLedgerConfig:
    cfg = ManagedLedgerConfig(managed_ledger_max_entries_per_ledger=100,
                              managed_ledger_min_ledger_rollover_time_minutes=0,
                              managed_ledger_default_ensemble_size=2,
                              managed_ledger_default_write_quorum=2,
                              managed_ledger_default_ack_quorum=2)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


async def test_managed_ledger_rollover_restart_and_cursor_recovery(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(2)]
    addrs = [b.address for b in bookies]
    bk = BookKeeper(meta, addrs)
    factory = ManagedLedgerFactory(meta, bk, small_config())
    ml = await factory.open("public/default/persistent/t1")
    cursor = await ml.open_cursor("sub", initial_position="earliest")
    positions = await asyncio.gather(*(ml.add_entry_nowait(b"m%d" % i) for i in range(350)))
    assert positions == sorted(positions)
    assert len({p.ledger_id for p in positions}) == 4  # 100 entries per ledger
    entries = await cursor.read_entries(1000)
    assert [e.data for e in entries] == [b"m%d" % i for i in range(350)]
    # Cumulative ack of the first 120, every other one of the next 100, a batch index ack.
    await cursor.mark_delete(positions[119])
    await cursor.delete(positions[120:220:2])
    await cursor.delete_batch_index_nowait(positions[300], 10, [0, 3, 5])
    assert cursor.mark_delete_position == positions[120]
    backlog_before = cursor.number_of_entries_in_backlog()
    assert backlog_before == 350 - 121 - 49
    # Crash: nothing is closed; a new "broker" opens everything again.
    await bk.close()
    bk2 = BookKeeper(meta, addrs)
    factory2 = ManagedLedgerFactory(meta, bk2, small_config())
    try:
        ml2 = await factory2.open("public/default/persistent/t1")
        assert ml2.last_confirmed == positions[-1]
        c2 = ml2.cursors["sub"]
        assert c2.mark_delete_position == cursor.mark_delete_position
        assert sorted(c2.individual_deleted.ranges()) == sorted(cursor.individual_deleted.ranges())
        assert c2.batch_deleted.unacked_indexes(positions[300]) == [1, 2, 4, 6, 7, 8, 9]
        assert c2.number_of_entries_in_backlog() == backlog_before
        redelivered = await c2.read_entries(1000)
        acked = set(positions[:121]) | set(positions[120:220:2])
        assert [e.position for e in redelivered] == [p for p in positions if p not in acked]
        # New writes go to a new ledger after the recovered ones.
        p = await ml2.add_entry(b"after restart")
        assert p.ledger_id > positions[-1].ledger_id
        more = await c2.read_entries(10)
        assert [e.data for e in more] == [b"after restart"]
    finally:
        await factory2.close()
        await bk2.close()


async def test_cursor_pip81_segmented_persistence(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(2)]
    addrs = [b.address for b in bookies]
    # Entries of at most 64 KiB + 6 KiB: the hole state must be split over segments.
    cfg = small_config(managed_ledger_max_entries_per_ledger=20000, max_entry_size_bytes=70 * 1024)
    bk = BookKeeper(meta, addrs)
    factory = ManagedLedgerFactory(meta, bk, cfg)
    ml = await factory.open("t/ns/persistent/holes")
    cursor = await ml.open_cursor("sub", initial_position="earliest")
    positions = []
    for _ in range(3):  # three ledgers of 20,000 entries
        positions += await asyncio.gather(*(ml.add_entry_nowait(b"x") for _ in range(20000)))
    # Every 3rd acknowledged, scattered so roaring cannot compress into runs.
    acked = positions[1::3]
    await cursor.delete(acked)
    full_bytes = cursor.last_persist_bytes
    assert full_bytes > 6 * 1024  # did not fit one entry: segments + index
    # Change one ledger's holes only: just that ledger's segment is rewritten.
    await cursor.delete([positions[2]])
    assert cursor.last_persist_bytes < full_bytes
    await bk.close()
    bk2 = BookKeeper(meta, addrs)
    factory2 = ManagedLedgerFactory(meta, bk2, cfg)
    try:
        ml2 = await factory2.open("t/ns/persistent/holes")
        c2 = ml2.cursors["sub"]
        assert c2.mark_delete_position == cursor.mark_delete_position
        assert sorted(c2.individual_deleted.ranges()) == sorted(cursor.individual_deleted.ranges())
    finally:
        await factory2.close()
        await bk2.close()


async def test_consumed_ledgers_are_trimmed(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(2)]
    bk = BookKeeper(meta, [b.address for b in bookies])
    factory = ManagedLedgerFactory(meta, bk, small_config())
    try:
        ml = await factory.open("public/default/persistent/trim")
        cursor = await ml.open_cursor("sub", initial_position="earliest")
        positions = await asyncio.gather(*(ml.add_entry_nowait(b"m") for _ in range(250)))
        first_ledgers = sorted({p.ledger_id for p in positions})
        await cursor.mark_delete(positions[-1])
        path = f"/ledgers/L{first_ledgers[0]:012d}"
        for _ in range(100):
            if first_ledgers[0] not in ml.ledgers and not await meta.exists(path):
                break
            await asyncio.sleep(0.05)
        assert first_ledgers[0] not in ml.ledgers
        assert not await meta.exists(f"/ledgers/L{first_ledgers[0]:012d}")
        assert positions[-1].ledger_id in ml.ledgers  # the current ledger stays
    finally:
        await factory.close()
        await bk.close()


async def test_cursor_mark_delete_rate_limit_defers_persists_but_flush_does_not_wait(bookie_factory, meta):
    """managedLedgerDefaultMarkDeleteRateLimit (replicator cursors): acks between persists stay in
    memory and go out together; flush() persists at once; the final state recovers."""
    bookies = [bookie_factory() for _ in range(2)]
    addrs = [b.address for b in bookies]
    bk = BookKeeper(meta, addrs)
    factory = ManagedLedgerFactory(meta, bk, small_config())
    ml = await factory.open("t/ns/persistent/rate-limited")
    cursor = await ml.open_cursor("pulsar.repl.b", initial_position="earliest")
    positions = await asyncio.gather(*(ml.add_entry_nowait(b"x") for _ in range(40)))
    await cursor.delete([positions[0]])  # first persist (opens the cursor ledger)
    cursor.mark_delete_rate_limit = 1.0  # at most one persist per second
    base = cursor._cursor_ledger.last_add_pushed
    await cursor.delete([positions[1]])  # persists at once: none in the last second... or waits <= 1 s
    after_first = cursor._cursor_ledger.last_add_pushed
    futures = [cursor.delete_nowait([p]) for p in positions[2:39:2]]  # 19 acks, with holes
    await asyncio.sleep(0.2)
    assert cursor._cursor_ledger.last_add_pushed == after_first  # held back by the limit
    assert not any(f.done() for f in futures)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await cursor.flush()
    assert loop.time() - t0 < 0.5  # flush does not wait for the limit
    assert all(f.done() and f.exception() is None for f in futures)
    assert cursor._cursor_ledger.last_add_pushed - after_first == 1  # 19 acks, one persist
    assert after_first - base <= 1
    expected_md = cursor.mark_delete_position
    expected_holes = sorted(cursor.individual_deleted.ranges())
    await bk.close()
    bk2 = BookKeeper(meta, addrs)
    factory2 = ManagedLedgerFactory(meta, bk2, small_config())
    try:
        ml2 = await factory2.open("t/ns/persistent/rate-limited")
        c2 = ml2.cursors["pulsar.repl.b"]
        assert c2.mark_delete_position == expected_md == positions[2]
        assert sorted(c2.individual_deleted.ranges()) == expected_holes and expected_holes
    finally:
        await factory2.close()
        await bk2.close()



async def test_cursor_read_failing_in_a_later_ledger_returns_what_it_read(bookie_factory, meta):
    """A cursor read crossing ledgers whose later ledger cannot be read (its only bookie
    killed) returns the entries of the earlier ledger and leaves the read position at the
    failed one (Pulsar's OpReadEntry.readEntriesFailed): the next read fails there, and once
    the bookie is back it returns the rest. Before, the read raised after moving the read
    position past the entries it had read, and the dispatcher never sent them."""
    bookies = [bookie_factory() for _ in range(2)]
    addrs = [b.address for b in bookies]
    cfg = small_config(managed_ledger_max_entries_per_ledger=10, managed_ledger_default_ensemble_size=1,
                       managed_ledger_default_write_quorum=1, managed_ledger_default_ack_quorum=1)
    name = "public/default/persistent/read-fails-later"
    bk = BookKeeper(meta, addrs)
    factory = ManagedLedgerFactory(meta, bk, cfg)
    ml = await factory.open(name)
    await ml.open_cursor("sub", initial_position="earliest")
    positions = [await ml.add_entry(b"m%d" % i) for i in range(40)]
    ledgers = sorted({p.ledger_id for p in positions})
    bookie_of = {lid: (await bk.open_ledger(lid, recovery=False)).ensemble[0] for lid in ledgers}
    await factory.close()
    await bk.close()
    # two consecutive ledgers on different bookies (E=1: the writer rotates its start)
    first, second = next((a, b) for a, b in zip(ledgers, ledgers[1:]) if bookie_of[a] != bookie_of[b])
    bk2 = BookKeeper(meta, addrs)                     # a fresh broker: nothing cached
    factory2 = ManagedLedgerFactory(meta, bk2, cfg)
    try:
        ml2 = await factory2.open(name)
        cursor = ml2.cursors["sub"]
        before_first = [p for p in positions if p.ledger_id < first]
        if before_first:
            await cursor.mark_delete(before_first[-1])
        victim = next(b for b in bookies if b.address == bookie_of[second])
        victim.kill()
        got = await cursor.read_entries(1000)
        assert [e.position for e in got] == [p for p in positions if p.ledger_id == first]
        assert [e.data for e in got] == [b"m%d" % positions.index(e.position) for e in got]
        assert cursor.read_position == Position(second, 0)
        with pytest.raises(Exception):
            await cursor.read_entries(1000)
        assert cursor.read_position == Position(second, 0)   # a failed read does not move it
        same_port(victim)
        rest = None
        for _ in range(200):
            try:
                rest = await cursor.read_entries(1000)
                break
            except Exception:   # the bookie client's backoff after the kill
                await asyncio.sleep(0.1)
        assert rest is not None, "the restarted bookie never served the read"
        assert [e.position for e in rest][:10] == [p for p in positions if p.ledger_id == second]
    finally:
        await factory2.close()
        await bk2.close()
