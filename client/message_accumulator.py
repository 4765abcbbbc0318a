"""The accumulator side of a producer's pure state (no I/O, no asyncio):
messages in, ``OpSendMsg``s (future entries) out.

- ``MessageAccumulator``: sequence ids, batching (Pulsar's
  ``BatchMessageContainer`` / ``BatchMessageKeyBasedContainer``, see
  ``client.batching``), compression, chunking and the "possible duplicate goes
  in a batch of its own" rule of Pulsar's ProducerImpl
  (``lastSequenceIdPushed`` / ``lastSequenceIdPublished`` /
  ``isLastSequenceIdPotentialDuplicated``); aiokafka's RecordAccumulator.
  Input: ``PendingMessage``; output: ``OpSendMsg``.
- ``make_message``: the ``PendingMessage`` of one ``send`` call;
  ``BatchingType``; ``key_batches_in_send_order`` (Pulsar #15413).

The ops then go to the sender side, ``client.pending_queue`` (Pulsar's
``pendingMessages``), which ``client.producer`` writes and settles.
"""
from __future__ import annotations

import datetime
import enum
import time
from typing import Callable

from client.batching import BatchMessageContainer, KeyBasedBatchMessageContainer, PendingMessage, message_metadata
from client.chunking import REPLICATION_METADATA_RESERVE, chunk_message, max_chunk_payload_size
from client.compression import CompressionType, compress
from client.entry_format import HEADER_SIZE, encode_entry
from client.errors import MessageTooBig
from client.pending_queue import OpSendMsg

__all__ = ["BatchingType", "MessageAccumulator", "make_message", "key_batches_in_send_order",
           "DEFAULT_MAX_MESSAGE_SIZE"]

DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024  # Pulsar's maxMessageSize default (bytes), until the broker says


class BatchingType(enum.Enum):
    """How a producer groups messages into batches (Pulsar's ``BatchingType``):
    ``Default`` one batch for all messages, ``KeyBased`` one batch per key
    (for Key_Shared subscriptions)."""

    Default = "Default"
    KeyBased = "KeyBased"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _mono_ms() -> float:
    return time.monotonic() * 1000.0


def key_batches_in_send_order(ops: list[OpSendMsg]) -> list[OpSendMsg]:
    """Make the batches of one KeyBased flush safe for broker deduplication
    (Pulsar #15413, ``BatchMessageKeyBasedContainer.createOpSendMsgs``).

    Batches of different keys interleave sequence ids (key A holds 0, 4, 8; key
    B 1, 5, 9), so their ``[lowest, highest]`` ranges overlap, and the broker,
    which drops a send whose ``sequence_id`` is at or below the highest id it
    has seen from the producer, would drop every batch after the first.  So,
    as Pulsar: each batch is sent with its *highest* sequence id as both
    ``sequence_id`` and ``highest_sequence_id`` (the entry's MessageMetadata
    keeps the real lowest/highest ids), and the batches go in increasing order
    of that id: every send's ``sequence_id`` is above the previous send's
    ``highest_sequence_id``.  A resent batch is still recognised (its id is at
    or below what the broker stored).  Returns a new list."""
    for op in ops:
        op.sequence_id = op.highest_sequence_id
    return sorted(ops, key=lambda op: op.highest_sequence_id)


