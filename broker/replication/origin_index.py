"""Where each data entry of a topic came from: local position <-> origin id, run-length encoded.

Every message has a global identity that every cluster already stores: its
*origin* -- the cluster where it was produced and its position there. A
replicated copy carries ``replicated_from`` and the source position in its
MessageMetadata; an entry produced locally has this cluster and its own
position. Replicated subscriptions (issue 15, beyond Pulsar's PIP-33) name
acknowledged messages by origin, so each cluster needs both directions:

* local -> origin, to turn its subscription's acknowledgments into origin ids
  (``ReplicatedSubscriptionsController._send_update`` via
  :func:`broker.replication.origin_acks.acked_origins`);
* origin -> local, to acknowledge the local copies of origin ids another
  cluster acknowledged (``origin_acks.RemoteAcks``).

Run-length encoding
-------------------
Consecutive data entries of one local ledger whose origins are consecutive
entries of one origin ledger (and that have the same ``replicate_to`` scope)
form one :class:`Run`. A replicator stores a remote's entries in the remote's
order, so a steady stream from one origin is a handful of runs: a run breaks at
a ledger rollover (local or origin), where another origin's entries or a
restricted marker of the origin interleave, and where ``replicate_to`` changes.
Markers are not indexed (they are never delivered; the controller acknowledges
them by position).

Ordering facts used throughout (and why lookups are bisections): runs are
appended in local order; for one origin cluster, local order and origin order
agree, because a replicator sends a remote's entries in order and the remote
stores them exactly once (source-position deduplication), and local entries
are their own origin.

Window and bounds
-----------------
The index holds every data entry after :attr:`OriginIndex.complete_after`
(a local position; ``None``: nothing is known yet). Runs at or before the
slowest replicated subscription's mark-delete position are pruned
(:meth:`OriginIndex.prune`), and at most ``max_runs`` runs are kept (the oldest
are evicted beyond that); both move ``complete_after`` forward and remember,
per origin, the origin position of the last entry dropped (:meth:`floor`).
Memory: about :data:`RUN_BYTES` bytes per run (:meth:`memory_bytes`).

Pure synchronous Python, no I/O.
"""
from __future__ import annotations

import bisect
from typing import Iterator, Optional

from broker.ledger.position import Position

__all__ = ["Run", "OriginIndex", "RUN_BYTES", "DEFAULT_MAX_RUNS"]

#: Estimated bytes of one run in memory (the slotted object, its ints, two list slots).
RUN_BYTES = 160
#: Runs kept at most by default (~16 MB); the oldest are evicted beyond.
DEFAULT_MAX_RUNS = 100_000


class Run:
    """``count`` consecutive data entries ``local_ledger:local_first ..`` whose origins are
    ``origin`` / ``origin_ledger:origin_first ..`` (consecutive too); ``scope`` is the
    entries' ``replicate_to`` (a frozenset of cluster names) or None (replicated everywhere)."""

    __slots__ = ("local_ledger", "local_first", "count", "origin", "origin_ledger", "origin_first", "scope")

    def __init__(self, local_ledger: int, local_first: int, count: int, origin: str,
                 origin_ledger: int, origin_first: int, scope: Optional[frozenset]):
        self.local_ledger = local_ledger
        self.local_first = local_first
        self.count = count
        self.origin = origin
        self.origin_ledger = origin_ledger
        self.origin_first = origin_first
        self.scope = scope

    @property
    def local_start(self) -> Position:
        """First local position of the run."""
        return Position(self.local_ledger, self.local_first)

    @property
    def local_end(self) -> Position:
        """Last local position of the run."""
        return Position(self.local_ledger, self.local_first + self.count - 1)

    @property
    def origin_start(self) -> Position:
        """Origin position of the run's first entry."""
        return Position(self.origin_ledger, self.origin_first)

    @property
    def origin_end(self) -> Position:
        """Origin position of the run's last entry."""
        return Position(self.origin_ledger, self.origin_first + self.count - 1)

    def includes(self, cluster: str) -> bool:
        """Whether ``cluster`` can have these entries (``replicate_to`` empty or naming it)."""
        return self.scope is None or cluster in self.scope

    def __repr__(self) -> str:
        scope = "" if self.scope is None else f" to {sorted(self.scope)}"
        return (f"Run({self.local_ledger}:{self.local_first}+{self.count} <- "
                f"{self.origin}/{self.origin_ledger}:{self.origin_first}{scope})")


