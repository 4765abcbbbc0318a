"""Turning pushed entries into messages, sans-I/O (Pulsar's
ConsumerImpl.messageReceived / receiveIndividualMessagesFromBatch /
processMessageChunk / discardCorruptedMessage).

One ``EntryMessage`` (position, entry bytes, redelivery count, ack set)
becomes zero or more ``Message`` objects:

1. ``decode_entry`` verifies the CRC32C; a corrupt entry is logged and
   acknowledged (never delivered, never redelivered forever);
2. marker entries (replication markers) are acknowledged, never delivered;
3. a chunk goes to the ``ChunkedMessageAssembler``: nothing comes out until
   the last chunk completes the message;
4. the payload is decompressed;
5. a batch is split with ``parse_batch``; indexes the broker reports as
   acknowledged (ack set bit clear), duplicates of pending acks and messages
   before the seek/start position are skipped.

Every message not delivered counts in ``skipped``: the consumer gives those
permits back to the broker.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from client.ack_grouping import AcknowledgmentsGroupingTracker, unacked_mask_from_ack_set
from client.batching import is_batched, iter_batch
from client.chunking import ChunkedMessageAssembler, is_chunk
from client.compression import decompress
from client.entry_format import decode_entry
from client.errors import CorruptedMessage, InvalidConfiguration
from client.message import Message, TopicChunkMessageId, TopicMessageId
from client.message_id import ChunkMessageId, MessageId

if TYPE_CHECKING:
    from proto.broker_pb2 import EntryMessage
    from proto.pulsar_api_pb2 import MessageMetadata

__all__ = ["EntrySplitter", "SplitResult", "StartFilter"]

log = logging.getLogger(__name__)


@dataclass
class SplitResult:
    """What one entry produced.

    ``messages``: to deliver, in order; ``ack``: entry ids to acknowledge now
    (corrupt entries, markers, stale or expired chunks); ``redeliver``: chunk
    ids dropped here but deliverable later (the consumer tracks them for the
    ack timeout, as Pulsar's trackMessage); ``skipped``: messages not
    delivered (permits to give back)."""

    messages: list[Message] = field(default_factory=list)
    ack: list[MessageId] = field(default_factory=list)
    redeliver: list[MessageId] = field(default_factory=list)
    skipped: int = 0


@dataclass(frozen=True)
class StartFilter:
    """Skip the messages of entry ``(ledger_id, entry_id)`` whose batch index is
    below ``min_batch_index`` (a Reader started, or a consumer sought, at a
    message inside a batch: the broker only knows entries)."""

    ledger_id: int
    entry_id: int
    min_batch_index: int

    def skips(self, ledger_id: int, entry_id: int, batch_index: int) -> bool:
        return (ledger_id == self.ledger_id and entry_id == self.entry_id
                and batch_index < self.min_batch_index)


class EntrySplitter:
    """Splits entries of one topic (or partition) into messages.  No I/O.

    ``topic``: full topic name given to messages; ``partition``: partition
    index put in message ids (-1: not partitioned); ``topic_in_ids``: build
    ``TopicMessageId`` (multi-topic consumers); ``tracker``: the consumer's
    ack tracker (batch entries are registered with it; pending acks filter
    duplicates); chunk options as ``ChunkedMessageAssembler``.
    """

    def __init__(self, topic: str, partition: int = -1, *, topic_in_ids: bool = False,
                 tracker: AcknowledgmentsGroupingTracker | None = None, max_pending_chunked_message: int = 10,
                 expire_time_of_incomplete_chunked_message_ms: int = 60000,
                 auto_ack_oldest_chunked_message_on_queue_full: bool = False):
        self.topic = topic
        self.partition = partition
        self.topic_in_ids = topic_in_ids
        self.tracker = tracker
        self.start_filter: StartFilter | None = None
        self.chunks = ChunkedMessageAssembler(max_pending_chunked_message,
                                              expire_time_of_incomplete_chunked_message_ms,
                                              auto_ack_oldest_chunked_message_on_queue_full)

    def _id(self, ledger_id: int, entry_id: int, batch_index: int = -1, batch_size: int = 0) -> MessageId:
        if self.topic_in_ids:
            return TopicMessageId(ledger_id, entry_id, self.partition, batch_index, batch_size, topic=self.topic)
        return MessageId(ledger_id, entry_id, self.partition, batch_index, batch_size)

    def _chunk_id(self, chunk_ids: tuple[MessageId, ...]) -> MessageId:
        """The id of a chunked message (Pulsar's ChunkMessageIdImpl): its last
        chunk's position, carrying the first chunk's id and every chunk's."""
        last = chunk_ids[-1]
        if self.topic_in_ids:
            return TopicChunkMessageId(last.ledger_id, last.entry_id, self.partition, topic=self.topic,
                                       first_chunk_message_id=chunk_ids[0], chunk_message_ids=chunk_ids)
        return ChunkMessageId(last.ledger_id, last.entry_id, self.partition,
                              first_chunk_message_id=chunk_ids[0], chunk_message_ids=chunk_ids)

    def split(self, entry: "EntryMessage", now_ms: int) -> SplitResult:
        """Messages of one pushed entry (see the module doc).  Never raises on
        bad entry bytes: they end up in ``ack``."""
        out = SplitResult()
        ledger_id, entry_id = entry.position.ledger_id, entry.position.entry_id
        entry_mid = self._id(ledger_id, entry_id)
        try:
            metadata, payload = decode_entry(entry.headers_and_payload)
        except CorruptedMessage as e:
            log.error("[%s] discarding corrupted entry %s: %s", self.topic, entry_mid, e)
            out.ack.append(entry_mid)
            out.skipped += 1
            return out
        if metadata.HasField("marker_type"):
            out.ack.append(entry_mid)  # markers are for brokers only
            out.skipped += 1
            return out
        chunk_ids: tuple[MessageId, ...] | None = None
        if is_chunk(metadata):
            completed = self.chunks.add(metadata, payload, entry_mid, now_ms)
            discarded = self.chunks.take_discarded()
            out.ack.extend(discarded.ack)
            out.redeliver.extend(discarded.redeliver)
            if completed is None:
                out.skipped += 1
                return out
            payload, chunk_ids = completed.payload, tuple(completed.message_ids)
            entry_mid = self._chunk_id(chunk_ids)
        try:
            data = decompress(metadata.compression, payload, metadata.uncompressed_size)
            batch = iter_batch(metadata, data) if is_batched(metadata) else None
        except (CorruptedMessage, InvalidConfiguration) as e:
            log.error("[%s] discarding undecodable message %s: %s", self.topic, entry_mid, e)
            out.ack.extend(chunk_ids or (entry_mid,))
            out.skipped += 1
            return out
        common = dict(publish_time=metadata.publish_time, redelivery_count=entry.redelivery_count,
                      producer_name=metadata.producer_name,
                      replicated_from=metadata.replicated_from if metadata.HasField("replicated_from") else None)
        if batch is None:
            mid = entry_mid
            if self.tracker is not None and self.tracker.is_duplicate(mid):
                out.skipped += 1
                return out
            out.messages.append(Message(
                data, mid, self.topic, properties={p.key: p.value for p in metadata.properties},
                partition_key=metadata.partition_key if metadata.HasField("partition_key") else None,
                ordering_key=metadata.ordering_key if metadata.HasField("ordering_key") else None,
                event_time=metadata.event_time, sequence_id=metadata.sequence_id, chunk_ids=chunk_ids, **common))
            return out
        self._split_batch(entry, metadata, batch, common, out)
        return out

    def _split_batch(self, entry: "EntryMessage", metadata: "MessageMetadata", batch: list, common: dict,
                     out: SplitResult) -> None:
        ledger_id, entry_id = entry.position.ledger_id, entry.position.entry_id
        size = len(batch)
        mask = unacked_mask_from_ack_set(entry.ack_set, size)
        tracker = self.tracker
        first_new = 0  # batch indexes below this one are duplicates (already acknowledged)
        if tracker is not None:
            # the acker also knows batch-index acks the broker may not have applied yet
            mask = tracker.register_batch(ledger_id, entry_id, size, mask).unacked_mask
            first_new = tracker.first_new_batch_index(ledger_id, entry_id)
        start_filter = self.start_filter
        full = mask == (1 << size) - 1
        topic = self.topic
        partition = self.partition
        entry_ordering_key = metadata.ordering_key if metadata.HasField("ordering_key") else None
        base_seq = metadata.sequence_id
        publish_time = common["publish_time"]
        redelivery_count = common["redelivery_count"]
        producer_name = common["producer_name"]
        replicated_from = common["replicated_from"]
        if self.topic_in_ids:
            def make_id(i):
                return TopicMessageId(ledger_id, entry_id, partition, i, size, topic=topic)
        else:
            def make_id(i, _trusted=MessageId._trusted):
                return _trusted(ledger_id, entry_id, partition, i, size)
        messages = out.messages
        append = messages.append
        fast_message = Message._received
        for i, (data, seq, event_time, smm) in enumerate(batch):
            if not full and not (mask >> i) & 1:
                out.skipped += 1
                continue
            if start_filter is not None and start_filter.skips(ledger_id, entry_id, i):
                out.skipped += 1
                continue
            if i < first_new:
                out.skipped += 1
                continue
            mid = make_id(i)
            if seq is None:
                seq = base_seq + i
            if smm is None:
                append(fast_message(data, mid, topic, entry_ordering_key, publish_time, event_time,
                                    redelivery_count, producer_name, replicated_from, seq))
                continue
            append(Message(
                b"" if smm.null_value else data, mid, topic,
                properties={p.key: p.value for p in smm.properties},
                partition_key=smm.partition_key if smm.HasField("partition_key") else None,
                ordering_key=smm.ordering_key if smm.HasField("ordering_key") else entry_ordering_key,
                event_time=event_time, sequence_id=seq, publish_time=publish_time,
                redelivery_count=redelivery_count, producer_name=producer_name, replicated_from=replicated_from))

    def expire_chunks(self, now_ms: int) -> list[MessageId]:
        """Chunk ids of incomplete chunked messages that expired (to acknowledge, as Pulsar)."""
        return self.chunks.expire(now_ms)

    def clear(self) -> list[MessageId]:
        """Drop incomplete chunked messages (reconnect, seek); returns their chunk ids."""
        return self.chunks.clear()
