"""Durability rules of the bookie client against real bookie processes (SIGSTOP,
SIGKILL, injected error statuses, recovery with bookies down).

Promise (DESIGN.md): an acknowledged entry survives while Qa bookies of its write
set live. Rules, from BookKeeper: an entry completes only with Qa acks of its
CURRENT write set (PendingAddOp, AckSet.removeBookieAndCheck); a bookie error is
a bookie failure (ensemble change), once per bookie; an unanswered add times out
(addEntryTimeout); recovery says "absent" only on Qw-Qa+1 "no such entry"
answers and floors the LAC at the last fragment's start (LedgerRecoveryOp,
BOOKKEEPER #2615).
"""
from __future__ import annotations

from tests.procs import restart_bookie_same_port

import asyncio
import collections
import os
import signal
import time

import pytest

from bookie.client import BookieConnection, BookKeeper, ledger_path
from bookie.errors import BookieUnavailableError, NotEnoughBookiesError
from proto import bookie_pb2 as pb
from proto import metadata_pb2
from tests.faulty_bookie import start_faulty_bookie

pytestmark = pytest.mark.timeout(180)

State = metadata_pb2.LedgerMetadata.State


same_port = restart_bookie_same_port




async def stored(bk: BookKeeper, address: str, ledger_id: int, entry_id: int) -> bytes | None:
    """The entry as stored on one bookie, None when that bookie does not have it."""
    try:
        return (await bk.connection(address).read_entries(ledger_id, entry_id, entry_id))[0]
    except Exception:
        return None


