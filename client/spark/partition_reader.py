"""Executor side of the Spark source: read one topic partition's range
``(start, end]`` with a Reader (non-durable cursor) and hand Spark Arrow
record batches.

Runs inside a pooled PySpark worker on an unpickled copy of the source's
reader, so a ``PartitionRange`` carries everything the read needs and the
read opens (and closes) its own broker connection, on its own event loop in
the worker's thread.

Where the range ends: messages are read until the last message of entry
``end`` (a batch entry's messages arrive together, with ``batch_size``).  If
``end`` or the entries before it are markers (replicated-subscription
snapshots, never delivered to consumers), nothing more arrives: after
``pollTimeoutMs`` without a message the read asks the broker for the reader's
subscription mark-delete position — markers are acknowledged by the broker,
our messages by the reader — and stops once it has reached ``end``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Iterator

from client.errors import ConnectError, NotFound, PulsarException, Timeout, TopicNotFound
from client.spark.offsets import EARLIEST, Position, TopicPartition, partition_topic_name
from client.spark.options import SourceError

__all__ = ["PartitionRange", "ROWS_PER_BATCH", "read_partition"]

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 8192


@dataclass(frozen=True)
class PartitionRange:
    """What one Spark input partition reads: topic partition ``tp`` from after
    ``start`` up to and including entry ``end``, plus the settings of the read
    (all picklable).  ``start`` may be ``EARLIEST``."""

    service_url: str
    tp: TopicPartition
    start: Position
    end: Position
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 200
    read_timeout_ms: int = 120_000
    operation_timeout_ms: int = 30_000
    receiver_queue_size: int = 1000

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


def _entry(mid) -> tuple[int, int]:
    return mid.ledger_id, mid.entry_id


class _RangeRead:
    """The asyncio state of one range read (client, reader, progress)."""

    def __init__(self, part: PartitionRange):
        self.part = part
        self.client = None
        self.reader = None
        self.admin = None
        self.done = part.end <= part.start
        self.last: tuple[int, int, int] | None = None   # (ledger, entry, batch_index) of the last row
        self.rows = 0

    async def open(self) -> None:
        """Check the partition (``_precheck``) and open the Reader after ``start``;
        retries connection errors within ``operationTimeoutMs``.  Raises ``SourceError``."""
        from client.client import AsyncClient
        from client.message_id import MessageId
        part = self.part
        self.client = AsyncClient(part.service_url, operation_timeout_seconds=part.operation_timeout_ms / 1000)
        if not await self._precheck():
            self.done = True
            return
        start = MessageId.earliest if part.start == EARLIEST else MessageId(*part.start)
        deadline = time.monotonic() + part.operation_timeout_ms / 1000
        backoff = 0.1
        try:
            while True:
                try:
                    self.reader = await self.client.create_reader(
                        part.topic, start, start_message_id_inclusive=False,
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
        partition still exist and still reach ``end``?  False = nothing to read
        (``failOnDataLoss=false``); raises ``SourceError`` otherwise."""
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
                return True
            problem = f"{part.topic} now ends at entry {last} (deleted and re-created?)"
        message = (f"option 'failOnDataLoss': {problem} but entries {part.start}..{part.end} were still to be "
                   f"read; set failOnDataLoss=false to skip them")
        if part.fail_on_data_loss:
            raise SourceError(message)
        log.warning("%s", message)
        return False

    async def next_columns(self, max_rows: int) -> _Columns:
        """Read up to ``max_rows`` messages of the range; sets ``done`` at its end."""
        cols = _Columns()
        part = self.part
        end = tuple(part.end)
        idle_since = None
        while not self.done and len(cols) < max_rows:
            try:
                msg = await self.reader.read_next(part.poll_timeout_ms)
            except Timeout:
                now = time.monotonic()
                idle_since = idle_since or now
                if await self._reached_end():
                    self.done = True
                elif (now - idle_since) * 1000 >= part.read_timeout_ms:
                    raise SourceError(
                        f"option 'readTimeoutMs': no message from {part.topic} for "
                        f"{part.read_timeout_ms / 1000:g}s while entries up to {part.end} remain (last read "
                        f"{self.last[0] if self.last else part.start.ledger_id}:"
                        f"{self.last[1] if self.last else part.start.entry_id}); is the broker up?") from None
                continue
            idle_since = None
            mid = msg.message_id()
            chunks = getattr(msg, "_chunk_ids", None)
            first_entry = _entry(chunks[0]) if chunks else _entry(mid)
            if first_entry > end:
                self.done = True   # past the range (the rest of the range were markers)
                break
            key = (mid.ledger_id, mid.entry_id, mid.batch_index)
            if self.last is not None and key <= self.last:
                continue           # a redelivery after a reconnect: already returned
            self.last = key
            cols.add(msg)
            self.rows += 1
            if _entry(mid) >= end and (mid.batch_index < 0 or mid.batch_size <= 0
                                       or mid.batch_index >= mid.batch_size - 1):
                self.done = True
        return cols

    async def _reached_end(self) -> bool:
        """After a quiet poll: has the reader's subscription mark-delete position
        (our acks + the broker's acks of markers) reached ``end``?"""
        try:
            stats = await self.admin.get_stats(self.part.topic)
        except PulsarException as exc:
            log.debug("stats of %s failed: %s", self.part.topic, exc)
            return False
        sub = stats.get("subscriptions", {}).get(self.reader.subscription_name())
        if not sub:
            return False
        ledger, _, entry = str(sub.get("markDeletePosition", "-1:-1")).partition(":")
        return (int(ledger), int(entry)) >= tuple(self.part.end)

    async def close(self) -> None:
        """Close the reader, the admin client and the client (best effort)."""
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
    unreachable -> option ``service_url``; partition gone with
    ``failOnDataLoss`` -> that option; nothing arriving for ``readTimeoutMs``
    -> that option).
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
        log.info("read %d messages of %s (%s, %s] in %.2fs", state.rows, part.topic, part.start, part.end,
                 time.monotonic() - started)
    finally:
        lt.run(state.close())
