"""Entry cache for tailing reads (Pulsar's ``EntryCacheManager`` / ``RangeEntryCacheImpl``).

Each managed ledger has an :class:`EntryCache` holding the entries it added
while it had active readers; one :class:`EntryCacheManager` per broker shares a
byte budget (``managed_ledger_cache_size_mb``) among all caches and runs the
eviction, as Pulsar's ``ManagedLedgerFactoryImpl.doCacheEviction`` does every
``managedLedgerCacheEvictionIntervalMs``:

1. **behind the readers** (``ManagedLedgerImpl.doCacheEviction`` /
   ``invalidateEntriesUpToSlowestReaderPosition``): every entry before the
   slowest active cursor's read position (or at/before its mark-delete
   position with ``cacheEvictionByMarkDeletedPosition``) goes; without an
   active cursor the whole cache goes and adds stop being cached (Pulsar
   caches on add only when ``hasActiveCursors()``);
2. **by age** (``invalidateEntriesBeforeTimestamp``): entries inserted more
   than ``managedLedgerCacheEvictionTimeThresholdMillis`` ago go, even when a
   slow (or idle) cursor still has to read them: it reads them from the bookies;
3. **by size**, the backstop (``doEvictToWatermarkWhenOverThreshold``): when
   all caches together exceed the budget, the globally oldest entries go until
   the total is at ``managedLedgerCacheEvictionWatermark`` (0.9) of it, as
   PIP-430's central removal queue does.

The size counts ``len(data)`` plus :data:`ENTRY_OVERHEAD_BYTES` per entry, the
memory the cache itself spends on an entry (see the constant).

Layout, chosen so that a full garbage collection does not walk the cache
(Python's cyclic GC visits every *tracked* container): per ledger one plain
``dict`` from ``int`` entry id to ``bytes``. A dict holding only ints and bytes
is not GC-tracked in CPython, so cached entries add nothing to a collection's
work; keying by ``Position`` (a NamedTuple subclass, always tracked) made the
broker's full collections grow with the cache. The time index is a short deque
of marks, one per eviction tick at which something was added, not one per entry.

Entries are only ever inserted in increasing position order (the order adds
complete in); eviction always removes a prefix, so the structure is a queue.
A cache is an optimization only: every miss is read from the bookies by
``ManagedLedger.read_entries``, so eviction never loses or reorders an entry.
"""
from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import time
from typing import Callable, Iterable, NamedTuple, Optional

from .position import Position

log = logging.getLogger(__name__)

# What the cache spends per entry besides the payload, in bytes: the bytes object
# header (33 on 64-bit CPython), the int key (28; ids above 256 are not shared),
# and the dict slot (entry 24 B + index, at a load factor of 1/3..2/3: ~50 B on
# average). tests/unit/test_entry_cache.py checks this against tracemalloc.
ENTRY_OVERHEAD_BYTES = 112

# A cache's eviction-position callback returns None when no cursor is active.
EvictionPositionFn = Callable[[], Optional[Position]]

# The marks of a cache that has none (shared, never appended to: a deque costs
# 624 bytes, and most topics of a broker are idle).
_NO_MARKS: collections.deque = collections.deque(maxlen=0)


class EvictionStats(NamedTuple):
    """Entries and bytes (with overhead) removed by one :meth:`EntryCacheManager.do_cache_eviction`."""

    entries: int = 0
    bytes: int = 0


class _Ledger:
    """The cached entries of one ledger: ``entries`` maps entry id -> data, every
    cached id lies in ``[first, next)``; ``nbytes`` counts data plus overhead."""

    __slots__ = ("entries", "first", "next", "nbytes")

    def __init__(self, first: int) -> None:
        self.entries: dict[int, bytes] = {}
        self.first = first
        self.next = first
        self.nbytes = 0


