"""Durability of the managed ledger and cursor when bookies fail (real bookie
processes, killed or paused; the managed ledger runs in the test process).

Each test pins one rule of BookKeeper/Pulsar and fails on the code before it:

* trimming: only closed ledgers with a known entry count, behind every durable
  cursor's *persisted* mark-delete (``ManagedLedgerImpl.internalTrimConsumedLedgers``);
* a write error is invisible to producers: the failed ledger is closed at the
  writer's LastAddConfirmed and the pending adds are resubmitted to a new ledger
  (``ManagedLedgerImpl.ledgerClosed``, ``OpAddEntry.handleAddFailure``);
* a failed cursor-ledger write persists the position to the metadata store and
  acknowledgments are confirmed only once durable (``ManagedCursorImpl``);
* cursor recovery falls back to the metadata snapshot only when the cursor
  ledger does not exist (``ManagedCursorImpl.recoverFromLedger``);
* the metadata record always names the cursor ledger holding the state; close
  does not hang while bookies are missing; reset to a position that is not an
  entry is refused.
"""
from __future__ import annotations

from tests.procs import restart_bookie_same_port

import asyncio
import os
import signal

import pytest

from bookie.client import BookKeeper
from broker.ledger.managed_cursor import InvalidCursorPosition, ManagedCursorError
from broker.ledger.errors import ManagedLedgerClosedError
from broker.ledger.factory import ManagedLedgerFactory
from broker.ledger.ml_config import ManagedLedgerConfig
from broker.ledger.position import Position
from proto import metadata_pb2


same_port = restart_bookie_same_port


def config(**kw) -> ManagedLedgerConfig:
    cfg = ManagedLedgerConfig(managed_ledger_max_entries_per_ledger=100,
                              managed_ledger_min_ledger_rollover_time_minutes=0,
                              managed_ledger_default_ensemble_size=2,
                              managed_ledger_default_write_quorum=2,
                              managed_ledger_default_ack_quorum=2)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg




async def _open(meta, addresses, name, cfg=None, **bk_options):
    bk = BookKeeper(meta, addresses, **bk_options)
    factory = ManagedLedgerFactory(meta, bk, cfg or config())
    return bk, factory, await factory.open(name)


async def _read_all(cursor, expect: int, timeout_s: float = 20.0) -> list:
    out = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(out) < expect and asyncio.get_running_loop().time() < deadline:
        out += await cursor.read_entries_or_wait(1000, timeout=0.5)
    return out


async def test_failed_ledger_with_unconsumed_entries_is_not_trimmed(bookie_factory, meta):
    """The user's report: defaults E=Qw=Qa=2 on two bookies, 1,000 messages stored, one bookie
    SIGKILLed, the first message acknowledged: the ledger holding the other 999 must survive
    (it was deleted as 'consumed': its entry count was still 0 after the failure)."""
    bookies = [bookie_factory() for _ in range(2)]
    addrs = [b.address for b in bookies]
    bk, factory, ml = await _open(meta, addrs, "public/default/persistent/trim-failed",
                                  config(managed_ledger_max_entries_per_ledger=50_000))
    try:
        cursor = await ml.open_cursor("sub", initial_position="earliest")
        positions = await asyncio.gather(*(ml.add_entry_nowait(b"m%d" % i) for i in range(1000)))
        data_ledger = positions[0].ledger_id
        bookies[1].kill()
        pending = ml.add_entry_nowait(b"during the outage")   # fails the ledger; waits for a new one
        await asyncio.sleep(1.0)
        assert not pending.done()
        first = (await cursor.read_entries(1))[0]
        await cursor.mark_delete(first.position)               # durable (metadata store fallback)
        ml.schedule_trim()
        await asyncio.sleep(0.5)
        assert data_ledger in ml.ledgers, "a ledger with 999 unconsumed entries was trimmed"
        assert await meta.exists(f"/ledgers/L{data_ledger:012d}")
        bookies[1] = same_port(bookies[1])
        pos = await asyncio.wait_for(pending, 30)
        assert pos.ledger_id > data_ledger
        got = await _read_all(cursor, 1000)
        assert [e.data for e in got] == [b"m%d" % i for i in range(1, 1000)] + [b"during the outage"]
    finally:
        await factory.close()
        await bk.close()