class MessageAccumulator:
    """Turns messages into ``OpSendMsg``s (Pulsar's ProducerImpl.sendAsync and
    batch container handling; aiokafka's accumulator).

    Settings: ``batching_enabled``; ``batching_type``; ``batching_max_messages``
    (count) and ``batching_max_bytes`` (bytes of payload per batch, capped
    under ``max_message_size``); ``compression``; ``chunking_enabled``;
    ``max_message_size`` (bytes of one entry, from the broker's
    ProducerSuccess); ``producer_name`` (set from the broker's answer).

    Sequence ids: ``init_sequence_ids(last_persisted, initial_sequence_id)`` sets
    the next id to ``initial_sequence_id + 1`` when given, else to
    ``last_persisted + 1``.  ``add`` assigns the next id to messages whose
    ``sequence_id`` is None (user-given ids are kept and do not move the
    generator).  A message whose id is at or below ``last_sequence_id_pushed``
    is a possible duplicate and travels in a batch of its own.
    """

    def __init__(self, *, producer_name: str = "", partition: int = -1, batching_enabled: bool = True,
                 batching_type: BatchingType = BatchingType.Default, batching_max_messages: int = 1000,
                 batching_max_bytes: int = 131072, compression: CompressionType | int | str = CompressionType.NONE,
                 chunking_enabled: bool = False, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 wall_clock_ms: Callable[[], int] = _wall_ms, mono_clock_ms: Callable[[], float] = _mono_ms):
        self.producer_name = producer_name
        self.partition = partition
        self.batching_enabled = batching_enabled
        self.batching_type = BatchingType(batching_type)
        self.batching_max_messages = batching_max_messages
        self.batching_max_bytes = batching_max_bytes
        self.compression = CompressionType.parse(compression)
        self.chunking_enabled = chunking_enabled
        self._wall = wall_clock_ms
        self._mono = mono_clock_ms
        container_cls = (KeyBasedBatchMessageContainer if self.batching_type is BatchingType.KeyBased
                         else BatchMessageContainer)
        self._container = container_cls(batching_max_messages, batching_max_bytes)
        self._plain_batching = batching_enabled and container_cls is BatchMessageContainer
        self.max_message_size = 0
        self.set_max_message_size(max_message_size)
        self.next_sequence_id = 0
        self.last_sequence_id_pushed = -1
        self.last_sequence_id_published = -1
        self._potential_duplicate = False
        self._last_seq_in_batch: int | None = None
        self.batch_created_ms: float | None = None  # monotonic ms of the current batch's first message

    # -- settings from the broker -------------------------------------------
    def set_max_message_size(self, max_message_size: int) -> None:
        """Use the broker's max entry size (bytes); <= 0 keeps the default."""
        self.max_message_size = max_message_size if max_message_size > 0 else DEFAULT_MAX_MESSAGE_SIZE
        cap = max(1, int(self.max_message_size * 0.9))  # room for batch metadata
        limit = self.batching_max_bytes
        self._container.max_bytes = cap if limit <= 0 else min(limit, cap)

    def init_sequence_ids(self, last_persisted: int, initial_sequence_id: int | None = None) -> None:
        """Start numbering (Pulsar: ``initialSequenceId`` else the broker's
        ``lastSequenceId``; both -1 = nothing yet).  The published/pushed marks
        start at that value."""
        last = initial_sequence_id if initial_sequence_id is not None else last_persisted
        last = max(-1, int(last))
        self.next_sequence_id = last + 1
        self.last_sequence_id_pushed = max(self.last_sequence_id_pushed, last)
        self.last_sequence_id_published = max(self.last_sequence_id_published, last)

    # -- batch state ------------------------------------------------------------
    @property
    def num_batched_messages(self) -> int:
        """Messages waiting in the open batch (count)."""
        return self._container.num_messages

    def has_batch(self) -> bool:
        """True when a batch is open (at least one message waits in it)."""
        return not self._container.is_empty()

    def batch_due(self, delay_ms: float, now_mono_ms: float | None = None) -> bool:
        """Whether the open batch is at least ``delay_ms`` old."""
        if self.batch_created_ms is None:
            return False
        now = self._mono() if now_mono_ms is None else now_mono_ms
        return now - self.batch_created_ms >= delay_ms

    def can_batch(self, msg: PendingMessage) -> bool:
        """Pulsar's canAddToBatch: batching on and no deliver_at."""
        return self.batching_enabled and msg.deliver_at is None

    # -- adding ----------------------------------------------------------------
    def add(self, msg: PendingMessage) -> list[OpSendMsg]:
        """Take ``msg`` (assigning its sequence id if None); return the ops that
        are ready to go, in order (closed batches, then the message's own op or
        chunks when it is not batched).

        Raises ``MessageTooBig`` (nothing changed, no sequence id used) when the
        message cannot fit one entry of ``max_message_size`` bytes and chunking
        is off; ``InvalidConfiguration`` for an unsupported compression.
        """
        if self._plain_batching and msg.sequence_id is None and not self._potential_duplicate:
            ops = self._add_plain(msg)
            if ops is not None:
                return ops
        if self.can_batch(msg) and (not self.chunking_enabled or not self._too_big_for_batch(msg)):
            if not self.chunking_enabled and self._too_big_for_batch(msg):
                raise MessageTooBig(f"message of {msg.size} bytes is larger than the broker's max message size "
                                    f"of {self.max_message_size} bytes; enable chunking (chunking_enabled=True) "
                                    "or send smaller messages")
            self._assign(msg)
            return self._add_to_batch(msg)
        prepared = self._prepare_single(msg)  # may raise MessageTooBig before any state change
        ops = self.flush()
        self._assign(msg)
        ops.extend(self._single_ops(msg, *prepared))
        return ops

    def _add_plain(self, msg: PendingMessage) -> list[OpSendMsg] | None:
        """Fast path of ``add`` for the common message: generated sequence id,
        no delay, no replication settings, no properties or keys, far below the
        size limit, with room in a batch of such messages.  Same outcome as the
        general path; None when the message does not qualify."""
        size = len(msg.payload)
        if (msg.deliver_at is not None or msg.replicate_to is not None or msg.disable_replication
                or msg.properties or msg.partition_key is not None or msg.ordering_key is not None
                or size + 8192 >= self.max_message_size):
            return None
        c = self._container
        messages = c._messages
        seq = self.next_sequence_id
        if messages:
            first = messages[0]
            if (first.replicate_to is not None or first.disable_replication or not c.has_space(size)
                    or self._last_seq_in_batch is None or self._last_seq_in_batch >= seq):
                return None
        if seq <= self.last_sequence_id_pushed:
            return None
        self.next_sequence_id = seq + 1
        msg.sequence_id = seq
        if not messages:
            self.batch_created_ms = self._mono()
        messages.append(msg)
        c._bytes += size
        self._last_seq_in_batch = seq
        return self.flush() if c.is_full() else []

    def flush(self) -> list[OpSendMsg]:
        """Close the open batch (if any) into ops (several for KeyBased)."""
        if self._container.is_empty():
            return []
        now = self._wall()
        if isinstance(self._container, KeyBasedBatchMessageContainer):
            built = self._container.build_all(self.producer_name, self.compression, now)
        else:
            built = [self._container.build(self.producer_name, self.compression, now)]
        self._last_seq_in_batch = None
        self.batch_created_ms = None
        ops: list[OpSendMsg] = []
        for md, payload, msgs in built:
            ops += self._batch_ops(md, payload, msgs, now)
        if len(ops) > 1 and isinstance(self._container, KeyBasedBatchMessageContainer):
            ops = key_batches_in_send_order(ops)
        return ops

    def _batch_ops(self, md, payload: bytes, msgs: list[PendingMessage], now: int) -> list[OpSendMsg]:
        entry = encode_entry(md, payload)
        if len(entry) > self.max_message_size - REPLICATION_METADATA_RESERVE and len(msgs) > 1:
            # per-message metadata pushed the batch over the broker's limit (less the room a
            # geo-replicator's metadata needs): split it in two
            half = len(msgs) // 2
            out: list[OpSendMsg] = []
            for part in (msgs[:half], msgs[half:]):
                c = BatchMessageContainer(max_messages=0, max_bytes=0)
                for m in part:
                    c.add(m)
                out += self._batch_ops(*c.build(self.producer_name, self.compression, now), now)
            return out
        return [self._op(md.sequence_id, md.highest_sequence_id, len(msgs), entry, msgs, batched=True)]

    def _assign(self, msg: PendingMessage) -> None:
        if msg.sequence_id is None:
            msg.sequence_id = self.next_sequence_id
            self.next_sequence_id += 1

    def _too_big_for_batch(self, msg: PendingMessage) -> bool:
        if (not msg.properties and msg.size + len(msg.partition_key or "") + len(msg.ordering_key or b"") + 8192
                < self.max_message_size):
            return False  # fast path: the metadata cannot be that large
        md = message_metadata(msg, self.producer_name, 0)
        md.sequence_id = self.next_sequence_id if msg.sequence_id is None else msg.sequence_id
        overhead = HEADER_SIZE + 2 * md.ByteSize() + 48
        # with chunking on, leave the room replication metadata needs (see _prepare_single)
        limit = self.max_message_size - (REPLICATION_METADATA_RESERVE if self.chunking_enabled else 0)
        return msg.size + overhead > limit

    def _add_to_batch(self, msg: PendingMessage) -> list[OpSendMsg]:
        ops: list[OpSendMsg] = []
        seq = msg.sequence_id
        if self._last_seq_in_batch is not None and seq <= self._last_seq_in_batch:
            ops += self.flush()  # out-of-order user ids: keep batches increasing
        if not self._container.can_add(msg):
            ops += self.flush()
            self._potential_duplicate = seq <= self.last_sequence_id_pushed
            return ops + self._put(msg)
        if seq <= self.last_sequence_id_pushed:
            # a possible duplicate: never in one batch with other messages
            self._potential_duplicate = True
            return ops + self.flush() + self._put(msg)
        if self._potential_duplicate:
            self._potential_duplicate = False
            return ops + self.flush() + self._put(msg)
        return ops + self._put(msg)

    def _put(self, msg: PendingMessage) -> list[OpSendMsg]:
        if self._container.is_empty():
            self.batch_created_ms = self._mono()
        full = self._container.add(msg)
        self._last_seq_in_batch = msg.sequence_id
        return self.flush() if full else []

    def _prepare_single(self, msg: PendingMessage):
        """Compress and size-check a message sent on its own; returns
        ``(metadata, compressed payload, max chunk payload or 0)``."""
        md = message_metadata(msg, self.producer_name, self._wall())
        payload = compress(self.compression, msg.payload)
        if self.compression is not CompressionType.NONE:
            md.compression = self.compression.value
            md.uncompressed_size = len(msg.payload)
        md.sequence_id = msg.sequence_id if msg.sequence_id is not None else self.next_sequence_id
        entry_size = HEADER_SIZE + md.ByteSize() + len(payload)
        if not self.chunking_enabled:
            if entry_size <= self.max_message_size:
                return md, payload, 0
            raise MessageTooBig(f"message of {msg.size} bytes ({len(payload)} bytes compressed) is larger than "
                                f"the broker's max message size of {self.max_message_size} bytes; enable "
                                "chunking (chunking_enabled=True) or send smaller messages")
        # With chunking, every entry keeps room for the metadata a geo-replicator
        # adds (the remote checks the same max message size), whole or chunked.
        if entry_size <= self.max_message_size - REPLICATION_METADATA_RESERVE:
            return md, payload, 0
        chunk_size = max_chunk_payload_size(md, self.max_message_size)
        if chunk_size < 1024:
            raise MessageTooBig(f"message metadata ({md.ByteSize()} bytes) leaves no room for chunks under the "
                                f"max message size of {self.max_message_size} bytes (less "
                                f"{REPLICATION_METADATA_RESERVE} bytes kept for replication metadata)")
        return md, payload, chunk_size

    def _single_ops(self, msg: PendingMessage, md, payload: bytes, chunk_size: int) -> list[OpSendMsg]:
        md.sequence_id = msg.sequence_id
        if not chunk_size:
            return [self._op(msg.sequence_id, msg.sequence_id, 1, encode_entry(md, payload), [msg])]
        chunks = chunk_message(md, payload, chunk_size)
        n = len(chunks)
        shared = [msg]  # one list for every chunk: identifies the message's chunks in the queue
        return [self._op(msg.sequence_id, msg.sequence_id, 1, encode_entry(cmd, data), shared,
                         chunk_id=i if n > 1 else -1, num_chunks=n if n > 1 else 0)
                for i, (cmd, data) in enumerate(chunks)]

    def _op(self, seq: int, highest: int, num: int, entry: bytes, msgs: list[PendingMessage], *,
            batched: bool = False, chunk_id: int = -1, num_chunks: int = 0) -> OpSendMsg:
        self.last_sequence_id_pushed = max(self.last_sequence_id_pushed, highest)
        return OpSendMsg(seq, highest, num, entry, msgs, batched=batched, chunk_id=chunk_id,
                         num_chunks=num_chunks, created_ms=self._mono())

    # -- receipts ----------------------------------------------------------------
    def on_published(self, highest_sequence_id: int) -> None:
        """Record a receipt (Pulsar's lastSequenceIdPublished)."""
        self.last_sequence_id_published = max(self.last_sequence_id_published, highest_sequence_id)

    def take_batch(self) -> list[PendingMessage]:
        """Drop the open batch and return its messages (to fail them on close)."""
        self._last_seq_in_batch = None
        self.batch_created_ms = None
        return self._container.clear()


