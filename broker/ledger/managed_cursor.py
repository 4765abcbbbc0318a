"""ManagedCursor: a subscription's position in a managed ledger.

Follows Pulsar's ``ManagedCursorImpl``:

* ``mark_delete_position``: every entry at or before it is acknowledged.
* ``individual_deleted`` (individualDeletedMessages): entries acknowledged
  above the mark-delete position, an ``AckRangeSet`` of roaring bitmaps.
* ``batch_deleted`` (batchDeletedIndexes): acknowledged indexes of batch entries.
* ``read_position``: the next entry a dispatcher reads.
* Persistence: PositionInfo entries in a *cursor ledger*; the metadata store keeps
  ``ManagedCursorInfo`` (cursorsLedgerId, mark-delete snapshot, lastActive,
  properties) at ``/managed-ledgers/<ml>/<cursor>``. Recovery reads the info,
  then the last PositionInfo of the cursor ledger; it falls back to the info's
  snapshot only when the cursor ledger or its entries do not exist
  (``recoverFromLedger``): any other error fails the recovery (the topic load is
  retried), so a confirmed acknowledgment is never rolled back. A recovered
  cursor continues on a new cursor ledger created at its first persist (state
  NoLedger); the old one is deleted only once the new one is in the metadata.
* A failed cursor-ledger write abandons that ledger and writes the whole state
  to the metadata store instead (``cursorsLedgerId = -1``, mark-delete,
  individualDeletedMessages, batch indexes: ``persistPositionToMetaStore``); the
  next persist creates a new cursor ledger.
* When the hole state does not fit one entry, it is written as SEGMENT entries
  followed by an INDEX entry naming them; only ledgers whose holes changed are
  rewritten (PIP-81). Recovery reads backwards to the last complete INDEX/FULL.

Persists are group-committed: changes made while one persist is in flight go
out together in the next. ``delete``/``mark_delete`` return once the new state
is durable. The persistence and cursor-ledger recovery code lives in
``cursor_persistence.CursorPersistence``, a mixin of ``ManagedCursor``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Iterable, Optional

from bookie.client import LedgerHandle
from bookie.errors import BKException
from broker.metadata.names import encode_path_segment, ml_path
from proto import metadata_pb2

from .batch_index import BatchDeletedIndexes
from .cursor_persistence import CursorPersistence
from .errors import InvalidCursorPosition, InvalidMarkDeletePosition, ManagedCursorError, ManagedLedgerError
from .position import Entry, Position
from .range_set import AckRangeSet

if TYPE_CHECKING:
    from .managed_ledger import ManagedLedger

log = logging.getLogger(__name__)

class ManagedCursor(CursorPersistence):
    """A durable (persisted) or non-durable (in-memory, Reader) cursor."""

    def __init__(self, ml: "ManagedLedger", name: str, durable: bool):
        self.ml = ml
        self.name = name
        self.durable = durable
        self.mark_delete_position: Position = Position(-1, -1)
        # The mark-delete position the metadata store / cursor ledger holds
        # (persistentMarkDeletePosition): what ledger trimming goes by.
        self.persistent_mark_delete_position: Position = Position(-1, -1)
        self.read_position: Position = Position(-1, -1)
        self._read_generation = 0      # bumped by rewind/seek/reset: a read in flight then is stale
        self._path_segment: Optional[str] = None   # metadata child name when recovered (see path_segment)
        self.active = False            # has read: its read position holds back entry-cache eviction
        self.individual_deleted = AckRangeSet()
        self.batch_deleted = BatchDeletedIndexes()
        self.properties: dict[str, int] = {}         # LongProperty, persisted with mark-delete
        self.cursor_properties: dict[str, str] = {}  # StringProperty, persisted in ManagedCursorInfo
        self.last_active = int(time.time() * 1000)
        self._info_version: Optional[int] = None
        self._info_lock = asyncio.Lock()   # one ManagedCursorInfo write at a time (version CAS)
        self._cursor_ledger: Optional[LedgerHandle] = None
        # Cursor ledgers to delete once a new one is in the metadata (recovered or abandoned).
        self._old_cursor_ledgers: list[int] = []
        self._unpersisted = False           # a persist failed: the in-memory state is not durable
        self._segment_refs: dict[int, int] = {}      # data ledger -> cursor-ledger entry holding its ack set
        self._force_full = True
        self._dirty = False
        self._persist_waiters: list[asyncio.Future] = []
        self._persist_task: Optional[asyncio.Task] = None
        self._closed = False
        self.last_persist_bytes = 0
        # Pulsar's managedLedgerDefaultMarkDeleteRateLimit (persists/s; 0 = every change at once).
        # Changes made meanwhile stay in memory and go out with the next persist; flush()/close()
        # never wait for the limit. Only safe where a lost in-memory ack is harmless (replicator
        # cursors: the remote drops re-sent entries by source position).
        self.mark_delete_rate_limit: float = 0.0
        self._last_persist_at = 0.0
        self._flush_now = False
        self._rate_wait: Optional[asyncio.Future] = None

    # ---- construction ---------------------------------------------------
    @property
    def path(self) -> str:
        """``/managed-ledgers/<ml>/<cursor>``: the cursor name URL-encoded into one
        path segment (Pulsar's Codec.encode), so names with '/' stay one node."""

        return f"{ml_path(self.ml.name)}/{self.path_segment}"

    @property
    def path_segment(self) -> str:
        """The metadata path segment of this cursor: the one it was recovered
        from, else the encoded name (broker.metadata.names)."""
        return self._path_segment or encode_path_segment(self.name)

    @classmethod
    def non_durable(cls, ml: "ManagedLedger", start: Position, name: str, inclusive: bool = True) -> "ManagedCursor":
        """An in-memory cursor reading from ``start`` (inclusive or not). A start
        beyond the last entry (latest, or an id the topic never had) reads from
        the next entry added, as Pulsar's NonDurableCursorImpl (next valid
        position, else latest): never skips the entries added after it."""
        cursor = cls(ml, name, durable=False)
        if start.ledger_id < 0:
            first = ml.first_position()
            cursor.mark_delete_position = Position(first.ledger_id, first.entry_id - 1)
        elif start > ml.last_confirmed:
            cursor.mark_delete_position = ml.last_confirmed
        else:
            cursor.mark_delete_position = start if not inclusive else Position(start.ledger_id, start.entry_id - 1)
        cursor.read_position = ml.next_position(cursor.mark_delete_position)
        return cursor

    @classmethod
    async def open_or_create(cls, ml: "ManagedLedger", name: str, initial_position: str = "latest",
                             properties: Optional[dict[str, int]] = None) -> "ManagedCursor":
        """Recover cursor ``name`` if it exists, else create it at ``initial_position``
        ("latest": after the last confirmed entry; "earliest": before the first; a
        Position: that mark-delete position)."""
        cursor = cls(ml, name, durable=True)
        if await ml.metadata.exists(cursor.path):
            return await cls.recover(ml, name)
        if initial_position == "earliest":
            first = ml.first_position()
            cursor.mark_delete_position = Position(first.ledger_id, first.entry_id - 1)
        elif initial_position == "latest":
            cursor.mark_delete_position = ml.last_confirmed
        elif isinstance(initial_position, tuple) and len(initial_position) == 2:
            cursor.mark_delete_position = min(Position(*initial_position), ml.last_confirmed)
        else:
            raise ValueError(f"initial_position must be 'latest', 'earliest' or a Position, got {initial_position!r}")
        cursor.properties = dict(properties or {})
        cursor.read_position = ml.next_position(cursor.mark_delete_position)
        await cursor._write_info(create=True)
        cursor.persistent_mark_delete_position = cursor.mark_delete_position
        log.info("[%s] cursor %s created at %s", ml.name, name, cursor.mark_delete_position)
        return cursor

    @classmethod
    async def recover(cls, ml: "ManagedLedger", name: str, path_segment: Optional[str] = None) -> "ManagedCursor":
        """Rebuild a durable cursor from ManagedCursorInfo and its cursor ledger
        (Pulsar's ManagedCursorImpl.recover / recoverFromLedger). ``path_segment``:
        the metadata child it is stored under (default: the encoded name)."""
        cursor = cls(ml, name, durable=True)
        cursor._path_segment = path_segment
        res = await ml.metadata.get(cursor.path)
        if res is None:
            raise ManagedCursorError(f"cursor {name} of {ml.name} has no metadata")
        info = metadata_pb2.ManagedCursorInfo()
        info.ParseFromString(res.value)
        cursor._info_version = res.version
        cursor.cursor_properties = {p.name: p.value for p in info.cursorProperties}
        cursor.last_active = info.lastActive
        cursor.mark_delete_position = Position(info.markDeleteLedgerId, info.markDeleteEntryId)
        cursor.properties = {p.name: p.value for p in info.properties}
        for r in info.individualDeletedMessages:
            lo, hi = r.lowerEndpoint, r.upperEndpoint
            cursor.individual_deleted.add_range(hi.ledgerId, lo.entryId + 1, hi.entryId)
        if info.batchedEntryDeletionIndexInfo:
            cursor.batch_deleted = BatchDeletedIndexes.from_protos(info.batchedEntryDeletionIndexInfo)
        old_ledger_id = info.cursorsLedgerId
        if old_ledger_id >= 0:
            await cursor._recover_from_ledger(old_ledger_id)
            cursor._old_cursor_ledgers.append(old_ledger_id)
        cursor.individual_deleted.clear_dirty()
        for pos in cursor.batch_deleted.positions():
            if not ml.is_entry(Position(*pos)):   # stored by a hostile ack before acks were validated
                cursor.batch_deleted.remove(pos)
        cursor.read_position = ml.next_position(cursor.mark_delete_position)
        cursor.persistent_mark_delete_position = cursor.mark_delete_position
        # Take the node over: a write that bumps its version, so that a late compare-and-set of the
        # previous owner (a broker cut off from the metadata store, or paused) at the version it read
        # fails instead of overwriting this owner's state (its write then fences it). The bytes are
        # the ones just read: the node keeps naming the recovered cursor ledger until the first persist.
        await cursor._take_over_info(res.value)
        # As Pulsar does (state NoLedger), the first persist creates a fresh cursor
        # ledger holding the whole state; the old one is deleted after that.
        log.info("[%s] cursor %s recovered: mark-delete %s, %d acked holes, %d batch entries", ml.name, name,
                 cursor.mark_delete_position, cursor.individual_deleted.size(), len(cursor.batch_deleted))
        return cursor

    # ---- reading --------------------------------------------------------
    def is_acknowledged(self, pos: Position) -> bool:
        """True when ``pos`` is at or before the mark-delete position or individually
        acknowledged (a batch entry once all its indexes are; Pulsar's isMessageDeleted)."""
        return pos <= self.mark_delete_position or self.individual_deleted.contains(pos.ledger_id, pos.entry_id)

    def _skip_acked(self, pos: Position) -> Position:
        if pos <= self.mark_delete_position:
            pos = self.ml.next_position(self.mark_delete_position)
        while pos.entry_id >= 0 and self.individual_deleted.contains(pos.ledger_id, pos.entry_id):
            end = self.individual_deleted.contiguous_end(pos.ledger_id, pos.entry_id)
            pos = self.ml.next_position(Position(pos.ledger_id, end))
        return pos

    async def read_entries(self, max_count: int, max_bytes: int = 5 * 1024 * 1024) -> list[Entry]:
        """Up to ``max_count`` unacknowledged entries from the read position on (may
        cross ledgers), advancing the read position past them. [] when none yet.
        A failed read raises (``ManagedLedgerError`` / bookie errors) only when nothing was
        read before it in this call; else the entries read so far are returned, so none
        is skipped (the read position never moves past an entry not returned)."""
        if not self.active:
            self.active = True         # ManagedCursorImpl.setActive: new adds are cached for it
            self.ml.cache.active = True
        out: list[Entry] = []
        size = 0
        while len(out) < max_count and size < max_bytes:
            pos = self._skip_acked(self.read_position)
            self.read_position = pos
            if pos > self.ml.last_confirmed:
                break
            generation = self._read_generation
            try:
                entries = await self.ml.read_entries(pos, max_count - len(out), max_bytes - size)
            except Exception as exc:
                if not out or generation != self._read_generation:
                    raise
                # Pulsar's OpReadEntry.readEntriesFailed: entries already read are returned
                # (the read position is just past them); the next read meets the failure again.
                log.warning("[%s] cursor %s: read at %s failed after %d entries were read (%s); "
                            "returning those", self.ml.name, self.name, pos, len(out), exc)
                return out
            if generation != self._read_generation:
                # A rewind/seek/reset moved the read position while the bookies answered:
                # this read is stale. Return nothing and leave the read position where the
                # rewind put it: the caller (a dispatcher that also noticed the rewind and
                # drops what it gets) reads again.
                return []
            if not entries:
                # pos is past the end of its ledger: continue in the next one.
                nxt = self.ml._next_ledger_start(pos)
                if nxt is None or nxt <= pos:
                    break
                self.read_position = nxt
                continue
            for entry in entries:
                if not self.is_acknowledged(entry.position):
                    out.append(entry)
                    size += len(entry.data)
            self.read_position = self.ml.next_position(entries[-1].position)
        return out

    async def read_entries_or_wait(self, max_count: int, max_bytes: int = 5 * 1024 * 1024,
                                   timeout: Optional[float] = None) -> list[Entry]:
        """Like ``read_entries`` but waits (up to ``timeout`` seconds) for new entries."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            entries = await self.read_entries(max_count, max_bytes)
            if entries or self._closed:
                return entries
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return []
            if not await self.ml.wait_for_position(self.read_position, remaining):
                if deadline is not None and time.monotonic() >= deadline:
                    return []
                if self.ml._closed:
                    return []

    def rewind(self) -> None:
        """Move the read position back to the first unacknowledged entry (redelivery)."""
        self._read_generation += 1
        self.read_position = self.ml.next_position(self.mark_delete_position)

    def seek(self, position: Position) -> None:
        """Move only the read position (acks unchanged)."""
        self._read_generation += 1
        self.read_position = position

    # ---- acknowledgments ------------------------------------------------
    def delete_nowait(self, positions: Iterable[Position]) -> asyncio.Future:
        """Acknowledge individual positions; returns a future done when durable.
        Positions at or below the mark-delete position are ignored; positions beyond
        the last confirmed entry raise InvalidMarkDeletePosition."""
        last = self.ml.last_confirmed
        mark_delete = self.mark_delete_position
        batch_deleted = self.batch_deleted if not self.batch_deleted.is_empty() else None
        changed = False
        # Runs of consecutive entries (acks usually come sorted) go into the range
        # set as one add_range each: no per-position work there for in-order acks.
        run_ledger = run_first = run_last = None
        checked_ledger, checked_entries = None, -1
        for pos in positions:
            if type(pos) is not Position:
                pos = Position(*pos)
            if pos > last:
                if run_ledger is not None:  # as before: what preceded stays applied in memory
                    self._ack_run(run_ledger, run_first, run_last)
                raise InvalidMarkDeletePosition(f"cannot acknowledge {pos}: beyond last entry {last} of {self.ml.name}")
            if pos <= mark_delete:
                continue
            ledger_id, entry_id = pos
            if ledger_id != checked_ledger:
                checked_entries = self.ml.ledger_entries(ledger_id) if ledger_id in self.ml.ledgers else -1
                checked_ledger = ledger_id
            if not 0 <= entry_id < checked_entries:
                if run_ledger is not None:
                    self._ack_run(run_ledger, run_first, run_last)
                raise InvalidMarkDeletePosition(f"cannot acknowledge {pos}: not an entry of {self.ml.name} "
                                                f"(an id from another topic?)")
            if ledger_id == run_ledger and entry_id == run_last + 1:
                run_last = entry_id
            else:
                if run_ledger is not None and self._ack_run(run_ledger, run_first, run_last):
                    changed = True
                run_ledger, run_first, run_last = ledger_id, entry_id, entry_id
            if batch_deleted is not None:
                batch_deleted.remove(pos)
        if run_ledger is not None and self._ack_run(run_ledger, run_first, run_last):
            changed = True
        if changed:
            self._advance_mark_delete()
        return self._schedule_persist() if changed else self._done()

    def _ack_run(self, ledger_id: int, first: int, last: int) -> bool:
        """Add entries first..last of a ledger to individual_deleted; True if any was new."""
        if first == last:
            return self.individual_deleted.add(ledger_id, first)
        return self.individual_deleted.add_range(ledger_id, first, last) > 0

    async def delete(self, positions: Iterable[Position]) -> None:
        """Acknowledge individual positions and wait until durable."""
        await self.delete_nowait(positions)

    def delete_batch_index_nowait(self, position: Position, batch_size: int, indexes: Iterable[int]) -> asyncio.Future:
        """Acknowledge some messages of a batch entry (batch-index ack); the entry
        itself counts as acknowledged once all its indexes are. ``batch_size``
        must be the entry's real message count (the caller reads it from the
        entry). Raises InvalidMarkDeletePosition for a position that is not an
        entry of the managed ledger (nothing is stored), ValueError for a bad
        index or batch size (BatchDeletedIndexes)."""
        position = Position(*position)
        if self.is_acknowledged(position):
            return self._done()
        if not self.ml.is_entry(position):
            raise InvalidMarkDeletePosition(f"cannot acknowledge batch indexes of {position}: not an entry of "
                                            f"{self.ml.name} (last {self.ml.last_confirmed})")
        if self.batch_deleted.ack(position, batch_size, indexes):
            return self.delete_nowait([position])
        return self._schedule_persist()

    def mark_delete_nowait(self, position: Position, properties: Optional[dict[str, int]] = None) -> asyncio.Future:
        """Cumulative acknowledgment up to and including ``position``."""
        position = Position(*position)
        if position > self.ml.last_confirmed:
            raise InvalidMarkDeletePosition(
                f"cannot mark-delete {position}: beyond last entry {self.ml.last_confirmed} of {self.ml.name}")
        if position > self.mark_delete_position and (
                position.ledger_id not in self.ml.ledgers
                or not -1 <= position.entry_id < self.ml.ledger_entries(position.ledger_id)):
            raise InvalidMarkDeletePosition(f"cannot mark-delete {position}: not an entry of {self.ml.name} "
                                            f"(an id from another topic?)")
        if properties is not None:
            self.properties = dict(properties)
        if position <= self.mark_delete_position:
            return self._schedule_persist() if properties is not None else self._done()
        self.mark_delete_position = position
        self.individual_deleted.remove_up_to(position.ledger_id, position.entry_id)
        self.batch_deleted.remove_up_to(position)
        self._advance_mark_delete()
        return self._schedule_persist()

    async def mark_delete(self, position: Position, properties: Optional[dict[str, int]] = None) -> None:
        """``mark_delete_nowait`` awaited: cumulative ack up to and including ``position`` (storing
        ``properties``, e.g. the dedup snapshot), done once persisted (Pulsar's ManagedCursor.markDelete).
        Raises InvalidMarkDeletePosition (not an entry, beyond the last), ManagedCursorError (persist failed)."""
        await self.mark_delete_nowait(position, properties)

    def _advance_mark_delete(self) -> None:
        md = self.mark_delete_position
        nxt = self.ml.next_position(md)
        moved = False
        while nxt.entry_id >= 0 and self.individual_deleted.contains(nxt.ledger_id, nxt.entry_id):
            end = self.individual_deleted.contiguous_end(nxt.ledger_id, nxt.entry_id)
            md = Position(nxt.ledger_id, end)
            moved = True
            nxt = self.ml.next_position(md)
        if moved:
            self.mark_delete_position = md
            self.individual_deleted.remove_up_to(md.ledger_id, md.entry_id)
            self.batch_deleted.remove_up_to(md)
        if self.read_position <= self.mark_delete_position:
            self.read_position = self.ml.next_position(self.mark_delete_position)

    def reset(self, position: Position) -> asyncio.Future:
        """Reset the cursor so ``position`` is the next entry delivered, forgetting
        acknowledgments (Pulsar's resetCursor, used by seek and reset-cursor).
        A position before the first entry (trimmed, or earliest) means the first
        entry; one after the position following the last entry, or inside the
        ledgers but not an entry, raises InvalidCursorPosition (nothing changes).
        Returns a future done once the new state is durable."""
        position = Position(*position)
        first = self.ml.first_position()
        after_last = self.ml.next_position(self.ml.last_confirmed)
        if position < first:
            position = first
        elif not (self.ml.is_entry(position) or position == after_last
                  or position == Position(self.ml.last_confirmed.ledger_id, self.ml.last_confirmed.entry_id + 1)):
            raise InvalidCursorPosition(
                f"cannot reset cursor {self.name} of {self.ml.name} to {position}: not an entry of the topic "
                f"(first {first}, last {self.ml.last_confirmed}); use an id the topic returned, or earliest/latest")
        self._read_generation += 1
        self.mark_delete_position = Position(position.ledger_id, position.entry_id - 1)
        self.persistent_mark_delete_position = min(self.persistent_mark_delete_position, self.mark_delete_position)
        self.individual_deleted.clear()
        self.batch_deleted.clear()
        self._force_full = True
        self.read_position = position
        return self._schedule_persist()

    # ---- figures --------------------------------------------------------
    def number_of_entries_in_backlog(self) -> int:
        """Entries after the mark-delete position not individually acknowledged."""
        total = self.ml.count_entries_between(self.mark_delete_position, self.ml.last_confirmed)
        return max(0, total - self.individual_deleted.size())

    # ---- lifecycle ------------------------------------------------------
    async def set_cursor_properties(self, props: dict[str, str]) -> None:
        """Replace the cursor's string properties (e.g. Pulsar's replicated flag) durably.
        Goes through a persist when no cursor ledger holds the state, so the
        metadata record keeps the holes it carries then."""
        self.cursor_properties = dict(props)
        if self._cursor_ledger is None and self.durable:
            await self._schedule_persist()
            return
        await self._write_info()

    async def close(self) -> None:
        """Flush pending persists and close the cursor ledger (state stays recoverable)."""
        if self._closed:
            return
        if self.durable:
            try:
                await self.flush()
            except ManagedLedgerError as exc:   # persist failed, or fenced (another owner)
                log.warning("[%s] cursor %s: final persist failed: %s", self.ml.name, self.name, exc)
            self.last_active = int(time.time() * 1000)
            if self._cursor_ledger is not None and not self._unpersisted:
                try:
                    await self._cursor_ledger.close()
                except BKException as exc:
                    log.warning("[%s] cursor %s: closing cursor ledger: %s", self.ml.name, self.name, exc)
                try:
                    await self._write_info()
                except Exception as exc:
                    log.warning("[%s] cursor %s: writing cursor info: %s", self.ml.name, self.name, exc)
        self._closed = True

    async def remove(self) -> None:
        """Remove the cursor's ledger and metadata (unsubscribe; ManagedLedger.deleteCursor)."""
        self._closed = True
        if self._persist_task is not None:
            await asyncio.gather(self._persist_task, return_exceptions=True)
        if self._cursor_ledger is not None:
            self._old_cursor_ledgers.append(self._cursor_ledger.ledger_id)
        await self._delete_ledgers_quietly(self._old_cursor_ledgers)
        if self.durable:
            try:
                await self.ml.metadata.delete(self.path)
            except Exception:
                pass