class EntryCache:
    """The entries of one managed ledger, in position order (Pulsar's ``RangeEntryCacheImpl``).

    Create through :meth:`EntryCacheManager.new_cache`. ``eviction_position``
    (a callable, or None) answers "which entries may go": the position before
    which every active cursor has read (entries strictly before it are
    evicted), or None when the managed ledger has no active cursor (the cache
    is emptied and stops caching until :attr:`active` is set again by a cursor
    that reads). Without the callable the cache is always active and only age
    and size evict.

    Attributes (read-only for callers): ``size`` (bytes, with overhead),
    ``count`` (entries), ``hits``/``misses`` (lookups by :meth:`get`),
    ``active`` (adds are cached).
    """

    __slots__ = ("manager", "name", "eviction_position", "active", "_ledgers", "_last", "_marks", "_marked",
                 "size", "count", "hits", "misses")

    def __init__(self, manager: "EntryCacheManager", name: str,
                 eviction_position: Optional[EvictionPositionFn] = None):
        self.manager = manager
        self.name = name
        self.eviction_position = eviction_position
        self.active = eviction_position is None
        self._ledgers: dict[int, _Ledger] = {}      # ascending ledger ids (inserted in order)
        self._last = (-1, -1)                       # last inserted (ledger, entry)
        # (time, ledger, entry): every entry before (ledger, entry) was inserted before time (monotonic s)
        self._marks: collections.deque[tuple[float, int, int]] = _NO_MARKS
        self._marked = (-1, -1)                     # _last when the newest mark was made
        self.size = 0
        self.count = 0
        self.hits = 0
        self.misses = 0

    # ---- reads / writes ---------------------------------------------------
    def insert(self, position: Position, data: bytes) -> bool:
        """Cache ``data`` (bytes) at ``position``; False (nothing cached) when the
        cache is inactive or disabled (budget 0), or ``position`` is not after the
        last inserted one (entries are inserted in add order). May evict other
        caches' (or this one's) oldest entries when the budget is exceeded."""
        if not self.active or self.manager.max_size_bytes <= 0:
            return False
        lid, eid = position
        if (lid, eid) <= self._last:
            return False
        led = self._ledgers.get(lid)
        if led is None:
            led = self._ledgers[lid] = _Ledger(eid)
        elif not led.entries:
            led.first = eid
        led.entries[eid] = data
        led.next = eid + 1
        n = len(data) + ENTRY_OVERHEAD_BYTES
        led.nbytes += n
        self._last = (lid, eid)
        self.size += n
        self.count += 1
        if self.count == 1:
            self.manager._became_non_empty(self)
        self.manager._grew(n)
        return True

    def get(self, position: Position) -> Optional[bytes]:
        """The cached data at ``position`` or None (counted as a hit or a miss)."""
        led = self._ledgers.get(position[0])
        data = None if led is None else led.entries.get(position[1])
        if data is None:
            self.misses += 1
        else:
            self.hits += 1
        return data

    def __len__(self) -> int:
        return self.count

    def __contains__(self, position: Position) -> bool:
        led = self._ledgers.get(position[0])
        return led is not None and position[1] in led.entries

    def positions(self) -> list[Position]:
        """Every cached position, ascending (for tests and debugging; O(count))."""
        return [Position(lid, eid) for lid, led in self._ledgers.items() for eid in led.entries]

    # ---- eviction -----------------------------------------------------------
    def invalidate_before(self, position: Position) -> tuple[int, int]:
        """Drop every entry strictly before ``position`` (Pulsar's
        ``invalidateEntries(lastPosition)``, exclusive); returns (entries, bytes)."""
        return self._evict_before(position[0], position[1])

    def invalidate_older_than(self, cutoff: float) -> tuple[int, int]:
        """Drop the entries known to be inserted before ``cutoff`` (``time.monotonic()``
        seconds), i.e. up to the newest mark made at or before ``cutoff``; entries
        inserted since the last :meth:`mark` are kept. Returns (entries, bytes)."""
        mark = None
        marks = self._marks
        while marks and marks[0][0] <= cutoff:
            mark = marks.popleft()
        if mark is None:
            return 0, 0
        return self._evict_before(mark[1], mark[2])

    def mark(self, now: float) -> None:
        """Record that every entry inserted so far was inserted before ``now``
        (monotonic seconds); called once per eviction tick (cheap: one tuple per
        tick at which something was added)."""
        if self._last != self._marked and self.count:
            if self._marks is _NO_MARKS:
                self._marks = collections.deque()
            self._marks.append((now, self._last[0], self._last[1] + 1))
            self._marked = self._last

    def oldest_mark(self) -> float:
        """Time of the oldest mark (an upper bound of the oldest entry's insertion
        time), or +inf when every entry was inserted after the last mark."""
        return self._marks[0][0] if self._marks else float("inf")

    def evict_oldest(self, nbytes: int) -> int:
        """Drop the oldest entries until ``nbytes`` bytes (with overhead) are freed
        or the cache is empty; returns the bytes freed."""
        freed = 0
        while self._ledgers and freed < nbytes:
            lid = next(iter(self._ledgers))
            led = self._ledgers[lid]
            pop = led.entries.pop
            eid = led.first
            while eid < led.next and freed < nbytes:
                data = pop(eid, None)
                eid += 1
                if data is not None:
                    n = len(data) + ENTRY_OVERHEAD_BYTES
                    freed += n
                    led.nbytes -= n
                    self.count -= 1
            led.first = eid
            if not led.entries:
                del self._ledgers[lid]
        self._after_evict(freed, self._head())
        return freed

    def invalidate_ledgers(self, ledger_ids: Iterable[int]) -> tuple[int, int]:
        """Drop every entry of the given ledgers (trimmed or deleted); returns (entries, bytes)."""
        n = freed = 0
        for lid in set(ledger_ids):
            led = self._ledgers.pop(lid, None)
            if led is not None:
                n += len(led.entries)
                freed += led.nbytes
        self.count -= n
        self._after_evict(freed, self._head())
        self.manager.evicted_entries["trim"] += n
        return n, freed

    def invalidate_all(self) -> tuple[int, int]:
        """Drop every entry (the cache stays registered); returns (entries, bytes)."""
        n, freed = self.count, self.size
        self._ledgers.clear()
        self._marks = _NO_MARKS
        self.count = 0
        self._after_evict(freed, None)
        return n, freed

    def clear(self) -> None:
        """Drop every entry and unregister from the manager (the managed ledger closed)."""
        self.invalidate_all()
        self.active = False
        self.manager._forget(self)

    # ---- internals ----------------------------------------------------------
    def _head(self) -> Optional[tuple[int, int]]:
        for lid, led in self._ledgers.items():
            return lid, led.first
        return None

    def _evict_before(self, lid: int, eid: int) -> tuple[int, int]:
        n = freed = 0
        for seg_lid in list(self._ledgers):
            if seg_lid > lid:
                break
            led = self._ledgers[seg_lid]
            if seg_lid < lid or eid >= led.next:
                n += len(led.entries)
                freed += led.nbytes
                del self._ledgers[seg_lid]
                continue
            if eid <= led.first:
                break
            pop = led.entries.pop
            seg_freed = 0
            for e in range(led.first, eid):
                data = pop(e, None)
                if data is not None:
                    n += 1
                    seg_freed += len(data) + ENTRY_OVERHEAD_BYTES
            led.first = eid
            led.nbytes -= seg_freed
            freed += seg_freed
            if not led.entries:
                del self._ledgers[seg_lid]
            break
        if n or freed:
            self.count -= n
            self._after_evict(freed, self._head())
        else:
            self._prune_marks(self._head())
        return n, freed

    def _after_evict(self, freed: int, head: Optional[tuple[int, int]]) -> None:
        self.size -= freed
        self.manager.total -= freed
        self._prune_marks(head)
        if self.count == 0:
            self.manager._became_empty(self)

    def _prune_marks(self, head: Optional[tuple[int, int]]) -> None:
        """Forget the marks whose whole range was evicted (their position <= the head)."""
        marks = self._marks
        if head is None:
            self._marks = _NO_MARKS
            return
        while marks and (marks[0][1], marks[0][2]) <= head:
            marks.popleft()