async def test_write_error_is_invisible_and_nothing_is_stored_twice(bookie_factory, meta):
    """A bookie SIGKILLed under load with no spare: no add fails; the failed ledger is closed at
    the writer's LAC and the unconfirmed adds land once, in order, on the next ledger. Before,
    they were failed to the caller and then revived by the recovery of the failed ledger, so a
    caller's resend was stored twice."""
    bookies = [bookie_factory() for _ in range(2)]
    addrs = [b.address for b in bookies]
    bk, factory, ml = await _open(meta, addrs, "public/default/persistent/no-dups",
                                  config(managed_ledger_max_entries_per_ledger=50_000))
    try:
        cursor = await ml.open_cursor("sub", initial_position="earliest")
        total = 10_000
        results: dict[int, Position] = {}
        resent = 0

        async def producer():
            nonlocal resent
            for start in range(0, total, 100):
                batch = {i: ml.add_entry_nowait(b"m%06d" % i) for i in range(start, start + 100)}
                for i, fut in batch.items():
                    try:
                        results[i] = await fut
                    except Exception:
                        resent += 1                     # what a client does with a failed send
                        results[i] = await ml.add_entry(b"m%06d" % i)
                await asyncio.sleep(0.02)           # ~4 s of sends: the kill lands mid-way

        task = asyncio.create_task(producer())
        await asyncio.sleep(0.5)
        assert not task.done()
        bookies[0].kill()
        await asyncio.sleep(1.5)
        bookies[0] = same_port(bookies[0])
        await asyncio.wait_for(task, 60)
        assert resent == 0, f"{resent} adds failed to the caller"
        positions = [results[i] for i in range(total)]
        assert positions == sorted(positions)              # completion order = call order
        got = await _read_all(cursor, total)
        assert [e.data for e in got] == [b"m%06d" % i for i in range(total)]
        assert len(ml.ledgers) >= 2                          # the failed ledger was closed, writes moved on
    finally:
        await factory.close()
        await bk.close()


async def test_failed_ledger_is_closed_at_the_writers_lac(bookie_factory, meta):
    """The failed ledger is CLOSED in metadata at the writer's LastAddConfirmed right away,
    so no later recovery can revive an add that was resubmitted elsewhere."""
    bookies = [bookie_factory() for _ in range(2)]
    bk, factory, ml = await _open(meta, [b.address for b in bookies], "public/default/persistent/closed-at-lac")
    try:
        first = await asyncio.gather(*(ml.add_entry_nowait(b"a%d" % i) for i in range(30)))
        failed_ledger = first[0].ledger_id
        bookies[1].kill()
        pending = [ml.add_entry_nowait(b"b%d" % i) for i in range(5)]
        for _ in range(100):
            res = await meta.get(f"/ledgers/L{failed_ledger:012d}")
            md = metadata_pb2.LedgerMetadata.FromString(res.value)
            if md.state == md.CLOSED:
                break
            await asyncio.sleep(0.05)
        assert md.state == md.CLOSED and md.last_entry_id == 29
        assert ml.ledgers[failed_ledger].entries == 30
        assert not any(f.done() for f in pending)
        bookies[1] = same_port(bookies[1])
        later = await asyncio.wait_for(asyncio.gather(*pending), 30)
        assert all(p.ledger_id > failed_ledger for p in later)
    finally:
        await factory.close()
        await bk.close()


