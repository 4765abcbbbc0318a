"""The producer's pure state machines (no I/O, no asyncio), unit-tested directly.

- ``MessageAccumulator``: sequence ids, batching, compression, chunking and the
  "possible duplicate goes in a batch of its own" rule of Pulsar's ProducerImpl
  (``lastSequenceIdPushed`` / ``lastSequenceIdPublished`` /
  ``isLastSequenceIdPotentialDuplicated``).  Input: ``PendingMessage``; output:
  ``OpSendMsg`` (one future entry each), like aiokafka's message accumulator.
- ``PendingQueue``: Pulsar's ``pendingMessages``: ops in send order, which of
  them are written on the current connection, receipt matching
  (``ackReceived``), send timeouts and resend after a reconnect.
"""
from __future__ import annotations

import datetime
import enum
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from client.batching import BatchMessageContainer, KeyBasedBatchMessageContainer, PendingMessage, message_metadata
from client.chunking import REPLICATION_METADATA_RESERVE, chunk_message, max_chunk_payload_size
from client.compression import CompressionType, compress
from client.entry_format import HEADER_SIZE, encode_entry
from client.errors import MessageTooBig, PulsarException
from client.message_id import MessageId
from proto import broker_pb2

__all__ = ["BatchingType", "OpSendMsg", "MessageAccumulator", "PendingQueue", "ReceiptAction",
           "SendCompletion", "SendCallback", "make_message", "DEFAULT_MAX_MESSAGE_SIZE", "is_duplicate",
           "key_batches_in_send_order", "REPLICATION_METADATA_RESERVE"]

log = logging.getLogger(__name__)

# callback(exception_or_None, message_id_or_None), the official client's callback(res, msg_id)
SendCallback = Callable[[PulsarException | None, MessageId | None], Any]

DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024  # Pulsar's maxMessageSize default (bytes), until the broker says
_U64 = (1 << 64) - 1


def is_duplicate(message_id: MessageId | None) -> bool:
    """True for the id a send resolves with when the broker's deduplication
    dropped it: ``MessageId(-1, -1)`` (Pulsar's ``-1:-1`` receipt).

    It means *this* send stored nothing new: the broker already holds a message
    of this producer name with this sequence id (its id is not known to the
    client).  That is the case when the application sends a sequence id again
    (``sequence_id`` at or below ``last_sequence_id()``), and after a reconnect
    for a message whose first transmission was stored but whose receipt was
    lost (it is stored once).  Never a failed send: those raise."""
    return message_id is not None and message_id.ledger_id < 0 and message_id.entry_id < 0


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


@dataclass(eq=False)
class OpSendMsg:
    """One Send on the wire, i.e. one future entry (Pulsar's ``OpSendMsg``).

    ``sequence_id`` / ``highest_sequence_id``: first and last producer sequence
    ids it carries; ``num_messages``: count (1 for a chunk); ``entry``: the
    headersAndPayload bytes; ``messages``: the PendingMessages it completes
    (every chunk of a message refers to the same message; only the last chunk
    completes it); ``batched``: the entry is a batch (message ids get a batch
    index); ``chunk_id`` / ``num_chunks``: -1 / 0 unless a chunk;
    ``created_ms``: monotonic ms, for the send timeout; ``waiters``: opaque
    objects (futures) the producer resolves when the op is settled (flush);
    ``transmissions``: how many times it was written on a stream (once written
    it may be stored even without a receipt); ``refusals``: how many of them
    the broker answered with a retriable SendError (those stored nothing);
    ``refused``: the latest one was.
    """

    sequence_id: int
    highest_sequence_id: int
    num_messages: int
    entry: bytes
    messages: list[PendingMessage]
    batched: bool = False
    chunk_id: int = -1
    num_chunks: int = 0
    created_ms: float = 0.0
    waiters: list = field(default_factory=list)
    transmissions: int = 0
    refusals: int = 0
    refused: bool = False

    @property
    def is_chunk(self) -> bool:
        return self.num_chunks > 1

    @property
    def written(self) -> bool:
        """It went out on a stream at least once."""
        return self.transmissions > 0

    @property
    def lost_as_duplicate(self) -> bool:
        """For a duplicate receipt (-1:-1) to the current transmission: True when
        every earlier transmission was refused, so no transmission of this op
        was ever stored; the broker took it for a duplicate because it stored
        later sends of the producer after refusing this one.  The message is
        then lost, not a duplicate (an application's repeated sequence id is
        never refused first, and stays a duplicate)."""
        return self.refusals > 0 and self.refusals == self.transmissions - 1

    @property
    def is_last_chunk(self) -> bool:
        """True unless this is a chunk other than the last one."""
        return not self.is_chunk or self.chunk_id == self.num_chunks - 1

    @property
    def size(self) -> int:
        """Entry size in bytes."""
        return len(self.entry)

    def to_proto(self) -> broker_pb2.Send:
        """The ``broker_pb2.Send`` for this op."""
        return broker_pb2.Send(sequence_id=self.sequence_id & _U64,
                               highest_sequence_id=self.highest_sequence_id & _U64,
                               num_messages=self.num_messages, headers_and_payload=self.entry,
                               is_chunk=self.is_chunk)

    def message_ids(self, ledger_id: int, entry_id: int, partition: int) -> list[MessageId]:
        """Ids of ``messages`` for a receipt at ``ledger_id:entry_id``: batch index i
        of n for a batch, the entry id otherwise, ``MessageId(-1, -1)`` for all
        when the receipt says duplicate (-1:-1)."""
        if ledger_id < 0 or entry_id < 0:
            return [MessageId(-1, -1) for _ in self.messages]
        trusted = MessageId._trusted  # int64 receipt fields and our own partition: always in range
        if self.batched:
            n = len(self.messages)
            return [trusted(ledger_id, entry_id, partition, i, n) for i in range(n)]
        return [trusted(ledger_id, entry_id, partition) for _ in self.messages]


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


