"""ManagedLedger: one topic's log as an ordered list of BookKeeper ledgers.

Follows Pulsar's ``ManagedLedgerImpl``:

* The list of ledgers (``ManagedLedgerInfo``: id, entries, size, timestamp per
  ledger) lives in the metadata store at ``/managed-ledgers/<name>``; cursors are
  its children ``/managed-ledgers/<name>/<cursor>``.
* ``add_entry`` appends to the current ledger; when it is full
  (``currentLedgerIsFull``: entries >= managed_ledger_max_entries_per_ledger or
  size >= managed_ledger_max_size_per_ledger_mb, once at least
  managed_ledger_min_ledger_rollover_time_minutes passed; or older than
  managed_ledger_max_ledger_rollover_time_minutes) the ledger is closed and a new
  one created (rollover) as soon as the add that filled it completes. Adds issued
  meanwhile queue and keep their order.
* Ledger creation that fails backs off (CREATE_LEDGER_RETRY_*), across rollovers;
  when the bookies are read-only (disk full) the waiting adds fail with
  NotEnoughBookies, and so do new adds until a ledger can be created again.
* A write error is invisible to producers (``ManagedLedgerImpl.ledgerClosed``,
  ``OpAddEntry.handleAddFailure``): the failed ledger is closed at the writer's
  LastAddConfirmed, and every add not confirmed on it is resubmitted, in order,
  to a new ledger. Only a fenced ledger (another owner), a closed managed
  ledger or an entry too large fail an add.
* On open after a restart the last ledger is recovered (fenced and closed at its
  last entry; recovery never closes short, see ``bookie.client``) and a new
  ledger is created for writes.
* Recently added entries stay in an entry cache (bounded in bytes) for tailing
  reads; closed ledgers with a known entry count that every durable cursor's
  *persisted* mark-delete position has passed are trimmed
  (``internalTrimConsumedLedgers``).
"""
from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import TYPE_CHECKING, Optional

from bookie.client import BookKeeper, LedgerHandle
from bookie.errors import BKException, EntryTooLargeError, LedgerFencedError, NoSuchLedgerError, NotEnoughBookiesError
from proto import metadata_pb2

from broker.metadata.names import ml_path

from .entry_cache import EntryCache
from .errors import ManagedLedgerClosedError, ManagedLedgerError, ManagedLedgerFencedError
from .ledger_positions import LedgerPositions
from .position import Entry, Position

if TYPE_CHECKING:
    from .factory import ManagedLedgerFactory
    from .managed_cursor import ManagedCursor

log = logging.getLogger(__name__)

# Ledger creation after a failure backs off from the first to the last delay (seconds),
# doubling; the delay is kept across rollovers and reset only once a new ledger took an
# add, so a ledger whose first add fails (a read-only bookie in its ensemble) is not
# followed by another one at once, and another (a tight create/fail loop).
CREATE_LEDGER_RETRY_FIRST_S = 0.05
CREATE_LEDGER_RETRY_MAX_S = 5.0