async def test_failed_cursor_ledger_write_persists_acks_to_the_metadata_store(bookie_factory, meta):
    """One bookie gone (no spare): the cursor ledger cannot be written. The acknowledgment goes
    to the metadata store (cursorsLedgerId -1) and is confirmed; after a clean restart it holds.
    Before, the persist failed, the retried ack was answered from memory, and the restart
    redelivered it."""
    bookies = [bookie_factory() for _ in range(2)]
    addrs = [b.address for b in bookies]
    name = "public/default/persistent/cursor-fallback"
    bk, factory, ml = await _open(meta, addrs, name)
    cursor = await ml.open_cursor("sub", initial_position="earliest")
    positions = await asyncio.gather(*(ml.add_entry_nowait(b"m%d" % i) for i in range(60)))
    await cursor.delete([positions[0]])                  # the cursor ledger exists now
    bookies[0].kill()
    await cursor.mark_delete(positions[9])               # durable although no ledger can be written
    await cursor.delete([positions[20], positions[22]])
    info = metadata_pb2.ManagedCursorInfo.FromString((await meta.get(cursor.path)).value)
    assert info.cursorsLedgerId == -1
    assert (info.markDeleteLedgerId, info.markDeleteEntryId) == tuple(positions[9])
    await cursor.delete([positions[20]])                 # a retried ack: durable, answered at once
    bookies[0] = same_port(bookies[0])
    await factory.close()                                # clean broker stop
    await bk.close()
    bk2, factory2, ml2 = await _open(meta, addrs, name)
    try:
        c2 = ml2.cursors["sub"]
        assert c2.mark_delete_position == positions[9]
        redelivered = [e.position for e in await c2.read_entries(100)]
        assert redelivered == [p for p in positions[10:] if p not in (positions[20], positions[22])]
        await c2.mark_delete(positions[30])              # and a new cursor ledger is used again
        info = metadata_pb2.ManagedCursorInfo.FromString((await meta.get(c2.path)).value)
        assert info.cursorsLedgerId >= 0
    finally:
        await factory2.close()
        await bk2.close()


async def test_ack_is_not_confirmed_while_nothing_can_persist_it(bookie_factory, meta, monkeypatch):
    """Neither the cursor ledger nor the metadata store takes the state: the ack fails, and a
    retry is not answered from memory as if it were durable."""
    bookies = [bookie_factory() for _ in range(2)]
    bk, factory, ml = await _open(meta, [b.address for b in bookies], "public/default/persistent/no-persist")
    try:
        cursor = await ml.open_cursor("sub", initial_position="earliest")
        positions = await asyncio.gather(*(ml.add_entry_nowait(b"m%d" % i) for i in range(10)))
        await cursor.delete([positions[0]])
        bookies[0].kill()
        real_put = meta.put

        async def failing_put(path, value, expected_version=None):
            if path == cursor.path:
                raise OSError("metadata store unavailable (injected)")
            return await real_put(path, value, expected_version)

        monkeypatch.setattr(meta, "put", failing_put)
        with pytest.raises(ManagedCursorError):
            await cursor.delete([positions[1]])
        with pytest.raises(ManagedCursorError):            # retried: still not durable
            await cursor.delete([positions[1]])
        monkeypatch.setattr(meta, "put", real_put)
        await cursor.delete([positions[1]])                # now it is
        info = metadata_pb2.ManagedCursorInfo.FromString((await meta.get(cursor.path)).value)
        assert (info.markDeleteLedgerId, info.markDeleteEntryId) == tuple(positions[1])
    finally:
        bookies[0] = same_port(bookies[0])
        await factory.close()
        await bk.close()