async def wait_stored(bk: BookKeeper, address: str, ledger_id: int, entry_ids, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    for e in entry_ids:
        while await stored(bk, address, ledger_id, e) is None:
            assert time.monotonic() < deadline, f"entry {ledger_id}:{e} never reached {address}"
            await asyncio.sleep(0.02)


async def add_direct(bk: BookKeeper, address: str, ledger_id: int, master_key: bytes, entry_id: int,
                     payload: bytes, lac: int) -> None:
    """One add straight to one bookie (what a writer's request to that bookie is)."""
    fut = asyncio.get_running_loop().create_future()
    bk.connection(address).add(pb.AddEntryRequest(ledger_id=ledger_id, entry_id=entry_id, master_key=master_key,
                                                  payload=payload, last_add_confirmed=lac),
                               lambda status, message: fut.set_result((status, message)))
    assert await fut == (pb.EOK, "")


async def retry_while_unavailable(make_call, timeout_s: float = 30.0):
    """``await make_call()`` until it does not raise BookieUnavailableError (a bookie that
    just came back may still be in gRPC's reconnect backoff for a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await make_call()
        except BookieUnavailableError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)


async def assert_on_write_sets(bk: BookKeeper, lh, payloads: dict[int, bytes]) -> None:
    """Every entry is stored on EVERY bookie of its write set in the ledger's metadata."""
    for e, payload in payloads.items():
        for address in lh.write_set(e):
            assert await stored(bk, address, lh.ledger_id, e) == payload, f"entry {e} missing on {address}"


async def test_ack_of_a_replaced_bookie_does_not_count(bookie_factory, meta):
    """E=3 Qw=2 Qa=2: entry 0 acked by A, then A is replaced by D. Entry 0 must wait for
    B (its current write set is [D, B]) instead of completing on {A, D} with one live copy."""
    bookies = [bookie_factory() for _ in range(4)]
    by_addr = {b.address: b for b in bookies}
    bk = BookKeeper(meta, [b.address for b in bookies[:3]], add_entry_timeout_s=120)
    stopped = []
    try:
        lh = await bk.create_ledger(3, 2, 2)
        spare = bookies[3]
        bk.bookies.append(spare.address)
        a, b, c = (by_addr[x] for x in lh.ensemble)
        # write sets: entry 0 -> [A, B], entry 1 -> [B, C], entry 2 -> [C, A]
        os.kill(b.pid, signal.SIGSTOP)
        stopped.append(b)
        f0 = lh.add_entry_nowait(b"e0")
        await wait_stored(bk, a.address, lh.ledger_id, [0])       # A acked entry 0
        os.kill(a.pid, signal.SIGSTOP)
        f1 = lh.add_entry_nowait(b"e1")
        f2 = lh.add_entry_nowait(b"e2")
        await wait_stored(bk, c.address, lh.ledger_id, [1, 2])    # C acked entries 1 and 2
        a.kill()  # A's stream breaks with entry 2 unanswered: ensemble change A -> D
        deadline = time.monotonic() + 10
        while spare.address not in lh.ensemble:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert a.address not in lh.ensemble
        await wait_stored(bk, spare.address, lh.ledger_id, [0, 2])  # D acked the re-sent entries
        await asyncio.sleep(0.3)
        # Entry 0 is on D only among its write set [D, B]: it must not be acknowledged.
        assert not f0.done(), "entry 0 completed with the ack of a replaced bookie"
        assert lh.last_add_confirmed == -1
        os.kill(b.pid, signal.SIGCONT)
        stopped.remove(b)
        assert await asyncio.wait_for(asyncio.gather(f0, f1, f2), 20) == [0, 1, 2]
        await assert_on_write_sets(bk, lh, {0: b"e0", 1: b"e1", 2: b"e2"})
        await lh.close()
    finally:
        for p in stopped:
            os.kill(p.pid, signal.SIGCONT)
        await bk.close()


@pytest.mark.parametrize("status", ["E_BOOKIE_ERROR", "E_DUPLICATE_ENTRY"])
async def test_bookie_error_status_leads_to_an_ensemble_change(bookie_factory, meta, tmp_path, process_tracker,
                                                               status):
    """A bookie answering adds with an error status is replaced; every add succeeds."""
    faulty = start_faulty_bookie(tmp_path / "faulty", fail_status=status, fail_first=5, tracker=process_tracker)
    good = [bookie_factory() for _ in range(2)]
    spare = bookie_factory()
    bk = BookKeeper(meta, [faulty.address] + [g.address for g in good])
    try:
        lh = await bk.create_ledger(3, 2, 2)  # 3 bookies known: the faulty one is in the ensemble
        bk.bookies.append(spare.address)
        payloads = {i: b"x%d" % i for i in range(200)}
        ids = await asyncio.wait_for(asyncio.gather(*(lh.add_entry_nowait(p) for p in payloads.values())), 30)
        assert ids == list(payloads)
        assert faulty.address not in lh.ensemble and spare.address in lh.ensemble
        assert lh.ensemble_changes == 1
        await assert_on_write_sets(bk, lh, payloads)
        await lh.close()
        ro = await bk.open_ledger(lh.ledger_id)
        assert ro.last_add_confirmed == 199
        assert await ro.read_entries(0, 199) == list(payloads.values())
    finally:
        await bk.close()


async def test_one_bookie_failure_resends_each_pending_entry_once(bookie_factory, meta, monkeypatch):
    """2,000 adds pending on a stopped bookie that then dies: one ensemble change, and each
    entry is sent to its write set once plus at most once more (to the replacement)."""
    bookies = [bookie_factory() for _ in range(4)]
    by_addr = {b.address: b for b in bookies}
    bk = BookKeeper(meta, [b.address for b in bookies[:3]], add_entry_timeout_s=120)
    try:
        lh = await bk.create_ledger(3, 2, 2)
        bk.bookies.append(bookies[3].address)
        for i in range(10):
            await lh.add_entry(b"warm%d" % i)
        sends: collections.Counter = collections.Counter()
        real_enqueue = BookieConnection._enqueue

        def counting_enqueue(self, framed, ledger_id, entry_id, fn, arg):
            if ledger_id == lh.ledger_id:
                sends[entry_id] += 1
            return real_enqueue(self, framed, ledger_id, entry_id, fn, arg)

        monkeypatch.setattr(BookieConnection, "_enqueue", counting_enqueue)
        victim = by_addr[lh.ensemble[0]]
        os.kill(victim.pid, signal.SIGSTOP)
        n = 2000
        futures = [lh.add_entry_nowait(b"p%d" % i) for i in range(n)]
        await asyncio.sleep(0.5)
        assert lh.last_add_confirmed < 10 + n - 1  # entries wait on the stopped bookie
        victim.kill()
        ids = await asyncio.wait_for(asyncio.gather(*futures), 60)
        assert ids == list(range(10, 10 + n))
        qw = 2
        per_entry = [sends[e] for e in range(10, 10 + n)]
        assert max(per_entry) <= qw + 1, f"an entry was sent {max(per_entry)} times"
        resent = sum(per_entry) - qw * n
        assert resent == lh.entries_resent <= n
        assert lh.ensemble_changes == 1 and len(lh.metadata.fragments) == 2
        assert victim.address not in lh.ensemble
        await lh.close()
        ro = await bk.open_ledger(lh.ledger_id)
        assert await ro.read_entries(10, 10 + n - 1) == [b"p%d" % i for i in range(n)]
    finally:
        await bk.close()


async def test_sigstopped_bookie_is_replaced_after_the_add_timeout(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(3)]
    by_addr = {b.address: b for b in bookies}
    bk = BookKeeper(meta, [b.address for b in bookies[:2]], add_entry_timeout_s=1.0)
    victim = None
    try:
        lh = await bk.create_ledger(2, 2, 2)
        bk.bookies.append(bookies[2].address)
        for i in range(10):
            await lh.add_entry(b"a%d" % i)
        victim = by_addr[lh.ensemble[0]]
        os.kill(victim.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        ids = await asyncio.wait_for(asyncio.gather(*(lh.add_entry_nowait(b"b%d" % i) for i in range(100))), 20)
        elapsed = time.monotonic() - t0
        assert ids == list(range(10, 110))
        assert 1.0 <= elapsed < 10, elapsed
        assert victim.address not in lh.ensemble and bookies[2].address in lh.ensemble
        await lh.close()
        ro = await bk.open_ledger(lh.ledger_id)
        assert ro.last_add_confirmed == 109
        assert await ro.read_entries(0, 109) == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(100)]
    finally:
        if victim is not None:
            os.kill(victim.pid, signal.SIGCONT)
        await bk.close()


async def test_sigstopped_bookie_without_spare_fails_the_ledger_and_close_needs_no_bookie(bookie_factory, meta):
    """No spare: the adds fail (NotEnoughBookiesError) after the add timeout; close() writes
    CLOSED at the writer's LAC while the bookie is still stopped; nothing moves the LAC later."""
    bookies = [bookie_factory() for _ in range(2)]
    bk = BookKeeper(meta, [b.address for b in bookies], add_entry_timeout_s=1.0)
    victim = None
    try:
        lh = await bk.create_ledger(2, 2, 2)
        for i in range(10):
            await lh.add_entry(b"a%d" % i)
        victim = next(b for b in bookies if b.address == lh.ensemble[0])
        os.kill(victim.pid, signal.SIGSTOP)
        results = await asyncio.wait_for(
            asyncio.gather(*(lh.add_entry_nowait(b"b%d" % i) for i in range(20)), return_exceptions=True), 20)
        assert all(isinstance(r, NotEnoughBookiesError) for r in results), results
        assert lh.last_add_confirmed == 9
        with pytest.raises(NotEnoughBookiesError):
            lh.add_entry_nowait(b"more")
        await asyncio.wait_for(lh.close(), 5)
        md, _ = await bk.get_metadata(lh.ledger_id)
        assert md.state == State.CLOSED and md.last_entry_id == 9
        os.kill(victim.pid, signal.SIGCONT)
        victim = None
        await asyncio.sleep(0.5)
        assert lh.last_add_confirmed == 9
        ro = await bk.open_ledger(lh.ledger_id)
        assert ro.last_add_confirmed == 9
        assert await ro.read_entries(0, 9) == [b"a%d" % i for i in range(10)]
    finally:
        if victim is not None:
            os.kill(victim.pid, signal.SIGCONT)
        await bk.close()


async def test_recovery_does_not_read_an_unreachable_bookie_as_no_such_entry(bookie_factory, meta):
    """E=Qw=2, Qa=1: entries 10..14 were acknowledged by B alone (A never got them). B dies
    right after answering the fence: recovery cannot tell where the ledger ends, so it
    raises and the ledger stays IN_RECOVERY; once B is back, recovery closes at 14."""
    a, b = bookie_factory(), bookie_factory()
    addrs = [a.address, b.address]
    writer = BookKeeper(meta, addrs)
    lh = await writer.create_ledger(2, 2, 1)
    for i in range(10):
        await lh.add_entry(b"e%d" % i)
    for i in range(10, 15):
        await add_direct(writer, b.address, lh.ledger_id, lh.metadata.password, i, b"e%d" % i, lac=9)
    await writer.close()  # the writer crashes: the ledger stays OPEN

    recoverer = BookKeeper(meta, addrs, rpc_timeout_s=5)
    conn = recoverer.connection(b.address)
    real_fence = conn.fence

    async def fence_then_die(ledger_id, master_key):
        response = await real_fence(ledger_id, master_key)
        b.kill()
        return response

    conn.fence = fence_then_die
    try:
        with pytest.raises(BookieUnavailableError):
            await asyncio.wait_for(recoverer.open_ledger(lh.ledger_id, recovery=True), 60)
        md, _ = await recoverer.get_metadata(lh.ledger_id)
        assert md.state == State.IN_RECOVERY
    finally:
        await recoverer.close()

    same_port(b)
    later = BookKeeper(meta, addrs)
    try:
        # Retried as a broker retries a topic load: gRPC may still be in its reconnect
        # backoff for the restarted bookie's address for a moment.
        deadline = time.monotonic() + 30
        while True:
            try:
                ro = await asyncio.wait_for(later.open_ledger(lh.ledger_id, recovery=True), 60)
                break
            except BookieUnavailableError:
                assert time.monotonic() < deadline
                md, _ = await later.get_metadata(lh.ledger_id)
                assert md.state == State.IN_RECOVERY
                await asyncio.sleep(0.5)
        assert ro.metadata.state == State.CLOSED
        assert ro.last_add_confirmed == 14
        assert await ro.read_entries(0, 14) == [b"e%d" % i for i in range(15)]
        md, _ = await later.get_metadata(lh.ledger_id)
        assert md.state == State.CLOSED and md.last_entry_id == 14
    finally:
        await later.close()


async def test_recovery_floors_the_lac_at_the_last_fragment(bookie_factory, meta):
    """The writer changed the ensemble from entry 10 on (metadata written) and crashed before
    the new bookies stored anything. With the old fragment's bookies unreachable, recovery
    still closes at 9: the ensemble change proves entries 0..9 were acknowledged (BK #2615)."""
    bookies = [bookie_factory() for _ in range(4)]
    addrs = [b.address for b in bookies]
    writer = BookKeeper(meta, addrs[:2])
    lh = await writer.create_ledger(2, 2, 2)
    for i in range(10):
        await lh.add_entry(b"e%d" % i)
    await writer.close()
    md, version = await writer.get_metadata(lh.ledger_id)
    md.fragments.add(first_entry_id=10, ensemble=addrs[2:])
    await meta.put(ledger_path(lh.ledger_id), md.SerializeToString(), expected_version=version)
    for b in bookies[:2]:
        b.kill()

    recoverer = BookKeeper(meta, addrs, rpc_timeout_s=5)
    try:
        ro = await asyncio.wait_for(recoverer.open_ledger(lh.ledger_id, recovery=True), 60)
        assert ro.last_add_confirmed == 9
        md, _ = await recoverer.get_metadata(lh.ledger_id)
        assert md.state == State.CLOSED and md.last_entry_id == 9
        # The old fragment's bookies are down: a read fails as "unavailable", not "no such entry".
        with pytest.raises(BookieUnavailableError):
            await ro.read_entries(0, 0)
    finally:
        await recoverer.close()

    for b in bookies[:2]:
        same_port(b)
    reader = BookKeeper(meta, addrs)
    try:
        ro = await reader.open_ledger(lh.ledger_id)
        assert await retry_while_unavailable(lambda: ro.read_entries(0, 9)) == [b"e%d" % i for i in range(10)]
    finally:
        await reader.close()


async def test_recovery_replaces_a_bookie_that_fails_its_write_back(bookie_factory, meta):
    """E=Qw=Qa=2 on [A, B] of 3 bookies: entries 0..9 acknowledged, 10..14 reached A only when
    the writer crashed; then B dies. Recovery fences A (Qw-Qa+1 = 1 is enough), reads 10..14
    from A and must write them back to Qa bookies: B fails, so it is replaced by C from entry
    10 on (an ensemble change during recovery, as BookKeeper's ReadOnlyLedgerHandle does) and
    the ledger closes at 14 without waiting for B. Before, the write-back needed B: the ledger
    stayed IN_RECOVERY (its topic could not load) until B came back."""
    bookies = [bookie_factory() for _ in range(3)]
    addrs = [b.address for b in bookies]
    writer = BookKeeper(meta, addrs[:2])
    lh = await writer.create_ledger(2, 2, 2)
    for i in range(10):
        await lh.add_entry(b"e%d" % i)
    a_addr, b_addr = lh.ensemble
    by_addr = {b.address: b for b in bookies}
    for i in range(10, 15):
        await add_direct(writer, a_addr, lh.ledger_id, lh.metadata.password, i, b"e%d" % i, lac=9)
    await writer.close()  # the writer crashes: the ledger stays OPEN
    by_addr[b_addr].kill()
    c_addr = next(x for x in addrs if x not in (a_addr, b_addr))

    recoverer = BookKeeper(meta, addrs, rpc_timeout_s=5)
    try:
        ro = await asyncio.wait_for(recoverer.open_ledger(lh.ledger_id, recovery=True), 60)
        assert ro.metadata.state == State.CLOSED and ro.last_add_confirmed == 14
        md, _ = await recoverer.get_metadata(lh.ledger_id)
        assert md.state == State.CLOSED and md.last_entry_id == 14
        assert [(f.first_entry_id, list(f.ensemble)) for f in md.fragments] == \
            [(0, [a_addr, b_addr]), (10, [a_addr, c_addr])]
        for e in range(10, 15):
            assert await stored(recoverer, c_addr, lh.ledger_id, e) == b"e%d" % e
        by_addr[a_addr].kill()   # entries 10..14 live on C too now
        assert await ro.read_entries(10, 14) == [b"e%d" % i for i in range(10, 15)]
    finally:
        await recoverer.close()


async def test_recovery_without_a_spare_for_a_failed_write_back_stays_in_recovery(bookie_factory, meta):
    """As above with only A and B: no spare for B, so recovery raises and the ledger stays
    IN_RECOVERY (never closed short: entries 10..14 are on A alone); with B back it closes at 14."""
    a, b = bookie_factory(), bookie_factory()
    addrs = [a.address, b.address]
    writer = BookKeeper(meta, addrs)
    lh = await writer.create_ledger(2, 2, 2)
    for i in range(10):
        await lh.add_entry(b"e%d" % i)
    for i in range(10, 15):
        await add_direct(writer, a.address, lh.ledger_id, lh.metadata.password, i, b"e%d" % i, lac=9)
    await writer.close()
    b.kill()
    recoverer = BookKeeper(meta, addrs, rpc_timeout_s=5)
    try:
        with pytest.raises(BookieUnavailableError, match="no spare bookie"):
            await asyncio.wait_for(recoverer.open_ledger(lh.ledger_id, recovery=True), 60)
        md, _ = await recoverer.get_metadata(lh.ledger_id)
        assert md.state == State.IN_RECOVERY and [sorted(f.ensemble) for f in md.fragments] == [sorted(addrs)]
    finally:
        await recoverer.close()
    same_port(b)
    later = BookKeeper(meta, addrs)
    try:
        ro = await retry_while_unavailable(lambda: later.open_ledger(lh.ledger_id, recovery=True))
        assert ro.last_add_confirmed == 14
        assert await ro.read_entries(0, 14) == [b"e%d" % i for i in range(15)]
    finally:
        await later.close()
