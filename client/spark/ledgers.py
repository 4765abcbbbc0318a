"""What the Spark source knows about a partition's ledgers (pure, no I/O).

A topic partition is a managed ledger: a list of ledgers, oldest first, each
holding entries ``0..n-1``; retention deletes whole ledgers from the head
(Pulsar's ``internalTrimConsumedLedgers``), never single entries.  The driver
sees the list in the broker's internal stats (``LedgerInfo``) when it plans a
micro-batch; this module turns that snapshot into what later checks need:

* ``plan_ledgers``: the ledgers holding a range ``(start, end]``, handed to the
  worker that reads the range, which verifies that it received every entry
  of them or that the ledger of a missing entry still exists (then the broker
  skipped a marker, which consumers never get); Kafka's fetched-offset check,
  pulsar-spark's "Potential Data Loss" check;
* ``next_ledger_after``: when a micro-batch ends on the last entry of a closed
  ledger, the id of the ledger after it, written into the checkpointed offset
  (``offsets.to_spark``) so that a restarted query does not mistake "that
  ledger was read to its end and then deleted" for lost data;
* ``seed_seen``: that annotation back into the ``seen`` map of
  ``offsets.possible_data_loss``.
"""
from __future__ import annotations

from typing import Iterable, MutableMapping

from client.spark.offsets import EARLIEST, LedgerInfo, Position

__all__ = ["plan_ledgers", "entries_in_range", "next_ledger_after", "seed_seen"]


def _sorted(ledgers: Iterable[LedgerInfo]) -> list[LedgerInfo]:
    return sorted((LedgerInfo(int(lid), int(n)) for lid, n in ledgers), key=lambda li: li.ledger_id)


def plan_ledgers(start: Position, end: Position, ledgers: Iterable[LedgerInfo]) -> tuple[LedgerInfo, ...]:
    """The ledgers (``(ledger_id, entries)``, oldest first) that hold entries of
    ``(start, end]``, from a snapshot of the partition's ledgers.  Ledgers
    without entries are left out; the last one's count may exceed ``end``."""
    out = []
    for li in _sorted(ledgers):
        if li.entries <= 0 or li.ledger_id > end.ledger_id:
            continue
        if start != EARLIEST and li.ledger_id < start.ledger_id:
            continue
        if entries_in_range(start, end, li) > 0:
            out.append(li)
    return tuple(out)


def entries_in_range(start: Position, end: Position, ledger: LedgerInfo) -> int:
    """How many entries of ``ledger`` lie in ``(start, end]``."""
    lid, n = ledger
    if n <= 0 or lid > end.ledger_id or lid < start.ledger_id:
        return 0
    first = start.entry_id + 1 if lid == start.ledger_id else 0
    last = min(n - 1, end.entry_id) if lid == end.ledger_id else n - 1
    return max(0, last - first + 1)


def next_ledger_after(position: Position, ledgers: Iterable[LedgerInfo]) -> int | None:
    """The id of the ledger listed after ``position``'s ledger when ``position``
    is the last entry of that ledger and the ledger is closed (another one
    follows it in ``ledgers``); None otherwise (the last ledger may still grow)."""
    current = _sorted(ledgers)
    for i, (lid, n) in enumerate(current[:-1]):
        if lid == position.ledger_id:
            return current[i + 1].ledger_id if n > 0 and position.entry_id == n - 1 else None
    return None


def seed_seen(seen: MutableMapping[int, "int | None"], position: Position, next_ledger: int | None) -> None:
    """Record in ``seen`` (``possible_data_loss``'s memory of ledgers: id ->
    final entry count, None while open) what a ``nextLedger`` annotation says:
    ``position``'s ledger closed with ``position.entry_id + 1`` entries and
    ``next_ledger`` followed it.  No-op when ``next_ledger`` is None."""
    if next_ledger is None or position == EARLIEST:
        return
    seen[position.ledger_id] = position.entry_id + 1
    seen.setdefault(int(next_ledger), None)