@pytest.mark.parametrize("spare", [False, True], ids=["no-spare", "spare"])
async def test_cursor_recovery_with_a_bookie_down_never_rolls_back(bookie_factory, meta, spare):
    """Broker crash, then one bookie of the cursor ledger's ensemble is down at restart.
    Without a spare bookie known to the restarted broker, the cursor ledger cannot be
    recovered (its last entry needs Qa copies): the topic load fails and is retried, and
    once the bookie is back every confirmed ack is there. Before, recovery fell back to the
    stale metadata position, wrote it to a new cursor ledger and deleted the old one: the
    acknowledgments were gone for good. With a spare, recovery replaces the dead bookie
    (an ensemble change during recovery) and the topic loads at once with every ack."""
    bookies = [bookie_factory() for _ in range(3)]
    addrs = [b.address for b in bookies]
    name = "public/default/persistent/cursor-recovery"
    cfg = config(managed_ledger_cursor_max_entries_per_ledger=3)
    bk, factory, ml = await _open(meta, addrs, name, cfg)
    cursor = await ml.open_cursor("sub", initial_position="earliest")
    positions = await asyncio.gather(*(ml.add_entry_nowait(b"m%d" % i) for i in range(50)))
    victim = None
    for i in range(40):
        await cursor.mark_delete(positions[i])
        spare_in_cursor = set(cursor._cursor_ledger.ensemble) - set(ml.current.ensemble)
        if spare_in_cursor and cursor._cursor_ledger.last_add_pushed >= 1:
            victim = next(b for b in bookies if b.address in spare_in_cursor)
            break
    assert victim is not None, "could not get a cursor ledger on a bookie outside the data ledger"
    confirmed = cursor.mark_delete_position
    cursor_ensemble = list(cursor._cursor_ledger.ensemble)
    await bk.close()                                       # broker crash: nothing closed
    victim.kill()
    # The bookies the restarted broker places ledgers on: with no spare, only the cursor
    # ledger's ensemble (the data ledger's other bookie is still reachable by address).
    bk2 = BookKeeper(meta, addrs if spare else cursor_ensemble)
    factory2 = ManagedLedgerFactory(meta, bk2, cfg)
    try:
        if spare:
            ml2 = await factory2.open(name)
            assert ml2.cursors["sub"].mark_delete_position == confirmed
            await factory2.close()
            return
        with pytest.raises(Exception):
            await factory2.open(name)
        info = metadata_pb2.ManagedCursorInfo.FromString((await meta.get(f"/managed-ledgers/{name}/sub")).value)
        assert await meta.exists(f"/ledgers/L{info.cursorsLedgerId:012d}"), "old cursor ledger deleted"
        same_port(victim)
        for attempt in range(50):                        # the broker retries the load on the next lookup
            try:
                ml2 = await factory2.open(name)
                break
            except Exception:
                if attempt == 49:
                    raise
                await asyncio.sleep(0.2)
        assert ml2.cursors["sub"].mark_delete_position == confirmed
        await factory2.close()
    finally:
        await bk2.close()


async def test_cursor_info_names_the_cursor_ledger_after_concurrent_property_writes(bookie_factory, meta):
    """set_cursor_properties racing cursor-ledger switches: the metadata record must always
    name the ledger the state is written to, so a crash never recovers a stale ledger."""
    bookies = [bookie_factory() for _ in range(2)]
    addrs = [b.address for b in bookies]
    name = "public/default/persistent/cursor-race"
    cfg = config(managed_ledger_cursor_max_entries_per_ledger=2)   # a switch every other persist
    bk, factory, ml = await _open(meta, addrs, name, cfg)
    cursor = await ml.open_cursor("sub", initial_position="earliest")
    positions = await asyncio.gather(*(ml.add_entry_nowait(b"m%d" % i) for i in range(40)))
    stop = False

    async def flip_properties():
        n = 0
        while not stop:
            await cursor.set_cursor_properties({"replicated": str(n % 2)})
            n += 1

    flipper = asyncio.create_task(flip_properties())
    for i in range(30):
        await cursor.mark_delete(positions[i])
    stop = True
    await flipper                                          # no write lost a version race
    await cursor.set_cursor_properties({"replicated": "1"})
    info = metadata_pb2.ManagedCursorInfo.FromString((await meta.get(cursor.path)).value)
    assert info.cursorsLedgerId == cursor._cursor_ledger.ledger_id
    await bk.close()                                       # crash
    bk2, factory2, ml2 = await _open(meta, addrs, name, cfg)
    try:
        assert ml2.cursors["sub"].mark_delete_position == positions[29]
        assert ml2.cursors["sub"].cursor_properties == {"replicated": "1"}
    finally:
        await factory2.close()
        await bk2.close()


