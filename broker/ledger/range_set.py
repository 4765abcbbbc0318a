"""Individually acknowledged positions of a managed cursor (ack holes).

This is minipulsar's ``individualDeletedMessages``: Pulsar's
``LongPairRangeSet`` (``DefaultRangeSet`` on Guava ``RangeSet``, and the
memory-friendly ``OpenLongPairRangeSet`` / ``ConcurrentOpenLongPairRangeSet``
on one ``BitSet`` per ledger).  Like the latter, the entries acknowledged in
each ledger are kept as a bit set -- here a compressed pyroaring ``BitMap`` --
and *ranges* are only derived when asked for.  That keeps the worst case of
the Pulsar article (1,000,000 entries, every other one acknowledged: 500,000
Guava ``Range`` objects) at about 128 KB instead of tens of megabytes.

Ranges
------
Pulsar's ``Range`` of acknowledged positions is open-closed:
``(1:-1, 1:2]`` means entries 0..2 of ledger 1.  minipulsar uses **closed**
ranges throughout: ``((1, 0), (1, 2))``.  Converting to Pulsar's
``MessageRange`` (``lowerEndpoint`` exclusive) means using ``entry - 1`` as the
lower endpoint.  A range never spans two ledgers (entry ids of different
ledgers are not adjacent), as in ``OpenLongPairRangeSet``.

Persistence (PIP-81)
--------------------
Every mutation that changes a ledger's set marks that ledger *dirty*; the
cursor persists only dirty ledgers (``serialize_ledger``) and then calls
``clear_dirty``.  ``load_ledger`` restores one ledger from its bytes
(pyroaring portable serialization, the ``LedgerAckSet.ackedEntries`` field of
``proto/metadata.proto``) without marking it dirty.  A ledger whose set
becomes empty disappears (but is reported dirty, so the persisted copy can be
dropped too).

Pure synchronous Python, no I/O, not thread-safe (one cursor = one owner).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator
from itertools import islice

from pyroaring import BitMap

__all__ = [
    "AckRangeSet",
    "MAX_ENTRY_ID",
    "Position",
    "ClosedRange",
]

#: Largest entry id a roaring bitmap (32-bit) can hold.
MAX_ENTRY_ID = 2**32 - 1

#: A position ``(ledger_id, entry_id)``.
Position = tuple[int, int]
#: A closed range ``((L, first), (L, last))`` of acknowledged entries, first <= last.
ClosedRange = tuple[Position, Position]

# Rough per-ledger cost beyond the containers: Python BitMap object and the
# C roaring_bitmap_t header (~100 B), a dict slot plus the int key (~70 B),
# the sorted ledger list slot (8 B).  Rounded up.
_PER_LEDGER_OVERHEAD = 256
# Per roaring container: 16-bit key + typecode + pointer in the high-low
# container array, plus the container struct (cardinality/capacity/pointer).
_PER_CONTAINER_OVERHEAD = 32


def _check_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}: {value!r}")
    return value


def _check_ledger(ledger_id: object) -> int:
    ledger_id = _check_int(ledger_id, "ledger id")
    if ledger_id < 0:
        raise ValueError(f"ledger id must be >= 0, got {ledger_id}")
    return ledger_id


def _check_entry(entry_id: object) -> int:
    entry_id = _check_int(entry_id, "entry id")
    if not 0 <= entry_id <= MAX_ENTRY_ID:
        raise ValueError(
            f"entry id must satisfy 0 <= entry id < 2**32 (roaring bitmaps are 32-bit), got {entry_id}"
        )
    return entry_id


def _check_position(position: object, what: str) -> Position:
    try:
        ledger_id, entry_id = position  # type: ignore[misc]
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a (ledger_id, entry_id) pair, got {position!r}") from None
    return _check_int(ledger_id, f"{what} ledger id"), _check_int(entry_id, f"{what} entry id")


def _run_end(bm: BitMap, entry: int) -> int:
    """Last entry of the run of consecutive members that starts at member ``entry``.

    Galloping + binary search over ranks: with ``k`` the rank index of
    ``entry``, ``bm[k + j] == entry + j`` holds exactly for the ``j`` inside
    the run (members are distinct and sorted), so the predicate is monotone.
    O(log(run length)) selects, no per-entry Python loop.
    """
    k = bm.rank(entry) - 1  # index of entry in sorted order
    last = len(bm) - 1 - k  # largest j allowed
    good, step = 0, 1
    while True:
        j = good + step
        if j >= last:
            if bm[k + last] == entry + last:
                return entry + last
            bad = last
            break
        if bm[k + j] == entry + j:
            good, step = j, step * 2
        else:
            bad = j
            break
    while bad - good > 1:
        mid = (good + bad) // 2
        if bm[k + mid] == entry + mid:
            good = mid
        else:
            bad = mid
    return entry + good


def _run_start(bm: BitMap, entry: int) -> int:
    """First entry of the run of consecutive members that ends at member ``entry``.

    Mirror image of :func:`_run_end`: ``bm[k - j] == entry - j`` inside the run.
    """
    k = bm.rank(entry) - 1
    good, step = 0, 1
    while True:
        j = good + step
        if j >= k:
            if bm[0] == entry - k:
                return entry - k
            bad = k
            break
        if bm[k - j] == entry - j:
            good, step = j, step * 2
        else:
            bad = j
            break
    while bad - good > 1:
        mid = (good + bad) // 2
        if bm[k - mid] == entry - mid:
            good = mid
        else:
            bad = mid
    return entry - good


def _runs(bm: BitMap) -> Iterator[tuple[int, int]]:
    """Closed runs ``(first, last)`` of consecutive members, ascending.

    Run starts are members whose predecessor is absent (``bm - (bm >> 1)``),
    run ends members whose successor is absent (``bm - (bm << 1)``); the i-th
    start pairs with the i-th end.  Both sets are computed in C, so the Python
    cost is one step per range, not per entry.
    """
    starts = bm - bm.shift(1)
    ends = bm - bm.shift(-1)
    return zip(starts, ends)


class AckRangeSet:
    """Acknowledged positions above a cursor's mark-delete position.

    Pulsar concept: ``ManagedCursorImpl.individualDeletedMessages``, a
    ``LongPairRangeSet<Position>`` (see ``OpenLongPairRangeSet``).  Storage:
    ledger id -> pyroaring ``BitMap`` of acknowledged entry ids.

    Shapes and units:

    * positions are ``(ledger_id, entry_id)`` tuples of ints, ordered
      lexicographically (Pulsar's ``Position.compareTo``);
    * ledger ids are ints ``>= 0``; entry ids stored or queried are ints with
      ``0 <= entry_id < 2**32``;
    * ranges are closed: ``((L, a), (L, b))`` with ``a <= b`` means entries
      ``a..b`` of ledger ``L`` are all acknowledged (Pulsar's ``Range`` is
      open-closed ``(L:a-1, L:b]``);
    * sizes are counts of entries; ``memory_bytes`` is in bytes.

    Errors: ``ValueError`` for a negative ledger id, an entry id outside
    ``[0, 2**32)``, ``first > last`` in :meth:`add_range`, a negative limit,
    or undecodable bytes in :meth:`load_ledger`; ``TypeError`` for
    non-integer ids.  Bound arguments (``remove_up_to``, ``ranges_between``,
    ``cardinality_between``) accept any ints, e.g. the mark-delete position
    ``(L, -1)`` of an untouched ledger, and are clipped.

    Not thread-safe.  Iterators (:meth:`ranges`, :meth:`ranges_between`)
    snapshot each ledger when they reach it.
    """

    __slots__ = ("_bitmaps", "_order", "_dirty", "_size")

    def __init__(self) -> None:
        self._bitmaps: dict[int, BitMap] = {}
        self._order: list[int] = []  # ledger ids present, ascending
        self._dirty: set[int] = set()
        self._size = 0

    # ------------------------------------------------------------ internals

    def _bitmap_for_write(self, ledger_id: int) -> BitMap:
        bm = self._bitmaps.get(ledger_id)
        if bm is None:
            bm = BitMap()
            self._bitmaps[ledger_id] = bm
            insort(self._order, ledger_id)
        return bm

    def _drop_if_empty(self, ledger_id: int) -> None:
        bm = self._bitmaps.get(ledger_id)
        if bm is not None and not bm:
            del self._bitmaps[ledger_id]
            del self._order[bisect_left(self._order, ledger_id)]

    # ------------------------------------------------------------ mutation

    def add(self, ledger_id: int, entry_id: int) -> bool:
        """Acknowledge one position (Pulsar: ``addOpenClosed(L, e-1, L, e)``).

        Returns True if it was not acknowledged before (the ledger is then
        marked dirty), False if it already was (no change).
        Raises ValueError/TypeError on bad ids.
        """
        ledger_id = _check_ledger(ledger_id)
        entry_id = _check_entry(entry_id)
        bm = self._bitmaps.get(ledger_id)
        if bm is not None and entry_id in bm:
            return False
        self._bitmap_for_write(ledger_id).add(entry_id)
        self._size += 1
        self._dirty.add(ledger_id)
        return True

    def add_range(self, ledger_id: int, first: int, last: int) -> int:
        """Acknowledge entries ``first..last`` (inclusive) of one ledger.

        Returns the number of entries newly acknowledged (0 = no change; the
        ledger is marked dirty only when this is > 0).  Raises ValueError if
        ``first > last`` or either is outside ``[0, 2**32)``.
        """
        ledger_id = _check_ledger(ledger_id)
        first = _check_entry(first)
        last = _check_entry(last)
        if first > last:
            raise ValueError(f"add_range: first entry {first} > last entry {last}")
        bm = self._bitmaps.get(ledger_id)
        already = bm.range_cardinality(first, last + 1) if bm is not None else 0
        added = last - first + 1 - already
        if added:
            self._bitmap_for_write(ledger_id).add_range(first, last + 1)
            self._size += added
            self._dirty.add(ledger_id)
        return added

    def remove_up_to(self, ledger_id: int, entry_id: int) -> int:
        """Forget every position ``<= (ledger_id, entry_id)``.

        Called when the mark-delete position advances (Pulsar:
        ``individualDeletedMessages.removeAtMost``): all lower ledgers vanish
        and the given ledger loses entries ``<= entry_id``.  Any ints are
        accepted (``(L, -1)`` removes only lower ledgers).  Returns the
        number of entries removed; every ledger that changed is marked dirty.
        Cost: O(number of ledgers dropped + containers touched), independent
        of the number of entries.
        """
        ledger_id = _check_int(ledger_id, "ledger id")
        entry_id = _check_int(entry_id, "entry id")
        removed = 0
        cut = bisect_left(self._order, ledger_id)
        for lower in self._order[:cut]:
            removed += len(self._bitmaps.pop(lower))
            self._dirty.add(lower)
        del self._order[:cut]
        bm = self._bitmaps.get(ledger_id)
        if bm is not None and entry_id >= 0:
            end = min(entry_id, MAX_ENTRY_ID) + 1
            n = bm.range_cardinality(0, end)
            if n:
                bm.remove_range(0, end)
                removed += n
                self._dirty.add(ledger_id)
                self._drop_if_empty(ledger_id)
        self._size -= removed
        return removed

    def clear(self) -> None:
        """Forget everything; every ledger that was present is marked dirty."""
        self._dirty.update(self._order)
        self._bitmaps.clear()
        self._order.clear()
        self._size = 0

    # ------------------------------------------------------------ queries

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """True if position ``(ledger_id, entry_id)`` is acknowledged.

        Pulsar: ``LongPairRangeSet.contains``; the dispatcher uses it to drop
        already-acknowledged entries after a cursor recovery.
        """
        ledger_id = _check_ledger(ledger_id)
        entry_id = _check_entry(entry_id)
        bm = self._bitmaps.get(ledger_id)
        return bm is not None and entry_id in bm

    def __contains__(self, position: object) -> bool:
        ledger_id, entry_id = _check_position(position, "position")
        return self.contains(ledger_id, entry_id)

    def size(self) -> int:
        """Number of acknowledged entries (Pulsar: ``cardinality``). O(1)."""
        return self._size

    def __len__(self) -> int:
        return self._size

    def is_empty(self) -> bool:
        """True when no position is acknowledged above the mark-delete position."""
        return self._size == 0

    def ledger_ids(self) -> list[int]:
        """Ledger ids having at least one acknowledged entry, ascending."""
        return list(self._order)

    def contiguous_end(self, ledger_id: int, entry_id: int) -> int:
        """Largest ``e >= entry_id`` with ``entry_id..e`` all acknowledged.

        Returns ``entry_id - 1`` when ``entry_id`` itself is not acknowledged.
        Used to advance the mark-delete position over a run of acks.  Stays
        within one ledger.  O(log run length) rank/select calls.
        Raises ValueError/TypeError on bad ids.
        """
        ledger_id = _check_ledger(ledger_id)
        entry_id = _check_entry(entry_id)
        bm = self._bitmaps.get(ledger_id)
        if bm is None or entry_id not in bm:
            return entry_id - 1
        return _run_end(bm, entry_id)

    def first_range(self) -> ClosedRange | None:
        """Lowest closed range ``((L, a), (L, b))``, or None when empty.

        Pulsar: ``LongPairRangeSet.firstRange`` (there open-closed).
        """
        if not self._order:
            return None
        ledger_id = self._order[0]
        bm = self._bitmaps[ledger_id]
        first = bm.min()
        return (ledger_id, first), (ledger_id, _run_end(bm, first))

    def last_range(self) -> ClosedRange | None:
        """Highest closed range ``((L, a), (L, b))``, or None when empty.

        Pulsar: ``LongPairRangeSet.lastRange``.
        """
        if not self._order:
            return None
        ledger_id = self._order[-1]
        bm = self._bitmaps[ledger_id]
        last = bm.max()
        return (ledger_id, _run_start(bm, last)), (ledger_id, last)

    def ranges(self) -> Iterator[ClosedRange]:
        """All closed ranges in position order.

        Pulsar: ``asRanges`` / ``forEach``.  Adjacent acknowledged entries of a
        ledger always form one range (ranges are maximal).  Python work is
        per range, not per entry.
        """
        for ledger_id in list(self._order):
            bm = self._bitmaps.get(ledger_id)
            if bm is None:
                continue
            for first, last in _runs(bm):
                yield (ledger_id, first), (ledger_id, last)

    def range_count(self) -> int:
        """Number of maximal closed ranges (Pulsar: ``size()`` of the range set)."""
        return sum(len(bm - bm.shift(1)) for bm in self._bitmaps.values())

    def _windows(self, lo: Position, hi: Position) -> Iterator[tuple[int, BitMap, int, int]]:
        """(ledger, bitmap, first, last) for each ledger within ``[lo, hi]``, entries clipped."""
        lo_ledger, lo_entry = _check_position(lo, "lo")
        hi_ledger, hi_entry = _check_position(hi, "hi")
        start = bisect_left(self._order, lo_ledger)
        stop = bisect_right(self._order, hi_ledger)
        for ledger_id in self._order[start:stop]:
            first = max(lo_entry, 0) if ledger_id == lo_ledger else 0
            last = min(hi_entry, MAX_ENTRY_ID) if ledger_id == hi_ledger else MAX_ENTRY_ID
            if first <= last:
                yield ledger_id, self._bitmaps[ledger_id], first, last

    def ranges_between(self, lo: Position, hi: Position) -> Iterator[ClosedRange]:
        """Closed ranges of acknowledged positions within ``[lo, hi]``, in order.

        ``lo`` and ``hi`` are positions ``(ledger, entry)`` (inclusive, any
        ints); ranges crossing a bound are clipped to it.  Empty when
        ``lo > hi``.  Pulsar: ``OpenLongPairRangeSet`` range iteration bounded
        by positions (e.g. redelivery / backlog between two positions).
        """
        windows = list(self._windows(lo, hi))
        for ledger_id, bm, first, last in windows:
            window = BitMap()
            window.add_range(first, last + 1)
            for a, b in _runs(bm & window):
                yield (ledger_id, a), (ledger_id, b)

    def cardinality_between(self, lo: Position, hi: Position) -> int:
        """Number of acknowledged positions within ``[lo, hi]`` (inclusive, any ints).

        Pulsar: ``LongPairRangeSet.cardinality(lowerKey, lowerValue, upperKey,
        upperValue)``, used to compute backlogs.
        """
        return sum(bm.range_cardinality(a, b + 1) for _, bm, a, b in self._windows(lo, hi))

    def to_message_ranges(self, limit: int) -> list[ClosedRange]:
        """The first ``limit`` closed ranges, in position order.

        Fallback for persisting holes into the metadata store
        (``ManagedCursorInfo.individualDeletedMessages``, bounded by
        ``managedLedgerMaxUnackedRangesToPersistInMetadataStore``).  To build a
        Pulsar ``MessageRange`` use ``lowerEndpoint = (L, a - 1)`` (open) and
        ``upperEndpoint = (L, b)``.  Raises ValueError if ``limit < 0``.
        """
        limit = _check_int(limit, "limit")
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        return list(islice(self.ranges(), limit))

    # ------------------------------------------------------------ PIP-81 persistence

    def dirty_ledgers(self) -> set[int]:
        """Ledgers changed since the last :meth:`clear_dirty` (a copy).

        May include ledgers that are now absent (their set became empty):
        their persisted ack set should be dropped.
        """
        return set(self._dirty)

    def clear_dirty(self) -> None:
        """Mark every ledger clean (call after persisting the dirty ones)."""
        self._dirty.clear()

    def serialize_ledger(self, ledger_id: int) -> bytes:
        """Portable roaring serialization of one ledger's acknowledged entry ids.

        Runs ``run_optimize()``/``shrink_to_fit()`` first (same content, smaller
        form).  An absent ledger serializes as the empty bitmap.  The bytes go
        in ``LedgerAckSet.ackedEntries`` and are readable by any Roaring
        implementation (Java's ``RoaringBitmap`` included).
        """
        ledger_id = _check_ledger(ledger_id)
        bm = self._bitmaps.get(ledger_id)
        if bm is None:
            return BitMap().serialize()
        bm.run_optimize()
        bm.shrink_to_fit()
        return bm.serialize()

    def load_ledger(self, ledger_id: int, data: bytes | bytearray | memoryview) -> None:
        """Replace one ledger's set with the bitmap serialized in ``data``.

        The ledger is *not* dirty afterwards (memory equals the persisted
        copy).  Empty bitmap -> the ledger disappears.  Raises ValueError if
        ``data`` is not a portable roaring bitmap.
        """
        ledger_id = _check_ledger(ledger_id)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"ack set data must be bytes, got {type(data).__name__}")
        try:
            bm = BitMap.deserialize(bytes(data))
        except ValueError as exc:
            raise ValueError(
                f"ledger {ledger_id}: ack set is not a valid portable roaring bitmap ({len(data)} bytes): {exc}"
            ) from None
        old = self._bitmaps.get(ledger_id)
        self._size -= len(old) if old is not None else 0
        if bm:
            if old is None:
                insort(self._order, ledger_id)
            self._bitmaps[ledger_id] = bm
            self._size += len(bm)
        elif old is not None:
            del self._bitmaps[ledger_id]
            del self._order[bisect_left(self._order, ledger_id)]
        self._dirty.discard(ledger_id)

    def memory_bytes(self) -> int:
        """Estimated in-memory size of the hole state, in bytes.

        Per ledger: container payload bytes as CRoaring counts them (array:
        2 B/entry, bitset: 8 KiB, run: 4 B/run) -- which is also the bulk of
        the portable serialization -- plus a per-container header and a
        per-ledger overhead for the Python/C objects.  Array containers grown
        by single adds may hold extra capacity until :meth:`compact` (or
        :meth:`serialize_ledger`) shrinks them.  1,000,000 entries with every
        other one acknowledged: ~131 KB.
        """
        total = 0
        for bm in self._bitmaps.values():
            st = bm.get_statistics()
            total += (
                st["n_bytes_array_containers"]
                + st["n_bytes_run_containers"]
                + st["n_bytes_bitset_containers"]
                + st["n_containers"] * _PER_CONTAINER_OVERHEAD
                + _PER_LEDGER_OVERHEAD
            )
        return total

    def compact(self) -> int:
        """``run_optimize()`` + ``shrink_to_fit()`` every ledger; returns bytes freed.

        Content and dirty state are unchanged.
        """
        freed = 0
        for bm in self._bitmaps.values():
            bm.run_optimize()
            freed += bm.shrink_to_fit()
        return freed

    def __repr__(self) -> str:
        return f"AckRangeSet(ledgers={len(self._order)}, entries={self._size}, dirty={len(self._dirty)})"