def make_message(content, properties, partition_key, ordering_key, sequence_id, event_timestamp,
                 replication_clusters, disable_replication, deliver_after, deliver_at) -> PendingMessage:
    """Build the ``PendingMessage`` of one send (arguments as ``Producer.send``):
    ``str`` content is UTF-8 encoded, ``deliver_after`` (timedelta) becomes
    ``deliver_at`` (ms since epoch), a ``str`` ordering key is UTF-8 encoded; the
    sequence id stays None unless given.  Raises ``TypeError`` for bad types."""
    if (type(content) is bytes and properties is None and partition_key is None and ordering_key is None
            and sequence_id is None and not event_timestamp and replication_clusters is None
            and not disable_replication and deliver_after is None and deliver_at is None):
        return PendingMessage(content, None)  # the common case, nothing to convert or check
    if isinstance(content, str):
        content = content.encode("utf-8")
    elif isinstance(content, (bytearray, memoryview)):
        content = bytes(content)
    elif not isinstance(content, bytes):
        raise TypeError(f"message content must be bytes, got {type(content).__name__}")
    if deliver_after is not None:
        if not isinstance(deliver_after, datetime.timedelta):
            raise TypeError("deliver_after must be a datetime.timedelta")
        deliver_at = time.time_ns() // 1_000_000 + int(deliver_after.total_seconds() * 1000)
    if isinstance(ordering_key, str):
        ordering_key = ordering_key.encode("utf-8")
    if sequence_id is not None and (not isinstance(sequence_id, int) or sequence_id < 0):
        raise TypeError(f"sequence_id must be an int >= 0, got {sequence_id!r}")
    return PendingMessage(
        payload=content, sequence_id=sequence_id,
        properties={str(k): str(v) for k, v in properties.items()} if properties else {},
        partition_key=partition_key, ordering_key=ordering_key, event_time=int(event_timestamp or 0),
        deliver_at=int(deliver_at) if deliver_at is not None else None,
        replicate_to=tuple(replication_clusters) if replication_clusters else None,
        disable_replication=bool(disable_replication))