class ManagedLedger(LedgerPositions):
    """A topic's append-only log. Create through ``ManagedLedgerFactory.open``."""

    def __init__(self, factory: "ManagedLedgerFactory", name: str):
        self.factory = factory
        self.name = name
        self.config = factory.config
        self.bk: BookKeeper = factory.bk
        self.metadata = factory.metadata
        self.ledgers: dict[int, metadata_pb2.ManagedLedgerInfo.LedgerInfo] = {}
        self.properties: dict[str, str] = {}
        self._info_version: Optional[int] = None
        self.current: Optional[LedgerHandle] = None
        self._current_created_ms = 0.0
        self._current_entries = 0
        self._current_size = 0
        self.last_confirmed: Position = Position(-1, -1)
        self.cursors: dict[str, "ManagedCursor"] = {}  # durable and non-durable
        self._opening_cursors: dict[str, asyncio.Task] = {}  # Pulsar's uninitializedCursors
        self.cache: EntryCache = factory.cache_manager.new_cache(name, self.cache_eviction_position)
        self._readers: list[weakref.ref] = []   # non-durable cursors (weak: dropped readers vanish), for the cache
        self._queued: list[tuple[bytes, asyncio.Future]] = []
        # Adds not confirmed on a ledger that failed: resubmitted first, in order, to the next ledger.
        self._failed_adds: list[tuple[bytes, asyncio.Future]] = []
        self._failed_ledger: Optional[LedgerHandle] = None   # closed at its LAC by the next rollover
        self._ledgers_to_delete: list[int] = []               # empty ledgers, deleted after _store_info
        self._rollover_task: Optional[asyncio.Task] = None
        self._create_retry_s = CREATE_LEDGER_RETRY_FIRST_S   # next ledger-creation backoff (see above)
        # Why no ledger can be created (NotEnoughBookies with read-only bookies: disk full); while
        # set and no ledger is open, adds fail at once with it instead of waiting.
        self._cannot_create: Optional[str] = None
        self._closing = asyncio.Event()                       # set by close(): stops creation retries
        self._read_handles: dict[int, LedgerHandle] = {}
        self._add_waiters: list[asyncio.Future] = []  # resolved at the next confirmed add (or close)
        self._closed = False
        self._fenced: Optional[Exception] = None
        self._fenced_listeners: list = []   # called with the error once fenced (the topic closes)
        self._info_lock = asyncio.Lock()
        self._trim_task: Optional[asyncio.Task] = None
        self.entries_added_total = 0
        self.bytes_added_total = 0

    # ---- open / metadata ------------------------------------------------
    async def _open(self) -> None:
        res = await self.metadata.get(ml_path(self.name))
        info = metadata_pb2.ManagedLedgerInfo()
        if res is not None:
            info.ParseFromString(res.value)
            self._info_version = res.version
        for li in info.ledgerInfo:
            self.ledgers[li.ledgerId] = li
        self.properties = {kv.key: kv.value for kv in info.properties}
        if self.ledgers:
            last_id = max(self.ledgers)
            try:
                handle = await self.bk.open_ledger(last_id, recovery=True)
            except NoSuchLedgerError:
                # Created but never written, and deleted (ManagedLedgerImpl.initialize
                # drops a last ledger that does not exist).
                log.warning("[%s] last ledger %d does not exist; dropping it from the list", self.name, last_id)
                del self.ledgers[last_id]
                handle = None
            if handle is not None:
                li = self.ledgers[last_id]
                li.entries = handle.last_add_confirmed + 1
                li.size = handle.metadata.length if handle.metadata.length > 0 else li.size
                if li.entries == 0:
                    del self.ledgers[last_id]
                    self._ledgers_to_delete.append(last_id)   # once the list without it is stored
                else:
                    self._read_handles[last_id] = handle
        non_empty = [lid for lid, li in self.ledgers.items() if li.entries > 0]
        if non_empty:
            last = max(non_empty)
            self.last_confirmed = Position(last, self.ledgers[last].entries - 1)
        await self._create_ledger()
        if self.last_confirmed.ledger_id == -1:
            self.last_confirmed = Position(self.current.ledger_id, -1)

    def _info(self) -> metadata_pb2.ManagedLedgerInfo:
        info = metadata_pb2.ManagedLedgerInfo()
        for lid in sorted(self.ledgers):
            info.ledgerInfo.append(self.ledgers[lid])
        for k, v in sorted(self.properties.items()):
            info.properties.add(key=k, value=v)
        return info

    async def _store_info(self) -> None:
        async with self._info_lock:
            await self.check_metadata_write()
            data = self._info().SerializeToString()
            try:
                self._info_version = await self.metadata.put(
                    ml_path(self.name), data,
                    expected_version=-1 if self._info_version is None else self._info_version)
            except Exception as exc:
                self._fence(ManagedLedgerFencedError(
                    f"managed ledger {self.name}: metadata changed by another owner ({exc})"))
                raise self._fenced from None
            # Empty ledgers left the stored list just now: only now may they be deleted
            # (deleted earlier, a crash would leave the list naming a missing ledger).
            gone = [lid for lid in self._ledgers_to_delete if lid not in self.ledgers]
            self._ledgers_to_delete = [lid for lid in self._ledgers_to_delete if lid in self.ledgers]
        for lid in gone:
            asyncio.ensure_future(self._delete_ledger_quietly(lid))

    def _fence(self, exc: Exception) -> None:
        if self._fenced is None:
            log.error("%s", exc)
            self._fenced = exc
            for listener in list(self._fenced_listeners):
                try:
                    listener(exc)
                except Exception:  # noqa: BLE001 - a listener's bug must not hide the fencing
                    log.exception("[%s] fenced listener failed", self.name)

    def add_fenced_listener(self, listener) -> None:
        """Call ``listener(ManagedLedgerFencedError)`` once, when this instance is fenced (another
        owner took it over, or this broker may no longer write its metadata): the topic closes and
        is reloaded from the store (Pulsar's ManagedLedgerFencedException closing a PersistentTopic)."""
        self._fenced_listeners.append(listener)

    async def check_metadata_write(self) -> None:
        """Raise ManagedLedgerFencedError unless this instance may still write its metadata (ledger
        list, cursor nodes): not fenced, and the factory's ``metadata_write_guard`` (the broker's bundle
        ownership and metadata session, ``NamespaceService.metadata_write_refusal``) has no objection.
        A refusal fences this instance: a broker that lost its session or its bundle writes nothing
        more for the topic (Pulsar: ManagedLedgerFactoryImpl.isMetadataServiceAvailable, and the
        topic closed when its bundle is no longer owned)."""
        if self._fenced is not None:
            raise self._fenced
        guard = self.factory.metadata_write_guard
        if guard is None:
            return
        refusal = await guard(self.name)
        if refusal is not None:
            self._fence(ManagedLedgerFencedError(f"managed ledger {self.name}: metadata write refused: {refusal}"))
            raise self._fenced

    async def _create_ledger(self) -> None:
        c = self.config
        handle = await self.bk.create_ledger(c.managed_ledger_default_ensemble_size,
                                             c.managed_ledger_default_write_quorum,
                                             c.managed_ledger_default_ack_quorum)
        self.ledgers[handle.ledger_id] = metadata_pb2.ManagedLedgerInfo.LedgerInfo(
            ledgerId=handle.ledger_id, entries=0, size=0, timestamp=int(time.time() * 1000))
        await self._store_info()
        self.current = handle
        self._current_created_ms = time.monotonic() * 1000
        self._current_entries = 0
        self._current_size = 0
        log.info("[%s] created ledger %d", self.name, handle.ledger_id)

    # ---- writes ---------------------------------------------------------
    def _current_is_full(self) -> bool:
        c = self.config
        age_min = (time.monotonic() * 1000 - self._current_created_ms) / 60000.0
        if self._current_entries == 0:
            return False
        full = (self._current_entries >= c.managed_ledger_max_entries_per_ledger
                or self._current_size >= c.managed_ledger_max_size_per_ledger_mb * 1024 * 1024)
        if full and age_min >= c.managed_ledger_min_ledger_rollover_time_minutes:
            return True
        return age_min >= c.managed_ledger_max_ledger_rollover_time_minutes

    def add_entry_nowait(self, data: bytes) -> asyncio.Future:
        """Start appending ``data`` (bytes); returns a future of its Position.

        Adds complete in call order. A bookie failure does not fail the add: the
        ledger is closed at its LastAddConfirmed and the add resubmitted to a new
        ledger (waiting while none can be created). Errors (set on the future or
        raised): ManagedLedgerClosedError (closed, also while waiting),
        ManagedLedgerFencedError (another owner), ManagedLedgerError (entry larger
        than ``max_entry_size_bytes``).
        """
        if self._closed or self._closing.is_set():
            raise ManagedLedgerClosedError(f"managed ledger {self.name} is closed")
        if self._fenced is not None:
            raise self._fenced
        if len(data) > self.config.max_entry_size_bytes:
            raise ManagedLedgerError(
                f"entry of {len(data)} bytes exceeds max_entry_size_bytes={self.config.max_entry_size_bytes}")
        if self._cannot_create is not None and self.current is None:
            raise ManagedLedgerError(f"[{self.name}] cannot store entries now: {self._cannot_create}")
        fut = asyncio.get_running_loop().create_future()
        if self._rollover_task is not None or self._queued or self.current is None:
            self._queued.append((data, fut))
            self._start_rollover()
            return fut
        if self._current_is_full():
            self._queued.append((data, fut))
            self._start_rollover()
            return fut
        self._write(data, fut)
        return fut

    async def add_entry(self, data: bytes) -> Position:
        """Append one entry; returns its Position once Qa bookies stored it."""
        return await self.add_entry_nowait(data)

    def _write(self, data: bytes, fut: asyncio.Future) -> None:
        handle = self.current
        self._current_entries += 1
        self._current_size += len(data)
        try:
            # Callback form of handle.add_entry_nowait: no bookie-level future and
            # no extra event-loop round trip per entry.
            handle._add_entry_cb(data, self._add_complete, (handle, data, fut))
        except BKException as exc:
            self._add_complete((handle, data, fut), None, exc)

    def _add_complete(self, ctx: tuple, entry_id: Optional[int], exc: Optional[BaseException]) -> None:
        handle, data, fut = ctx
        if exc is not None:
            if isinstance(exc, EntryTooLargeError) or self._fenced is not None or \
                    isinstance(exc, LedgerFencedError) or self._closing.is_set():
                self._on_ledger_error(handle, exc)
                if not fut.done():
                    fut.set_exception(self._fenced or (
                        ManagedLedgerClosedError(f"managed ledger {self.name} closed while adding ({exc})")
                        if self._closing.is_set() else ManagedLedgerError(f"[{self.name}] add failed: {exc}")))
                return
            # OpAddEntry.handleAddFailure: not confirmed on this ledger, so resubmitted
            # to the next one; the producer never sees the bookie failure.
            self._failed_adds.append((data, fut))
            self._on_ledger_error(handle, exc)
            return
        pos = Position(handle.ledger_id, entry_id)
        self.last_confirmed = pos
        self._create_retry_s = CREATE_LEDGER_RETRY_FIRST_S   # a ledger took an add: creation works
        self.entries_added_total += 1
        self.bytes_added_total += len(data)
        self.cache.insert(pos, data)
        if not fut.done():
            fut.set_result(pos)
        if self._add_waiters:
            self._wake_add_waiters()
        if handle is self.current and self._rollover_task is None and self._current_is_full():
            # ManagedLedgerImpl: the add that fills the ledger closes it and creates the next
            # one at once (not at the next add), so a caught-up reader sees the ledger closed.
            self._start_rollover()

    def _on_ledger_error(self, handle: LedgerHandle, exc: BaseException) -> None:
        if isinstance(exc, LedgerFencedError):
            self._fence(ManagedLedgerFencedError(f"managed ledger {self.name}: ledger {handle.ledger_id} fenced: {exc}"))
            failed, self._failed_adds = self._failed_adds, []
            for _, fut in failed:
                if not fut.done():
                    fut.set_exception(self._fenced)
            return
        if isinstance(exc, EntryTooLargeError):
            return
        if handle is self.current:
            # ManagedLedgerImpl.ledgerClosed: close this ledger at the writer's LAC and
            # continue on a new one (the rollover resubmits the failed adds first).
            log.warning("[%s] ledger %d failed at LAC %d (%s); closing it and continuing on a new ledger",
                        self.name, handle.ledger_id, handle.last_add_confirmed, exc)
            self._failed_ledger = handle
            self.current = None
        self._start_rollover()

    def _start_rollover(self) -> None:
        if self._rollover_task is None and not self._closing.is_set():
            self._rollover_task = asyncio.create_task(self._rollover())

    async def _close_ledger(self, old: LedgerHandle) -> None:
        """Close ``old`` at the writer's LastAddConfirmed (waits for its pending adds)
        and record its entry count; an empty ledger leaves the list. Raises
        ManagedLedgerFencedError when the ledger was fenced or its metadata changed
        (another owner recovered it)."""
        try:
            await old.close()
        except LedgerFencedError as exc:
            self._fence(ManagedLedgerFencedError(f"managed ledger {self.name}: ledger {old.ledger_id}: {exc}"))
            raise self._fenced from None
        if isinstance(old._error, LedgerFencedError):
            self._fence(ManagedLedgerFencedError(
                f"managed ledger {self.name}: ledger {old.ledger_id} fenced: {old._error}"))
            raise self._fenced
        li = self.ledgers.get(old.ledger_id)
        if li is None:
            return
        if old.last_add_confirmed < 0:
            del self.ledgers[old.ledger_id]
            self._ledgers_to_delete.append(old.ledger_id)   # deleted once the list without it is stored
            return
        li.entries = old.last_add_confirmed + 1
        li.size = old.length
        self._read_handles[old.ledger_id] = old

    async def _delete_ledger_quietly(self, ledger_id: int) -> None:
        try:
            await self.bk.delete_ledger(ledger_id)
        except Exception as exc:  # noqa: BLE001 - an empty ledger; leaks at worst
            log.warning("[%s] deleting empty ledger %d: %s", self.name, ledger_id, exc)

    async def _backoff_creation(self) -> None:
        """Wait the current ledger-creation backoff (or until close) and double it."""
        delay = self._create_retry_s
        self._create_retry_s = min(delay * 2, CREATE_LEDGER_RETRY_MAX_S)
        try:
            await asyncio.wait_for(self._closing.wait(), delay)
        except asyncio.TimeoutError:
            pass

    def _fail_waiting_adds(self, error: ManagedLedgerError) -> None:
        """Fail the adds waiting for a ledger (Pulsar's clearPendingAddEntries after a failed
        createLedger): none was stored; the producer's client resends them."""
        waiting = self._failed_adds + self._queued
        self._failed_adds, self._queued = [], []
        for _, fut in waiting:
            if not fut.done():
                fut.set_exception(error)

    async def _rollover(self) -> None:
        try:
            old = self.current if self.current is not None else self._failed_ledger
            failed_unused = old is not None and old is self._failed_ledger and old.last_add_confirmed < 0
            if old is not None:
                await self._close_ledger(old)
            self._failed_ledger = None
            self.current = None
            if failed_unused and self._create_retry_s > CREATE_LEDGER_RETRY_FIRST_S:
                # The last ledger failed before it took a single add, after an earlier failure:
                # wait before the next one (else: create, fail the first add, create, ...).
                log.warning("[%s] ledger %d failed before its first add; next ledger in %.2fs", self.name,
                            old.ledger_id, self._create_retry_s)
                await self._backoff_creation()
            elif failed_unused:
                self._create_retry_s = CREATE_LEDGER_RETRY_FIRST_S * 2
            while True:
                if self._closing.is_set():
                    raise ManagedLedgerClosedError(f"managed ledger {self.name} is closed")
                try:
                    await self._create_ledger()
                    if self._cannot_create is not None:
                        log.info("[%s] a ledger could be created again (%s)", self.name, self._cannot_create)
                    self._cannot_create = None
                    break
                except ManagedLedgerFencedError:
                    raise
                except BKException as exc:
                    if isinstance(exc, NotEnoughBookiesError) and exc.read_only_bookies:
                        # Disk full: lasts until an operator frees space. Fail the sends waiting
                        # now (clear error, NotEnoughBookies) rather than let them time out.
                        if self._cannot_create is None:
                            log.error("[%s] cannot create a ledger: %s; failing sends until bookies are "
                                      "writable again", self.name, exc)
                        self._cannot_create = str(exc)
                        self._fail_waiting_adds(ManagedLedgerError(f"[{self.name}] cannot store entries: {exc}"))
                    log.warning("[%s] cannot create a ledger yet: %s; retrying in %.2fs", self.name, exc,
                                self._create_retry_s)
                    await self._backoff_creation()
        except Exception as exc:
            failed = self._failed_adds + self._queued
            self._failed_adds, self._queued = [], []
            error = exc if isinstance(exc, ManagedLedgerError) else ManagedLedgerError(str(exc))
            for _, fut in failed:
                if not fut.done():
                    fut.set_exception(error)
            self._rollover_task = None
            return
        self._rollover_task = None
        queued = self._failed_adds + self._queued
        self._failed_adds, self._queued = [], []
        for i, (data, fut) in enumerate(queued):
            if self.current is None or self._current_is_full():
                # The new ledger failed or filled up already: the rest waits for the next one.
                self._queued = queued[i:] + self._queued
                self._start_rollover()
                break
            self._write(data, fut)
        self.schedule_trim()

    # ---- reads ----------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        """True once ``close()`` or ``delete()`` ran (ManagedLedger.isClosed)."""
        return self._closed

    async def read_entries(self, start: Position, max_count: int, max_bytes: int = 5 * 1024 * 1024) -> list[Entry]:
        """Up to ``max_count`` confirmed entries from ``start`` on, within ``start``'s
        ledger (a later call continues in the next ledger), stopping once ``max_bytes``
        (bytes) are collected. Returns [] when nothing is confirmed at ``start`` yet."""
        if start.ledger_id not in self.ledgers or start.entry_id >= self.ledger_entries(start.ledger_id):
            start = self.next_position(Position(start.ledger_id, start.entry_id - 1)) \
                if start.entry_id > 0 else start
            if start.ledger_id not in self.ledgers or start.entry_id >= self.ledger_entries(start.ledger_id):
                nxt = self._next_ledger_start(start)
                if nxt is None:
                    return []
                start = nxt
        n = self.ledger_entries(start.ledger_id)
        last = min(n - 1, start.entry_id + max_count - 1)
        if last < start.entry_id:
            return []
        out: list[Entry] = []
        size = 0
        entry = start.entry_id
        lid = start.ledger_id
        while entry <= last:
            data = self.cache.get(Position(lid, entry))
            if data is None:
                # Read the run of uncached entries from the bookies in one call.
                end = entry
                while end + 1 <= last and self.cache.get(Position(lid, end + 1)) is None and end - entry < 255:
                    end += 1
                handle = await self._read_handle(lid)
                datas = await handle.read_entries(entry, end)
                for i, d in enumerate(datas):
                    out.append(Entry(Position(lid, entry + i), d))
                    size += len(d)
                entry = end + 1
            else:
                out.append(Entry(Position(lid, entry), data))
                size += len(data)
                entry += 1
            if size >= max_bytes:
                break
        return out

    def _next_ledger_start(self, pos: Position) -> Optional[Position]:
        for lid in sorted(self.ledgers):
            if lid > pos.ledger_id and self.ledger_entries(lid) > 0:
                return Position(lid, 0)
        return None

    async def _read_handle(self, ledger_id: int) -> LedgerHandle:
        if self.current is not None and ledger_id == self.current.ledger_id:
            return self.current
        handle = self._read_handles.get(ledger_id)
        if handle is None:
            handle = await self.bk.open_ledger(ledger_id, recovery=True)
            self._read_handles[ledger_id] = handle
        return handle

    def _wake_add_waiters(self) -> None:
        waiters, self._add_waiters = self._add_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def position_future(self, pos: Position) -> Optional[asyncio.Future]:
        """None if an entry at or after ``pos`` is already confirmed (or the managed
        ledger is closed), else a future resolved at the next confirmed add or at
        close (check again then).  Cancelling it is harmless.  A plain future, so
        that idle dispatchers and replicators wait without creating tasks."""
        if self._closed or not self.last_confirmed < pos:
            return None
        if len(self._add_waiters) > 64:  # drop waiters cancelled meanwhile (woken dispatchers)
            self._add_waiters = [w for w in self._add_waiters if not w.done()]
        fut = asyncio.get_running_loop().create_future()
        self._add_waiters.append(fut)
        return fut

    async def wait_for_position(self, pos: Position, timeout: Optional[float] = None) -> bool:
        """Wait until an entry at or after ``pos`` is confirmed (``last_confirmed >= pos``);
        returns False on timeout (seconds) or when the managed ledger closes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            fut = self.position_future(pos)
            if fut is None:
                break
            if deadline is None:
                await fut
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                fut.cancel()
                return False
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                return False
        return self.last_confirmed >= pos

    # ---- cursors --------------------------------------------------------
    async def open_cursor(self, name: str, initial_position: str = "latest",
                          properties: Optional[dict[str, int]] = None) -> "ManagedCursor":
        """Open (recover) or create the durable cursor ``name``; a new cursor starts
        after the last entry (``latest``) or before the first (``earliest``). Concurrent
        calls for one name share one open. Raises what ManagedCursor.open_or_create raises."""
        from .managed_cursor import ManagedCursor

        cursor = self.cursors.get(name)
        if cursor is not None:
            return cursor
        # Concurrent opens of one cursor (two consumers subscribing at once) share one
        # open_or_create, as Pulsar's uninitializedCursors: a second create would find the
        # node the first wrote and take it for another owner's (a fenced managed ledger).
        opening = self._opening_cursors.get(name)
        if opening is None:
            opening = asyncio.ensure_future(ManagedCursor.open_or_create(self, name, initial_position, properties))
            self._opening_cursors[name] = opening

            def opened(task: asyncio.Task, name: str = name) -> None:
                if self._opening_cursors.get(name) is task:
                    del self._opening_cursors[name]
                if not task.cancelled() and task.exception() is None:
                    self.cursors.setdefault(name, task.result())
            opening.add_done_callback(opened)
        await asyncio.shield(opening)
        return self.cursors.get(name) or opening.result()

    def new_non_durable_cursor(self, start: Position, name: Optional[str] = None,
                               inclusive: bool = True) -> "ManagedCursor":
        """A cursor kept only in memory (Reader); it does not hold back trimming."""
        from .managed_cursor import ManagedCursor

        cursor = ManagedCursor.non_durable(self, start, name or f"reader-{id(start)}-{time.monotonic_ns()}", inclusive)
        self._readers = [r for r in self._readers if r() is not None] + [weakref.ref(cursor)]
        return cursor

    async def delete_cursor(self, name: str) -> None:
        """Remove a durable cursor, its cursor ledger and metadata."""
        cursor = self.cursors.pop(name, None)
        if cursor is not None:
            await cursor.remove()
        self.schedule_trim()

    # ---- trimming -------------------------------------------------------
    def schedule_trim(self) -> None:
        """Trim consumed ledgers soon (coalesced)."""
        if self._trim_task is None or self._trim_task.done():
            self._trim_task = asyncio.create_task(self._trim_consumed_ledgers())

    def slowest_mark_delete(self) -> Optional[Position]:
        """The lowest in-memory mark-delete position of the durable cursors (None without any)."""
        durable = [c.mark_delete_position for c in self.cursors.values() if c.durable]
        return min(durable) if durable else None

    def slowest_persisted_mark_delete(self) -> Optional[Position]:
        """The lowest mark-delete position that the durable cursors have made durable
        (ManagedCursorImpl.persistentMarkDeletePosition); None without durable cursors."""
        durable = [c.persistent_mark_delete_position for c in self.cursors.values() if c.durable]
        return min(durable) if durable else None

    def cache_eviction_position(self) -> Optional[Position]:
        """The entry cache may drop every entry before this position: the slowest
        read position of the active cursors (durable and non-durable; Pulsar's
        getEarlierReadPositionForActiveCursors), or the position after the slowest
        mark-delete with ``cache_eviction_by_mark_deleted_position``. None when no
        cursor is active (a cursor is active once it has read; the dedup cursor and
        subscriptions recovered without consumers are not)."""
        by_md = self.config.cache_eviction_by_mark_deleted_position
        slowest = None
        readers = [r() for r in self._readers]
        for cursors in (self.cursors.values(), readers):
            for c in cursors:
                if c is None or not c.active or c._closed:
                    continue
                p = Position(c.mark_delete_position.ledger_id, c.mark_delete_position.entry_id + 1) \
                    if by_md else c.read_position
                if slowest is None or p < slowest:
                    slowest = p
        return slowest

    async def _trim_consumed_ledgers(self) -> None:
        """Pulsar's internalTrimConsumedLedgers: delete the closed ledgers, oldest
        first, that every durable cursor's *persisted* mark-delete position has
        passed, honouring retention. A ledger whose entry count is not final (the
        current one, one being closed after a write error, or an entry count of 0
        in the list) stops the trimming: its consumption cannot be decided."""
        await asyncio.sleep(0)
        c = self.config
        if c.default_retention_time_in_minutes < 0 and c.default_retention_size_in_mb < 0:
            return
        if self.current is None or self._closed:
            return  # a rollover or close is in progress; the rollover trims when done
        slowest = self.slowest_persisted_mark_delete()
        if slowest is None:
            slowest = self.last_confirmed if c.default_retention_time_in_minutes == 0 else None
        if slowest is None:
            return
        now_ms = time.time() * 1000
        current_id = self.current.ledger_id
        deletable = []
        for lid in sorted(self.ledgers):
            if lid >= current_id:
                break
            li = self.ledgers[lid]
            if li.entries <= 0:
                break
            consumed = lid < slowest.ledger_id or (lid == slowest.ledger_id and slowest.entry_id >= li.entries - 1)
            if not consumed:
                break
            age_min = (now_ms - li.timestamp) / 60000.0
            if c.default_retention_time_in_minutes < 0 or age_min < c.default_retention_time_in_minutes:
                break
            deletable.append(lid)
        if not deletable:
            return
        for lid in deletable:
            del self.ledgers[lid]
            self._read_handles.pop(lid, None)
        self.cache.invalidate_ledgers(deletable)
        await self._store_info()
        for lid in deletable:
            await self.bk.delete_ledger(lid)
        log.info("[%s] trimmed consumed ledgers %s", self.name, deletable)

    # ---- lifecycle ------------------------------------------------------
    async def close(self) -> None:
        """Close the current ledger and every cursor; the object is unusable afterwards."""
        if self._closed:
            return
        self._closing.set()   # a rollover waiting for bookies gives up; its queued adds fail (not stored)
        if self._rollover_task is not None:
            await asyncio.gather(self._rollover_task, return_exceptions=True)
        # Adds still waiting for a ledger (queued behind a rollover that filled up or gave up,
        # or resubmissions of failed adds) are not stored and never will be here: fail them
        # (Pulsar's clearPendingAddEntries with ManagedLedgerAlreadyClosedException), else
        # their producers wait forever on a topic that is gone.
        unstored, self._queued, self._failed_adds = self._queued + self._failed_adds, [], []
        for _, fut in unstored:
            if not fut.done():
                fut.set_exception(ManagedLedgerClosedError(f"managed ledger {self.name} closed before storing"))
        for cursor in list(self.cursors.values()):
            await cursor.close()
        self._closed = True
        if self.current is not None and self._fenced is None:
            try:
                await self.current.close()
                li = self.ledgers.get(self.current.ledger_id)
                if li is not None:
                    li.entries = self.current.last_add_confirmed + 1
                    li.size = self.current.length
                    await self._store_info()
            except Exception as exc:
                log.warning("[%s] close: %s", self.name, exc)
        self._wake_add_waiters()
        self.factory._forget(self)
        self.cache.clear()

    async def delete(self) -> None:
        """Delete the managed ledger: every cursor, ledger and its metadata
        (ManagedLedgerImpl.asyncDelete). The factory forgets it first, so an open
        meanwhile creates a new one instead of returning this one; the adds in
        flight complete first (close). Raises the metadata store's error."""
        self.factory._forget(self)
        await self.close()
        for name in list(self.cursors):
            await self.delete_cursor(name)
        for lid in list(self.ledgers):
            await self.bk.delete_ledger(lid)
        if await self.metadata.exists(ml_path(self.name)):
            await self.metadata.delete(ml_path(self.name))
