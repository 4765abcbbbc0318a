"""A topic's subscription (Pulsar's ``PersistentSubscription``): a cursor, the
connected consumers, the dispatcher of the subscription's type, acknowledgments,
redelivery, seek and unsubscribe.

Client-supplied lists are bounded by what the broker knows (DESIGN.md "servers
keep serving"): a batch-index ack is checked against the entry's *real* batch
size (the message count the dispatcher read from the entry, or the entry read
again), never the client's ``batch_size``; acks of positions that are not
entries are refused and store nothing; a RedeliverUnacknowledged only
redelivers positions pending for that consumer (Pulsar's
``Consumer.redeliverUnacknowledgedMessages``). Long lists are walked by
``acknowledge_async`` / ``redeliver_unacknowledged_async`` in chunks of
:data:`CHUNK`, yielding to the event loop between chunks.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Awaitable, Iterable, Optional, Sequence

from broker.ledger.managed_cursor import InvalidCursorPosition, InvalidMarkDeletePosition, ManagedCursor
from broker.ledger.position import Entry, Position
from proto.entry_format import peek_metadata
from proto.errors import ConsumerBusy, CorruptedMessage, NotAllowed
from proto import broker_pb2 as pb

from .consumer import Consumer
from .dispatcher_key_shared import KeySharedDispatcher
from .dispatchers import Dispatcher, MultipleConsumersDispatcher, SingleActiveConsumerDispatcher, batch_size_of
from .errors import InvalidArgument, PreconditionFailed

if TYPE_CHECKING:
    from .topic import PersistentTopic

log = logging.getLogger(__name__)

SUB_TYPE_NAMES = {pb.Exclusive: "Exclusive", pb.Shared: "Shared", pb.Failover: "Failover", pb.Key_Shared: "Key_Shared"}
REPLICATED_PROPERTY = "pulsar.replicated.subscription"
#: Positions handled per step when a command's list is walked in the background
#: (between steps the event loop serves everyone else); commands with at most
#: this many positions are applied at once. Small steps also keep few objects alive
#: across garbage collections: with 1000 the GC's full collections made a second
#: client wait up to ~0.5 s during a 1,000,000-position ack, with 256 ~0.1 s.
CHUNK = 256


class Subscription:
    """One subscription of a topic (Pulsar's PersistentSubscription): its
    ManagedCursor, the connected consumers, the dispatcher of its type and
    ``redelivery_counts`` (Position -> times redelivered). ``durable`` False for
    Readers (non-durable cursor). ``msg_acked_counter`` counts the positions
    acknowledged (cumulative acks count 1)."""

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
        self._reset_epoch = 0           # bumped by reset_cursor: background acks from before it are dropped

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
        """Attach a consumer, creating the dispatcher of ``sub_type`` (pb.Exclusive,
        Shared, Failover, Key_Shared) when there is none or the type changes.
        Raises ConsumerBusy (Exclusive taken), NotAllowed (another subscription
        type while consumers are connected) or InvalidArgument (unknown type)."""
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
        consumer.on_writable = self._wake_dispatcher
        self.dispatcher.add_consumer(consumer)

    def _wake_dispatcher(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.wake()

    def _new_dispatcher(self, sub_type: int) -> Dispatcher:
        if sub_type in (pb.Exclusive, pb.Failover):
            return SingleActiveConsumerDispatcher(self, self.topic.name.partition_index if sub_type == pb.Failover else -1)
        if sub_type == pb.Shared:
            return MultipleConsumersDispatcher(self)
        if sub_type == pb.Key_Shared:
            return KeySharedDispatcher(self)
        raise InvalidArgument(f"unknown subscription type {sub_type}")

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach a consumer whose stream ended: its pending entries are
        redelivered to the others and the frames it was not sent are dropped
        (their memory is freed now, not when the topic unloads)."""
        consumer.closed = True
        consumer.on_writable = None
        if consumer.writer is not None:
            consumer.writer.discard()
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            if self.dispatcher is not None:
                self.dispatcher.remove_consumer(consumer)

    def flow(self, consumer: Consumer, permits: int) -> None:
        """A Flow command: ``permits`` more messages (clamped, Consumer.add_permits)."""
        consumer.add_permits(permits)
        if self.dispatcher is not None:
            self.dispatcher.wake()

    # ---- acknowledgments ------------------------------------------------
    def known_batch_size(self, position: Position, consumer: Optional[Consumer] = None) -> Optional[int]:
        """The real message count of the entry at ``position`` when the broker
        knows it without a read: from the pending acks of ``consumer`` or of
        another consumer of this subscription (what the dispatcher read from the
        entry, Pulsar's ``Consumer.getBatchSize``), or from an earlier batch-index
        ack of it. None when unknown."""
        if consumer is not None:
            n = consumer.pending_acks.get(position)
            if n is not None:
                return n
        for c in self.consumers:
            n = c.pending_acks.get(position)
            if n is not None:
                return n
        return self.cursor.batch_deleted.batch_size(position)

    async def read_batch_size(self, position: Position) -> int:
        """Read the entry at ``position`` and return its real batch size
        (dispatchers.batch_size_of). Raises InvalidArgument when ``position`` is
        not an entry of the topic."""
        ml = self.cursor.ml
        if not ml.is_entry(position):
            raise InvalidArgument(f"cannot acknowledge {position}: not an entry of {self.topic.name} "
                                  f"(last {ml.last_confirmed})")
        entries = await ml.read_entries(position, 1)
        if not entries or entries[0].position != position:
            raise InvalidArgument(f"cannot acknowledge {position}: not an entry of {self.topic.name}")
        try:
            return batch_size_of(peek_metadata(entries[0].data), entries[0].data)
        except CorruptedMessage:
            return 1

    def needs_async_ack(self, consumer: Consumer, ack: pb.Ack) -> bool:
        """True when ``ack`` must go through :meth:`acknowledge_async`: more than
        :data:`CHUNK` positions, or a batch-index ack of an entry whose real batch
        size the broker only learns by reading it. Cost: O(min(len, CHUNK))."""
        if len(ack.positions) > CHUNK:
            return True
        for ap in ack.positions:
            if ap.batch_indexes:
                pos = Position(ap.ledger_id, ap.entry_id)
                if not self.cursor.is_acknowledged(pos) and self.known_batch_size(pos, consumer) is None:
                    return True
        return False

    def acknowledge(self, consumer: Consumer, ack: pb.Ack) -> Awaitable[None]:
        """Apply an Ack command at once; returns an awaitable done when it is
        durable. For acks where :meth:`needs_async_ack` is False (a batch-index
        ack of an entry of unknown size is refused here). Raises NotAllowed
        (cumulative ack on Shared/Key_Shared) or InvalidArgument (a position
        that is not an entry of the topic, a batch index outside the entry's
        real batch size, more indexes than messages)."""
        return self._apply_ack(consumer, ack.ack_type, ack.positions, {})

    async def acknowledge_async(self, consumer: Consumer, ack: pb.Ack) -> Awaitable[None]:
        """Apply an Ack of any length: positions in chunks of :data:`CHUNK`,
        yielding to the event loop between chunks, reading the entries whose
        batch size is unknown first. Returns an awaitable done when what was
        applied is durable. Raises like :meth:`acknowledge` (chunks applied
        before the failing one stay applied, as an inline ack's preceding
        positions do). A reset/seek meanwhile drops the chunks not applied yet."""
        epoch = self._reset_epoch
        if ack.ack_type == pb.Cumulative and len(ack.positions) != 1:
            raise InvalidArgument("a cumulative ack carries exactly one position")
        remaining = iter(ack.positions)   # one iterator: slicing a long repeated field costs per slice
        futures = []
        for _ in range(0, max(1, len(ack.positions)), CHUNK):
            # Whole-entry positions become plain Positions at once (the protobuf wrappers
            # die right away: fewer tracked objects, shorter GC pauses); batch-index ones
            # stay AckPositions, their unknown batch sizes read first.
            chunk: list = []
            sizes: dict[Position, int] = {}
            for ap in itertools.islice(remaining, CHUNK):
                pos = Position(ap.ledger_id, ap.entry_id)
                if not ap.batch_indexes:
                    chunk.append(pos)
                    continue
                chunk.append(ap)
                if not self.cursor.is_acknowledged(pos) and self.known_batch_size(pos, consumer) is None:
                    sizes[pos] = await self.read_batch_size(pos)
            if epoch != self._reset_epoch:
                break
            futures.append(self._apply_ack(consumer, ack.ack_type, chunk, sizes))
            await asyncio.sleep(0)
        return asyncio.gather(*futures)

    def _batch_size_for(self, pos: Position, consumer: Consumer, sizes: dict[Position, int],
                        ap: pb.AckPosition) -> int:
        size = sizes.get(pos) or self.known_batch_size(pos, consumer)
        if size is None:
            raise InvalidArgument(f"batch size of {pos} is not known yet; acknowledge it again")
        if len(ap.batch_indexes) > size:
            raise InvalidArgument(f"{len(ap.batch_indexes)} batch indexes for entry {pos}, which holds "
                                  f"{size} message(s)")
        return size

    def _apply_ack(self, consumer: Consumer, ack_type: int, positions: Sequence,
                   sizes: dict[Position, int]) -> Awaitable[None]:
        """Apply ``positions`` (AckPositions, or Positions for whole entries) of
        one Ack; ``sizes``: real batch sizes read for this call."""
        futures = []
        md_before = self.cursor.mark_delete_position
        try:
            if ack_type == pb.Cumulative:
                if self.sub_type in (pb.Shared, pb.Key_Shared):
                    raise NotAllowed(f"cumulative acknowledgment is not allowed on {SUB_TYPE_NAMES[self.sub_type]} "
                                     f"subscription {self.name}; acknowledge messages individually")
                if len(positions) != 1:
                    raise InvalidArgument("a cumulative ack carries exactly one position")
                ap = positions[0]
                pos = Position(ap.ledger_id, ap.entry_id)
                indexes = () if type(ap) is Position else ap.batch_indexes
                if indexes and not self.cursor.is_acknowledged(pos):
                    # Cumulative up to a batch index: the previous entry fully, this one partly.
                    if not self.cursor.ml.is_entry(pos):
                        raise InvalidMarkDeletePosition(f"cannot acknowledge {pos}: not an entry of "
                                                        f"{self.topic.name} (last {self.cursor.ml.last_confirmed})")
                    size = self._batch_size_for(pos, consumer, sizes, ap)
                    upto, lowest = max(indexes), min(indexes)
                    if upto >= size or lowest < 0:
                        raise InvalidArgument(f"batch index {upto if upto >= size else lowest} "
                                              f"out of range [0, {size}) for entry {pos}")
                    prev = Position(pos.ledger_id, pos.entry_id - 1)
                    if prev > self.cursor.mark_delete_position and pos.entry_id > 0:
                        futures.append(self.cursor.mark_delete_nowait(prev))
                    futures.append(self.cursor.delete_batch_index_nowait(pos, size, range(upto + 1)))
                elif not indexes:
                    futures.append(self.cursor.mark_delete_nowait(pos))
                for c in self.consumers:
                    c.acked_up_to(pos)
                self.msg_acked_counter += 1
            else:
                whole = []
                for ap in positions:
                    if type(ap) is Position:
                        pos, ap = ap, None
                    else:
                        pos = Position(ap.ledger_id, ap.entry_id)
                    if ap is not None and ap.batch_indexes:
                        if self.cursor.is_acknowledged(pos):
                            consumer.acked(pos)
                            continue
                        if not self.cursor.ml.is_entry(pos):
                            raise InvalidMarkDeletePosition(
                                f"cannot acknowledge {pos}: not an entry of {self.topic.name} "
                                f"(last {self.cursor.ml.last_confirmed})")
                        size = self._batch_size_for(pos, consumer, sizes, ap)
                        futures.append(self.cursor.delete_batch_index_nowait(pos, size, ap.batch_indexes))
                        if self.cursor.is_acknowledged(pos):
                            consumer.acked(pos)
                    else:
                        whole.append(pos)
                        consumer.acked(pos)
                        self.redelivery_counts.pop(pos, None)
                if whole:
                    futures.append(self.cursor.delete_nowait(whole))
                self.msg_acked_counter += len(positions)
        except InvalidMarkDeletePosition as exc:
            raise InvalidArgument(str(exc)) from None
        except ValueError as exc:
            raise InvalidArgument(f"invalid acknowledgment: {exc}") from None
        if self.cursor.mark_delete_position != md_before or ack_type != pb.Cumulative or futures:
            self._mark_delete_moved()
        if self.dispatcher is not None:
            self.dispatcher.wake()
        return asyncio.gather(*futures)

    def ack_set_for(self, position: Position) -> Optional[list[int]]:
        """Batch-index ack state of an entry being redelivered (set bit = not acknowledged)."""
        return self.cursor.batch_deleted.ack_set_words(position)

    def redeliver_unacknowledged(self, consumer: Consumer, positions: Iterable) -> None:
        """RedeliverUnacknowledged: of ``positions`` (``(ledger_id, entry_id)``
        pairs or objects with ``ledger_id``/``entry_id``), only those pending for
        ``consumer`` are redelivered (Pulsar's
        Consumer.redeliverUnacknowledgedMessages: positions never delivered to it,
        acknowledged or repeated are ignored); empty: everything pending of
        ``consumer``. Walks the list at once: long lists go through
        :meth:`redeliver_unacknowledged_async`."""
        if positions:
            pending = self._take_pending_of(consumer, positions)
        else:
            pending = consumer.take_pending()
        self._redeliver(consumer, pending)

    async def redeliver_unacknowledged_async(self, consumer: Consumer, positions: Sequence) -> None:
        """:meth:`redeliver_unacknowledged` for a list of any length: walked in
        chunks of :data:`CHUNK`, yielding to the event loop between chunks."""
        pending: list[Position] = []
        remaining = iter(positions)
        for _ in range(0, len(positions), CHUNK):
            pending.extend(self._take_pending_of(consumer, itertools.islice(remaining, CHUNK)))
            await asyncio.sleep(0)
        self._redeliver(consumer, pending)

    @staticmethod
    def _take_pending_of(consumer: Consumer, positions: Iterable) -> list[Position]:
        out = []
        pending = consumer.pending_acks
        for p in positions:
            key = p if isinstance(p, tuple) else (p.ledger_id, p.entry_id)
            if key in pending:
                pos = Position(*key)
                consumer.acked(pos)
                out.append(pos)
        return out

    def _redeliver(self, consumer: Consumer, positions: list[Position]) -> None:
        consumer.msg_redeliver_counter += len(positions)
        if self.dispatcher is not None and positions:
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
        """After an ack of a replicated subscription: send an UPDATE now when the
        mark-delete position passed a cached snapshot (PIP-33); after a consumer's
        ack, beyond PIP-33, the (rate-limited) UPDATE with the acknowledged state by
        origin id, with or without snapshots (issue 15). Acks of markers alone never
        cause the latter, or UPDATE markers would keep producing UPDATE markers."""
        if not self.replicated or self.topic.controller is None:
            return
        snap = None
        if self.snapshot_cache is not None:
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
        position reaches a consumer before the answer. Clears the redelivery
        counts; raises InvalidArgument when the cursor refuses ``position``
        (Pulsar's PersistentSubscription.resetCursor)."""
        dispatcher = self.dispatcher
        if dispatcher is not None:
            dispatcher.paused = True
            dispatcher.reset()
        try:
            # Commands the consumers sent before the seek (long acks applied in the
            # background) are applied first; what is still queued after is dropped.
            for c in list(self.consumers):
                await c.drain_ordered()
            if dispatcher is not None:
                dispatcher.reset()
            self._reset_epoch += 1
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
        """unackedMessages of the subscription's stats: messages (count, batch
        entries by their message count) pushed to its consumers and not acknowledged."""
        return sum(c.unacked_messages for c in self.consumers)

    async def unsubscribe(self, consumer: Optional[Consumer] = None) -> None:
        """Delete the subscription; PreconditionFailed if other consumers are connected."""
        others = [c for c in self.consumers if c is not consumer]
        if others:
            raise PreconditionFailed(f"subscription {self.name} has {len(others)} other connected consumer(s); "
                                     f"close them first")
        await self.topic.remove_subscription(self.name)

    async def close(self) -> None:
        """Topic close/unload: stop the UPDATE timer and the dispatcher and
        disconnect every consumer (the clients reconnect); the cursor stays."""
        if self.update_timer is not None:
            self.update_timer.cancel()
            self.update_timer = None
        if self.dispatcher is not None:
            await self.dispatcher.close()
        for c in list(self.consumers):
            c.disconnect()
        self.consumers.clear()
