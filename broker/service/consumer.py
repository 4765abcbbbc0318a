"""Broker-side consumer (Pulsar's ``org.apache.pulsar.broker.service.Consumer``):
flow permits, the positions sent but not yet acknowledged (pendingAcks), and
the outgoing queue of its gRPC stream."""
from __future__ import annotations

import asyncio
import itertools
from typing import Callable, Optional

from broker.ledger.position import Position
from proto import broker_pb2 as pb

_ids = itertools.count(1)


class DispatchItem:
    """One entry ready to push: position, bytes, message count, key hash, and the
    metadata the dispatcher peeked (``num_messages`` counts, ``sticky_key`` bytes)."""

    __slots__ = ("position", "data", "num_messages", "sticky_key", "deliver_at")

    def __init__(self, position: Position, data: bytes, num_messages: int, sticky_key: bytes,
                 deliver_at: Optional[int] = None):
        self.position = position
        self.data = data
        self.num_messages = num_messages
        self.sticky_key = sticky_key
        self.deliver_at = deliver_at


class Consumer:
    """A connected consumer of a subscription.

    ``permits``: messages it can still take (Flow adds, dispatch subtracts the
    entry's message count). ``pending_acks``: position -> message count of every
    entry pushed and not acknowledged yet. ``send`` queues a ConsumerResponse on
    the consumer's stream (never blocks). ``epoch``: PIP-84 consumer epoch, put
    on every MessageBatch (see ``set_epoch``).
    """

    def __init__(self, name: str, priority_level: int, send: Callable[[pb.ConsumerResponse], None],
                 max_unacked_messages: int = 50000):
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
        self.closed = False
        # PIP-84 consumer epoch: raised by a RedeliverUnacknowledged (redeliver-all on
        # Exclusive/Failover); every MessageBatch carries it so the client drops frames
        # dispatched before its redeliver-all. Per stream: a new stream starts at 0.
        self.epoch = 0
        self.on_disconnect: Optional[Callable[[], None]] = None   # set by the transport: ends the stream

    def disconnect(self) -> None:
        """Close this consumer and end its stream (topic unload/delete: the client
        reconnects and looks the topic up again; Pulsar's Consumer.disconnect)."""
        self.closed = True
        if self.on_disconnect is not None:
            self.on_disconnect()

    @property
    def blocked(self) -> bool:
        """Pulsar's blockedConsumerOnUnackedMsgs."""
        return self.max_unacked_messages > 0 and self.unacked_messages >= self.max_unacked_messages

    def available_permits(self) -> int:
        return 0 if (self.closed or self.blocked) else max(0, self.permits)

    def send_entries(self, items: list[DispatchItem], redelivery_counts: dict[Position, int],
                     ack_set_for: Callable[[Position], Optional[list[int]]]) -> None:
        """Push entries in one MessageBatch frame and track them as pending acks."""
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
        n = self.pending_acks.pop(position, None)
        if n is not None:
            self.unacked_messages -= n

    def acked_up_to(self, position: Position) -> None:
        for pos in [p for p in self.pending_acks if p <= position]:
            self.acked(pos)

    def take_pending(self) -> list[Position]:
        """Forget and return every pending position (for redelivery)."""
        positions = list(self.pending_acks)
        self.pending_acks.clear()
        self.unacked_messages = 0
        return positions

    def notify_active(self, active: bool) -> None:
        if active != self.is_active:
            self.is_active = active
            self._send(pb.ConsumerResponse(active_change=pb.ActiveConsumerChange(is_active=active)))

    def send_response(self, response: pb.ConsumerResponse) -> None:
        self._send(response)


class ConsumerWriter:
    """The outgoing side of a consumer stream: an unbounded queue drained by the
    servicer (so the dispatcher never waits on a slow client: permits bound it)."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()

    def send(self, response: pb.ConsumerResponse) -> None:
        self.queue.put_nowait(response)

    def close(self) -> None:
        self.queue.put_nowait(None)
