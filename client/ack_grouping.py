"""Acknowledgement grouping, as Pulsar's PersistentAcknowledgmentsGroupingTracker
and BatchMessageAcker.  Sans-I/O: the consumer feeds acks in and sends the
``Ack`` frames that ``flush()`` returns.

- Individual acks are collected for ``ack_group_time_ms`` (or until 1000 are
  pending) and leave as ONE ``Ack`` frame listing every position.
- Cumulative acks keep only the highest id.
- A message of a batch entry: with ``batch_index_ack_enabled`` its index is
  acknowledged (``AckPosition.batch_indexes``); otherwise the entry is
  acknowledged once every message of the batch is (BatchMessageAcker), and a
  cumulative ack inside a batch acknowledges the previous entry cumulatively
  (Pulsar's ``prevBatchMessageId``).
- Flushed acks stay "in flight" until the broker confirms them
  (``flush_in_flight`` / ``confirm``): they keep filtering redeliveries
  (``is_duplicate``), and when the connection breaks ``requeue_in_flight``
  makes them pending again, to be sent on the next connection (a frame written
  to a stream that broke before anyone noticed never reached the broker).
"""
from __future__ import annotations

from typing import Iterable, Sequence

from client.message_id import MessageId
from proto import broker_pb2

__all__ = ["BatchMessageAcker", "AcknowledgmentsGroupingTracker", "unacked_mask_from_ack_set",
           "MAX_ACK_GROUP_SIZE"]

MAX_ACK_GROUP_SIZE = 1000  # Pulsar's PersistentAcknowledgmentsGroupingTracker.MAX_ACK_GROUP_SIZE
_WHOLE = 1 << 40  # batch-index slot of "the whole entry" in comparison keys


def unacked_mask_from_ack_set(words: Sequence[int], batch_size: int) -> int:
    """Decode ``EntryMessage.ack_set`` (Java ``BitSet.toLongArray()`` words,
    int64, bit i of word i // 64 = index i; set bit = not yet acknowledged)
    into an int mask of the first ``batch_size`` bits.  An empty list means
    "no ack state": every index unacknowledged.  Missing trailing words are 0
    (Java trims them), i.e. acknowledged."""
    full = (1 << batch_size) - 1
    if not words:
        return full
    mask = 0
    for i, word in enumerate(words):
        mask |= (word & 0xFFFFFFFFFFFFFFFF) << (64 * i)
    return mask & full