class EntryCacheManager:
    """All entry caches of a broker and their eviction (Pulsar's
    ``RangeEntryCacheManagerImpl`` + the eviction task of ``ManagedLedgerFactoryImpl``).

    ``max_size_bytes``: budget of all caches together (bytes incl. per-entry
    overhead; 0 disables caching); ``eviction_watermark``: the size-based
    eviction brings the total down to this fraction of the budget
    (``managedLedgerCacheEvictionWatermark``); ``eviction_interval_ms``: period
    of the eviction task (``managedLedgerCacheEvictionIntervalMs``; 0 = no task,
    only the size cap evicts); ``eviction_time_threshold_ms``: age after which
    entries go (``managedLedgerCacheEvictionTimeThresholdMillis``; 0 = no age
    eviction). The task starts with the first cache created inside a running
    event loop; :meth:`close` stops it. Raises ValueError when
    ``eviction_watermark`` is not in (0, 1].

    Counters: ``total`` (bytes), ``entries``, ``evicted_entries`` (by reason:
    ``readers``, ``age``, ``size``, ``trim``, ``inactive``), ``evictions`` (ticks that removed something).
    """

    def __init__(self, max_size_bytes: int, eviction_watermark: float = 0.9, eviction_interval_ms: float = 10,
                 eviction_time_threshold_ms: float = 1000):
        if not 0.0 < eviction_watermark <= 1.0:
            raise ValueError(f"eviction_watermark must be in (0, 1], got {eviction_watermark}")
        self.max_size_bytes = max_size_bytes
        self.eviction_watermark = eviction_watermark
        self.eviction_interval_ms = eviction_interval_ms
        self.eviction_time_threshold_ms = eviction_time_threshold_ms
        self.total = 0
        self.evictions = 0
        self.evicted_entries: dict[str, int] = {"readers": 0, "age": 0, "size": 0, "trim": 0, "inactive": 0}
        self._caches: set[EntryCache] = set()
        self._non_empty: dict[EntryCache, None] = {}   # insertion-ordered set
        self._task: Optional[asyncio.Task] = None
        self._wakeup: Optional[asyncio.Event] = None
        self._closed = False

    # ---- caches -------------------------------------------------------------
    def new_cache(self, name: str, eviction_position: Optional[EvictionPositionFn] = None) -> EntryCache:
        """A new cache (see :class:`EntryCache` for ``eviction_position``); starts
        the eviction task when called in a running event loop."""
        cache = EntryCache(self, name, eviction_position)
        self._caches.add(cache)
        self._ensure_task()
        return cache

    @property
    def entries(self) -> int:
        """Entries cached in all caches."""
        return sum(c.count for c in list(self._non_empty))

    def caches(self) -> list[EntryCache]:
        """The registered caches (a copy)."""
        return list(self._caches)

    # ---- eviction -------------------------------------------------------------
    def do_cache_eviction(self, now: Optional[float] = None) -> EvictionStats:
        """One eviction pass over the non-empty caches at ``now`` (monotonic
        seconds; default now): behind the readers, then by age, then marks the
        entries inserted so far with ``now`` (for later age eviction) and enforces
        the size cap. Pure and synchronous; the task calls it every interval.
        Returns what was removed."""
        if now is None:
            now = time.monotonic()
        n = freed = 0
        cutoff = now - self.eviction_time_threshold_ms / 1000.0 if self.eviction_time_threshold_ms > 0 else None
        for cache in list(self._non_empty):
            if cache.eviction_position is not None:
                pos = cache.eviction_position()
                if pos is None:
                    # No active cursor: nothing will read these (Pulsar clears the cache).
                    cache.active = False
                    e, b = cache.invalidate_all()
                    self.evicted_entries["inactive"] += e
                    n, freed = n + e, freed + b
                    continue
                e, b = cache.invalidate_before(pos)
                self.evicted_entries["readers"] += e
                n, freed = n + e, freed + b
            if cutoff is not None and cache.count:
                e, b = cache.invalidate_older_than(cutoff)
                self.evicted_entries["age"] += e
                n, freed = n + e, freed + b
            cache.mark(now)
        if self.total > self.max_size_bytes:
            e, b = self._evict_to_watermark()
            n, freed = n + e, freed + b
        if n:
            self.evictions += 1
        return EvictionStats(n, freed)

    def _grew(self, nbytes: int) -> None:
        self.total += nbytes
        if self.total > self.max_size_bytes:
            self._evict_to_watermark()

    def _evict_to_watermark(self) -> tuple[int, int]:
        """Pulsar's size-based eviction: remove the globally oldest entries (by
        mark, caches without marks last and biggest first) until the total is at
        ``eviction_watermark`` of the budget."""
        target = int(self.max_size_bytes * self.eviction_watermark)
        before_entries, before = self.entries, self.total
        heap = [(c.oldest_mark(), -c.size, id(c), c) for c in self._non_empty]
        heapq.heapify(heap)
        while heap and self.total > target:
            t, _, _, cache = heapq.heappop(heap)
            if t != float("inf"):
                mark = cache._marks.popleft()
                cache._evict_before(mark[1], mark[2])
            else:
                cache.evict_oldest(self.total - target)
            if cache.count:
                heapq.heappush(heap, (cache.oldest_mark(), -cache.size, id(cache), cache))
        removed = before_entries - self.entries
        self.evicted_entries["size"] += removed
        return removed, before - self.total

    def _became_non_empty(self, cache: EntryCache) -> None:
        self._non_empty[cache] = None
        if self._wakeup is not None:
            self._wakeup.set()

    def _became_empty(self, cache: EntryCache) -> None:
        self._non_empty.pop(cache, None)

    def _forget(self, cache: EntryCache) -> None:
        self._caches.discard(cache)
        self._non_empty.pop(cache, None)

    # ---- the eviction task -------------------------------------------------------
    def _ensure_task(self) -> None:
        if self._task is not None or self._closed or self.eviction_interval_ms <= 0:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._eviction_loop(), name="entry-cache-eviction")

    async def _eviction_loop(self) -> None:
        interval = self.eviction_interval_ms / 1000.0
        try:
            while not self._closed:
                if not self._non_empty:
                    # Nothing cached: sleep until an insert (an idle broker does not wake up).
                    self._wakeup.clear()
                    await self._wakeup.wait()
                await asyncio.sleep(interval)
                try:
                    self.do_cache_eviction(time.monotonic())
                except Exception:  # noqa: BLE001 - keep evicting; a bug here must not stop the broker
                    log.exception("entry cache eviction failed")
        except asyncio.CancelledError:
            pass

    async def close(self) -> None:
        """Stop the eviction task (the caches stay usable; only the size cap evicts then)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
