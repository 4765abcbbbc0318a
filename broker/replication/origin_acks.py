"""Acknowledgments of a replicated subscription as sets of origin ids (issue 15, beyond PIP-33).

An *origin id* names a message in every cluster: (origin cluster, ledger id,
entry id in that cluster, batch index) -- the position where it was produced
(see :mod:`broker.replication.origin_index`). A replicated subscription's
acknowledged state is sent to the other clusters as, per origin cluster, an
:class:`OriginAcks`:

* ``acked_through`` (origin position or None): every message of that origin
  that the *sender had stored*, up to and including this position, is
  acknowledged. It is the origin of the last such entry at or before the
  sender's mark-delete position, extended over the acknowledged entries that
  follow it. Entries of a third cluster the sender had not received yet are
  later in its origin order and so never covered: a cumulative acknowledgment
  never acknowledges elsewhere what the sender had not seen.
* ``ranges``: closed intervals ``[lo, hi]`` of origin positions above it, each
  a maximal run of the sender's entries of that origin that are all
  acknowledged (compacted like individualDeletedMessages; an interval may span
  origin positions the sender never had, e.g. the origin's local markers: the
  receiver skips entries whose ``replicate_to`` excludes the sender).
* ``batches``: ``(origin position, batch size, acknowledged batch indexes)`` of
  partially acknowledged batch entries (batchDeletedIndexes).

The sender's state is sent whole (idempotent, so any one UPDATE positions a
missing subscription and a restart loses nothing it already sent);
:class:`RemoteAcks` on the receiver diffs it against what it already applied
and keeps the *pending* part: ids whose entries have not arrived yet.

Bounds (count): :data:`MAX_UPDATE_RANGES` intervals per UPDATE,
:data:`MAX_UPDATE_BATCHES` partial batches per UPDATE, :data:`MAX_WALK_RUNS`
index runs examined per UPDATE, and per (sender, origin) on the receiver
:data:`MAX_TRACKED_RANGES` intervals and :data:`MAX_TRACKED_BATCHES` partial
batches (the lowest are dropped first: those are the resolved ones). Whatever
is cut is redelivered after a failover (at least once), never lost.

Pure synchronous Python, no I/O.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from broker.ledger.position import Position

from .origin_index import OriginIndex

__all__ = ["OriginAcks", "acked_origins", "RemoteAcks", "Piece", "subtract", "union", "creation_position",
           "MAX_UPDATE_RANGES", "MAX_UPDATE_BATCHES", "MAX_WALK_RUNS", "MAX_TRACKED_RANGES",
           "MAX_TRACKED_BATCHES", "MIN_POSITION"]

MAX_UPDATE_RANGES = 10_000       # intervals per UPDATE (Pulsar's maxUnackedRangesToPersist is 10,000 too)
MAX_UPDATE_BATCHES = 1_000       # partially acknowledged batch entries per UPDATE
MAX_WALK_RUNS = 20_000           # origin-index runs examined per UPDATE
MAX_TRACKED_RANGES = 10_000      # intervals kept per (sender, origin) on the receiver
MAX_TRACKED_BATCHES = 1_000      # partial batches kept per (sender, origin) on the receiver
MIN_POSITION = Position(-1, -1)  # below every origin position

Interval = tuple[Position, Position]   # closed [lo, hi] of origin positions


def _succ(p: Position) -> Position:
    return Position(p.ledger_id, p.entry_id + 1)


@dataclass
class OriginAcks:
    """The acknowledged messages of one origin cluster in one sender's subscription
    (see the module docstring). ``ranges`` are ascending, disjoint and above
    ``acked_through``; ``batches`` are ``(origin position, batch size, acked indexes)``."""

    acked_through: Optional[Position] = None
    ranges: list[Interval] = field(default_factory=list)
    batches: list[tuple[Position, int, tuple[int, ...]]] = field(default_factory=list)

    def is_empty(self) -> bool:
        """Nothing acknowledged."""
        return self.acked_through is None and not self.ranges and not self.batches


# ---- sender side ---------------------------------------------------------------
def acked_origins(index: OriginIndex, mark_delete: Position, acked_ranges: Iterable[Interval],
                  partial_batches: Iterable[tuple[Position, int, Iterable[int]]] = (),
                  max_ranges: int = MAX_UPDATE_RANGES, max_batches: int = MAX_UPDATE_BATCHES,
                  max_runs: int = MAX_WALK_RUNS) -> dict[str, OriginAcks]:
    """A subscription's acknowledged state as origin ids: {origin cluster: OriginAcks}.

    ``index``: the topic's origin index; ``mark_delete``: the cursor's mark-delete
    position; ``acked_ranges``: its individually acknowledged local ranges above
    it, closed ``((L, a), (L, b))``, ascending (``individual_deleted.ranges()``);
    ``partial_batches``: ``(local position, batch size, acknowledged indexes)`` of
    partially acknowledged batch entries. Entries outside the index window are
    left out (and with a mark-delete position before the window, no
    ``acked_through`` is derived: the receiver keeps what it applied before).
    Work: O(runs between the mark-delete position and the last acknowledged
    entry), at most ``max_runs``; at most ``max_ranges`` intervals and
    ``max_batches`` batches are returned."""
    out: dict[str, OriginAcks] = {}
    prefix_open: set[str] = set()
    if index.complete_after is not None and mark_delete >= index.complete_after:
        # every entry at or before the window start is at or before the mark-delete position
        for origin in index.origins():
            prefix_open.add(origin)
            base = index.last_of_origin_at_or_before(origin, mark_delete) or index.floor(origin)
            if base is not None:
                out[origin] = OriginAcks(acked_through=base)
    acked = list(acked_ranges)
    batches = list(partial_batches)
    highest = mark_delete
    if acked:
        highest = max(highest, Position(*acked[-1][1]))
    if batches:
        highest = max(highest, Position(*batches[-1][0]))
    open_ranges: dict[str, list] = {}
    n_ranges = 0

    def close(origin: str) -> None:
        nonlocal n_ranges
        r = open_ranges.pop(origin, None)
        if r is not None:
            out.setdefault(origin, OriginAcks()).ranges.append((r[0], r[1]))
            n_ranges += 1

    def acked_piece(run, first: int, last: int) -> None:
        origin = run.origin
        lo = Position(run.origin_ledger, run.origin_first + first - run.local_first)
        hi = Position(run.origin_ledger, run.origin_first + last - run.local_first)
        if origin in prefix_open:
            out.setdefault(origin, OriginAcks()).acked_through = hi
        elif origin in open_ranges:
            open_ranges[origin][1] = hi
        else:
            open_ranges[origin] = [lo, hi]

    def unacked_piece(run) -> None:
        prefix_open.discard(run.origin)
        close(run.origin)

    j = 0
    walked = 0
    for run in index.runs_after(mark_delete):
        if run.local_start > highest or n_ranges >= max_ranges:
            break
        walked += 1
        if walked > max_runs:
            break
        ledger = run.local_ledger
        s, e = run.local_first, run.local_first + run.count - 1
        if ledger == mark_delete.ledger_id and s <= mark_delete.entry_id:
            s = mark_delete.entry_id + 1
        while j < len(acked) and tuple(acked[j][1]) < (ledger, s):
            j += 1
        cur = s
        k = j
        while k < len(acked) and tuple(acked[k][0]) <= (ledger, e):
            a = acked[k][0][1] if acked[k][0][0] == ledger else 0
            b = acked[k][1][1] if acked[k][1][0] == ledger else e
            a, b = max(a, cur), min(b, e)
            if a <= b:
                if a > cur:
                    unacked_piece(run)
                acked_piece(run, a, b)
                cur = b + 1
            k += 1
        if cur <= e:
            unacked_piece(run)
    for origin in list(open_ranges):
        close(origin)
    n_batches = 0
    for local, size, indexes in batches:
        if n_batches >= max_batches:
            break
        found = index.origin_of(Position(*local))
        if found is None:
            continue
        origin, opos, _ = found
        out.setdefault(origin, OriginAcks()).batches.append((opos, int(size), tuple(sorted(indexes))))
        n_batches += 1
    return {o: a for o, a in out.items() if not a.is_empty()}


# ---- interval lists --------------------------------------------------------------
def subtract(lo: Position, hi: Position, ranges: list[Interval]) -> list[Interval]:
    """The parts of ``[lo, hi]`` not covered by ``ranges`` (ascending, disjoint, closed)."""
    out: list[Interval] = []
    cur = lo
    i = bisect.bisect_left(ranges, lo, key=lambda r: r[1])
    while cur <= hi and i < len(ranges) and ranges[i][0] <= hi:
        a, b = ranges[i]
        if a > cur:
            out.append((cur, _pred(a)))
        cur = max(cur, _succ(b))
        i += 1
    if cur <= hi:
        out.append((cur, hi))
    return out


def _pred(p: Position) -> Position:
    # (ledger, -1) is a valid closed bound: after every position of earlier ledgers,
    # before every entry of this one
    return Position(p.ledger_id, p.entry_id - 1)


def union(ranges: list[Interval], more: Iterable[Interval]) -> list[Interval]:
    """Ascending, disjoint union of two interval collections (adjacent ones merged)."""
    merged: list[list] = []
    for lo, hi in sorted(list(ranges) + list(more)):
        if merged and lo <= _succ(merged[-1][1]):
            if hi > merged[-1][1]:
                merged[-1][1] = hi
        else:
            merged.append([lo, hi])
    return [(a, b) for a, b in merged]


def _covers(ranges: list[Interval], p: Position) -> Optional[Interval]:
    i = bisect.bisect_left(ranges, p, key=lambda r: r[1])
    if i < len(ranges) and ranges[i][0] <= p:
        return ranges[i]
    return None


# ---- receiver side ---------------------------------------------------------------
@dataclass
class Piece:
    """Newly acknowledged origin ids to apply locally: the origin positions
    ``[lo, hi]`` of ``origin`` (``indexes`` None), or batch indexes ``indexes`` of the
    entry at origin position ``lo`` (= ``hi``) holding ``batch_size`` messages."""

    origin: str
    lo: Position
    hi: Position
    indexes: Optional[frozenset] = None
    batch_size: int = 0


class _Track:
    """What one sender acknowledged of one origin, as applied here."""

    __slots__ = ("cx", "ranges", "batches")

    def __init__(self) -> None:
        self.cx: Optional[Position] = None
        self.ranges: list[Interval] = []
        self.batches: dict[Position, tuple[int, frozenset]] = {}

    def top(self) -> Optional[Position]:
        tops = [p for p in (self.cx, self.ranges[-1][1] if self.ranges else None,
                            max(self.batches) if self.batches else None) if p is not None]
        return max(tops) if tops else None

    def covered(self, p: Position) -> bool:
        return (self.cx is not None and p <= self.cx) or _covers(self.ranges, p) is not None


class RemoteAcks:
    """The acknowledgments of one subscription received from other clusters, by
    origin id: per (sender cluster, origin cluster) the sender's ``acked_through``
    and intervals as applied here, and the partially acknowledged batches.

    :meth:`apply` takes a sender's whole state and returns the newly acknowledged
    :class:`Piece` s; the caller acknowledges the local copies it already has.
    Entries arriving later are checked with :meth:`match`. :meth:`pending` is
    the part whose entries have not arrived yet (what must survive a restart).
    Bounds: ``max_ranges`` intervals and ``max_batches`` batches per (sender,
    origin) (the lowest dropped first)."""

    def __init__(self, max_ranges: int = MAX_TRACKED_RANGES, max_batches: int = MAX_TRACKED_BATCHES):
        self.max_ranges = max_ranges
        self.max_batches = max_batches
        self.tracks: dict[tuple[str, str], _Track] = {}
        self._by_origin: dict[str, list[tuple[str, _Track]]] = {}
        self._top: dict[str, Position] = {}

    def senders(self) -> list[str]:
        """Clusters whose acknowledgments were applied, sorted."""
        return sorted({s for s, _ in self.tracks})

    def _track(self, sender: str, origin: str) -> _Track:
        t = self.tracks.get((sender, origin))
        if t is None:
            t = self.tracks[(sender, origin)] = _Track()
            self._by_origin.setdefault(origin, []).append((sender, t))
        return t

    def apply(self, sender: str, state: dict[str, OriginAcks]) -> list[Piece]:
        """Merge ``sender``'s acknowledged state ({origin: OriginAcks}); returns the
        origin ids not acknowledged by ``sender`` before (ranges first, then batch
        indexes). Idempotent: the same state again returns []."""
        pieces: list[Piece] = []
        for origin, acks in sorted(state.items()):
            t = self._track(sender, origin)
            new: list[Interval] = []
            if acks.acked_through is not None and (t.cx is None or acks.acked_through > t.cx):
                lo = MIN_POSITION if t.cx is None else _succ(t.cx)
                for a, b in subtract(lo, acks.acked_through, t.ranges):
                    pieces.append(Piece(origin, a, b))
                t.cx = acks.acked_through
                keep = []
                for a, b in t.ranges:
                    if b > t.cx:
                        keep.append((max(a, _succ(t.cx)), b))
                t.ranges = keep
                for p in [p for p in t.batches if p <= t.cx]:
                    del t.batches[p]
            for lo, hi in acks.ranges:
                if t.cx is not None:
                    if hi <= t.cx:
                        continue
                    lo = max(lo, _succ(t.cx))
                for a, b in subtract(lo, hi, t.ranges):
                    new.append((a, b))
                    pieces.append(Piece(origin, a, b))
            if new:
                t.ranges = union(t.ranges, new)
                if len(t.ranges) > self.max_ranges:
                    del t.ranges[:len(t.ranges) - self.max_ranges]
            for pos, size, indexes in acks.batches:
                if t.covered(pos):
                    continue
                old_size, old = t.batches.get(pos, (size, frozenset()))
                added = frozenset(indexes) - old
                if added:
                    t.batches[pos] = (size, old | added)
                    pieces.append(Piece(origin, pos, pos, frozenset(added), size))
            for pos, _ in [(p, None) for p in list(t.batches) if t.covered(p)]:
                del t.batches[pos]
            if len(t.batches) > self.max_batches:
                for pos in sorted(t.batches)[:len(t.batches) - self.max_batches]:
                    del t.batches[pos]
            top = t.top()
            if top is not None and (origin not in self._top or top > self._top[origin]):
                self._top[origin] = top
        return pieces

    def match(self, origin: str, pos: Position, scope: Optional[frozenset] = None
              ) -> tuple[bool, Optional[tuple[int, frozenset]]]:
        """An entry of ``origin`` at origin position ``pos`` arrived here (``scope``: its
        ``replicate_to``, None = everywhere): ``(True, None)`` when a sender that could
        have it acknowledged it whole, else ``(False, (batch size, indexes))`` when
        some of its batch indexes were, else ``(False, None)``. O(1) for entries
        above every acknowledgment of that origin."""
        top = self._top.get(origin)
        if top is None or pos > top:
            return False, None
        partial: Optional[tuple[int, frozenset]] = None
        for sender, t in self._by_origin.get(origin, ()):
            if scope is not None and sender not in scope:
                continue
            if t.covered(pos):
                return True, None
            b = t.batches.get(pos)
            if b is not None:
                partial = (b[0], b[1] | (partial[1] if partial else frozenset()))
        return False, partial

    def covered_until(self, sender: str, origin: str, pos: Position) -> Optional[Position]:
        """The last origin position ``q >= pos`` such that ``sender`` acknowledged every
        entry it had of ``origin`` in ``[pos, q]``; None when ``pos`` itself is not."""
        t = self.tracks.get((sender, origin))
        if t is None:
            return None
        end: Optional[Position] = None
        if t.cx is not None and pos <= t.cx:
            end = t.cx
        q = pos if end is None else _succ(end)
        while True:
            r = _covers(t.ranges, q)
            if r is None:
                return end
            end = r[1]
            q = _succ(end)

    def pending(self, high: Callable[[str], Optional[Position]]) -> dict[str, dict[str, OriginAcks]]:
        """The acknowledgments whose entries have not arrived yet: per sender, per
        origin, the parts above ``high(origin)`` (the newest entry of that origin
        stored here; None = unknown, everything kept)."""
        out: dict[str, dict[str, OriginAcks]] = {}
        for (sender, origin), t in sorted(self.tracks.items()):
            h = high(origin)
            acks = OriginAcks()
            if t.cx is not None and (h is None or t.cx > h):
                acks.acked_through = t.cx
            acks.ranges = [r for r in t.ranges if h is None or r[1] > h]
            acks.batches = [(p, s, tuple(sorted(ix))) for p, (s, ix) in sorted(t.batches.items())
                            if h is None or p > h]
            if not acks.is_empty():
                out.setdefault(sender, {})[origin] = acks
        return out

    def pending_count(self, high: Callable[[str], Optional[Position]]) -> int:
        """Number of pending items (an ``acked_through`` beyond the arrivals, an
        interval or a partial batch each count 1)."""
        return sum((a.acked_through is not None) + len(a.ranges) + len(a.batches)
                   for per in self.pending(high).values() for a in per.values())

    def memory_bytes(self) -> int:
        """Estimated bytes held: ~200 per (sender, origin), ~180 per interval,
        ~250 + 30 per index per partial batch."""
        total = 0
        for t in self.tracks.values():
            total += 200 + 180 * len(t.ranges)
            total += sum(250 + 30 * len(ix) for _, ix in t.batches.values())
        return total


def creation_position(index: OriginIndex, remote: RemoteAcks, sender: str, first: Position,
                      last_confirmed: Position, previous: Callable[[Position], Position]) -> Position:
    """The mark-delete position of a subscription created here by an UPDATE from
    ``sender`` (whose state ``remote`` holds): just before the first data entry
    here that ``sender`` did not acknowledge, walking ``index`` in local order.

    ``first``: the topic's first entry; ``last_confirmed``: its last entry;
    ``previous(pos)``: the entry before ``pos`` (``Position(-1, -1)`` when none).
    When the index window does not start at ``first``, the entries before it
    count as acknowledged only if the first indexed entry of every origin is
    (then the older ones of that origin are too, in origin order); otherwise the
    walk starts at the first entry (redeliveries possible, never a skipped
    message). Runs ``sender`` could not have (``replicate_to``) stop the walk.
    Returns a position between ``first`` - 1 and ``last_confirmed``."""
    earliest = Position(first.ledger_id, first.entry_id - 1)
    start = earliest
    if index.complete_after is not None and index.complete_after >= first:
        heads: dict[str, object] = {}
        for run in index.runs:
            heads.setdefault(run.origin, run)
        if not all(r.includes(sender) and remote.covered_until(sender, o, r.origin_start) is not None
                   for o, r in heads.items()):
            return earliest      # the entries before the window are not known to be acknowledged
        start = index.complete_after
    pos = start
    for run in index.runs_after(start):
        end = remote.covered_until(sender, run.origin, run.origin_start) if run.includes(sender) else None
        if end is None:
            pos = previous(run.local_start)
            break
        if end < run.origin_end:
            pos = Position(run.local_ledger, run.local_first + end.entry_id - run.origin_first)
            break
        pos = run.local_end
    else:
        pos = max(pos, last_confirmed)
    if pos < earliest:
        pos = earliest
    return min(pos, last_confirmed) if last_confirmed >= earliest else earliest
