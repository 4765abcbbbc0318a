"""A topic's subscription (Pulsar's ``PersistentSubscription``): a cursor, the
connected consumers, the dispatcher of the subscription's type, acknowledgments,
redelivery, seek and unsubscribe."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Awaitable, Optional

from broker.ledger.managed_cursor import InvalidCursorPosition, InvalidMarkDeletePosition, ManagedCursor
from broker.ledger.position import Entry, Position
from client.errors import ConsumerBusy, NotAllowed
from proto import broker_pb2 as pb

from .consumer import Consumer
from .dispatchers import (Dispatcher, KeySharedDispatcher, MultipleConsumersDispatcher,
                          SingleActiveConsumerDispatcher)
from .errors import InvalidArgument, PreconditionFailed

if TYPE_CHECKING:
    from .topic import PersistentTopic

log = logging.getLogger(__name__)

SUB_TYPE_NAMES = {pb.Exclusive: "Exclusive", pb.Shared: "Shared", pb.Failover: "Failover", pb.Key_Shared: "Key_Shared"}
REPLICATED_PROPERTY = "pulsar.replicated.subscription"


class Subscription:
    """One subscription of a topic. ``durable`` False for Readers (non-durable cursor)."""

    def __init__(self, topic: "PersistentTopic", name: str, cursor: ManagedCursor, durable: bool = True):
        self.topic = topic
        self.name = name
        self.cursor = cursor
        self.durable = durable
        self.sub_type: Optional[int] = None
        self.dispatcher: Optional[Dispatcher] = None
        self.consumers: list[Consumer] = []
        self.redelivery_counts: dict[Position, int] = {}
        self.msg_acked_counter = 0
        self.snapshot_cache = None    # PIP-33 ReplicatedSubscriptionSnapshotCache, when replicated
        self.last_snapshot_used = None  # the newest snapshot the mark-delete position passed
        self.last_update_sent = 0.0     # loop time of the last UPDATE marker for this subscription
        self.update_timer = None

    @property
    def replicated(self) -> bool:
        """PIP-33: whether this subscription's state is replicated to other clusters."""
        return self.cursor.cursor_properties.get(REPLICATED_PROPERTY) == "true"

    async def set_replicated(self, replicated: bool) -> None:
        """Persist the replicated flag in the cursor properties (Pulsar's setReplicated)."""
        if replicated != self.replicated:
            props = dict(self.cursor.cursor_properties)
            props[REPLICATED_PROPERTY] = "true" if replicated else "false"
            await self.cursor.set_cursor_properties(props)

    # ---- consumers ------------------------------------------------------
    def add_consumer(self, consumer: Consumer, sub_type: int) -> None:
        """Attach a consumer. Raises ConsumerBusy (Exclusive taken) or NotAllowed
        (another subscription type while consumers are connected)."""
        if self.consumers and sub_type != self.sub_type:
            raise NotAllowed(f"subscription {self.name} on {self.topic.name} is of type "
                             f"{SUB_TYPE_NAMES[self.sub_type]}, not {SUB_TYPE_NAMES.get(sub_type, sub_type)}; "
                             f"use the same type or another subscription name")
        if sub_type == pb.Exclusive and self.consumers:
            raise ConsumerBusy(f"exclusive subscription {self.name} on {self.topic.name} already has a consumer; "
                               f"use a Shared/Failover/Key_Shared subscription or another name")
        if self.dispatcher is None or sub_type != self.sub_type:
            old = self.dispatcher
            if old is not None:
                asyncio.ensure_future(old.close())
            self.sub_type = sub_type
            self.dispatcher = self._new_dispatcher(sub_type)
            self.dispatcher.start()
        self.consumers.append(consumer)
        self.dispatcher.add_consumer(consumer)

    def _new_dispatcher(self, sub_type: int) -> Dispatcher:
        if sub_type in (pb.Exclusive, pb.Failover):
            return SingleActiveConsumerDispatcher(self, self.topic.name.partition_index if sub_type == pb.Failover else -1)
        if sub_type == pb.Shared:
            return MultipleConsumersDispatcher(self)
        if sub_type == pb.Key_Shared:
            return KeySharedDispatcher(self)
        raise InvalidArgument(f"unknown subscription type {sub_type}")

    def remove_consumer(self, consumer: Consumer) -> None:
        consumer.closed = True
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            if self.dispatcher is not None:
                self.dispatcher.remove_consumer(consumer)

    def flow(self, consumer: Consumer, permits: int) -> None:
        consumer.permits += permits
        if self.dispatcher is not None:
            self.dispatcher.wake()

    # ---- acknowledgments ------------------------------------------------
    def acknowledge(self, consumer: Consumer, ack: pb.Ack) -> Awaitable[None]:
        """Apply an Ack command; returns an awaitable done when it is durable.
        Raises NotAllowed (cumulative ack on Shared/Key_Shared) or InvalidArgument
        (a position beyond the topic's last entry)."""
        futures = []
        md_before = self.cursor.mark_delete_position
        try:
            if ack.ack_type == pb.Cumulative:
                if self.sub_type in (pb.Shared, pb.Key_Shared):
                    raise NotAllowed(f"cumulative acknowledgment is not allowed on {SUB_TYPE_NAMES[self.sub_type]} "
                                     f"subscription {self.name}; acknowledge messages individually")
                if len(ack.positions) != 1:
                    raise InvalidArgument("a cumulative ack carries exactly one position")
                ap = ack.positions[0]
                pos = Position(ap.ledger_id, ap.entry_id)
                if ap.batch_indexes and ap.batch_size:
                    # Cumulative up to a batch index: the previous entry fully, this one partly.
                    prev = Position(pos.ledger_id, pos.entry_id - 1)
                    if prev > self.cursor.mark_delete_position and pos.entry_id > 0:
                        futures.append(self.cursor.mark_delete_nowait(prev))
                    futures.append(self.cursor.delete_batch_index_nowait(pos, ap.batch_size, range(max(ap.batch_indexes) + 1)))
                else:
                    futures.append(self.cursor.mark_delete_nowait(pos))
                for c in self.consumers:
                    c.acked_up_to(pos)
                self.msg_acked_counter += 1
            else:
                whole = []
                for ap in ack.positions:
                    pos = Position(ap.ledger_id, ap.entry_id)
                    if ap.batch_indexes and ap.batch_size:
                        futures.append(self.cursor.delete_batch_index_nowait(pos, ap.batch_size, ap.batch_indexes))
                        if self.cursor.is_acknowledged(pos):
                            consumer.acked(pos)
                    else:
                        whole.append(pos)
                        consumer.acked(pos)
                        self.redelivery_counts.pop(pos, None)
                if whole:
                    futures.append(self.cursor.delete_nowait(whole))
                self.msg_acked_counter += len(ack.positions)
        except InvalidMarkDeletePosition as exc:
            raise InvalidArgument(str(exc)) from None
        except ValueError as exc:
            raise InvalidArgument(f"invalid acknowledgment: {exc}") from None
        if self.cursor.mark_delete_position != md_before or ack.ack_type != pb.Cumulative:
            self._mark_delete_moved()
        if self.dispatcher is not None:
            self.dispatcher.wake()
        return asyncio.gather(*futures)

    def ack_set_for(self, position: Position) -> Optional[list[int]]:
        """Batch-index ack state of an entry being redelivered (set bit = not acknowledged)."""
        return self.cursor.batch_deleted.ack_set_words(position)

    def redeliver_unacknowledged(self, consumer: Consumer, positions: list[Position]) -> None:
        """RedeliverUnacknowledged: the given positions (or all pending of this consumer)."""
        if positions:
            for pos in positions:
                consumer.acked(pos)
        else:
            positions = consumer.take_pending()
        consumer.msg_redeliver_counter += len(positions)
        if self.dispatcher is not None:
            self.dispatcher.redeliver(positions)

    def on_marker(self, entry: Entry, metadata) -> None:
        """A marker passed the dispatcher: a local SNAPSHOT goes to the snapshot
        cache of a replicated subscription (processReplicatedSubscriptionSnapshot)."""
        from broker.replication import markers

        if metadata.marker_type != markers.SNAPSHOT or metadata.HasField("replicated_from") or not self.replicated:
            return
        try:
            _, snap = markers.parse(entry.data)
        except Exception as exc:
            log.warning("[%s][%s] bad snapshot marker at %s: %s", self.topic.name, self.name, entry.position, exc)
            return
        self._cache().add(markers.position(snap.local_message_id), snap)

    def _cache(self):
        if self.snapshot_cache is None:
            from broker.replication.snapshot import SnapshotCache
            self.snapshot_cache = SnapshotCache(
                self.topic.config.replicated_subscriptions_snapshot_max_cached_per_subscription)
        return self.snapshot_cache

    def _mark_delete_moved(self, consumer_ack: bool = True) -> None:
        """After an ack moved the mark-delete position: send an UPDATE when it
        passed a cached snapshot; after a consumer's ack also the (rate-limited)
        acknowledged-origins UPDATE. Acks of markers alone never cause the latter,
        or UPDATE markers would keep producing UPDATE markers."""
        if self.snapshot_cache is None or not self.replicated or self.topic.controller is None:
            return
        snap = self.snapshot_cache.advanced_mark_delete(self.cursor.mark_delete_position)
        if snap is not None or consumer_ack:
            self.topic.controller.subscription_acked(self, snap)

    def after_mark_delete_moved_by_update(self) -> None:
        """An UPDATE from another cluster moved the cursor: drop what consumers
        hold below it and let the dispatcher skip acknowledged entries."""
        md = self.cursor.mark_delete_position
        for c in self.consumers:
            c.acked_up_to(md)
            for pos in [p for p in c.pending_acks if self.cursor.is_acknowledged(p)]:
                c.acked(pos)
        if self.dispatcher is not None:
            self.dispatcher.wake()

    # ---- seek / figures / unsubscribe ------------------------------------
    async def reset_cursor(self, position: Position, before_resume=None) -> None:
        """Move the subscription so ``position`` is the next message delivered.
        Dispatch pauses until the new state is durable and ``before_resume()`` ran
        (the servicer queues the seek's answer there), so no entry from the new
        position reaches a consumer before the answer."""
        dispatcher = self.dispatcher
        if dispatcher is not None:
            dispatcher.paused = True
            dispatcher.reset()
        try:
            self.redelivery_counts.clear()
            try:
                done = self.cursor.reset(position)
            except InvalidCursorPosition as exc:
                raise InvalidArgument(str(exc)) from None
            await done
            if before_resume is not None:
                before_resume()
        finally:
            if dispatcher is not None:
                dispatcher.paused = False
                dispatcher.wake()

    def acknowledge_server_side(self, positions: list[Position]) -> None:
        """Acknowledge entries the broker consumed itself (markers, corrupt entries);
        like a consumer ack, moving the mark-delete position may emit an UPDATE."""
        md_before = self.cursor.mark_delete_position
        self.cursor.delete_nowait(positions).add_done_callback(lambda f: f.cancelled() or f.exception())
        if self.cursor.mark_delete_position != md_before:
            self._mark_delete_moved(consumer_ack=False)

    def backlog(self) -> int:
        """msgBacklog: entries not acknowledged, markers excluded."""
        return max(0, self.cursor.number_of_entries_in_backlog() - self.topic.markers_in_backlog(self.cursor))

    def unacked_messages(self) -> int:
        return sum(c.unacked_messages for c in self.consumers)

    async def unsubscribe(self, consumer: Optional[Consumer] = None) -> None:
        """Delete the subscription; PreconditionFailed if other consumers are connected."""
        others = [c for c in self.consumers if c is not consumer]
        if others:
            raise PreconditionFailed(f"subscription {self.name} has {len(others)} other connected consumer(s); "
                                     f"close them first")
        await self.topic.remove_subscription(self.name)

    async def close(self) -> None:
        if self.update_timer is not None:
            self.update_timer.cancel()
            self.update_timer = None
        if self.dispatcher is not None:
            await self.dispatcher.close()
        for c in list(self.consumers):
            c.disconnect()
        self.consumers.clear()