def _local_key(run: Run) -> tuple[int, int]:
    return run.local_ledger, run.local_first


def _origin_key(run: Run) -> tuple[int, int]:
    return run.origin_ledger, run.origin_first


class OriginIndex:
    """Run-length map between a topic's local data entries and their origin ids
    (see the module docstring). ``max_runs``: runs kept at most (count).
    ``complete_after``: every data entry at a local position after it is indexed
    (None until :meth:`start_after` or the first :meth:`add`)."""

    def __init__(self, max_runs: int = DEFAULT_MAX_RUNS, complete_after: Optional[Position] = None):
        self.max_runs = max(1, max_runs)
        self.complete_after: Optional[Position] = complete_after
        self.runs: list[Run] = []
        self._by_origin: dict[str, list[Run]] = {}
        self._floor: dict[str, Position] = {}
        self._high: dict[str, Position] = {}
        self.evicted_runs = 0

    def __len__(self) -> int:
        return len(self.runs)

    # ---- building ---------------------------------------------------------
    def add(self, local: Position, origin: str, origin_pos: Position, scope: Optional[frozenset] = None) -> None:
        """Index the data entry just stored at ``local`` (after every indexed one; an entry
        at or before the last indexed position is ignored) whose origin is ``origin`` /
        ``origin_pos``; ``scope``: its ``replicate_to`` clusters, None when empty."""
        runs = self.runs
        if runs:
            last = runs[-1]
            if local <= last.local_end:
                return
            if (last.local_ledger == local.ledger_id and last.local_first + last.count == local.entry_id
                    and last.origin == origin and last.origin_ledger == origin_pos.ledger_id
                    and last.origin_first + last.count == origin_pos.entry_id and last.scope == scope):
                last.count += 1
                self._high[origin] = origin_pos
                return
        elif self.complete_after is None:
            self.complete_after = Position(local.ledger_id, local.entry_id - 1)
        run = Run(local.ledger_id, local.entry_id, 1, origin, origin_pos.ledger_id, origin_pos.entry_id, scope)
        runs.append(run)
        self._by_origin.setdefault(origin, []).append(run)
        high = self._high.get(origin)
        if high is None or origin_pos > high:
            self._high[origin] = origin_pos
        if len(runs) > self.max_runs:
            self._drop_front(1)
            self.evicted_runs += 1

    def prepend(self, older: "OriginIndex") -> None:
        """Put the runs of ``older`` (an index of entries all before this one's, e.g. a
        backlog scan at topic load) in front; ``complete_after`` becomes ``older``'s.
        Runs beyond ``max_runs`` are evicted from the front."""
        if older.runs and self.runs and older.runs[-1].local_end >= self.runs[0].local_start:
            raise ValueError("prepend: the older index overlaps this one")
        self.runs[:0] = older.runs
        for origin, runs in older._by_origin.items():
            self._by_origin.setdefault(origin, [])[:0] = runs
        for origin, high in older._high.items():
            if origin not in self._high or self._high[origin] < high:
                self._high[origin] = high
        for origin, floor in older._floor.items():
            self._floor.setdefault(origin, floor)
        self.complete_after = older.complete_after
        if len(self.runs) > self.max_runs:
            self._drop_front(len(self.runs) - self.max_runs)

    def prune(self, upto: Position) -> int:
        """Forget the runs whose entries are all at or before ``upto`` (the slowest
        replicated subscription's mark-delete position); returns how many."""
        i = 0
        runs = self.runs
        while i < len(runs) and runs[i].local_end <= upto:
            i += 1
        if i:
            self._drop_front(i)
        return i

    def _drop_front(self, n: int) -> None:
        dropped = self.runs[:n]
        del self.runs[:n]
        counts: dict[str, int] = {}
        for run in dropped:
            counts[run.origin] = counts.get(run.origin, 0) + 1
            self._floor[run.origin] = run.origin_end
        for origin, k in counts.items():
            lst = self._by_origin[origin]
            del lst[:k]
            if not lst:
                del self._by_origin[origin]
        end = dropped[-1].local_end
        if self.complete_after is None or end > self.complete_after:
            self.complete_after = end

    # ---- queries ------------------------------------------------------------
    def origins(self) -> list[str]:
        """Origin clusters with indexed or dropped entries, sorted."""
        return sorted(set(self._by_origin) | set(self._floor))

    def high(self, origin: str) -> Optional[Position]:
        """Origin position of the newest indexed entry of ``origin`` (None: none seen)."""
        return self._high.get(origin)

    def floor(self, origin: str) -> Optional[Position]:
        """Origin position of the last entry of ``origin`` dropped from the front
        (pruned or evicted), None when none was."""
        return self._floor.get(origin)

    def origin_of(self, local: Position) -> Optional[tuple[str, Position, Run]]:
        """``(origin cluster, origin position, run)`` of the data entry at ``local``, or
        None when it is not indexed (a marker, outside the window)."""
        runs = self.runs
        i = bisect.bisect_right(runs, (local.ledger_id, local.entry_id), key=_local_key) - 1
        if i < 0:
            return None
        run = runs[i]
        if run.local_ledger != local.ledger_id or local.entry_id >= run.local_first + run.count:
            return None
        off = local.entry_id - run.local_first
        return run.origin, Position(run.origin_ledger, run.origin_first + off), run

    def last_of_origin_at_or_before(self, origin: str, local: Position) -> Optional[Position]:
        """Origin position of the newest indexed entry of ``origin`` stored at or before
        the local position ``local`` (None: no indexed one)."""
        lst = self._by_origin.get(origin)
        if not lst:
            return None
        i = bisect.bisect_right(lst, (local.ledger_id, local.entry_id), key=_local_key) - 1
        if i < 0:
            return None
        run = lst[i]
        if run.local_end <= local:
            return run.origin_end
        return Position(run.origin_ledger, run.origin_first + (local.entry_id - run.local_first))

    def runs_after(self, local: Position) -> Iterator[Run]:
        """Runs with an entry after the local position ``local``, in local order."""
        runs = self.runs
        i = bisect.bisect_right(runs, (local.ledger_id, local.entry_id), key=_local_key) - 1
        if i < 0 or runs[i].local_end <= local:
            i += 1
        for j in range(max(0, i), len(runs)):
            yield runs[j]

    def local_ranges(self, origin: str, lo: Position, hi: Position,
                     acker: Optional[str] = None) -> Iterator[tuple[Run, int, int]]:
        """The indexed entries of ``origin`` whose origin positions are within ``[lo, hi]``
        (closed, any positions), as ``(run, first offset, last offset)`` in order; with
        ``acker``, runs whose scope excludes that cluster are skipped (it never had them)."""
        lst = self._by_origin.get(origin)
        if not lst or lo > hi:
            return
        i = bisect.bisect_right(lst, (lo.ledger_id, lo.entry_id), key=_origin_key) - 1
        if i < 0 or lst[i].origin_end < lo:
            i += 1
        for j in range(max(0, i), len(lst)):
            run = lst[j]
            if run.origin_start > hi:
                return
            if acker is not None and not run.includes(acker):
                continue
            first = 0 if run.origin_start >= lo else lo.entry_id - run.origin_first
            last = run.count - 1 if run.origin_end <= hi else hi.entry_id - run.origin_first
            if first <= last:
                yield run, first, last

    def memory_bytes(self) -> int:
        """Estimated bytes held (``RUN_BYTES`` per run plus the per-origin dicts)."""
        return RUN_BYTES * len(self.runs) + 200 * (len(self._by_origin) + len(self._floor) + len(self._high))
