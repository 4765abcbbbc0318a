"""Producer-side batch containers and the consumer-side batch parser.

Follows Pulsar's BatchMessageContainerImpl / BatchMessageKeyBasedContainer and
``Commands.serializeSingleMessageInBatchWithPayload``: a batch payload is, per
message, ``[4-byte BE size of SingleMessageMetadata][SingleMessageMetadata][payload]``,
and the whole batch is compressed once.  One batch becomes one entry.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from client.compression import CompressionType, compress
from client.errors import CorruptedMessage
from proto.wire import encode_varint
from proto.pulsar_api_pb2 import MessageMetadata, SingleMessageMetadata

__all__ = ["PendingMessage", "BatchMessageContainer", "KeyBasedBatchMessageContainer", "parse_batch",
           "is_batched", "message_metadata", "LOCAL_ONLY", "iter_batch"]

_SIZE = struct.Struct(">I")
LOCAL_ONLY = "__local__"  # replicate_to value of Pulsar's disableReplication()


@dataclass(slots=True)
class PendingMessage:
    """One message waiting in a producer (Pulsar's MessageImpl + its SendCallback).

    ``payload``: message bytes (uncompressed); ``sequence_id``: producer sequence
    id; ``properties``: str -> str; ``partition_key``: routing/compaction key;
    ``ordering_key``: Key_Shared key (bytes); ``event_time``: ms since epoch, 0 =
    unset; ``deliver_at``: ms since epoch or None (such messages are never
    batched, as in Pulsar); ``replicate_to``: cluster names or None for the
    namespace's clusters; ``disable_replication``: keep the message local;
    ``callback``: opaque to this module (e.g. a future), returned by build.
    """

    payload: bytes
    sequence_id: int
    properties: dict[str, str] = field(default_factory=dict)
    partition_key: str | None = None
    ordering_key: bytes | None = None
    event_time: int = 0
    deliver_at: int | None = None
    replicate_to: tuple[str, ...] | None = None
    disable_replication: bool = False
    callback: Any = None

    @property
    def size(self) -> int:
        """Payload size in bytes (what counts against batching_max_bytes)."""
        return len(self.payload)

    def replication_targets(self) -> tuple[str, ...]:
        """Value for ``MessageMetadata.replicate_to`` (empty = default clusters)."""
        if self.disable_replication:
            return (LOCAL_ONLY,)
        return tuple(self.replicate_to) if self.replicate_to else ()


def message_metadata(msg: PendingMessage, producer_name: str, publish_time_ms: int) -> MessageMetadata:
    """``MessageMetadata`` for sending ``msg`` alone, not batched (delayed
    messages, chunks, batching disabled).  Compression/uncompressed_size are left
    for the caller, who compresses.  No ``num_messages_in_batch`` is set, so
    consumers see a non-batched entry (``is_batched`` is False)."""
    md = MessageMetadata(producer_name=producer_name, sequence_id=msg.sequence_id,
                         publish_time=publish_time_ms, replicate_to=msg.replication_targets())
    for k, v in msg.properties.items():
        md.properties.add(key=k, value=v)
    if msg.partition_key is not None:
        md.partition_key = msg.partition_key
    if msg.ordering_key is not None:
        md.ordering_key = msg.ordering_key
    if msg.event_time:
        md.event_time = msg.event_time
    if msg.deliver_at is not None:
        md.deliver_at_time = msg.deliver_at
    return md


def is_batched(metadata: MessageMetadata) -> bool:
    """True if the entry's payload is a batch (Pulsar: hasNumMessagesInBatch)."""
    return metadata.HasField("num_messages_in_batch")


_U63 = (1 << 63) - 1


def _single_metadata(msg: PendingMessage) -> bytes:
    """Serialized ``SingleMessageMetadata`` of ``msg``.  The common case (no
    properties or keys) is encoded by hand, byte for byte what protobuf writes
    (fields in number order: payload_size=3, event_time=5, sequence_id=8)."""
    seq = msg.sequence_id
    if (seq is not None and not msg.properties and msg.partition_key is None and msg.ordering_key is None
            and 0 <= seq <= _U63 and 0 <= msg.event_time <= _U63):
        if msg.event_time:
            return b"".join((b"\x18", encode_varint(len(msg.payload)), b"(", encode_varint(msg.event_time),
                             b"@", encode_varint(seq)))
        return b"".join((b"\x18", encode_varint(len(msg.payload)), b"@", encode_varint(seq)))
    smm = SingleMessageMetadata(payload_size=len(msg.payload), sequence_id=msg.sequence_id)
    for k, v in msg.properties.items():
        smm.properties.add(key=k, value=v)
    if msg.partition_key is not None:
        smm.partition_key = msg.partition_key
    if msg.ordering_key is not None:
        smm.ordering_key = msg.ordering_key
    if msg.event_time:
        smm.event_time = msg.event_time
    return smm.SerializeToString()


class BatchMessageContainer:
    """Accumulates messages into one batch (Pulsar's BatchMessageContainerImpl).

    Limits: ``max_messages`` (count) and ``max_bytes`` (sum of payload sizes);
    a limit <= 0 means unlimited.  Not thread-safe; no I/O.
    """

    def __init__(self, max_messages: int = 1000, max_bytes: int = 131072):
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._messages: list[PendingMessage] = []
        self._bytes = 0

    @property
    def num_messages(self) -> int:
        """Messages in the current batch (count)."""
        return len(self._messages)

    @property
    def num_bytes(self) -> int:
        """Sum of the payload sizes in the current batch (bytes, uncompressed)."""
        return self._bytes

    def is_empty(self) -> bool:
        """True when no message is waiting."""
        return not self._messages

    def has_space(self, size: int) -> bool:
        """Whether a message of ``size`` payload bytes fits the current batch
        (Pulsar's haveEnoughSpace).  An empty batch always has space: a message
        larger than ``max_bytes`` then makes a batch of one."""
        if not self._messages:
            return True
        fits_bytes = self.max_bytes <= 0 or self._bytes + size <= self.max_bytes
        fits_count = self.max_messages <= 0 or len(self._messages) < self.max_messages
        return fits_bytes and fits_count

    def is_compatible(self, msg: PendingMessage) -> bool:
        """Whether ``msg`` may share this batch: not delayed (``deliver_at``), and
        with the same replication targets as the batch (they are per entry)."""
        if msg.deliver_at is not None:
            return False
        if not self._messages:
            return True
        first = self._messages[0]
        if (msg.replicate_to is None and first.replicate_to is None
                and msg.disable_replication == first.disable_replication):
            return True  # the common case, no tuples to build
        return msg.replication_targets() == first.replication_targets()

    def can_add(self, msg: PendingMessage) -> bool:
        """``is_compatible(msg) and has_space(msg.size)``: if False, build and
        send the current batch first, then add."""
        return self.is_compatible(msg) and self.has_space(msg.size)

    def is_full(self) -> bool:
        """True when a limit is reached (Pulsar's isBatchFull): send now."""
        return ((self.max_bytes > 0 and self._bytes >= self.max_bytes)
                or (self.max_messages > 0 and len(self._messages) >= self.max_messages))

    def add(self, msg: PendingMessage) -> bool:
        """Add ``msg``; returns ``is_full()`` afterwards.

        Raises ``ValueError`` if ``msg`` is not compatible (delayed, other
        replication targets) or its sequence id is not above the batch's last
        one (duplicates must travel in their own batch, for broker dedup).
        """
        if msg.deliver_at is not None:
            raise ValueError("messages with deliver_at are sent individually, not batched")
        if not self.is_compatible(msg):
            raise ValueError("message has other replication targets than the current batch; build it first")
        if self._messages and msg.sequence_id <= self._messages[-1].sequence_id:
            raise ValueError(f"sequence id {msg.sequence_id} is not above the batch's last "
                             f"{self._messages[-1].sequence_id}; send possible duplicates in their own batch")
        self._messages.append(msg)
        self._bytes += len(msg.payload)
        return self.is_full()

    def clear(self) -> list[PendingMessage]:
        """Drop the current batch and return its messages (e.g. to fail them)."""
        messages, self._messages, self._bytes = self._messages, [], 0
        return messages

    def build(self, producer_name: str, compression: CompressionType | int | str = CompressionType.NONE,
              publish_time_ms: int = 0) -> tuple[MessageMetadata, bytes, list[PendingMessage]]:
        """Close the batch: returns ``(metadata, compressed payload bytes, messages)``
        and empties the container.

        metadata: producer_name, publish_time (ms), sequence_id = first message's,
        highest_sequence_id = last's, num_messages_in_batch, uncompressed_size
        (bytes), compression (when not NONE), replicate_to.  Raises ``ValueError``
        when empty, ``InvalidConfiguration`` for an unsupported compression.
        """
        if not self._messages:
            raise ValueError("cannot build an empty batch")
        compression = CompressionType.parse(compression)
        messages = self._messages
        parts: list[bytes] = []
        for msg in messages:
            smm = _single_metadata(msg)
            parts += (_SIZE.pack(len(smm)), smm, msg.payload)
        uncompressed = b"".join(parts)
        first, last = messages[0], messages[-1]
        md = MessageMetadata(producer_name=producer_name, sequence_id=first.sequence_id,
                             publish_time=publish_time_ms, highest_sequence_id=last.sequence_id,
                             num_messages_in_batch=len(messages), uncompressed_size=len(uncompressed),
                             replicate_to=first.replication_targets())
        # As Pulsar, the batch carries its first message's keys: the broker's
        # Key_Shared dispatcher routes whole entries by this sticky key.
        if first.partition_key is not None:
            md.partition_key = first.partition_key
        if first.ordering_key is not None:
            md.ordering_key = first.ordering_key
        if compression is not CompressionType.NONE:
            md.compression = compression.value
        payload = compress(compression, uncompressed)
        self.clear()
        return md, payload, messages


class KeyBasedBatchMessageContainer:
    """Batches per key for Key_Shared (Pulsar's BatchMessageKeyBasedContainer).

    Messages are grouped by ``ordering_key`` if set, else ``partition_key`` (keyless
    messages form one group).  Limits apply to the total over all groups.
    ``build_all`` returns one batch per key, ordered by lowest sequence id; each
    batch's metadata carries its own lowest (``sequence_id``) and highest
    (``highest_sequence_id``) message sequence id.

    Batches of different keys interleave sequence ids (key A: 0, 4, 8; key B: 1,
    5, 9), so their ranges overlap and must not be sent as ``[lowest, highest]``
    with broker deduplication on: the broker drops a send whose sequence id is
    at or below the highest one it has seen.  The producer therefore sends each
    key batch under its highest sequence id, in increasing order of it (Pulsar
    #15413; ``client.producer_state.key_batches_in_send_order``).
    """

    def __init__(self, max_messages: int = 1000, max_bytes: int = 131072):
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._groups: dict[object, BatchMessageContainer] = {}
        self._count = 0
        self._bytes = 0

    @staticmethod
    def key_of(msg: PendingMessage) -> object:
        """The grouping key: ordering_key, else partition_key, else None."""
        if msg.ordering_key is not None:
            return ("o", bytes(msg.ordering_key))
        if msg.partition_key is not None:
            return ("p", msg.partition_key)
        return None

    @property
    def num_messages(self) -> int:
        """Messages over all keys (count)."""
        return self._count

    @property
    def num_bytes(self) -> int:
        """Sum of payload sizes over all keys (bytes, uncompressed)."""
        return self._bytes

    @property
    def num_batches(self) -> int:
        """Number of key groups, i.e. entries ``build_all`` will return."""
        return len(self._groups)

    def is_empty(self) -> bool:
        """True when no message is waiting."""
        return self._count == 0

    def has_space(self, size: int) -> bool:
        """As ``BatchMessageContainer.has_space`` over the totals of all keys."""
        if self._count == 0:
            return True
        return ((self.max_bytes <= 0 or self._bytes + size <= self.max_bytes)
                and (self.max_messages <= 0 or self._count < self.max_messages))

    def is_compatible(self, msg: PendingMessage) -> bool:
        """As ``BatchMessageContainer.is_compatible``, against ``msg``'s key batch."""
        group = self._groups.get(self.key_of(msg))
        return group.is_compatible(msg) if group else msg.deliver_at is None

    def can_add(self, msg: PendingMessage) -> bool:
        """``is_compatible(msg) and has_space(msg.size)``."""
        return self.is_compatible(msg) and self.has_space(msg.size)

    def is_full(self) -> bool:
        """True when the totals reach a limit: build and send all batches."""
        return ((self.max_bytes > 0 and self._bytes >= self.max_bytes)
                or (self.max_messages > 0 and self._count >= self.max_messages))

    def add(self, msg: PendingMessage) -> bool:
        """Add ``msg`` to its key's batch; returns ``is_full()``.  Raises
        ``ValueError`` like ``BatchMessageContainer.add``."""
        key = self.key_of(msg)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = BatchMessageContainer(max_messages=0, max_bytes=0)
        group.add(msg)
        self._count += 1
        self._bytes += len(msg.payload)
        return self.is_full()

    def clear(self) -> list[PendingMessage]:
        """Drop all batches; return their messages in sequence-id order."""
        messages = [m for g in self._groups.values() for m in g.clear()]
        self._groups.clear()
        self._count = self._bytes = 0
        return sorted(messages, key=lambda m: m.sequence_id)

    def build_all(self, producer_name: str, compression: CompressionType | int | str = CompressionType.NONE,
                  publish_time_ms: int = 0) -> list[tuple[MessageMetadata, bytes, list[PendingMessage]]]:
        """One ``(metadata, payload, messages)`` per key (see
        ``BatchMessageContainer.build``), ordered by lowest sequence id; empties
        the container.  Returns [] when empty."""
        groups = sorted(self._groups.values(), key=lambda g: g._messages[0].sequence_id)
        batches = [g.build(producer_name, compression, publish_time_ms) for g in groups]
        self._groups.clear()
        self._count = self._bytes = 0
        return batches


def _fast_single_metadata(buf: bytes, pos: int, end: int) -> tuple[int, int | None, int] | None:
    """Decode ``buf[pos:end]`` as a SingleMessageMetadata holding only
    payload_size (3), event_time (5) and sequence_id (8): ``(payload_size,
    sequence_id or None, event_time)``.  None when anything else is there (or the
    bytes are malformed): the caller then parses with protobuf, which also
    produces the right error."""
    size = seq = None
    event_time = 0
    try:
        while pos < end:
            tag = buf[pos]
            pos += 1
            b = buf[pos]
            pos += 1
            if b < 0x80:
                value = b
            else:
                value = b & 0x7F
                shift = 7
                while True:
                    b = buf[pos]
                    pos += 1
                    value |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                    if shift > 63:
                        return None
            if tag == 0x18:
                size = value
            elif tag == 0x40:
                seq = value
            elif tag == 0x28:
                event_time = value
            else:
                return None
    except IndexError:
        return None
    if pos != end or size is None or size > 0x7FFFFFFF or (seq is not None and seq > _U63):
        return None
    return size, seq, event_time


def iter_batch(metadata: MessageMetadata, payload: bytes) -> list[tuple[bytes, int | None, int, SingleMessageMetadata | None]]:
    """Like ``parse_batch`` but cheap for the common case: one ``(payload bytes,
    sequence_id or None, event_time, smm)`` per message, where ``smm`` is the
    parsed ``SingleMessageMetadata`` only for messages that carry more than
    payload_size/event_time/sequence_id (properties, keys, null value), else
    None.  Same checks and ``CorruptedMessage`` errors as ``parse_batch``."""
    count = metadata.num_messages_in_batch
    buf = payload if isinstance(payload, bytes) else bytes(payload)
    total = len(buf)
    if count <= 0:
        raise CorruptedMessage(f"corrupted batch: num_messages_in_batch is {count}")
    if count > total // _SIZE.size:
        raise CorruptedMessage(f"corrupted batch: {count} messages cannot fit in {total} bytes")
    out = []
    append = out.append
    unpack = _SIZE.unpack_from
    fast = _fast_single_metadata
    pos = 0
    for i in range(count):
        if pos + 4 > total:
            raise CorruptedMessage(f"corrupted batch: truncated before message {i} of {count}")
        (size,) = unpack(buf, pos)
        pos += 4
        end = pos + size
        if end > total:
            raise CorruptedMessage(f"corrupted batch: metadata of message {i} ({size} bytes) is truncated")
        decoded = fast(buf, pos, end)
        if decoded is not None:
            payload_size, seq, event_time = decoded
            smm = None
        else:
            smm = _parse_single_metadata(buf[pos:end], i)
            payload_size = smm.payload_size
            seq = smm.sequence_id if smm.HasField("sequence_id") else None
            event_time = smm.event_time
        pos = end
        if pos + payload_size > total:
            raise CorruptedMessage(f"corrupted batch: payload of message {i} ({payload_size} bytes) is truncated")
        append((buf[pos:pos + payload_size], seq, event_time, smm))
        pos += payload_size
    if pos != total:
        raise CorruptedMessage(f"corrupted batch: {total - pos} trailing bytes after {count} messages")
    return out


def _parse_single_metadata(data, i: int) -> SingleMessageMetadata:
    smm = SingleMessageMetadata()
    try:
        smm.ParseFromString(data)
    except DecodeError as e:
        raise CorruptedMessage(f"corrupted batch: unparsable SingleMessageMetadata of message {i}: {e}") from None
    if not smm.IsInitialized() or smm.payload_size < 0:
        raise CorruptedMessage(f"corrupted batch: SingleMessageMetadata of message {i} has no valid payload_size")
    return smm


def parse_batch(metadata: MessageMetadata, payload: bytes | memoryview) -> list[tuple[SingleMessageMetadata, bytes]]:
    """Split a decompressed batch payload into ``[(SingleMessageMetadata, payload bytes)]``,
    ``metadata.num_messages_in_batch`` of them (Pulsar's
    ``Commands.deSerializeSingleMessageInBatch``).

    Raises ``CorruptedMessage`` on a bad count, truncated data, unparsable
    SingleMessageMetadata, or trailing bytes.
    """
    count = metadata.num_messages_in_batch
    view = memoryview(payload)
    if count <= 0:
        raise CorruptedMessage(f"corrupted batch: num_messages_in_batch is {count}")
    if count > len(view) // _SIZE.size:
        raise CorruptedMessage(f"corrupted batch: {count} messages cannot fit in {len(view)} bytes")
    out: list[tuple[SingleMessageMetadata, bytes]] = []
    pos = 0
    for i in range(count):
        if pos + _SIZE.size > len(view):
            raise CorruptedMessage(f"corrupted batch: truncated before message {i} of {count}")
        (size,) = _SIZE.unpack_from(view, pos)
        pos += _SIZE.size
        if pos + size > len(view):
            raise CorruptedMessage(f"corrupted batch: metadata of message {i} ({size} bytes) is truncated")
        smm = _parse_single_metadata(view[pos:pos + size], i)
        pos += size
        if pos + smm.payload_size > len(view):
            raise CorruptedMessage(f"corrupted batch: payload of message {i} ({smm.payload_size} bytes) is truncated")
        out.append((smm, bytes(view[pos:pos + smm.payload_size])))
        pos += smm.payload_size
    if pos != len(view):
        raise CorruptedMessage(f"corrupted batch: {len(view) - pos} trailing bytes after {count} messages")
    return out

