"""A Reader whose entry splitter reports every pushed entry to a
``progress.RangeProgress`` (the worker side of the Spark source).

A Pulsar Reader hands out messages only; a range read also needs the entries
that yield none: chunks of a chunked message still incomplete, chunks whose
first chunk lies before the range (dropped by the assembler), and it needs
to know when a chunked message is complete, dropped or restarted after a
reconnection.  ``TrackingSplitter`` is the consumer's ``EntrySplitter``
(Pulsar's ConsumerImpl message/chunk handling) with those reports added; it
is installed before the Reader subscribes, so no entry escapes it.

Uses the client's Reader internals (``ConsumerImpl``, ``Reader``): they live in
the same package; a public entry listener on ``create_reader`` would replace
this module's ``open_tracked_reader``.
"""
from __future__ import annotations

import uuid

from client.chunking import is_chunk
from client.consumer_config import ConsumerConfig, ConsumerType
from client.consumer_impl import ConsumerImpl
from client.entry_format import peek_metadata
from client.entry_splitter import EntrySplitter, SplitResult
from client.errors import CorruptedMessage
from client.message_id import MessageId
from client.reader import Reader
from client.spark.offsets import Position
from client.spark.progress import RangeProgress

__all__ = ["TrackingSplitter", "open_tracked_reader", "MAX_PENDING_CHUNKED"]

#: incomplete chunked messages a range reader holds at once (interleaved producers)
MAX_PENDING_CHUNKED = 100


def _pos(mid) -> Position:
    return Position(mid.ledger_id, mid.entry_id)


class TrackingSplitter(EntrySplitter):
    """``EntrySplitter`` that reports to ``progress`` (see the module doc);
    same constructor arguments after ``progress``."""

    def __init__(self, progress: RangeProgress, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.progress = progress

    def split(self, entry, now_ms: int) -> SplitResult:
        """``EntrySplitter.split``, then report the entry, completed chunked
        messages and discarded chunks."""
        result = super().split(entry, now_ms)
        progress = self.progress
        first_chunk = False
        if not result.messages:
            try:
                md = peek_metadata(entry.headers_and_payload)
                first_chunk = is_chunk(md) and md.chunk_id == 0
            except CorruptedMessage:
                pass
        position = Position(entry.position.ledger_id, entry.position.entry_id)
        progress.on_entry(position, first_chunk)
        messages = result.messages
        if len(messages) == 1 and getattr(messages[0], "_chunk_ids", None):
            first = _pos(messages[0]._chunk_ids[0])
            progress.on_chunked_complete(first)
            progress.on_message(first)
        elif messages:
            progress.on_message(position, len(messages))     # a batch: one entry's messages
        if result.ack or result.redeliver:
            progress.on_chunks_dropped([_pos(m) for m in (*result.ack, *result.redeliver)])
        return result

    def expire_chunks(self, now_ms: int) -> list[MessageId]:
        """``EntrySplitter.expire_chunks``; the expired messages are reported dropped."""
        expired = super().expire_chunks(now_ms)
        if expired:
            self.progress.on_chunks_dropped([_pos(m) for m in expired])
        return expired

    def clear(self) -> list[MessageId]:
        """``EntrySplitter.clear`` (reconnection, seek): the progress is reset to
        what was handed out (the Reader restarts from what it dropped)."""
        ids = super().clear()
        self.progress.on_reset()
        return ids


async def open_tracked_reader(client, topic: str, partition: int, start: Position, progress: RangeProgress,
                              receiver_queue_size: int = 1000, reader_name: str | None = None) -> Reader:
    """A connected Reader of ``topic`` (one partition or a non-partitioned
    topic; ``partition``: its index, -1 when not partitioned) from after entry
    ``start`` (``Position``; ``(-1, -1)`` = the first entry), reporting to
    ``progress``.  Its non-durable subscription is named ``spark-reader-<hex>``.
    Raises what ``ConsumerImpl.start`` raises (``TopicNotFound``, ``Timeout``,
    ``ConnectError``...)."""
    client._check_open()
    conf = ConsumerConfig(subscription_name=f"spark-reader-{uuid.uuid4().hex[:10]}",
                          consumer_type=ConsumerType.Exclusive, receiver_queue_size=receiver_queue_size,
                          consumer_name=reader_name, max_pending_chunked_message=MAX_PENDING_CHUNKED).validate()
    start_id = MessageId.earliest if start.ledger_id < 0 else MessageId(start.ledger_id, start.entry_id)
    impl = ConsumerImpl(client, topic, conf, partition=partition, durable=False, start_message_id=start_id,
                        start_inclusive=False)
    impl.splitter = TrackingSplitter(
        progress, topic, partition, tracker=impl.tracker, max_pending_chunked_message=MAX_PENDING_CHUNKED,
        expire_time_of_incomplete_chunked_message_ms=conf.expire_time_of_incomplete_chunked_message_ms,
        auto_ack_oldest_chunked_message_on_queue_full=conf.auto_ack_oldest_chunked_message_on_queue_full)
    await impl.start()
    reader = Reader(client, topic, impl)
    client._register(reader)
    return reader
