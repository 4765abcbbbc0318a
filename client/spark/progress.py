"""Progress of one range read ``(start, end]`` of the Spark source (pure, no I/O).

The worker reads a range with a Reader whose entry splitter reports every
entry the broker pushes, delivered or not (``tracked_reader``).  From that,
``RangeProgress`` answers the three questions of a range read:

* **Is it complete?**  When every entry up to ``end`` was pushed (or, at the
  tail, the broker has nothing more to push: what is left are markers, which
  consumers never receive), no chunked message that began in the range is
  still waiting for chunks, and the range's messages received were handed
  out (messages past ``end`` may wait in the queue: they are the next
  range's).  The reader's own position decides, never topic stats.
* **Which chunked messages does it own?**  A chunked message belongs to the
  range holding its *first* chunk: the read goes on past ``end`` until such a
  message is complete, and the range that starts after that first chunk
  skips the message's later chunks (its assembler drops chunks without a
  first one).  So an offset may fall between the chunks of a message (an
  interleaved producer's entry may sit there too) without losing or
  repeating it.
* **Were entries lost?**  With the ledgers planned for the range
  (``ledgers.plan_ledgers``), every planned entry not received is either a
  marker the broker skipped or an entry of a ledger that retention deleted
  after the range was planned.  Missing entries *before* a received entry of
  the same ledger are markers (the ledger existed when it was read, and
  ledgers are deleted whole).  Other missing entries make their ledger a
  *suspect*: the caller asks the broker whether it still exists (then they
  were markers) and otherwise reports lost data (``failOnDataLoss``).  This
  is Kafka's fetched-offset check and pulsar-spark's "Potential Data Loss:
  intended to start at X, actually we get Y", for Pulsar's positions.

Positions are ``offsets.Position`` (``(ledger_id, entry_id)``).
"""
from __future__ import annotations

from typing import Iterable

from client.spark.offsets import LedgerInfo, Position

__all__ = ["RangeProgress"]


