"""ManagedLedger at its edges (issue 34), with real bookie processes:

* a full ledger is closed and the next one created as soon as the add that filled it
  completes (Pulsar's ManagedLedgerImpl), not at the next add: a cursor at its last entry
  lets it be trimmed at once;
* a read-only bookie (disk full) is never put in a new ensemble: ledger creation fails with
  NotEnoughBookies naming it, backs off instead of creating ledgers in a loop, adds fail
  at once with that error; once the bookie is writable again, adds are stored.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from bookie.client import BookKeeper
from bookie.ledger_handle import LEDGER_ID_COUNTER_PATH
from broker.ledger.errors import ManagedLedgerError
from broker.ledger.factory import ManagedLedgerFactory
from broker.ledger.ml_config import ManagedLedgerConfig
from tests.procs import restart_bookie_same_port

pytestmark = pytest.mark.timeout(120)


def config(**kw) -> ManagedLedgerConfig:
    cfg = ManagedLedgerConfig(managed_ledger_max_entries_per_ledger=100,
                              managed_ledger_min_ledger_rollover_time_minutes=0,
                              managed_ledger_default_ensemble_size=2,
                              managed_ledger_default_write_quorum=2,
                              managed_ledger_default_ack_quorum=2)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


async def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_the_add_that_fills_a_ledger_closes_it_and_creates_the_next(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(2)]
    bk = BookKeeper(meta, [b.address for b in bookies])
    factory = ManagedLedgerFactory(meta, bk, config(default_retention_time_in_minutes=0,
                                                    default_retention_size_in_mb=0))
    try:
        ml = await factory.open("public/default/persistent/full-ledger")
        cursor = await ml.open_cursor("sub", initial_position="earliest")
        positions = await asyncio.gather(*(ml.add_entry_nowait(b"m%d" % i) for i in range(100)))
        first = positions[0].ledger_id
        assert {p.ledger_id for p in positions} == {first}
        # no further add: the full ledger is closed at entry 99 and a successor exists
        await _wait(lambda: len(ml.ledgers) == 2 and ml.current is not None and ml.current.ledger_id != first,
                    5, f"the full ledger was not closed without another add: {dict(ml.ledgers)}")
        assert ml.ledgers[first].entries == 100
        # a cursor at its last entry lets it be trimmed without another add
        await cursor.mark_delete(positions[-1])
        await _wait(lambda: first not in ml.ledgers, 10, "the consumed full ledger was not trimmed")
        p = await ml.add_entry(b"next")
        assert p.ledger_id > first and p.entry_id == 0
    finally:
        await factory.close()
        await bk.close()


async def _ledgers_created(meta) -> int:
    res = await meta.get(LEDGER_ID_COUNTER_PATH)
    return int.from_bytes(res.value, "big", signed=True) if res is not None else 0


async def test_read_only_bookie_is_not_placed_and_creation_backs_off(bookie_factory, meta):
    writable = bookie_factory()
    full = bookie_factory(extra_args=("--disk-usage-threshold", "0.0001", "--disk-usage-lwm-threshold", "0.0001"))
    bk = BookKeeper(meta, [writable.address, full.address], add_entry_timeout_s=2)
    factory = ManagedLedgerFactory(meta, bk, config())
    try:
        ml = await factory.open("public/default/persistent/read-only-bookie")
        failures = []
        for i in range(5):   # the first ledger includes the read-only bookie: its adds fail
            try:
                await asyncio.wait_for(ml.add_entry(b"x%d" % i), 10)
            except ManagedLedgerError as exc:
                failures.append(str(exc))
        assert failures and "NotEnoughBookies" in failures[-1] and full.address in failures[-1], failures
        # ledgers created while the only spare is read-only: a few, not a loop
        before, t0 = await _ledgers_created(meta), time.monotonic()
        await asyncio.sleep(5)
        with pytest.raises(ManagedLedgerError, match="read-only"):
            ml.add_entry_nowait(b"while full")
        created = await _ledgers_created(meta) - before
        assert created <= 1, f"{created} ledgers created in {time.monotonic() - t0:.1f} s with a read-only bookie"
        assert full.address in bk.read_only_bookies
        # the bookie becomes writable (restarted without the thresholds): adds are stored again
        full.terminate()
        full = restart_bookie_same_port(full)
        deadline = time.monotonic() + 30
        while True:
            try:
                p = await asyncio.wait_for(ml.add_entry(b"after"), 10)
                break
            except ManagedLedgerError:
                assert time.monotonic() < deadline, "adds never stored after the bookie turned writable"
                await asyncio.sleep(0.5)
        assert p.entry_id == 0 and full.address in ml.current.ensemble
    finally:
        await factory.close()
        await bk.close()
