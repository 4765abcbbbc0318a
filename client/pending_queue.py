"""The sender side of a producer's pure state (no I/O, no asyncio): what is in
flight and how the broker's receipts settle it.

- ``OpSendMsg``: one Send on the wire, i.e. one future entry (Pulsar's
  ``ProducerImpl.OpSendMsg``), built by ``client.message_accumulator``;
- ``PendingQueue``: Pulsar's ``pendingMessages`` (``OpSendMsgQueue``): ops in
  send order, which of them are written on the current connection, receipt
  matching (``ackReceived`` -> ``ReceiptAction``), send timeouts and resend
  after a reconnect;
- ``SendCompletion``: settles one message's callback exactly once;
  ``is_duplicate`` reads a receipt's ``-1:-1`` id.

The accumulator side (sequence ids, batching, compression, chunking) is
``client.message_accumulator``, as aiokafka splits its RecordAccumulator from
its Sender; ``client.producer`` drives both on the event loop.
"""
from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from client.batching import PendingMessage
from client.errors import PulsarException
from client.message_id import MessageId
from proto import broker_pb2

__all__ = ["OpSendMsg", "PendingQueue", "ReceiptAction", "SendCompletion", "SendCallback", "is_duplicate"]

log = logging.getLogger("client.producer_state")  # the logger name of before the split

# callback(exception_or_None, message_id_or_None), the official client's callback(res, msg_id)
SendCallback = Callable[[PulsarException | None, MessageId | None], Any]

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
        """True for one chunk of a chunked message (``num_chunks > 1``)."""
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
        """Settle: ``fn(exc, msg_id)`` (its exceptions are logged, never raised), then
        the waiters; False (and nothing done) when already settled."""
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
