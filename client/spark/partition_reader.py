"""Executor side of the Spark source: read one topic partition's range
``(start, end]`` with a Reader (non-durable cursor) and hand Spark Arrow
record batches.

Runs inside a pooled PySpark worker on an unpickled copy of the source's
reader, so a ``PartitionRange`` carries everything the read needs and the
read opens (and closes) its own broker connection, on its own event loop in
the worker's thread.

Where the range ends (``progress.RangeProgress``): the Reader's entry
splitter reports every entry the broker pushes, delivered or not, so the
read knows its own position.  It stops once every entry up to ``end`` was
pushed, every chunked message that began in the range is complete (its last
chunks may lie past ``end``; a chunked message belongs to the range of its
first chunk) and the messages received were handed out.  Entries the broker
never pushes are markers (replicated-subscription snapshots): when the read
waits for entries up to ``end`` but the topic's last dispatchable entry
(GetLastMessageId, which skips trailing markers) was already pushed, the rest
are markers.

Lost data (``failOnDataLoss``): the range comes with the ledgers it covered
when the driver planned it.  Before reading, every one of them must still
exist; while reading, an entry that was planned but not pushed is a marker
only if its ledger still exists, else retention deleted it after planning
(Kafka's fetched-offset check; pulsar-spark's "Potential Data Loss").  With
``failOnDataLoss=true`` that fails the read, else it is logged with the
number of entries lost and the read goes on.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Iterator

from client.errors import ConnectError, NotFound, PulsarException, Timeout, TopicNotFound
from client.spark.ledgers import entries_in_range
from client.spark.offsets import EARLIEST, LedgerInfo, Position, TopicPartition, partition_topic_name
from client.spark.options import SourceError
from client.spark.progress import RangeProgress

__all__ = ["PartitionRange", "ROWS_PER_BATCH", "read_partition"]

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 8192


@dataclass(frozen=True)
class PartitionRange:
    """What one Spark input partition reads: topic partition ``tp`` from after
    ``start`` up to and including entry ``end``, plus the settings of the read
    (all picklable).  ``start`` may be ``EARLIEST``.  ``ledgers``: the ledgers
    (``(ledger_id, entries)``) holding the range when the driver planned it
    (``ledgers.plan_ledgers``); empty = no check for ledgers deleted since."""

    service_url: str
    tp: TopicPartition
    start: Position
    end: Position
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 200
    read_timeout_ms: int = 120_000
    operation_timeout_ms: int = 30_000
    receiver_queue_size: int = 1000
    ledgers: tuple[LedgerInfo, ...] = ()

    @property
    def topic(self) -> str:
        """The topic (partition) the Reader opens."""
        return partition_topic_name(self.tp)


class _Columns:
    """Column buffers of the output rows (the source schema's order)."""

    __slots__ = ("message_id", "key", "value", "properties", "publish_time", "event_time", "producer_name",
                 "replicated_from", "redelivery_count")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, [])

    def __len__(self) -> int:
        return len(self.message_id)

    def add(self, msg) -> None:
        """Append one ``client.message.Message`` as a row (times in us)."""
        self.message_id.append(str(msg.message_id()))
        self.key.append(msg.partition_key() if msg.has_partition_key() else None)
        self.value.append(msg.data())
        self.properties.append(list(msg.properties().items()))
        self.publish_time.append(msg.publish_timestamp() * 1000)
        event = msg.event_timestamp()
        self.event_time.append(event * 1000 if event else None)
        self.producer_name.append(msg.producer_name() or None)
        self.replicated_from.append(msg.replicated_from() or None)
        self.redelivery_count.append(msg.redelivery_count())

    def to_arrow(self, part: PartitionRange, arrow_schema):
        """A ``pyarrow.RecordBatch`` in ``arrow_schema`` (the source schema as
        PySpark converts it)."""
        import pyarrow as pa
        n = len(self)
        t = {f.name: f.type for f in arrow_schema}
        arrays = [
            pa.array([part.tp.topic] * n, type=t["topic"]),
            pa.array([part.tp.partition] * n, type=t["partition"]),
            pa.array(self.message_id, type=t["message_id"]),
            pa.array(self.key, type=t["key"]),
            pa.array(self.value, type=t["value"]),
            pa.array(self.properties, type=t["properties"]),
            pa.array(self.publish_time, type=t["publish_time"]),
            pa.array(self.event_time, type=t["event_time"]),
            pa.array(self.producer_name, type=t["producer_name"]),
            pa.array(self.replicated_from, type=t["replicated_from"]),
            pa.array(self.redelivery_count, type=t["redelivery_count"]),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _entry(mid) -> Position:
    return Position(mid.ledger_id, mid.entry_id)


class _RangeRead:
    """The asyncio state of one range read (client, reader, progress)."""

    def __init__(self, part: PartitionRange):
        self.part = part
        self.client = None
        self.reader = None
        self.admin = None
        self.progress = RangeProgress(part.start, part.end, part.ledgers)
        self.done = part.end <= part.start
        self.last: tuple[int, int, int] | None = None   # (ledger, entry, batch_index) of the last message read
        self.rows = 0
        self.lost = 0                                   # entries deleted before being read (failOnDataLoss=false)

    async def open(self) -> None:
        """Check the partition (``_precheck``) and open the Reader after ``start``;
        retries connection errors within ``operationTimeoutMs``.  Raises ``SourceError``."""
        from client.client import AsyncClient
        from client.spark.tracked_reader import open_tracked_reader
        part = self.part
        self.client = AsyncClient(part.service_url, operation_timeout_seconds=part.operation_timeout_ms / 1000)
        if not await self._precheck():
            self.done = True
            return
        deadline = time.monotonic() + part.operation_timeout_ms / 1000
        backoff = 0.1
        try:
            while True:
                try:
                    self.reader = await open_tracked_reader(
                        self.client, part.topic, part.tp.partition, part.start, self.progress,
                        receiver_queue_size=part.receiver_queue_size, reader_name=f"spark-{part.tp.partition}")
                    break
                except (ConnectError, Timeout) as exc:
                    # a busy or restarting broker: retry within operationTimeoutMs
                    if time.monotonic() + backoff >= deadline:
                        raise
                    log.info("opening a reader on %s failed (%s); retrying in %.1fs", part.topic, exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
        except (TopicNotFound, NotFound) as exc:
            if part.fail_on_data_loss:
                raise SourceError(f"option 'failOnDataLoss': {part.topic} no longer exists but entries "
                                  f"{part.start}..{part.end} were still to be read ({exc}); set "
                                  f"failOnDataLoss=false to skip it") from None
            log.warning("%s no longer exists; skipping entries %s..%s (failOnDataLoss=false)",
                        part.topic, part.start, part.end)
            self.done = True
        except (ConnectError, Timeout) as exc:
            raise SourceError(f"option 'service_url': cannot read {part.topic} from {part.service_url} "
                              f"({exc})") from None

    async def _precheck(self) -> bool:
        """Before subscribing (which would auto-create a deleted topic): does the
        partition still exist, still reach ``end`` and still hold every ledger
        planned for the range?  False = nothing to read (``failOnDataLoss=false``,
        topic gone); raises ``SourceError`` otherwise."""
        from client.admin import AdminClient
        from client.spark.lookup import parse_stats_position
        part = self.part
        self.admin = AdminClient(part.service_url, part.operation_timeout_ms / 1000)
        try:
            stats = await self.admin.get_internal_stats(part.topic)
        except (TopicNotFound, NotFound) as exc:
            problem = f"{part.topic} no longer exists ({exc})"
        except (ConnectError, Timeout) as exc:
            raise SourceError(f"option 'service_url': cannot reach the broker at {part.service_url} to read "
                              f"{part.topic} ({exc})") from None
        else:
            last = parse_stats_position(stats.get("lastConfirmedEntry", "-1:-1"))
            if last >= part.end:
                present = {int(li["ledgerId"]) for li in stats.get("ledgers", ())}
                gone = {li.ledger_id: entries_in_range(part.start, part.end, li) for li in part.ledgers
                        if li.ledger_id not in present}
                self._lost(gone, "before the read started")
                return True
            problem = f"{part.topic} now ends at entry {last} (deleted and re-created?)"
        message = (f"option 'failOnDataLoss': {problem} but entries {part.start}..{part.end} were still to be "
                   f"read; set failOnDataLoss=false to skip them")
        if part.fail_on_data_loss:
            raise SourceError(message)
        log.warning("%s", message)
        return False

    def _lost(self, gone: dict[int, int], when: str) -> None:
        """Report entries of deleted ledgers (``{ledger_id: entries}``): raise with
        ``failOnDataLoss``, else log and count them."""
        gone = {lid: n for lid, n in gone.items() if n > 0}
        if not gone:
            return
        part, n = self.part, sum(gone.values())
        first = self.progress.observed if self.progress.observed != part.start else None
        message = (f"option 'failOnDataLoss': potential data loss in {part.tp.topic} partition {part.tp.partition}: "
                   f"{n} entries of ({part.start}, {part.end}] were deleted {when}: ledger(s) "
                   f"{', '.join(str(lid) for lid in sorted(gone))} no longer exist (retention trimmed them after "
                   f"the micro-batch was planned{f'; the read went on at {first}' if first else ''}). Readers do not "
                   f"hold data: give the namespace a retention policy longer than a query may lag, or set the "
                   f"source option durableSubscription=true; set failOnDataLoss=false to skip lost entries")
        if part.fail_on_data_loss:
            raise SourceError(message)
        self.lost += n
        log.warning("%s; skipping them (failOnDataLoss=false)", message)

    async def _settle_suspects(self) -> None:
        """Ledgers with planned entries that were not pushed: still there (the
        entries were markers) or deleted (lost data)."""
        progress = self.progress
        if not progress.suspects:
            return
        suspects, progress.suspects = dict(progress.suspects), {}
        try:
            stats = await self.admin.get_internal_stats(self.part.topic)
            present = {int(li["ledgerId"]) for li in stats.get("ledgers", ())}
        except (TopicNotFound, NotFound):
            present = set()
        except PulsarException as exc:
            progress.suspects.update(suspects)     # decide at the next pass
            log.debug("internal stats of %s failed: %s", self.part.topic, exc)
            return
        self._lost({lid: n for lid, n in suspects.items() if lid not in present}, "before being read")

    async def next_columns(self, max_rows: int) -> _Columns:
        """Read up to ``max_rows`` messages of the range; sets ``done`` at its end.
        Raises ``SourceError`` (lost data with ``failOnDataLoss``, nothing
        arriving for ``readTimeoutMs``)."""
        cols = _Columns()
        part, progress = self.part, self.progress
        idle_since = None
        while not self.done and len(cols) < max_rows:
            await self._settle_suspects()
            if progress.complete():
                self.done = True
                break
            try:
                msg = await self.reader.read_next(part.poll_timeout_ms)
            except Timeout:
                now = time.monotonic()
                idle_since = idle_since or now
                await self._idle((now - idle_since) * 1000)
                continue
            idle_since = None
            mid = msg.message_id()
            chunks = getattr(msg, "_chunk_ids", None)
            first = _entry(chunks[0]) if chunks else _entry(mid)
            progress.on_consumed(mid.ledger_id, mid.entry_id, mid.batch_index, mid.batch_size, first)
            key = (mid.ledger_id, mid.entry_id, mid.batch_index)
            if self.last is not None and key <= self.last:
                continue           # a redelivery after a reconnect: already returned
            self.last = key
            if not progress.belongs(first):
                continue           # the next range's (read on for a chunked message of this one)
            cols.add(msg)
            self.rows += 1
        return cols

    async def _idle(self, idle_ms: float) -> None:
        """Nothing arrived for a poll: at the tail, the entries up to ``end`` that
        never came are markers; after ``readTimeoutMs`` give up (an incomplete
        chunked message of the range is dropped, missing entries fail)."""
        part, progress = self.part, self.progress
        if not progress.pushed_to_end():
            try:
                last = await self.client.get_last_message_id(part.topic)
            except PulsarException as exc:
                log.debug("last message id of %s failed: %s", part.topic, exc)
                last = None
            if last is not None and _entry(last) <= progress.highest:
                progress.finish_at_tail()          # the rest up to end: markers (or deleted: checked)
                await self._settle_suspects()
                return
        if idle_ms < part.read_timeout_ms:
            return
        if progress.pushed_to_end():
            log.warning("%s: chunked message(s) starting at %s never completed within %gs (the producer stopped "
                        "between chunks?); skipped, as Pulsar consumers drop incomplete chunked messages",
                        part.topic, ", ".join(str(p) for p in sorted(progress.pending)), part.read_timeout_ms / 1000)
            progress.on_chunks_dropped(list(progress.pending))
            return
        raise SourceError(
            f"option 'readTimeoutMs': no message from {part.topic} for {part.read_timeout_ms / 1000:g}s while "
            f"entries up to {part.end} remain (last entry received {progress.highest}); is the broker up?")

    async def close(self) -> None:
        """Close the reader, the admin client and the client (best effort)."""
        if self.progress.dropped:
            log.warning("%s: %d chunked message(s) of (%s, %s] were dropped incomplete by the consumer",
                        self.part.topic, len(self.progress.dropped), self.part.start, self.part.end)
        for closer in (self.reader, self.admin, self.client):
            if closer is not None:
                try:
                    await closer.close()
                except Exception:  # noqa: BLE001 - best effort
                    pass


_LOOP = None


def _loop_thread():
    """This process's event-loop thread for reads (one per worker process: grpc
    aio channels must not outlive their loop, and a pooled worker runs many
    reads).  Re-created after a fork."""
    global _LOOP
    import os
    from client.sync import LoopThread
    if _LOOP is None or not _LOOP[1].running or _LOOP[0] != os.getpid():
        _LOOP = (os.getpid(), LoopThread("minipulsar-spark-read"))
    return _LOOP[1]


def read_partition(part: PartitionRange, arrow_schema, rows_per_batch: int = ROWS_PER_BATCH) -> Iterator:
    """Yield ``pyarrow.RecordBatch``es (``arrow_schema``) of every message of
    ``part``'s range, in order, each batch at most ``rows_per_batch`` rows.

    Opens its own client (on this process's read loop thread) and closes it
    when exhausted or closed early.  Raises ``SourceError`` (broker
    unreachable -> option ``service_url``; partition gone or entries deleted
    before being read, with ``failOnDataLoss`` -> that option; nothing
    arriving for ``readTimeoutMs`` -> that option).
    """
    if part.end <= part.start:
        return
    lt = _loop_thread()
    state = _RangeRead(part)
    started = time.monotonic()
    try:
        lt.run(state.open())
        while not state.done:
            cols = lt.run(state.next_columns(rows_per_batch))
            if len(cols):
                yield cols.to_arrow(part, arrow_schema)
        log.info("read %d messages of %s (%s, %s] in %.2fs%s", state.rows, part.topic, part.start, part.end,
                 time.monotonic() - started, f"; {state.lost} entries lost" if state.lost else "")
    finally:
        lt.run(state.close())