class RangeProgress:
    """Bookkeeping of one range read (see the module doc).

    ``start`` (exclusive) and ``end`` (inclusive) are entry positions;
    ``plan``: the ledgers holding the range when it was planned (``(ledger_id,
    entries)``; empty = no loss check).  Attributes read by the caller:
    ``highest`` (highest entry pushed since the last reset), ``pending``
    (first-chunk positions of this range's chunked messages not complete),
    ``queued`` (the range's messages received but not handed out),
    ``suspects`` (``{ledger_id: entries missing there}``, to verify and then
    clear), ``dropped`` (first chunks of this range's chunked messages the
    consumer gave up on: incomplete)."""

    def __init__(self, start: Position, end: Position, plan: Iterable[LedgerInfo] = ()):
        self.start = Position(*start)
        self.end = Position(*end)
        self.plan: dict[int, int] = {int(lid): int(n) for lid, n in sorted(plan) if int(n) > 0}   # oldest first
        self.highest = self.start
        self.observed = self.start     # highest entry ever pushed (gaps are counted once)
        self.consumed = self.start     # last entry whose messages were all handed out
        self.pending: set[Position] = set()
        self.queued = 0
        self.suspects: dict[int, int] = {}
        self.dropped: list[Position] = []

    # -- what the entry splitter reports ---------------------------------------------------
    def on_entry(self, position: Position, first_chunk: bool = False) -> None:
        """The broker pushed the entry at ``position`` (delivered or discarded);
        ``first_chunk``: it is chunk 0 of a chunked message."""
        if position > self.highest:
            self.highest = position
        if position > self.observed:
            self._missing_between(self.observed, position)
            self.observed = position
        if first_chunk and self.start < position <= self.end:
            self.pending.add(position)

    def on_message(self, first_entry: Position, count: int = 1) -> None:
        """``count`` messages were received (queued); ``first_entry``: their
        entry, or the first chunk's of a chunked message."""
        if self.start < first_entry <= self.end:
            self.queued += count

    def on_chunked_complete(self, first_chunk: Position) -> None:
        """A chunked message whose first chunk is at ``first_chunk`` is complete."""
        self.pending.discard(Position(*first_chunk))

    def on_chunks_dropped(self, positions: Iterable[Position]) -> list[Position]:
        """The consumer discarded these chunks (expired, out of order, too many
        pending); returns the first chunks of this range's messages among them
        (now lost: ``dropped``)."""
        gone = [p for p in (Position(*q) for q in positions) if p in self.pending]
        for p in gone:
            self.pending.discard(p)
            self.dropped.append(p)
        return gone

    def on_reset(self) -> None:
        """The consumer cleared its queue and incomplete chunks after a
        reconnection and restarts from what it dropped: entries after the last
        one handed out come again.  Pending chunked messages stay pending (their
        chunks come again too)."""
        self.highest = self.consumed
        self.queued = 0

    # -- what the reading loop reports ------------------------------------------------------
    def on_consumed(self, ledger_id: int, entry_id: int, batch_index: int = -1, batch_size: int = 0,
                    first_entry: Position | None = None) -> None:
        """A message was handed out (read from the queue); ``first_entry``: its
        entry, or its first chunk's (default: its own entry).  The entry counts
        as consumed once its last message of a batch was."""
        first = first_entry if first_entry is not None else (ledger_id, entry_id)
        if self.queued and self.start < first <= self.end:
            self.queued -= 1
        if batch_index < 0 or batch_size <= 0 or batch_index >= batch_size - 1:
            if (ledger_id, entry_id) > self.consumed:
                self.consumed = Position(ledger_id, entry_id)
        elif (ledger_id, entry_id - 1) > self.consumed:
            self.consumed = Position(ledger_id, entry_id - 1)

    def belongs(self, first_entry: Position) -> bool:
        """Whether a message whose (first) entry is ``first_entry`` is read by
        this range."""
        return self.start < Position(*first_entry) <= self.end

    def pushed_to_end(self) -> bool:
        """Every entry up to ``end`` was pushed (or found to be a marker)."""
        return self.highest >= self.end

    def complete(self) -> bool:
        """The range is read once everything up to ``end`` was pushed, no
        chunked message of the range waits for chunks and none of its messages
        waits in the queue."""
        return self.highest >= self.end and not self.pending and self.queued == 0

    def finish_at_tail(self) -> None:
        """The broker has nothing more to push up to ``end``: the entries after
        the last one pushed are markers, or were deleted.  Their ledgers become
        suspects; the range counts as pushed to ``end``."""
        if self.observed < self.end:
            self._missing_between(self.observed, None)
            self.observed = self.end
        if self.highest < self.end:
            self.highest = self.end

    # -- loss accounting ----------------------------------------------------------------
    def missing_in(self, ledger_id: int) -> int:
        """Entries of ``ledger_id`` counted as missing so far (suspects)."""
        return self.suspects.get(ledger_id, 0)

    def _missing_between(self, after: Position, before: Position | None) -> None:
        """Count the planned entries strictly between ``after`` and ``before``
        (None: up to ``end`` inclusive), capped at ``end``.  Those in
        ``before``'s own ledger precede an entry received from it: markers."""
        if before is not None and before.ledger_id == after.ledger_id:
            return                 # within one ledger: markers at most
        end = self.end
        for lid in self.plan:
            if lid < after.ledger_id or lid > end.ledger_id:
                continue
            if before is not None and lid > before.ledger_id:
                break
            if before is not None and lid == before.ledger_id:
                continue           # before a received entry of the same ledger: markers
            n = self.plan[lid]
            first = after.entry_id + 1 if lid == after.ledger_id else 0
            last = n - 1
            if lid == end.ledger_id:
                last = min(last, end.entry_id)
            if last >= first:
                self.suspects[lid] = self.suspects.get(lid, 0) + (last - first + 1)