async def test_close_does_not_hang_while_no_ledger_can_be_created(bookie_factory, meta):
    """Unload while a rollover waits for bookies: close returns, the waiting add fails with
    ManagedLedgerClosedError (it was stored nowhere). Before, close waited forever."""
    bookies = [bookie_factory() for _ in range(2)]
    bk, factory, ml = await _open(meta, [b.address for b in bookies], "public/default/persistent/close-hang")
    try:
        await asyncio.gather(*(ml.add_entry_nowait(b"m%d" % i) for i in range(10)))
        bookies[1].kill()
        pending = ml.add_entry_nowait(b"waits for a ledger")
        await asyncio.sleep(1.0)
        await asyncio.wait_for(ml.close(), 10)
        with pytest.raises(ManagedLedgerClosedError):
            await pending
    finally:
        bookies[1] = same_port(bookies[1])
        await factory.close()
        await bk.close()


async def test_reset_to_a_position_that_is_not_an_entry_is_refused(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(2)]
    bk, factory, ml = await _open(meta, [b.address for b in bookies], "public/default/persistent/reset")
    try:
        cursor = await ml.open_cursor("sub", initial_position="earliest")
        positions = await asyncio.gather(*(ml.add_entry_nowait(b"m%d" % i) for i in range(10)))
        await cursor.mark_delete(positions[4])
        for bad in (Position(positions[0].ledger_id, 999_999), Position(positions[0].ledger_id + 50, 0)):
            with pytest.raises(InvalidCursorPosition):
                cursor.reset(bad)
        assert cursor.mark_delete_position == positions[4]        # unchanged
        await cursor.reset(Position(-1, -1))                      # earliest: the first entry
        assert cursor.read_position == positions[0]
        await cursor.reset(Position(positions[-1].ledger_id, positions[-1].entry_id + 1))  # end
        assert await cursor.read_entries(10) == []
    finally:
        await factory.close()
        await bk.close()


async def test_paused_bookie_without_spare_neither_loses_nor_duplicates(bookie_factory, meta):
    """SIGSTOP one of two bookies under load: the adds to it time out, the ledger is closed at
    its LAC, and once the bookie answers again every add is stored exactly once."""
    bookies = [bookie_factory() for _ in range(2)]
    addrs = [b.address for b in bookies]
    bk = BookKeeper(meta, addrs, add_entry_timeout_s=1.0)
    factory = ManagedLedgerFactory(meta, bk, config(managed_ledger_max_entries_per_ledger=50_000))
    ml = await factory.open("public/default/persistent/paused")
    try:
        cursor = await ml.open_cursor("sub", initial_position="earliest")
        futures = [ml.add_entry_nowait(b"a%d" % i) for i in range(200)]
        await asyncio.sleep(0.2)
        os.kill(bookies[1].pid, signal.SIGSTOP)
        futures += [ml.add_entry_nowait(b"b%d" % i) for i in range(200)]
        await asyncio.sleep(3.0)
        os.kill(bookies[1].pid, signal.SIGCONT)
        positions = await asyncio.wait_for(asyncio.gather(*futures), 60)
        assert positions == sorted(positions)
        got = await _read_all(cursor, 400)
        assert [e.data for e in got] == [b"a%d" % i for i in range(200)] + [b"b%d" % i for i in range(200)]
    finally:
        try:
            os.kill(bookies[1].pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        await factory.close()
        await bk.close()

