"""Position arithmetic over a managed ledger's ledgers (Pulsar's
``ManagedLedgerImpl`` getNextValidPosition, getPreviousPosition,
getPositionAfterN, getNumberOfEntries, getLedgersInfo...): pure logic, no
I/O. ``LedgerPositions`` is a mixin of
``broker.ledger.managed_ledger.ManagedLedger`` and reads its ``ledgers``
(ledger id -> ``ManagedLedgerInfo.LedgerInfo``), ``current`` (the open
``LedgerHandle`` or None) and ``last_confirmed`` (``Position``). Positions are
``(ledger_id, entry_id)``; counts are entries; sizes are bytes."""
from __future__ import annotations

from .position import Position

__all__ = ["LedgerPositions"]


class LedgerPositions:
    """Queries on the ledgers of a managed ledger (see the module docstring)."""

    def ledger_entries(self, ledger_id: int) -> int:
        """Number of confirmed entries of a ledger of this managed ledger (0 if unknown)."""
        if self.current is not None and ledger_id == self.current.ledger_id:
            return self.current.last_add_confirmed + 1
        li = self.ledgers.get(ledger_id)
        if li is None:
            return 0
        if li.entries == 0 and ledger_id == self.last_confirmed.ledger_id:
            return self.last_confirmed.entry_id + 1
        return li.entries

    def next_position(self, pos: Position) -> Position:
        """The position after ``pos``: next entry, or entry 0 of the next non-empty
        ledger, or (current ledger, next entry id) when ``pos`` is the last one."""
        if pos.ledger_id in self.ledgers and pos.entry_id + 1 < self.ledger_entries(pos.ledger_id):
            return Position(pos.ledger_id, pos.entry_id + 1)
        for lid in sorted(self.ledgers):
            if lid > pos.ledger_id and self.ledger_entries(lid) > 0:
                return Position(lid, 0)
        if pos.ledger_id in self.ledgers:
            return Position(pos.ledger_id, pos.entry_id + 1) if self.current is None or \
                pos.ledger_id == self.current.ledger_id else Position(self.current.ledger_id, 0)
        if self.current is not None and pos.ledger_id < self.current.ledger_id:
            return Position(self.current.ledger_id, 0)
        return Position(pos.ledger_id, pos.entry_id + 1)

    def previous_position(self, pos: Position) -> Position:
        """The entry before ``pos``: the previous entry of its ledger, or the last
        entry of the newest earlier non-empty ledger; ``Position(-1, -1)`` when
        there is none (Pulsar's ManagedLedger.getPreviousPosition)."""
        if pos.entry_id > 0 and pos.ledger_id in self.ledgers:
            return Position(pos.ledger_id, min(pos.entry_id, self.ledger_entries(pos.ledger_id)) - 1)
        for lid in sorted(self.ledgers, reverse=True):
            if lid < pos.ledger_id and self.ledger_entries(lid) > 0:
                return Position(lid, self.ledger_entries(lid) - 1)
        return Position(-1, -1)

    def position_at_index(self, index: int) -> Position:
        """The ``index``-th stored entry (0 = the oldest kept), counting over the
        ledgers in order (Pulsar's getPositionAfterN from the first position).
        Raises IndexError when ``index`` is not below ``number_of_entries``."""
        if index >= 0:
            for lid in sorted(self.ledgers):
                n = self.ledger_entries(lid)
                if index < n:
                    return Position(lid, index)
                index -= n
        raise IndexError(f"no entry at index {index} of {self.name}")

    def ledgers_info(self) -> list[tuple[int, int, int]]:
        """``(ledger_id, entries, size in bytes)`` of every ledger, oldest first
        (Pulsar's getLedgersInfo; the current ledger's entries are its LAC + 1)."""
        return [(lid, self.ledger_entries(lid), li.size) for lid, li in sorted(self.ledgers.items())]

    def first_position(self) -> Position:
        """The first readable position (entry 0 of the oldest non-empty ledger)."""
        for lid in sorted(self.ledgers):
            if self.ledger_entries(lid) > 0:
                return Position(lid, 0)
        return Position(self.current.ledger_id if self.current else self.last_confirmed.ledger_id, 0)

    def is_entry(self, pos: Position) -> bool:
        """True when ``pos`` is a confirmed entry of a ledger of this managed ledger."""
        return pos.ledger_id in self.ledgers and 0 <= pos.entry_id < self.ledger_entries(pos.ledger_id)

    def count_entries_between(self, after: Position, upto: Position) -> int:
        """Number of confirmed entries p with ``after < p <= upto``."""
        total = 0
        for lid in self.ledgers:
            n = self.ledger_entries(lid)
            if n == 0 or lid < after.ledger_id or lid > upto.ledger_id:
                continue
            lo = after.entry_id + 1 if lid == after.ledger_id else 0
            hi = min(n - 1, upto.entry_id) if lid == upto.ledger_id else n - 1
            if hi >= lo:
                total += hi - lo + 1
        return total

    @property
    def number_of_entries(self) -> int:
        """Confirmed entries kept over all ledgers (the current one's: LAC + 1; trimmed
        ledgers not counted; Pulsar's getNumberOfEntries)."""
        return sum(self.ledger_entries(lid) for lid in self.ledgers)

    @property
    def total_size(self) -> int:
        """Bytes stored in this managed ledger's ledgers (Pulsar's storageSize)."""
        size = sum(li.size for lid, li in self.ledgers.items() if self.current is None or lid != self.current.ledger_id)
        return size + (self.current.length if self.current is not None else 0)