class ReceiptAction(enum.Enum):
    """What the producer does with a receipt (Pulsar's ProducerImpl.ackReceived)."""

    COMPLETE = "complete"      # the head op is persisted: pop it, complete its messages
    IGNORE = "ignore"          # receipt for an op that already timed out
    RECONNECT = "reconnect"    # receipt ahead of the head op: close the stream and resend


class PendingQueue:
    """Ops in send order (Pulsar's ``pendingMessages``).

    The first ``num_sent`` ops were written on the current stream; the rest
    wait for the sender.  After a reconnect ``drop_stored`` removes what the
    broker's last sequence id shows as stored, and ``mark_all_unsent`` makes
    every remaining op go again, in order (the broker deduplicates).
    """

    def __init__(self) -> None:
        self._ops: deque[OpSendMsg] = deque()
        self.num_sent = 0

    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self):
        return iter(self._ops)

    def __bool__(self) -> bool:
        return bool(self._ops)

    @property
    def last(self) -> OpSendMsg | None:
        """The most recent op, or None."""
        return self._ops[-1] if self._ops else None

    @property
    def num_unsent(self) -> int:
        """Ops not written on the current stream yet (count)."""
        return len(self._ops) - self.num_sent

    def append(self, op: OpSendMsg) -> None:
        """Queue ``op`` after the others (unsent)."""
        self._ops.append(op)

    def extend(self, ops: Iterable[OpSendMsg]) -> None:
        """Queue ``ops`` in order (unsent)."""
        self._ops.extend(ops)

    def take_unsent(self, max_bytes: int) -> list[OpSendMsg]:
        """Next unsent ops whose entries total at most ``max_bytes`` (at least
        one op); they count as sent from now on.  [] when none wait."""
        out: list[OpSendMsg] = []
        total = 0
        while self.num_sent < len(self._ops):
            op = self._ops[self.num_sent]
            if out and total + op.size > max_bytes:
                break
            out.append(op)
            total += op.size
            op.transmissions += 1
            op.refused = False
            self.num_sent += 1
        return out

    def mark_all_unsent(self) -> None:
        """New connection: everything pending must be written again."""
        self.num_sent = 0

    def on_receipt(self, sequence_id: int, highest_sequence_id: int) -> tuple[ReceiptAction, OpSendMsg | None]:
        """Match a receipt against the head op (Pulsar's ackReceived): returns
        ``(COMPLETE, op)`` after popping it, ``(IGNORE, None)`` for an op that is
        gone (timed out / failed), ``(RECONNECT, None)`` when the receipt is
        ahead of the head op or does not match a batch's highest id."""
        if not self._ops:
            return ReceiptAction.IGNORE, None
        head = self._ops[0]
        if sequence_id > head.sequence_id:
            return ReceiptAction.RECONNECT, None
        if sequence_id < head.sequence_id:
            return ReceiptAction.IGNORE, None
        if sequence_id >= highest_sequence_id or highest_sequence_id == head.highest_sequence_id:
            self._pop()
            return ReceiptAction.COMPLETE, head
        return ReceiptAction.RECONNECT, None

    def mark_refused(self, sequence_id: int) -> int:
        """The broker refused the send of ``sequence_id`` with a retriable error
        (it then ends the stream): mark the written ops carrying that id (one op,
        or the chunks of one message) as not stored by this transmission, so
        ``drop_stored`` resends them.  Returns how many were marked."""
        n = 0
        for op in self._ops:
            if not op.written:
                break
            if op.sequence_id == sequence_id and not op.refused:
                op.refused = True
                op.refusals += 1
                n += 1
        return n

    def drop_stored(self, last_sequence_id: int) -> list[OpSendMsg]:
        """After a reconnect, before ``mark_all_unsent``: remove and return the
        ops the broker already stored, so they are not sent again (the broker's
        ``last_sequence_id``, the highest sequence id it persisted for the
        producer name, covers them); what stays is resent in order.

        A message is dropped whole (a plain op or batch, or every remaining
        chunk of a chunked message: the broker deduplicates a chunked message on
        its last chunk) when all its ops were written before, none was refused
        on its latest transmission, and its highest sequence id is at or below
        ``last_sequence_id``.  A refused message stays (that transmission
        stored nothing) and the scan goes on after it; the scan stops at the
        first message never written, or whose sequence id is not above every
        earlier one's (application-given ids out of order): from there on
        everything is resent and the broker decides.  Without this, a resent
        chunk would be stored again (only the last chunk is deduplicated) and,
        with deduplication off, a message stored without a receipt would be
        stored twice."""
        dropped: list[OpSendMsg] = []
        kept: list[OpSendMsg] = []
        previous: int | None = None
        ops = list(self._ops)
        i = 0
        while i < len(ops):
            head = ops[i]
            n = 1
            if head.is_chunk:
                while i + n < len(ops) and ops[i + n].is_chunk and ops[i + n].messages is head.messages:
                    n += 1
            unit = ops[i:i + n]
            highest = max(op.highest_sequence_id for op in unit)
            if (any(not op.written for op in unit) or (head.is_chunk and not unit[-1].is_last_chunk)
                    or (previous is not None and head.sequence_id <= previous)):
                break
            if highest <= last_sequence_id and not any(op.refused for op in unit):
                dropped += unit
            else:
                kept += unit
            previous = highest if previous is None else max(previous, highest)
            i += n
        if dropped:
            self._ops = deque(kept + ops[i:])
            self.num_sent = 0
        return dropped

    def pop_sequence(self, sequence_id: int) -> list[OpSendMsg]:
        """Remove and return the ops at the head carrying ``sequence_id`` (one op,
        or the remaining chunks of a message), e.g. after a non-retriable
        SendError.  [] if the head has another sequence id."""
        out = []
        while self._ops and self._ops[0].sequence_id == sequence_id:
            out.append(self._pop())
        return out

    def expire(self, now_mono_ms: float, timeout_ms: float) -> list[OpSendMsg]:
        """Remove and return the ops created more than ``timeout_ms`` ago (a
        prefix of the queue), plus the remaining chunks of a message whose
        chunk expired; nothing when ``timeout_ms <= 0``."""
        out: list[OpSendMsg] = []
        if timeout_ms <= 0:
            return out
        while self._ops and now_mono_ms - self._ops[0].created_ms >= timeout_ms:
            op = self._pop()
            out.append(op)
            if op.is_chunk:
                while self._ops and self._ops[0].is_chunk and self._ops[0].messages is op.messages:
                    out.append(self._pop())
        return out

    def oldest_created_ms(self) -> float | None:
        """Creation time (monotonic ms) of the head op, None when empty."""
        return self._ops[0].created_ms if self._ops else None

    def clear(self) -> list[OpSendMsg]:
        """Remove and return every op (producer closed or failed)."""
        ops = list(self._ops)
        self._ops.clear()
        self.num_sent = 0
        return ops

    def _pop(self) -> OpSendMsg:
        op = self._ops.popleft()
        if self.num_sent > 0:
            self.num_sent -= 1
        return op


class SendCompletion:
    """Settles one message exactly once: calls ``fn(exception_or_None,
    message_id_or_None)`` (a user callback or a future setter), then resolves
    the ``waiters`` (futures of ``flush``).  ``counted``: the message holds a
    ``max_pending_messages`` permit.  ``fire`` returns False if already settled."""

    __slots__ = ("fn", "done", "counted", "waiters")

    def __init__(self, fn: SendCallback):
        self.fn = fn
        self.done = False
        self.counted = False  # holds a max_pending_messages permit
        self.waiters: list = []  # futures

    def fire(self, exc: PulsarException | None, msg_id: MessageId | None) -> bool:
        if self.done:
            return False
        self.done = True
        try:
            self.fn(exc, msg_id)
        except Exception:  # a user callback must not break the producer
            log.exception("send callback raised")
        for w in self.waiters:
            if not w.done():
                w.set_result(None)
        return True


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