class BatchMessageAcker:
    """Which messages of one batch entry are still unacknowledged (Pulsar's
    BatchMessageAcker).  ``batch_size``: messages in the batch;
    ``unacked_mask``: bit i set = index i not yet acknowledged (default: all)."""

    __slots__ = ("batch_size", "_unacked", "prev_batch_cumulatively_acked")

    def __init__(self, batch_size: int, unacked_mask: int | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        full = (1 << batch_size) - 1
        self._unacked = full if unacked_mask is None else unacked_mask & full
        self.prev_batch_cumulatively_acked = False

    def _check(self, index: int) -> None:
        if not 0 <= index < self.batch_size:
            raise ValueError(f"batch index {index} out of range for a batch of {self.batch_size}")

    def ack_individual(self, index: int) -> bool:
        """Acknowledge ``index``; True once every index is acknowledged."""
        self._check(index)
        self._unacked &= ~(1 << index)
        return self._unacked == 0

    def ack_cumulative(self, index: int) -> bool:
        """Acknowledge indexes 0..``index``; True once every index is acknowledged."""
        self._check(index)
        self._unacked &= ~((1 << (index + 1)) - 1)
        return self._unacked == 0

    def is_acked(self, index: int) -> bool:
        """Whether ``index`` is acknowledged."""
        return not (self._unacked >> index) & 1

    @property
    def unacked_mask(self) -> int:
        """Bit i set = index i not yet acknowledged."""
        return self._unacked

    @property
    def outstanding(self) -> int:
        """Number of unacknowledged messages."""
        return bin(self._unacked).count("1")

    def acked_indexes(self) -> list[int]:
        """Acknowledged indexes, ascending (``AckPosition.batch_indexes``)."""
        return [i for i in range(self.batch_size) if not (self._unacked >> i) & 1]


def _entry_key(mid: MessageId) -> tuple[int, int]:
    return (mid.ledger_id, mid.entry_id)


def _order_key(mid: MessageId) -> tuple[int, int, int]:
    return (mid.ledger_id, mid.entry_id, mid.batch_index if mid.batch_index >= 0 else _WHOLE)


class AcknowledgmentsGroupingTracker:
    """Groups acknowledgements into few ``Ack`` frames (Pulsar's
    PersistentAcknowledgmentsGroupingTracker).  No I/O, not thread-safe.

    ``ack_group_time_ms``: how long individual/cumulative acks wait (ms; 0 =
    flush at once); ``batch_index_ack_enabled``: acknowledge single messages of
    a batch (PIP-54).  The ``add_*`` methods return True when the caller should
    flush now (group full or grouping disabled); otherwise flush when
    ``flush_due_ms()`` has passed.
    """

    def __init__(self, ack_group_time_ms: int = 100, batch_index_ack_enabled: bool = False,
                 max_ack_group_size: int = MAX_ACK_GROUP_SIZE):
        self.ack_group_time_ms = max(0, int(ack_group_time_ms))
        self.batch_index_ack_enabled = batch_index_ack_enabled
        self.max_ack_group_size = max_ack_group_size
        self._ackers: dict[tuple[int, int], BatchMessageAcker] = {}
        self._individual: dict[tuple[int, int], None] = {}  # ordered set of entry positions
        self._batch_index: dict[tuple[int, int], BatchMessageAcker] = {}
        self._cumulative: broker_pb2.AckPosition | None = None
        self._cumulative_key: tuple[int, int, int] | None = None
        self._cumulative_dirty = False
        self._first_pending_ms: int | None = None
        # token -> (individual keys, batch-index ackers, had a cumulative frame) of flushed acks
        # the broker has not confirmed yet; tokens whose batch-index ackers are not empty
        self._in_flight: dict[int, tuple[dict, dict, bool]] = {}
        self._in_flight_batch_index: dict[int, dict] = {}
        self._tokens = 0

    # -- batch entries -------------------------------------------------------------
    def register_batch(self, ledger_id: int, entry_id: int, batch_size: int,
                       unacked_mask: int | None = None) -> BatchMessageAcker:
        """Start tracking a received batch entry (a new acker per delivery, as
        Pulsar).  ``unacked_mask`` from ``unacked_mask_from_ack_set``."""
        key = (ledger_id, entry_id)
        acker = BatchMessageAcker(batch_size, unacked_mask)
        if self._batch_index or self._in_flight_batch_index:
            # batch-index acks the broker may not have yet (pending, in flight) still count
            known = self._batch_index.get(key) or next(
                (d[key] for d in self._in_flight_batch_index.values() if key in d), None)
            if known is not None and known.batch_size == batch_size:
                acker._unacked &= known._unacked
        self._ackers[key] = acker
        return acker

    def acker_of(self, message_id: MessageId) -> BatchMessageAcker | None:
        """The acker of the batch entry ``message_id`` belongs to, if tracked."""
        return self._ackers.get(_entry_key(message_id))

    # -- adding acks ---------------------------------------------------------------
    def _touch(self, now_ms: int) -> bool:
        if self._first_pending_ms is None:
            self._first_pending_ms = now_ms
        return (self.ack_group_time_ms == 0
                or len(self._individual) + len(self._batch_index) >= self.max_ack_group_size)

    def add_individual(self, message_id: MessageId, now_ms: int,
                       chunk_ids: Iterable[MessageId] | None = None) -> bool:
        """Acknowledge one message (``chunk_ids``: every chunk's id, for a
        chunked message).  Returns True if the caller should flush now."""
        if chunk_ids:
            for cid in chunk_ids:
                self._add_entry(_entry_key(cid))
            return self._touch(now_ms)
        key = _entry_key(message_id)
        if message_id.batch_index >= 0:
            acker = self._ackers.get(key)
            if acker is None and self.batch_index_ack_enabled and message_id.batch_size > message_id.batch_index:
                acker = self.register_batch(*key, message_id.batch_size)
            if acker is not None and message_id.batch_index < acker.batch_size:
                if not acker.ack_individual(message_id.batch_index):
                    if not self.batch_index_ack_enabled:
                        return False  # the entry is acknowledged once the whole batch is
                    self._batch_index[key] = acker
                    return self._touch(now_ms)
            # acker unknown (e.g. a deserialized id): acknowledge the whole entry, as Pulsar
        self._add_entry(key)
        return self._touch(now_ms)

    def _add_entry(self, key: tuple[int, int]) -> None:
        self._ackers.pop(key, None)
        self._batch_index.pop(key, None)
        self._individual[key] = None

    def add_cumulative(self, message_id: MessageId, now_ms: int) -> bool:
        """Acknowledge every message up to and including ``message_id``; only
        the highest cumulative ack is kept.  Returns True to flush now."""
        key = _entry_key(message_id)
        position = broker_pb2.AckPosition(ledger_id=message_id.ledger_id, entry_id=message_id.entry_id)
        order = (*key, _WHOLE)
        if message_id.batch_index >= 0:
            acker = self._ackers.get(key)
            if acker is None and message_id.batch_size > message_id.batch_index:
                acker = self.register_batch(*key, message_id.batch_size)
            if acker is not None and message_id.batch_index < acker.batch_size \
                    and not acker.ack_cumulative(message_id.batch_index):
                if self.batch_index_ack_enabled:
                    position.batch_size = acker.batch_size
                    position.batch_indexes.extend(range(message_id.batch_index + 1))
                    order = (*key, message_id.batch_index)
                elif not acker.prev_batch_cumulatively_acked:
                    acker.prev_batch_cumulatively_acked = True
                    position = broker_pb2.AckPosition(ledger_id=message_id.ledger_id,
                                                      entry_id=message_id.entry_id - 1)
                    order = (message_id.ledger_id, message_id.entry_id - 1, _WHOLE)
                else:
                    return False
        if self._cumulative_key is not None and order <= self._cumulative_key:
            return False
        self._cumulative, self._cumulative_key, self._cumulative_dirty = position, order, True
        upto = order[:2]
        for k in [k for k in self._ackers if k < upto or (k == upto and order[2] == _WHOLE)]:
            del self._ackers[k]
        return self._touch(now_ms)

    # -- queries -------------------------------------------------------------------
    def first_new_batch_index(self, ledger_id: int, entry_id: int) -> int:
        """For a received batch entry: messages with a batch index below the
        returned one are duplicates in the sense of ``is_duplicate``, the others
        are not (``1 << 40`` = the whole entry).  One check per entry instead of
        one per message."""
        key = (ledger_id, entry_id)
        if key in self._individual or (self._in_flight and self._in_flight_entry(key)):
            return _WHOLE
        cum = self._cumulative_key
        if cum is None:
            return 0
        head = (cum[0], cum[1])
        if key < head:
            return _WHOLE
        if key == head:
            return _WHOLE if cum[2] == _WHOLE else cum[2] + 1
        return 0

    def is_duplicate(self, message_id: MessageId) -> bool:
        """True if ``message_id`` is already covered by the last cumulative ack
        or by an individual ack not flushed yet (Pulsar's isDuplicate): such a
        redelivered message is dropped, not delivered again."""
        if self._cumulative_key is not None and _order_key(message_id) <= self._cumulative_key:
            return True
        key = _entry_key(message_id)
        return key in self._individual or bool(self._in_flight) and self._in_flight_entry(key)

    def _in_flight_entry(self, key: tuple[int, int]) -> bool:
        return any(key in flight[0] for flight in self._in_flight.values())

    def has_pending(self) -> bool:
        """Whether ``flush()`` would return frames."""
        return bool(self._individual or self._batch_index or self._cumulative_dirty)

    def flush_due_ms(self) -> int | None:
        """When the pending acks must leave (ms, same clock as ``now_ms``), None if none pending."""
        if not self.has_pending():
            return None
        return (self._first_pending_ms or 0) + self.ack_group_time_ms

    def flush(self) -> list[broker_pb2.Ack]:
        """Take the pending acks as ``Ack`` frames: the cumulative one (if it
        moved) and one Individual frame with every position (batch-index acks
        carry ``batch_size`` and the acknowledged ``batch_indexes``).  They
        are forgotten at once (see ``flush_in_flight`` to keep them)."""
        return self._flush()[0]

    def _flush(self) -> tuple[list[broker_pb2.Ack], dict, dict, bool]:
        frames: list[broker_pb2.Ack] = []
        cumulative = False
        if self._cumulative_dirty and self._cumulative is not None:
            frames.append(broker_pb2.Ack(ack_type=broker_pb2.Cumulative, positions=[self._cumulative]))
            self._cumulative_dirty = False
            cumulative = True
        individual, batch_index = self._individual, self._batch_index
        positions = [broker_pb2.AckPosition(ledger_id=l, entry_id=e) for (l, e) in individual]
        for (l, e), acker in batch_index.items():
            positions.append(broker_pb2.AckPosition(ledger_id=l, entry_id=e, batch_size=acker.batch_size,
                                                    batch_indexes=acker.acked_indexes()))
        if positions:
            frames.append(broker_pb2.Ack(ack_type=broker_pb2.Individual, positions=positions))
        self._individual, self._batch_index = {}, {}
        self._first_pending_ms = None
        return frames, individual, batch_index, cumulative

    def flush_in_flight(self) -> tuple[int, list[broker_pb2.Ack]]:
        """``flush``, keeping what it returned in flight under the returned
        token (0 when there was nothing to flush): it filters redeliveries
        until ``confirm(token)`` and goes back to pending on ``requeue_in_flight``."""
        frames, individual, batch_index, cumulative = self._flush()
        if not frames:
            return 0, frames
        self._tokens += 1
        self._in_flight[self._tokens] = (individual, batch_index, cumulative)
        if batch_index:
            self._in_flight_batch_index[self._tokens] = batch_index
        return self._tokens, frames

    def confirm(self, token: int) -> None:
        """The broker applied the frames flushed under ``token``."""
        if self._in_flight.pop(token, None) is not None and self._in_flight_batch_index:
            self._in_flight_batch_index.pop(token, None)

    def in_flight(self) -> int:
        """Number of flushes the broker has not confirmed yet."""
        return len(self._in_flight)

    def requeue_in_flight(self, now_ms: int = 0) -> bool:
        """The connection broke: every unconfirmed flush becomes pending again
        (Pulsar keeps pending acks across reconnects), to be sent on the next
        connection.  Returns True if anything was requeued."""
        if not self._in_flight:
            return False
        for flight in self._in_flight.values():
            self._make_pending(*flight)
        self._in_flight.clear()
        self._in_flight_batch_index.clear()
        if self._first_pending_ms is None:
            self._first_pending_ms = now_ms
        return True

    def requeue(self, token: int, now_ms: int = 0) -> bool:
        """The broker refused the flush ``token`` with a retriable error (its
        topic is being unloaded or fenced): its acks are pending again and leave
        with the next flush, due ``ack_group_time_ms`` after ``now_ms`` (ms).
        Returns False for a token not in flight."""
        flight = self._in_flight.pop(token, None)
        if flight is None:
            return False
        self._in_flight_batch_index.pop(token, None)
        self._make_pending(*flight)
        if self._first_pending_ms is None:
            self._first_pending_ms = now_ms
        return True

    def _make_pending(self, individual: dict, batch_index: dict, cumulative: bool) -> None:
        for key in individual:
            self._individual[key] = None
        for key, acker in batch_index.items():
            if key not in self._individual:
                self._batch_index.setdefault(key, acker)
        if cumulative and self._cumulative is not None:
            self._cumulative_dirty = True

    def clear(self) -> None:
        """Forget everything, including the last cumulative ack (after a seek,
        as Pulsar's flushAndClean once the pending acks were flushed)."""
        self._ackers.clear()
        self._individual.clear()
        self._batch_index.clear()
        self._cumulative = self._cumulative_key = None
        self._cumulative_dirty = False
        self._first_pending_ms = None
        self._in_flight.clear()
        self._in_flight_batch_index.clear()
