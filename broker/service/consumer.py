"""Broker-side consumer (Pulsar's ``org.apache.pulsar.broker.service.Consumer``):
flow permits, the positions sent but not yet acknowledged (pendingAcks), the
outgoing queue of its gRPC stream with Pulsar's channel writability, and the
ordered background work of commands that carry long client-supplied lists.

Bounds (DESIGN.md "servers keep serving"): permits are clamped to
:data:`MAX_PERMITS`; a consumer whose outgoing queue holds more than
:data:`OUTBOUND_HIGH_WATER_BYTES` (2 MiB) is not writable and gets nothing until the
queue drains below :data:`OUTBOUND_LOW_WATER_BYTES` (Netty's
``WriteBufferWaterMark`` behind Pulsar's ``Consumer.isWritable``).
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from typing import Awaitable, Callable, Optional

from broker.ledger.position import Position
from proto import broker_pb2 as pb

log = logging.getLogger(__name__)

_ids = itertools.count(1)

#: Most flow permits (messages) a consumer holds at the broker; a Flow beyond it is clamped.
#: Far above any receiver queue a client uses (Pulsar's default is 1000); the
#: memory a slow consumer costs is bounded by the outbound water marks, not by permits.
MAX_PERMITS = 1 << 20
#: Outgoing bytes queued for one consumer stream above which it is not writable (dispatch stops).
OUTBOUND_HIGH_WATER_BYTES = 2 * 1024 * 1024
#: ... and below which it is writable again (dispatch resumes).
OUTBOUND_LOW_WATER_BYTES = 1024 * 1024
#: Most commands waiting in a consumer's ordered background work; more are refused
#: (retriable) so a client cannot queue unbounded memory faster than the broker applies it.
MAX_ORDERED_JOBS = 16


class DispatchItem:
    """One entry ready to push (Pulsar's EntryAndMetadata): ``position``
    ((ledger_id, entry_id)), ``data`` (the entry's bytes: headers and payload),
    and what the dispatcher peeked from its metadata: ``num_messages`` (its real
    batch size, a count >= 1, dispatchers.batch_size_of), ``sticky_key`` (the
    ordering key, else the partition key, as bytes; b"" for neither; Key_Shared
    hashes it) and ``deliver_at`` (epoch ms; the dispatchers pass None, delayed
    entries wait in the dispatcher instead)."""

    __slots__ = ("position", "data", "num_messages", "sticky_key", "deliver_at")

    def __init__(self, position: Position, data: bytes, num_messages: int, sticky_key: bytes,
                 deliver_at: Optional[int] = None):
        self.position = position
        self.data = data
        self.num_messages = num_messages
        self.sticky_key = sticky_key
        self.deliver_at = deliver_at


class Consumer:
    """A connected consumer of a subscription (Pulsar's
    ``org.apache.pulsar.broker.service.Consumer``).

    ``permits``: messages it can still take (Flow adds, clamped to
    :data:`MAX_PERMITS`; dispatch subtracts the entry's message count).
    ``pending_acks``: position -> message count of every entry pushed and not
    acknowledged yet. ``send`` queues a ConsumerResponse on the consumer's
    stream (never blocks); given the :class:`ConsumerWriter` behind ``send``
    as ``writer``, the consumer follows that writer's writability (no permits while
    it is over its high-water mark) and calls ``on_writable`` (set by the
    subscription: wakes its dispatcher) once it drained. ``epoch``: PIP-84
    consumer epoch, put on every MessageBatch (see ``set_epoch``).
    ``max_unacked_messages``: count at which the consumer is ``blocked`` (0 =
    unlimited; broker config max_unacked_messages_per_consumer, Pulsar's
    maxUnackedMessagesPerConsumer). ``priority_level``: Failover priority
    (lower first; the Shared dispatcher ignores it). Counters: ``msg_out_counter`` (messages), ``bytes_out_counter``
    (bytes), ``msg_redeliver_counter`` (positions redelivered), ``frames_written``
    (frames the transport's write completed for; with ``writer.queue.qsize()`` it tells a
    frame still queued at the broker from one already handed to gRPC).
    """

    def __init__(self, name: str, priority_level: int, send: Callable[[pb.ConsumerResponse], None],
                 max_unacked_messages: int = 50000, writer: Optional["ConsumerWriter"] = None):
        self.consumer_id = next(_ids)
        self.name = name
        self.priority_level = priority_level
        self._send = send
        self.permits = 0
        self.pending_acks: dict[Position, int] = {}
        self.unacked_messages = 0
        self.max_unacked_messages = max_unacked_messages
        self.is_active = False
        self.connected_since_ms = 0
        self.msg_out_counter = 0
        self.bytes_out_counter = 0
        self.msg_redeliver_counter = 0
        self.frames_written = 0   # ConsumerResponse frames the stream's writer handed to gRPC (count)
        self.closed = False
        # PIP-84 consumer epoch: raised by a RedeliverUnacknowledged (redeliver-all on
        # Exclusive/Failover); every MessageBatch carries it so the client drops frames
        # dispatched before its redeliver-all. Per stream: a new stream starts at 0.
        self.epoch = 0
        self.on_disconnect: Optional[Callable[[], None]] = None   # set by the transport: ends the stream
        self.on_writable: Optional[Callable[[], None]] = None     # set by the subscription: wakes dispatch
        self.writer = writer
        if self.writer is not None:
            self.writer.on_writable = self._writable_again
        self._ordered: collections.deque = collections.deque()
        self._ordered_task: Optional[asyncio.Task] = None

    def disconnect(self) -> None:
        """Close this consumer and end its stream (topic unload/delete: the client
        reconnects and looks the topic up again; Pulsar's Consumer.disconnect)."""
        self.closed = True
        if self.on_disconnect is not None:
            self.on_disconnect()

    @property
    def blocked(self) -> bool:
        """Pulsar's blockedConsumerOnUnackedMsgs: ``unacked_messages`` reached
        ``max_unacked_messages`` (> 0); a blocked consumer has no available permits."""
        return self.max_unacked_messages > 0 and self.unacked_messages >= self.max_unacked_messages

    @property
    def writable(self) -> bool:
        """Pulsar's ``Consumer.isWritable``: the outgoing queue is under its high-water mark."""
        return self.writer is None or self.writer.writable

    def available_permits(self) -> int:
        """Messages the dispatcher may push now: 0 while closed, blocked on
        unacknowledged messages or not writable."""
        return 0 if (self.closed or self.blocked or not self.writable) else max(0, self.permits)

    def add_permits(self, permits: int) -> None:
        """A Flow: add ``permits`` (messages, >= 0), keeping the total at most
        :data:`MAX_PERMITS` (a client granting 2**32-1 gets the bound)."""
        if permits > 0:
            self.permits = min(self.permits + permits, MAX_PERMITS)

    def _writable_again(self) -> None:
        if self.on_writable is not None and not self.closed:
            self.on_writable()

    # ---- ordered background work ------------------------------------------
    def ordered_busy(self) -> bool:
        """True while commands wait in (or run from) this consumer's ordered work."""
        return self._ordered_task is not None

    def run_ordered(self, job: Callable[[], Awaitable[None]]) -> bool:
        """Run ``job()`` after every job queued before it (one task per consumer):
        commands with long client lists are applied there in chunks, yielding to
        the event loop, in the order the client sent them. Returns False (job
        dropped) when :data:`MAX_ORDERED_JOBS` already wait. A job's exception is
        logged; jobs keep running after the consumer closed (acks still count)."""
        if len(self._ordered) >= MAX_ORDERED_JOBS:
            return False
        self._ordered.append(job)
        if self._ordered_task is None:
            self._ordered_task = asyncio.ensure_future(self._run_ordered())
        return True

    async def _run_ordered(self) -> None:
        try:
            while self._ordered:
                job = self._ordered.popleft()
                try:
                    await job()
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - one bad command must not stop the others
                    log.exception("consumer %s: background command failed", self.name)
        finally:
            self._ordered.clear()
            self._ordered_task = None

    async def drain_ordered(self) -> None:
        """Wait until the ordered work queued so far has run (seek/reset ordering)."""
        while self._ordered_task is not None:
            await asyncio.shield(self._ordered_task)

    def send_entries(self, items: list[DispatchItem], redelivery_counts: dict[Position, int],
                     ack_set_for: Callable[[Position], Optional[list[int]]]) -> None:
        """Push ``items`` in one MessageBatch frame (carrying ``epoch`` when set) and
        track them as pending acks: each entry takes its ``num_messages`` from
        ``permits`` (which may go below 0: dispatch stops there), adds them to
        ``unacked_messages`` once per position, and counts messages/bytes out.
        Each message carries ``redelivery_counts[position]`` (0 when absent) and
        the ``ack_set_for(position)`` words of a partly acknowledged batch. Does
        not check permits or writability: the dispatcher does."""
        batch = pb.MessageBatch()
        if self.epoch:
            batch.consumer_epoch = self.epoch
        for item in items:
            msg = batch.entries.add(position=pb.Position(ledger_id=item.position.ledger_id,
                                                         entry_id=item.position.entry_id),
                                    headers_and_payload=item.data,
                                    redelivery_count=redelivery_counts.get(item.position, 0))
            ack_set = ack_set_for(item.position)
            if ack_set:
                msg.ack_set.extend(ack_set)
            self.permits -= item.num_messages
            if item.position not in self.pending_acks:
                self.unacked_messages += item.num_messages
            self.pending_acks[item.position] = item.num_messages
            self.msg_out_counter += item.num_messages
            self.bytes_out_counter += len(item.data)
        self._send(pb.ConsumerResponse(messages=batch))

    def set_epoch(self, epoch: int) -> None:
        """A redeliver-all carried the client's epoch: only ever raise ours
        (PersistentDispatcherSingleActiveConsumer.internalRedeliverUnacknowledgedMessages).
        Entries pushed from now on carry it; those queued before keep the old one."""
        if epoch > self.epoch:
            self.epoch = epoch

    def acked(self, position: Position) -> None:
        """An individual ack of ``position`` ((ledger_id, entry_id)): forget it from
        ``pending_acks`` and lower ``unacked_messages`` by its message count; a
        position not pending for this consumer is ignored (Pulsar's
        Consumer.removePendingAcks)."""
        n = self.pending_acks.pop(position, None)
        if n is not None:
            self.unacked_messages -= n

    def acked_up_to(self, position: Position) -> None:
        """A cumulative ack (or a mark-delete move) up to ``position`` inclusive:
        :meth:`acked` for every pending position <= it."""
        for pos in [p for p in self.pending_acks if p <= position]:
            self.acked(pos)

    def take_pending(self) -> list[Position]:
        """Forget and return every pending position (for redelivery; in
        insertion order) and set ``unacked_messages`` back to 0."""
        positions = list(self.pending_acks)
        self.pending_acks.clear()
        self.unacked_messages = 0
        return positions

    def notify_active(self, active: bool) -> None:
        """Failover/Exclusive: tell the client it became active or inactive with an
        ActiveConsumerChange frame, only when that changed (Pulsar's
        Consumer.notifyActiveConsumerChange)."""
        if active != self.is_active:
            self.is_active = active
            self._send(pb.ConsumerResponse(active_change=pb.ActiveConsumerChange(is_active=active)))


class _OutboundQueue:
    """FIFO of ConsumerResponse frames (None = end of stream) with their sizes;
    ``await get()`` as ``asyncio.Queue.get``. Taking a frame lowers the
    writer's byte count."""

    def __init__(self, writer: "ConsumerWriter"):
        self._writer = writer
        self._items: collections.deque = collections.deque()
        self._waiter: Optional[asyncio.Future] = None

    def qsize(self) -> int:
        """Frames queued (count, the end marker included)."""
        return len(self._items)

    def empty(self) -> bool:
        """True when no frame is queued."""
        return not self._items

    def put_nowait(self, item: Optional[pb.ConsumerResponse], size: int = 0) -> None:
        """Append ``item`` (None: end of stream) whose serialized size is ``size``
        bytes, waking a waiting :meth:`get`. Never blocks, never refuses."""
        self._items.append((item, size))
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def get(self) -> Optional[pb.ConsumerResponse]:
        """Wait for and take the oldest frame (None: end the stream); its size
        leaves the writer's ``buffered_bytes``, which may make it writable again."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item, size = self._items.popleft()
        self._writer._taken(size)
        return item

    def clear(self) -> int:
        """Drop every queued frame but an end-of-stream marker; returns the bytes dropped."""
        dropped = sum(size for item, size in self._items if item is not None)
        ended = any(item is None for item, _ in self._items)
        self._items.clear()
        if ended:
            self._items.append((None, 0))
        return dropped


class ConsumerWriter:
    """The outgoing side of a consumer stream: a queue drained by the servicer
    (``await writer.queue.get()``, None = end the stream), so the dispatcher
    never waits on a slow client.

    Pulsar's channel writability: ``buffered_bytes`` counts the serialized size
    of the queued frames; above ``high_water`` bytes the writer is not
    writable (its consumer gets no permits, so dispatch to it stops), and once
    the servicer took it below ``low_water`` it is writable again and
    ``on_writable()`` runs (the consumer wakes its dispatcher). Answers and
    control frames are always queued: only dispatch looks at writability, so
    a stream holds at most ``high_water`` plus one dispatched frame.
    """

    def __init__(self, high_water: int = OUTBOUND_HIGH_WATER_BYTES, low_water: int = OUTBOUND_LOW_WATER_BYTES):
        if not 0 <= low_water <= high_water:
            raise ValueError(f"water marks must satisfy 0 <= low ({low_water}) <= high ({high_water})")
        self.high_water = high_water
        self.low_water = low_water
        self.queue = _OutboundQueue(self)
        self.buffered_bytes = 0
        self.writable = True
        self.on_writable: Optional[Callable[[], None]] = None

    def send(self, response: pb.ConsumerResponse) -> None:
        """Queue one frame (never blocks); may turn the writer unwritable."""
        size = response.ByteSize()
        self.buffered_bytes += size
        if self.buffered_bytes > self.high_water:
            self.writable = False
        self.queue.put_nowait(response, size)

    def room(self) -> int:
        """Bytes until the high-water mark (0 when over it)."""
        return max(0, self.high_water - self.buffered_bytes)

    def _taken(self, size: int) -> None:
        self.buffered_bytes -= size
        if not self.writable and self.buffered_bytes <= self.low_water:
            self.writable = True
            if self.on_writable is not None:
                self.on_writable()

    def close(self) -> None:
        """End the stream after the frames queued so far."""
        self.queue.put_nowait(None, 0)

    def discard(self) -> int:
        """Drop the frames not sent yet (the consumer is gone; what they carried
        is redelivered from its pending acks). Returns the bytes freed."""
        dropped = self.queue.clear()
        self.buffered_bytes = 0
        self.writable = True
        return dropped
