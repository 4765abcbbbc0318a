"""The persistence half of ``ManagedCursor`` (Pulsar's ``ManagedCursorImpl``
persistPositionToLedger / persistPositionToMetaStore / recoverFromLedger):
group-committed persists of the cursor state as PositionInfo entries in a
cursor ledger (FULL, or SEGMENT entries plus an INDEX when the holes do not
fit one entry, PIP-81), the switch to a new cursor ledger, the fallback to the
metadata store after a failed ledger write, and loading the last complete
state back from a cursor ledger. ``CursorPersistence`` is a mixin of
``broker.ledger.managed_cursor.ManagedCursor`` and uses its state
(``mark_delete_position``, ``individual_deleted``, ``batch_deleted``,
``properties``, ``ml``, the persist bookkeeping set in its ``__init__``)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

from bookie.client import LedgerHandle
from bookie.errors import BKException, NoSuchEntryError, NoSuchLedgerError
from proto import metadata_pb2

from .batch_index import BatchDeletedIndexes
from broker.metadata.store import BadVersion, NotFound

from .errors import ManagedCursorError, ManagedLedgerFencedError
from .position import Position

__all__ = ["CursorPersistence", "PositionInfo", "ENTRY_MARGIN_BYTES", "MAX_RANGES_IN_METADATA"]

log = logging.getLogger("broker.ledger.managed_cursor")   # the cursor's own log, as before the split

PositionInfo = metadata_pb2.PositionInfo
# Room left in a cursor-ledger entry for the non-hole fields of a PositionInfo.
ENTRY_MARGIN_BYTES = 64 * 1024
# Most acknowledged ranges written to the metadata store when the cursor ledger
# cannot be written (Pulsar's managedLedgerMaxUnackedRangesToPersistInMetadataStore
# is 1000 and silently drops the rest; here a larger state fails the persist, so
# the acknowledgments are not confirmed instead of being lost).
MAX_RANGES_IN_METADATA = 100_000


class CursorPersistence:
    """Persisting and recovering a cursor's state (see the module docstring)."""

    # ---- recovery from the cursor ledger ----------------------------------
    async def _recover_from_ledger(self, ledger_id: int) -> None:
        """Load the last complete state of cursor ledger ``ledger_id``. Falls back to the
        metadata snapshot (already loaded) only when the ledger or its entries do not
        exist (NoSuchLedgerError / NoSuchEntryError, BookKeeper's "not recoverable"
        errors); any other BKException (a bookie unavailable) propagates, so the
        topic load fails and is retried instead of rolling acknowledgments back."""
        try:
            await self._load_from_ledger(ledger_id)
        except (NoSuchLedgerError, NoSuchEntryError) as exc:
            log.warning("[%s] cursor %s: cursor ledger %d does not exist any more (%s); using the "
                        "metadata snapshot", self.ml.name, self.name, ledger_id, exc)

    async def _load_from_ledger(self, ledger_id: int) -> None:
        bk = self.ml.bk
        handle = await bk.open_ledger(ledger_id, recovery=True)
        entry_id = handle.last_add_confirmed
        cache: dict[int, PositionInfo] = {}

        async def read(e: int) -> PositionInfo:
            if e not in cache:
                pi = PositionInfo()
                pi.ParseFromString((await handle.read_entries(e, e))[0])
                cache[e] = pi
            return cache[e]

        while entry_id >= 0:
            pi = await read(entry_id)
            if pi.kind in (PositionInfo.FULL, PositionInfo.INDEX):
                break
            entry_id -= 1  # an interrupted segmented write: look further back
        else:
            return
        self.mark_delete_position = Position(pi.ledgerId, pi.entryId)
        self.properties = {p.name: p.value for p in pi.properties}
        self.individual_deleted.clear()
        self.batch_deleted = BatchDeletedIndexes.from_protos(pi.batchedEntryDeletionIndexInfo)
        if pi.kind == PositionInfo.FULL:
            for s in pi.ackSets:
                self.individual_deleted.load_ledger(s.ledgerId, s.ackedEntries)
        else:
            for ref in pi.segmentRefs:
                seg = await read(ref.cursorLedgerEntryId)
                for s in seg.ackSets:
                    if s.ledgerId == ref.ledgerId:
                        self.individual_deleted.load_ledger(s.ledgerId, s.ackedEntries)

    # ---- persistence ----------------------------------------------------
    def _done(self) -> asyncio.Future:
        """A future for an operation that changed nothing in memory: done at once when
        the state is durable, else at the next persist (an acknowledgment retried
        after a failed or still running persist is confirmed only once durable)."""
        if self.durable and (self._unpersisted or self._dirty or self._persist_task is not None):
            return self._schedule_persist()
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    def _schedule_persist(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if not self.durable:
            fut.set_result(None)
            return fut
        self._dirty = True
        self._persist_waiters.append(fut)
        if self._persist_task is None:
            self._persist_task = asyncio.create_task(self._persist_loop())
        return fut

    async def flush(self) -> None:
        """Wait until every change so far is durable (not held back by mark_delete_rate_limit)."""
        if self.durable and (self._dirty or self._unpersisted or self._persist_task is not None):
            self._flush_now = True
            self._end_rate_wait()
            await self._schedule_persist()

    def _end_rate_wait(self) -> None:
        if self._rate_wait is not None and not self._rate_wait.done():
            self._rate_wait.set_result(None)

    async def _persist_loop(self) -> None:
        try:
            while self._dirty:
                if self.mark_delete_rate_limit > 0 and not self._flush_now and not self._closed:
                    wait = self._last_persist_at + 1.0 / self.mark_delete_rate_limit - time.monotonic()
                    if wait > 0:
                        loop = asyncio.get_running_loop()
                        self._rate_wait = loop.create_future()
                        timer = loop.call_later(wait, self._end_rate_wait)
                        try:
                            await self._rate_wait
                        finally:
                            timer.cancel()
                            self._rate_wait = None
                self._flush_now = False
                self._last_persist_at = time.monotonic()
                self._dirty = False
                waiters, self._persist_waiters = self._persist_waiters, []
                mark_delete = self.mark_delete_position
                try:
                    await self._persist_once()
                except ManagedLedgerFencedError as exc:
                    # another owner took the cursor over (or this broker lost the bundle): no
                    # fallback, no retry; the topic closes and is reloaded from the store
                    self._unpersisted = True
                    for w in waiters:
                        if not w.done():
                            w.set_exception(exc)
                    continue
                except Exception as exc:
                    log.error("[%s] cursor %s: writing the cursor ledger failed: %s; persisting the position "
                              "to the metadata store", self.ml.name, self.name, exc)
                    self._abandon_cursor_ledger()
                    try:
                        await self._persist_to_metadata()
                    except Exception as exc2:
                        log.error("[%s] cursor %s: persisting failed: %s", self.ml.name, self.name, exc2)
                        self._unpersisted = True
                        for w in waiters:
                            if not w.done():
                                w.set_exception(ManagedCursorError(
                                    f"cursor {self.name} persist failed: {exc}; then {exc2}"))
                        continue
                self._unpersisted = False
                # What was written is at least the position at the start of this persist
                # (or, after a reset backwards meanwhile, at least the current one).
                persisted = min(mark_delete, self.mark_delete_position)
                moved = persisted > self.persistent_mark_delete_position
                self.persistent_mark_delete_position = persisted
                if moved:
                    self.ml.schedule_trim()   # trimming goes by the persisted position
                for w in waiters:
                    if not w.done():
                        w.set_result(None)
        finally:
            self._persist_task = None

    def _limit(self) -> int:
        return self.ml.config.max_entry_size_bytes - ENTRY_MARGIN_BYTES

    def _base_info(self, kind: int) -> PositionInfo:
        pi = PositionInfo(ledgerId=self.mark_delete_position.ledger_id, entryId=self.mark_delete_position.entry_id,
                          kind=kind)
        for k, v in sorted(self.properties.items()):
            pi.properties.add(name=k, value=v)
        pi.batchedEntryDeletionIndexInfo.extend(self.batch_deleted.to_protos())
        return pi

    async def _persist_once(self) -> None:
        if self._cursor_ledger is None or \
                self._cursor_ledger.last_add_pushed + 1 >= self.ml.config.managed_ledger_cursor_max_entries_per_ledger:
            await self._switch_cursor_ledger()
            return
        await self._write_state(self._cursor_ledger, full_rewrite=self._force_full)

    async def _write_state(self, handle: LedgerHandle, full_rewrite: bool) -> None:
        """Write the current state to ``handle``: one FULL entry when it fits, else
        SEGMENT entries (dirty ledgers only unless ``full_rewrite``) plus an INDEX."""
        dirty = self.individual_deleted.dirty_ledgers()
        self.individual_deleted.clear_dirty()
        try:
            full = self._base_info(PositionInfo.FULL)
            for lid in self.individual_deleted.ledger_ids():
                full.ackSets.add(ledgerId=lid, ackedEntries=self.individual_deleted.serialize_ledger(lid))
            data = full.SerializeToString()
            if len(data) <= self._limit():
                await handle.add_entry(data)
                self._segment_refs = {}
                self.last_persist_bytes = len(data)
                self._force_full = False
                return
            # PIP-81: segments for the changed ledgers, then an index naming all.
            live = set(self.individual_deleted.ledger_ids())
            to_write = sorted(live if (full_rewrite or not self._segment_refs) else (dirty & live))
            refs = {lid: e for lid, e in self._segment_refs.items() if lid in live}
            written = 0
            seg = PositionInfo(kind=PositionInfo.SEGMENT)
            seg_size = 0
            pending_ids: list[int] = []

            async def flush_segment():
                nonlocal seg, seg_size, pending_ids, written
                if not pending_ids:
                    return
                payload = seg.SerializeToString()
                entry_id = await handle.add_entry(payload)
                written += len(payload)
                for lid in pending_ids:
                    refs[lid] = entry_id
                seg, seg_size, pending_ids = PositionInfo(kind=PositionInfo.SEGMENT), 0, []

            for lid in to_write:
                blob = self.individual_deleted.serialize_ledger(lid)
                if seg_size + len(blob) + 32 > self._limit():
                    await flush_segment()
                seg.ackSets.add(ledgerId=lid, ackedEntries=blob)
                seg_size += len(blob) + 32
                pending_ids.append(lid)
            await flush_segment()
            index = self._base_info(PositionInfo.INDEX)
            for lid in sorted(refs):
                index.segmentRefs.add(ledgerId=lid, cursorLedgerEntryId=refs[lid])
            payload = index.SerializeToString()
            await handle.add_entry(payload)
            self._segment_refs = refs
            self.last_persist_bytes = written + len(payload)
            self._force_full = False
        except BaseException:
            self._force_full = True
            raise

    def _abandon_cursor_ledger(self) -> None:
        """Stop writing to the current cursor ledger (state NoLedger): the next
        persist creates a new one; this one is deleted once that is in the metadata."""
        self._force_full = True
        self._segment_refs = {}
        old, self._cursor_ledger = self._cursor_ledger, None
        if old is not None:
            self._old_cursor_ledgers.append(old.ledger_id)

    async def _switch_cursor_ledger(self) -> None:
        """Create a new cursor ledger, write the whole state there, point the
        ManagedCursorInfo at it, and only then delete the previous cursor ledgers
        (Pulsar's createNewMetadataLedger / switchToNewLedger). Raises BKException
        or a metadata error; on failure the previous ledger stays referenced."""
        c = self.ml.config
        handle = await self.ml.bk.create_ledger(c.managed_ledger_default_ensemble_size,
                                                c.managed_ledger_default_write_quorum,
                                                c.managed_ledger_default_ack_quorum)
        try:
            self._segment_refs = {}
            await self._write_state(handle, full_rewrite=True)
            await self._write_info(cursor_ledger_id=handle.ledger_id)
        except BaseException:
            self._force_full = True
            asyncio.ensure_future(self._delete_ledgers_quietly([handle.ledger_id]))
            raise
        old = self._cursor_ledger
        self._cursor_ledger = handle
        stale, self._old_cursor_ledgers = self._old_cursor_ledgers, []
        if old is not None:
            try:
                await old.close()
            except BKException:
                pass
            stale.append(old.ledger_id)
        await self._delete_ledgers_quietly(stale)

    async def _delete_ledgers_quietly(self, ledger_ids: list[int]) -> None:
        for lid in ledger_ids:
            try:
                await self.ml.bk.delete_ledger(lid)
            except Exception as exc:  # noqa: BLE001 - no longer referenced: leaks at worst
                log.warning("[%s] cursor %s: deleting old cursor ledger %d: %s", self.ml.name, self.name, lid, exc)

    async def _persist_to_metadata(self) -> None:
        """Write the whole state into ManagedCursorInfo with cursorsLedgerId = -1
        (persistPositionToMetaStore). Raises ManagedCursorError when the holes are
        more than MAX_RANGES_IN_METADATA ranges, or the metadata store's error."""
        if self.individual_deleted.range_count() > MAX_RANGES_IN_METADATA:
            raise ManagedCursorError(
                f"cursor {self.name}: {self.individual_deleted.range_count()} acknowledged ranges do not fit "
                f"the metadata store (max {MAX_RANGES_IN_METADATA}) while the cursor ledger cannot be written")
        await self._write_info(cursor_ledger_id=-1, with_state=True)

    async def _take_over_info(self, raw: bytes) -> None:
        """Rewrite the ManagedCursorInfo just read (``raw`` bytes) at the version it was read at: the
        recovering owner bumps the node's version so a previous owner's late compare-and-set fails.
        Raises ManagedLedgerFencedError when another broker changed it meanwhile (or this broker may
        not write it)."""
        async with self._info_lock:
            await self.ml.check_metadata_write()
            try:
                self._info_version = await self.ml.metadata.put(self.path, raw, expected_version=self._info_version)
            except (BadVersion, NotFound) as exc:
                self.ml._fence(ManagedLedgerFencedError(
                    f"managed ledger {self.ml.name}: cursor {self.name} changed while being recovered ({exc})"))
                raise self.ml._fenced from None

    async def _write_info(self, create: bool = False, cursor_ledger_id: Optional[int] = None,
                          with_state: bool = False) -> None:
        """Write ManagedCursorInfo (compare-and-set on its version; one writer at a
        time). ``cursor_ledger_id`` defaults to the current cursor ledger (-1 none);
        ``with_state`` adds the holes and batch indexes (no cursor ledger)."""
        async with self._info_lock:
            if cursor_ledger_id is None:
                cursor_ledger_id = self._cursor_ledger.ledger_id if self._cursor_ledger is not None else -1
            info = metadata_pb2.ManagedCursorInfo(
                cursorsLedgerId=cursor_ledger_id,
                markDeleteLedgerId=self.mark_delete_position.ledger_id,
                markDeleteEntryId=self.mark_delete_position.entry_id,
                lastActive=self.last_active)
            for k, v in sorted(self.properties.items()):
                info.properties.add(name=k, value=v)
            for k, v in sorted(self.cursor_properties.items()):
                info.cursorProperties.add(name=k, value=v)
            if with_state:
                for (lid, first), (_, last) in self.individual_deleted.ranges():
                    r = info.individualDeletedMessages.add()
                    r.lowerEndpoint.ledgerId, r.lowerEndpoint.entryId = lid, first - 1
                    r.upperEndpoint.ledgerId, r.upperEndpoint.entryId = lid, last
                info.batchedEntryDeletionIndexInfo.extend(self.batch_deleted.to_protos())
            await self.ml.check_metadata_write()
            try:
                self._info_version = await self.ml.metadata.put(
                    self.path, info.SerializeToString(),
                    expected_version=-1 if create else self._info_version)
            except (BadVersion, NotFound) as exc:
                # ManagedCursorImpl: a BadVersion on the cursor node means another broker owns the
                # cursor now (its recovery bumped the version): fenced, never retried
                self.ml._fence(ManagedLedgerFencedError(
                    f"managed ledger {self.ml.name}: cursor {self.name} taken over by another owner ({exc})"))
                raise self.ml._fenced from None
