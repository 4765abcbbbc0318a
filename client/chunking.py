"""Chunking of large messages (PIP-37), producer and consumer sides.

Producer (Pulsar's ProducerImpl): the *compressed* payload is split into
chunks of at most ``max_chunk_size`` bytes; every chunk is its own entry whose
metadata is the message's plus ``uuid = "<producer_name>-<sequence_id>"``,
``chunk_id``, ``num_chunks_from_msg`` and ``total_chunk_msg_size``.  All chunks
share the sequence id.  Chunked messages are never batched.  A chunk's entry
leaves ``REPLICATION_METADATA_RESERVE`` bytes under the broker's max message
size (``max_chunk_payload_size``), so that it still fits once a replicator
has added ``replicated_from`` and the source ledger/entry ids.

Consumer (Pulsar's ConsumerImpl.processMessageChunk + ChunkedMessageCtx):
``ChunkedMessageAssembler`` joins the chunks back; the caller decompresses the
result with the last chunk's metadata (compression, uncompressed_size).
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

from client.entry_format import HEADER_SIZE
from client.message_id import MessageId
from proto.pulsar_api_pb2 import MessageMetadata

__all__ = ["split_into_chunks", "chunk_metadatas", "chunk_message", "ChunkedMessageAssembler",
           "CompletedChunkedMessage", "DiscardedChunks", "is_chunk", "max_chunk_payload_size",
           "chunk_metadata_size", "REPLICATION_METADATA_RESERVE"]

# Bytes of MessageMetadata a geo-replicator adds to an entry before sending it to
# a remote cluster, which checks the same max message size: replicated_from
# (1-byte tag, length, the cluster name) and replicated_source_ledger_id /
# replicated_source_entry_id (2-byte tags, varints of up to 10 bytes): 27 bytes
# plus the cluster name.  512 covers cluster names of up to 480 bytes (Pulsar's
# broker allows a 10 KB frame padding instead; minipulsar's broker checks
# max_message_size exactly, so the room is kept here).
REPLICATION_METADATA_RESERVE = 512
_I32_MAX = (1 << 31) - 1
_U64_MAX = (1 << 64) - 1

log = logging.getLogger(__name__)
_COMPLETED_MEMORY = 64  # completed messages remembered, to recognise their redelivered chunks


def split_into_chunks(payload: bytes | memoryview, max_chunk_size: int) -> list[bytes]:
    """Split ``payload`` into ``ceil(len / max_chunk_size)`` pieces of at most
    ``max_chunk_size`` bytes (at least one piece, even for an empty payload,
    as Pulsar's ``max(1, size) / maxMessageSize``).  Raises ``ValueError`` if
    ``max_chunk_size <= 0``."""
    if max_chunk_size <= 0:
        raise ValueError(f"max_chunk_size must be positive, got {max_chunk_size}")
    data = bytes(payload)
    if not data:
        return [b""]
    return [data[i:i + max_chunk_size] for i in range(0, len(data), max_chunk_size)]


def chunk_metadata_size(metadata: MessageMetadata) -> int:
    """Upper bound (bytes) of the serialized metadata of any chunk of a message
    with ``metadata``: the message's fields plus a uuid, chunk_id,
    num_chunks_from_msg and total_chunk_msg_size at their largest encodings."""
    md = MessageMetadata()
    md.CopyFrom(metadata)
    md.sequence_id = _U64_MAX
    md.uuid = f"{metadata.producer_name}-{_U64_MAX}"
    md.chunk_id = md.num_chunks_from_msg = md.total_chunk_msg_size = _I32_MAX
    return md.ByteSize()


def max_chunk_payload_size(metadata: MessageMetadata, max_message_size: int,
                           reserve: int = REPLICATION_METADATA_RESERVE) -> int:
    """Payload bytes per chunk so that every chunk entry of a message with
    ``metadata`` is at most ``max_message_size - reserve`` bytes (entry header
    + chunk metadata + chunk payload), as Pulsar's ProducerImpl subtracts the
    metadata size from the max message size when chunking.  ``reserve``: room
    for metadata added on the way (replication, see
    ``REPLICATION_METADATA_RESERVE``).  May be <= 0 when the metadata alone is
    too large: the caller refuses the message."""
    return max_message_size - reserve - HEADER_SIZE - chunk_metadata_size(metadata)


def chunk_metadatas(metadata: MessageMetadata, num_chunks: int, total_chunk_msg_size: int) -> list[MessageMetadata]:
    """Per-chunk copies of ``metadata`` with uuid ``"<producer_name>-<sequence_id>"``,
    ``chunk_id`` 0..num_chunks-1, ``num_chunks_from_msg`` and
    ``total_chunk_msg_size`` (bytes of the whole compressed payload).  For
    ``num_chunks == 1`` returns ``[metadata]`` unchanged (not chunked, as Pulsar).
    Raises ``ValueError`` if ``num_chunks < 1``."""
    if num_chunks < 1:
        raise ValueError(f"num_chunks must be >= 1, got {num_chunks}")
    if num_chunks == 1:
        return [metadata]
    uuid = f"{metadata.producer_name}-{metadata.sequence_id}"
    out = []
    for chunk_id in range(num_chunks):
        md = MessageMetadata()
        md.CopyFrom(metadata)
        md.uuid = uuid
        md.chunk_id = chunk_id
        md.num_chunks_from_msg = num_chunks
        md.total_chunk_msg_size = total_chunk_msg_size
        out.append(md)
    return out


def chunk_message(metadata: MessageMetadata, payload: bytes | memoryview,
                  max_chunk_size: int) -> list[tuple[MessageMetadata, bytes]]:
    """``split_into_chunks`` + ``chunk_metadatas``: ``[(metadata, chunk bytes)]``,
    one element (the input, unchanged) when the payload fits one chunk."""
    chunks = split_into_chunks(payload, max_chunk_size)
    return list(zip(chunk_metadatas(metadata, len(chunks), len(payload)), chunks))


def is_chunk(metadata: MessageMetadata) -> bool:
    """True if the entry is one chunk of a chunked message."""
    return metadata.HasField("uuid") and metadata.num_chunks_from_msg > 1


class CompletedChunkedMessage(NamedTuple):
    """A reassembled message: ``payload`` (bytes, still compressed) and the
    ``message_ids`` of its chunks in chunk order (first one = Pulsar's
    ChunkMessageIdImpl first id, last one = the message's id)."""

    payload: bytes
    message_ids: list


class DiscardedChunks(NamedTuple):
    """Chunk message ids the consumer must settle: ``ack`` (never to be
    delivered: duplicates, corrupt or expired chunks) and ``redeliver`` (dropped
    here but deliverable later: ask the broker to redeliver them)."""

    ack: list
    redeliver: list


@dataclass
class _Ctx:  # Pulsar's ChunkedMessageCtx
    num_chunks: int
    total_size: int
    received_ms: int
    chunks: list = field(default_factory=list)
    ids: list = field(default_factory=list)
    size: int = 0

    @property
    def last_chunk_id(self) -> int:
        return len(self.chunks) - 1

    def has_id(self, message_id: MessageId) -> bool:
        return any(_same_entry(i, message_id) for i in self.ids)


def _same_entry(a: MessageId, b: MessageId) -> bool:
    return a.ledger_id == b.ledger_id and a.entry_id == b.entry_id


class ChunkedMessageAssembler:
    """Reassembles chunked messages on the consumer (Pulsar's ConsumerImpl
    chunk handling, without I/O).

    - ``max_pending_chunked_messages`` (count, <= 0 = unlimited): when a new
      chunked message starts and too many are pending, the oldest is dropped;
      its chunk ids go to ``ack`` if ``auto_ack_oldest_chunked_message_on_queue_full``
      else to ``redeliver``.
    - ``expire_incomplete_chunked_message_ms`` (ms, <= 0 = never): incomplete
      messages older than this are dropped by ``expire``.

    Chunk handling as Pulsar: chunk 0 seen again restarts the message (the old
    chunks are acked if they are a different, stale copy); a chunk id at or
    below the last one is a duplicate (acked if it is a different entry); a gap
    or a chunk without its first chunk discards the message (its ids are
    redelivered; Pulsar leaves them unacked).  A chunk contradicting its first
    chunk (count, sizes) is corrupt: all its message's ids are acked.  A
    redelivered chunk of a recently completed message is ignored.  Ids to
    settle accumulate until ``take_discarded()``.
    """

    def __init__(self, max_pending_chunked_messages: int = 10, expire_incomplete_chunked_message_ms: int = 60000,
                 auto_ack_oldest_chunked_message_on_queue_full: bool = False):
        self.max_pending = max_pending_chunked_messages
        self.expire_ms = expire_incomplete_chunked_message_ms
        self.auto_ack_oldest = auto_ack_oldest_chunked_message_on_queue_full
        self._pending: OrderedDict[str, _Ctx] = OrderedDict()  # oldest first
        self._completed: OrderedDict[str, list] = OrderedDict()  # recent uuid -> chunk ids
        self._ack: list = []
        self._redeliver: list = []

    def __len__(self) -> int:
        """Number of incomplete chunked messages held."""
        return len(self._pending)

    def take_discarded(self) -> DiscardedChunks:
        """Return and forget the chunk ids to ack / redeliver collected so far."""
        out = DiscardedChunks(self._ack, self._redeliver)
        self._ack, self._redeliver = [], []
        return out

    def add(self, metadata: MessageMetadata, payload: bytes | memoryview, message_id: MessageId,
            now_ms: int) -> CompletedChunkedMessage | None:
        """Feed one chunk (its entry's metadata, payload bytes and id; ``now_ms``
        = receive time).  Returns the ``CompletedChunkedMessage`` (unpacks as
        ``(payload, ids)``) when this was the last missing chunk, else None.
        Raises ``ValueError`` if ``metadata`` is not a chunk (see ``is_chunk``)."""
        if not is_chunk(metadata):
            raise ValueError("not a chunk: metadata needs uuid and num_chunks_from_msg > 1")
        uuid, chunk_id, num_chunks = metadata.uuid, metadata.chunk_id, metadata.num_chunks_from_msg
        ctx = self._pending.get(uuid)
        if chunk_id == 0:
            if ctx is not None:
                del self._pending[uuid]
                if not ctx.has_id(message_id):  # a stale, different copy: never deliverable
                    self._ack.extend(ctx.ids)
                # else a redelivery of the same chunks: nothing to settle, restart
            self._drop_oldest_if_full()
            ctx = self._pending[uuid] = _Ctx(num_chunks, metadata.total_chunk_msg_size, now_ms)
        if ctx is not None and 0 < chunk_id <= ctx.last_chunk_id:
            log.warning("duplicated chunk %s of %s (last chunk %s), id %s", chunk_id, uuid,
                        ctx.last_chunk_id, message_id)
            if not ctx.has_id(message_id):
                self._ack.append(message_id)
            return None
        if ctx is None and any(_same_entry(i, message_id) for i in self._completed.get(uuid, ())):
            return None  # redelivered chunk of a message already completed: settled with that message
        if ctx is None or chunk_id != ctx.last_chunk_id + 1:
            self._discard_out_of_order(uuid, ctx, metadata, message_id, now_ms)
            return None
        if (num_chunks != ctx.num_chunks or metadata.total_chunk_msg_size != ctx.total_size
                or ctx.size + len(payload) > ctx.total_size):
            log.warning("chunk %s of %s contradicts its first chunk (num chunks, sizes): dropping the message",
                        chunk_id, uuid)
            del self._pending[uuid]
            self._ack.extend(ctx.ids + [message_id])  # corrupt: redelivery cannot fix it
            return None
        ctx.chunks.append(bytes(payload))
        ctx.ids.append(message_id)
        ctx.size += len(payload)
        if chunk_id < num_chunks - 1:
            return None
        del self._pending[uuid]
        if ctx.size != ctx.total_size:
            log.warning("chunked message %s has %s bytes, expected %s: dropped", uuid, ctx.size, ctx.total_size)
            self._ack.extend(ctx.ids)
            return None
        self._completed[uuid] = ctx.ids
        if len(self._completed) > _COMPLETED_MEMORY:
            self._completed.popitem(last=False)
        return CompletedChunkedMessage(b"".join(ctx.chunks), ctx.ids)

    def _discard_out_of_order(self, uuid: str, ctx: _Ctx | None, metadata: MessageMetadata,
                              message_id: MessageId, now_ms: int) -> None:
        log.info("unexpected chunk %s of %s (last chunk %s), id %s: discarding the message", metadata.chunk_id,
                 uuid, None if ctx is None else ctx.last_chunk_id, message_id)
        if ctx is not None:
            del self._pending[uuid]
            self._redeliver.extend(ctx.ids)  # beyond Pulsar: no ack hole for the earlier chunks
        if self.expire_ms > 0 and now_ms > metadata.publish_time + self.expire_ms:
            self._ack.append(message_id)
        else:
            self._redeliver.append(message_id)

    def _drop_oldest_if_full(self) -> None:
        while self.max_pending > 0 and len(self._pending) >= self.max_pending:
            _, oldest = self._pending.popitem(last=False)
            (self._ack if self.auto_ack_oldest else self._redeliver).extend(oldest.ids)

    def expire(self, now_ms: int) -> list:
        """Drop incomplete messages whose first chunk arrived more than
        ``expire_incomplete_chunked_message_ms`` before ``now_ms``; returns their
        chunk ids (Pulsar acks them).  Returns [] when expiry is disabled."""
        expired: list = []
        if self.expire_ms <= 0:
            return expired
        while self._pending:
            uuid, ctx = next(iter(self._pending.items()))
            if now_ms <= ctx.received_ms + self.expire_ms:
                break
            del self._pending[uuid]
            expired.extend(ctx.ids)
        return expired

    def clear(self) -> list:
        """Drop every incomplete message (consumer close, seek, reconnect);
        returns their chunk ids, to redeliver."""
        ids = [i for ctx in self._pending.values() for i in ctx.ids]
        self._pending.clear()
        return ids
