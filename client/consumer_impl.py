"""One consumer of one topic or partition (Pulsar's ConsumerImpl): the
receive / ack / redelivery bookkeeping on top of its gRPC stream.

Here: the Subscribe request and what a new stream starts with, splitting
pushed entries into messages (flow permits, chunks, dead letters), grouped
acks, negative acks, ack timeout, redelivery (PIP-84 consumer epochs), seek,
unsubscribe, close, and the maintenance task that sends flows, acks and
redeliveries.  The stream itself (subscribe round trip, reading, reconnection
with backoff, writes, request/response matching) is
``client.consumer_connection.ConsumerConnection``, its base class (Pulsar's
ConnectionHandler / ClientCnx side).

Not public: ``Consumer``, ``MultiTopicsConsumer`` and ``Reader`` (the user
API) drive one or several ``ConsumerImpl``.  Everything runs on the client's
event loop; the plain ack methods may be called from another thread (they
hop onto the loop).
"""
from __future__ import annotations

import asyncio
import logging
import random
import string
import time
from typing import Callable

import grpc

from client.ack_grouping import AcknowledgmentsGroupingTracker
from client.consumer_config import ConsumerConfig, ConsumerType
from client.consumer_connection import ConsumerConnection
from client.dead_letter import DeadLetterPublisher
from client.entry_format import peek_metadata
from client.entry_splitter import EntrySplitter, StartFilter
from client.ack_receipts import CONFIRMED, PENDING, REFUSED, REQUEUE, AckReceipts
from client.errors import AlreadyClosed, ConnectError, CorruptedMessage, PulsarException, Timeout
from client.message import Message
from client.message_id import MessageId, chunk_message_ids
from client.receiver_queue import FlowPermits, ReceiverQueue
from client.redelivery_trackers import NegativeAcksTracker, UnAckedMessageTracker
from proto import broker_pb2 as pb

__all__ = ["ConsumerImpl", "now_ms", "random_consumer_name"]

log = logging.getLogger(__name__)
_CHUNK_EXPIRY_CHECK_MS = 1000
_CLOSE_GRACE_S = 2.0


def now_ms() -> int:
    """Wall-clock ms (the trackers' clock)."""
    return int(time.time() * 1000)


def random_consumer_name() -> str:
    """A random 5-letter name, as Pulsar's ConsumerName.generateRandomName()."""
    return "".join(random.choices(string.ascii_lowercase, k=5))


def first_chunk_of(mid: MessageId | None, partition: int) -> MessageId | None:
    """Where a start or seek "at" ``mid`` (inclusive) begins: for a chunked
    message's id (``ChunkMessageId``, whose position is its last chunk's) the
    first chunk's entry, so the whole message is read again (Pulsar #16154,
    apache/pulsar#16154's fix of ConsumerImpl's startMessageId); any other id
    unchanged."""
    first = getattr(mid, "first_chunk_message_id", None)
    if first is None or (first.ledger_id, first.entry_id) == (mid.ledger_id, mid.entry_id):
        return mid
    return MessageId(first.ledger_id, first.entry_id, partition)


def _position(mid: MessageId) -> pb.Position:
    return pb.Position(ledger_id=mid.ledger_id, entry_id=mid.entry_id)


class ConsumerImpl(ConsumerConnection):
    """Consumer of one topic or partition.

    ``topic``: full topic/partition name; ``conf``: validated ``ConsumerConfig``;
    ``partition``: index put in message ids (-1 = not partitioned);
    ``queue``: receive queue (shared by a multi-topic consumer's children;
    default: own); ``topic_in_ids``: message ids are ``TopicMessageId``;
    ``durable`` False for a Reader, which starts at ``start_message_id``
    (``start_inclusive``) and, after a reconnection, at the first message it
    dropped from its queue, else right after the last message it handed out
    (Pulsar's clearReceiverQueue), never at "latest" again; ``dead_letter``: publisher of the dead-letter
    topic (required when ``conf.dead_letter_policy`` is set);
    ``on_failed(impl, exc)``: called when the consumer gives up reconnecting.

    The stream (``start``'s subscribe, reconnection, ``request``) is the base
    class ``ConsumerConnection``; this class provides its hooks.
    """

    def __init__(self, client, topic: str, conf: ConsumerConfig, *, partition: int = -1,
                 queue: ReceiverQueue | None = None, topic_in_ids: bool = False, durable: bool = True,
                 start_message_id: MessageId | None = None, start_inclusive: bool = False,
                 dead_letter: DeadLetterPublisher | None = None,
                 on_failed: Callable[["ConsumerImpl", PulsarException], None] | None = None):
        super().__init__(client, topic, on_failed)
        self.conf = conf
        self.partition = partition
        self.queue = queue if queue is not None else ReceiverQueue()
        self._owns_queue = queue is None
        self.durable = durable
        if start_inclusive:
            start_message_id = first_chunk_of(start_message_id, partition)
        self._start_id = start_message_id
        self._start_inclusive = start_inclusive
        self.last_dequeued: MessageId | None = None
        self.consumer_name = conf.consumer_name or random_consumer_name()
        self._dead_letter = dead_letter

        self.permits = FlowPermits(conf.receiver_queue_size)
        self.tracker = AcknowledgmentsGroupingTracker(conf.ack_group_time_ms, conf.batch_index_ack_enabled)
        self.splitter = EntrySplitter(
            topic, partition, topic_in_ids=topic_in_ids, tracker=self.tracker,
            max_pending_chunked_message=conf.max_pending_chunked_message,
            expire_time_of_incomplete_chunked_message_ms=conf.expire_time_of_incomplete_chunked_message_ms,
            auto_ack_oldest_chunked_message_on_queue_full=conf.auto_ack_oldest_chunked_message_on_queue_full)
        self.unacked = (UnAckedMessageTracker(conf.unacked_messages_timeout_ms)
                        if conf.unacked_messages_timeout_ms else None)
        self.nacks = NegativeAcksTracker(conf.negative_ack_redelivery_delay_ms)

        self.active = conf.consumer_type is not ConsumerType.Failover
        self.reached_end_of_topic = False
        self._wake = asyncio.Event()
        self._flush_now = False
        self._pending_flow = 0
        self._pending_redeliver: dict[MessageId, None] = {}
        self._redeliver_all = False
        # PIP-84 consumer epoch of the current stream: raised by a redeliver-all on
        # Exclusive/Failover; frames of an older epoch are dropped.  A stream starts at 0
        # on both sides (its frames cannot reach another stream).
        self._epoch = 0
        self.receipts = AckReceipts()   # ack frames in flight and the acknowledge_and_wait calls waiting
        self._background: set[asyncio.Task] = set()
        self._maintenance_task: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Subscribe (errors propagate: ``ConsumerBusy``, ``TopicNotFound``,
        ``NotAllowed``, ``Timeout``...; ``_connect_first``) and start the background tasks."""
        await self._connect_first()
        self._run_task = self._loop.create_task(self._run())
        self._maintenance_task = self._loop.create_task(self._maintenance())

    def _subscribe_request(self) -> pb.ConsumerRequest:
        """The Subscribe of a new stream (hook of ``ConsumerConnection._connect``); a
        non-durable consumer (Reader) starts at ``_start_id`` and filters batch indexes
        before it (``StartFilter``)."""
        conf = self.conf
        sub = pb.Subscribe(topic=self.topic, subscription=conf.subscription_name,
                           sub_type=conf.consumer_type.value, consumer_name=self.consumer_name,
                           priority_level=conf.priority_level, initial_position=conf.initial_position.value,
                           durable=self.durable,
                           replicate_subscription_state=conf.replicate_subscription_state_enabled,
                           metadata=conf.properties or {})
        if not self.durable:
            start, inclusive = self._start_id or MessageId.latest, self._start_inclusive
            if start.batch_index >= 0:  # the broker knows entries: start at it, skip earlier indexes here
                self.splitter.start_filter = StartFilter(start.ledger_id, start.entry_id,
                                                         start.batch_index + (0 if inclusive else 1))
                inclusive = True
            else:
                self.splitter.start_filter = None
            sub.start_message_id.CopyFrom(_position(start))
            sub.start_message_id_inclusive = inclusive
        return pb.ConsumerRequest(subscribe=sub)

    def _requeue_acks(self) -> None:
        """The stream broke: acks not confirmed by the broker are pending again."""
        self.receipts.connection_lost()
        if self.tracker.requeue_in_flight(now_ms()):
            self._flush_now = True

    async def _on_subscribed(self, call, timeout: float) -> None:
        """The broker accepted the Subscribe on ``call`` (hook of ``ConsumerConnection._connect``):
        a new stream starts at consumer epoch 0 with no flow or redelivery pending; the
        pending acks and the first Flow (``receiver_queue_size`` permits) go out within
        ``timeout`` seconds (``TimeoutError`` otherwise; ``_connect`` turns it into ``Timeout``)."""
        self._epoch = 0
        self._pending_flow = 0
        self._pending_redeliver.clear()
        self._redeliver_all = False
        # Acks still pending (kept across the reconnection, Pulsar) leave before the first
        # Flow: the broker applies them before it dispatches anything on this stream, so
        # it does not redeliver what the application already acknowledged.
        async with asyncio.timeout(timeout):
            for ack in self._take_acks():
                await call.write(pb.ConsumerRequest(ack=ack))
            await call.write(pb.ConsumerRequest(flow=pb.Flow(permits=self.permits.initial())))

    def _on_connection_lost(self) -> None:
        """The stream broke (hook of ``ConsumerConnection._on_disconnected``): unconfirmed
        acks are pending again; queued messages not handed out and incomplete chunks
        are dropped (the broker redelivers them); a Reader moves its start position."""
        self._requeue_acks()
        # As Pulsar's clearReceiverQueue: drop what was not handed out; the broker redelivers it.
        removed = self.queue.remove_if(lambda m: m._consumer is self)
        chunks = self.splitter.clear()
        if not self.durable:
            self._restart_after_clear(removed, chunks)

    def _restart_after_clear(self, removed: list[Message], chunks: list[MessageId]) -> None:
        """A non-durable consumer (Reader) restarts from the first message it
        dropped (the first chunk of a chunked one, or of an incomplete chunked
        message), else right after the last one handed to the application,
        else where it started (Pulsar's clearReceiverQueue): never from
        "latest" again, which would skip what it had received."""
        first = [m._chunk_ids[0] if m._chunk_ids else m.message_id() for m in removed[:1]] + chunks
        if first:
            start = min(first)
            self._start_id = MessageId(start.ledger_id, start.entry_id, self.partition, start.batch_index,
                                       start.batch_size)
            self._start_inclusive = True
        elif self.last_dequeued is not None:
            self._start_id, self._start_inclusive = self.last_dequeued, False

    async def close(self, flush: bool = True) -> None:
        """Flush pending acks (waiting for the broker, briefly), end the stream,
        stop the tasks.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        maintenance = self._maintenance_task
        if maintenance is not None and not maintenance.done():
            # Let it finish its pass rather than cancel it: cancelling a coroutine that is
            # writing to a grpc.aio stream cancels the whole call.
            self._wake.set()
            try:
                await asyncio.wait_for(asyncio.shield(maintenance), _CLOSE_GRACE_S)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - closing anyway
                pass
        call = self._call
        if call is not None and flush:
            try:
                await asyncio.wait_for(self._flush_acks_and_wait(), _CLOSE_GRACE_S)
            except (PulsarException, asyncio.TimeoutError, grpc.aio.AioRpcError) as e:
                log.debug("[%s] acks not confirmed at close: %s", self.topic, e)
            try:
                async with self._write_lock:
                    await asyncio.wait_for(call.done_writing(), _CLOSE_GRACE_S)
                if self._run_task is not None:
                    await asyncio.wait_for(asyncio.shield(self._run_task), _CLOSE_GRACE_S)
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise  # close() itself is cancelled
                log.debug("[%s] consumer stream was cancelled while closing", self.topic)
            except Exception as e:  # noqa: BLE001 - timeouts, a broken stream: we are closing anyway
                log.debug("[%s] consumer stream did not end cleanly: %r", self.topic, e)
        for task in (self._run_task, self._maintenance_task, *self._background):
            if task is not None and not task.done():
                task.cancel()
        for c in {call, self._call} - {None}:  # self._call: a stream a reconnection opened meanwhile
            c.cancel()
        self._call = None
        self._connected.clear()
        for fut in self._requests.values():
            if not fut.done():
                fut.set_exception(AlreadyClosed("consumer closed"))
        self.receipts.close(AlreadyClosed("consumer closed before the broker confirmed the acknowledgment"))
        if self._owns_queue:
            self.queue.close()
        else:
            self.queue.remove_if(lambda m: m._consumer is self)
        log.info("[%s][%s] closed consumer %s", self.topic, self.conf.subscription_name, self.consumer_name)

    # ------------------------------------------------------------------ receiving
    def _on_entries(self, entries) -> None:
        """Entries of a current-epoch frame (hook of ``ConsumerConnection._handle``): split
        into messages for the queue; dead letters, chunk acks and permits on the side."""
        now = now_ms()
        deliver: list[Message] = []
        skipped = 0
        ack_flush = False
        policy = self.conf.dead_letter_policy
        for entry in entries:
            result = self.splitter.split(entry, now)
            skipped += result.skipped
            for mid in result.ack:
                ack_flush |= self.tracker.add_individual(mid, now)
            if result.redeliver and self.unacked is not None:
                # Dropped incomplete chunks: ack-timeout tracking, not an immediate redelivery
                # (Pulsar's trackMessage); without an ack timeout they wait for a reconnection.
                for mid in result.redeliver:
                    self.unacked.add(mid.entry_id_only(), now)
            if not result.messages:
                continue
            if policy is not None and entry.redelivery_count > policy.max_redeliver_count \
                    and self._dead_letter is not None:
                skipped += len(result.messages)
                for msg in result.messages:
                    self._spawn(self._dead_letter_one(msg))
                continue
            for msg in result.messages:
                msg._consumer = self
            deliver.extend(result.messages)
        if deliver:
            self.queue.put_many(deliver)
        wake = ack_flush
        if ack_flush:
            self._flush_now = True
        if skipped:
            wake |= self._return_permits(skipped)
        if wake or self.tracker.has_pending():
            self._wake.set()

    def _drop_stale(self, entries) -> None:
        """A frame dispatched before our last redeliver-all (older consumer
        epoch, PIP-84): its entries come again from the rewound cursor, so drop
        them and give their permits back (Pulsar: isValidConsumerEpoch, then
        increaseAvailablePermits).  Rare: metadata is peeked only here."""
        count = 0
        for entry in entries:
            try:
                md = peek_metadata(entry.headers_and_payload)
                count += max(1, md.num_messages_in_batch) if md.HasField("num_messages_in_batch") else 1
            except CorruptedMessage:
                count += 1
        if self._return_permits(count):
            self._wake.set()

    async def _dead_letter_one(self, msg: Message) -> None:
        try:
            await self._dead_letter.publish(msg)
        except Exception as e:  # noqa: BLE001 - retried through a redelivery
            log.warning("[%s][%s] publishing %s to the dead-letter topic %s failed (%s); redelivering it "
                        "after the negative-ack delay", self.topic, self.conf.subscription_name,
                        msg.message_id(), self._dead_letter.topic, e)
            if not self.closed:
                # Redelivered like a negative ack (Exclusive/Failover: everything unacknowledged,
                # queue cleared, new epoch), after the delay: a dead-letter topic that keeps
                # failing does not make the consumer spin.
                self.negative_ack(msg.message_id(), msg)
            return
        self.ack_individual(msg.message_id(), msg)

    def _spawn(self, coro) -> None:
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _return_permits(self, count: int) -> bool:
        permits = self.permits.processed(count)
        if permits:
            self._pending_flow += permits
            return True
        return False

    def on_dequeued(self, msg: Message) -> None:
        """The application took ``msg`` from the queue: permits, ack timeout, last id."""
        self.last_dequeued = msg.message_id()
        if self.unacked is not None:
            self.unacked.add(msg.message_id(), now_ms(), msg._entry_positions())
        if self._return_permits(1):
            self._wake.set()

    # ------------------------------------------------------------------ acks (on the loop)
    def _after_ack(self, was_pending: bool, flush: bool) -> None:
        if flush:
            self._flush_now = True
        if flush or not was_pending:
            self._wake.set()

    def ack_individual(self, mid: MessageId, msg: Message | None = None) -> None:
        """Group an individual ack of ``mid`` (``msg`` gives the chunk ids)."""
        if self.closed:
            return
        was_pending = self.tracker.has_pending()
        chunk_ids = msg._chunk_ids if msg is not None else chunk_message_ids(mid)
        flush = self.tracker.add_individual(mid, now_ms(), chunk_ids)
        if self.unacked is not None:
            self.unacked.remove(mid)
            for cid in chunk_ids or ():  # chunks once dropped and tracked for the ack timeout
                self.unacked.remove(cid.entry_id_only())
        self._after_ack(was_pending, flush)

    def ack_cumulative(self, mid: MessageId) -> None:
        """Group a cumulative ack up to ``mid``."""
        if self.closed:
            return
        was_pending = self.tracker.has_pending()
        flush = self.tracker.add_cumulative(mid, now_ms())
        if self.unacked is not None:
            self.unacked.remove_up_to(mid)
        self._after_ack(was_pending, flush)

    def negative_ack(self, mid: MessageId, msg: Message | None = None) -> None:
        """Redeliver ``mid`` after ``negative_ack_redelivery_delay_ms``."""
        if self.closed:
            return
        first = len(self.nacks) == 0
        if msg is not None:
            positions = msg._entry_positions()
        else:
            positions = tuple(c.entry_id_only() for c in chunk_message_ids(mid)) or None
        self.nacks.add(mid, now_ms(), positions)
        if self.unacked is not None:
            self.unacked.remove(mid)
        if first:
            self._wake.set()

    def _take_acks(self) -> list[pb.Ack]:
        """The pending acks as frames, each with a request id: they stay in
        flight in the tracker (filtering redeliveries) until the broker answers,
        and are pending again if the stream breaks first."""
        token, frames = self.tracker.flush_in_flight()
        if frames:
            for ack in frames:
                ack.request_id = next(self._request_ids)
            self.receipts.sent(token, [ack.request_id for ack in frames])
        self.receipts.attach()
        return frames

    def _ack_answered(self, request_id: int, error: PulsarException | None) -> bool:
        """The broker answered the ack frame ``request_id`` (``error``: its
        CommandError, None for success). Returns False if it was not an ack in
        flight. A flush refused with a retriable error (its topic is being
        unloaded) is pending again; one refused otherwise is dropped, and the
        calls waiting for it get the error (AckReceipts)."""
        token, outcome = self.receipts.answered(request_id, error)
        if token is None:
            return False
        if outcome in (CONFIRMED, REFUSED):
            self.tracker.confirm(token)
        elif outcome == REQUEUE:
            self.tracker.requeue(token, now_ms())
            self._wake.set()
        if error is not None and outcome != PENDING:
            log.warning("[%s][%s] broker refused an acknowledgment (%s): %s", self.topic,
                        self.conf.subscription_name, "sent again" if outcome == REQUEUE else "dropped", error)
        return True

    async def _flush_acks_and_wait(self, fut: asyncio.Future | None = None) -> None:
        """Send the pending acks and wait (operation timeout) until the broker
        answered every flush that may carry them; ``fut``: a waiter registered
        earlier (``AckReceipts.add_waiter``), else one is registered now."""
        if fut is None:
            fut = self._loop.create_future()
            self.receipts.add_waiter(fut)
        try:
            for ack in self._take_acks():
                await self._write(pb.ConsumerRequest(ack=ack))
            await asyncio.wait_for(asyncio.shield(fut), self._client.operation_timeout_seconds)
        except asyncio.TimeoutError:
            raise Timeout(f"acknowledgment on {self.topic}: no answer within "
                          f"{self._client.operation_timeout_seconds} s") from None
        finally:
            if not fut.done():
                fut.cancel()

    async def flush_acks_and_wait(self) -> None:
        """Send every pending ack now and wait until the broker confirmed them
        (the ``*_and_wait`` ack variants, Pulsar's ack receipt), whichever flush
        carries them: while disconnected they leave on the new connection, and
        a flush the broker refuses as retriable (topic being unloaded) is sent
        again. Raises the broker's non-retriable error (``InvalidArgument``,
        ``NotAllowed``), ``Timeout`` (no confirmation within the operation
        timeout), ``AlreadyClosed``, or a consumer's failure."""
        fut = self._loop.create_future()
        self.receipts.add_waiter(fut)   # before waiting: a reconnection may send the acks meanwhile
        try:
            await self._wait_connected()
        except BaseException:
            fut.cancel()
            raise
        await self._flush_acks_and_wait(fut)

    def redeliver_unacknowledged(self, positions: list[MessageId] | None = None) -> None:
        """Pulsar's redeliverUnacknowledgedMessages: ``positions`` (entry ids) or,
        when None or on Exclusive/Failover (where order matters: Pulsar's
        redeliverUnacknowledgedMessages(Set) turns into the redeliver-all
        there), everything unacknowledged.  Messages still queued for them are
        dropped and their permits given back.  A redeliver-all on
        Exclusive/Failover starts a new consumer epoch (PIP-84): frames the
        broker dispatched before it are dropped on arrival."""
        if self.closed:
            return
        if positions is None or self.conf.consumer_type.allows_cumulative_ack:
            removed = self.queue.remove_if(lambda m: m._consumer is self)
            if self.conf.consumer_type.allows_cumulative_ack:
                self._epoch += 1
                self.splitter.clear()  # the rewound cursor sends every chunk again
            self._redeliver_all = True
            self._pending_redeliver.clear()
            if self.unacked is not None:
                self.unacked.clear()
            self.nacks.clear()
        else:
            wanted = {p.entry_id_only() for p in positions}
            removed = self.queue.remove_if(
                lambda m: m._consumer is self and any(p in wanted for p in m._entry_positions()))
            for p in wanted:
                self._pending_redeliver[p] = None
        self._return_permits(len(removed))
        self._wake.set()

    # ------------------------------------------------------------------ seek / unsubscribe
    async def seek(self, target: MessageId | int) -> None:
        """Reset the subscription to message id ``target`` (that message is the
        next one) or to publish time ``target`` (ms).  Pending acks are flushed
        first; queued messages, trackers and chunks are dropped after."""
        if isinstance(target, MessageId):
            target = first_chunk_of(target, self.partition)    # the chunked message is the next one
            seek = pb.Seek(message_id=_position(target))
            start_filter = (StartFilter(target.ledger_id, target.entry_id, target.batch_index)
                            if target.batch_index > 0 else None)
        elif isinstance(target, int) and not isinstance(target, bool) and target >= 0:
            seek, start_filter = pb.Seek(publish_time=target), None
        else:
            raise ValueError(f"seek target must be a MessageId or a publish time in ms, got {target!r}")
        await self._wait_connected()
        try:
            await self._flush_acks_and_wait()
        except PulsarException as e:
            log.debug("[%s] acks before seek not confirmed: %s", self.topic, e)
        await self.request(seek=seek, on_success=lambda: self._after_seek(target, start_filter))

    def _after_seek(self, target: MessageId | int, start_filter: StartFilter | None) -> None:
        """Runs as the seek's CommandSuccess is read, so that every message
        read after it comes from the new position and is kept."""
        self.tracker.clear()
        removed = self.queue.remove_if(lambda m: m._consumer is self)
        self._return_permits(len(removed))
        if self.unacked is not None:
            self.unacked.clear()
        self.nacks.clear()
        self.splitter.clear()
        self.splitter.start_filter = start_filter
        self._pending_redeliver.clear()
        self._redeliver_all = False
        self.reached_end_of_topic = False
        if not self.durable:
            self.last_dequeued = None
            if isinstance(target, MessageId):
                self._start_id, self._start_inclusive = target, True
        self._wake.set()

    async def unsubscribe(self) -> None:
        """Delete the subscription on the broker, then close.  Raises the
        broker's error (e.g. other consumers still connected)."""
        await self.request(unsubscribe=pb.Unsubscribe(), on_success=lambda: setattr(self, "_stopping", True))
        await self.close(flush=False)

    # ------------------------------------------------------------------ maintenance
    async def _maintenance(self) -> None:
        """Sends flows, grouped acks and redeliveries; fires ack timeouts,
        negative-ack delays and chunk expiry."""
        while not self.closed:
            if self._call is None:
                # Disconnected: nothing can be sent (pending acks wait for the next stream,
                # which sends them first).  Do not spin on deadlines already passed.
                try:
                    await asyncio.wait_for(self._connected.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass
                continue
            self._wake.clear()
            now = now_ms()
            if self._call is not None:
                try:
                    await self._maintain(now)
                except ConnectError as e:
                    log.debug("[%s] maintenance: %s", self.topic, e)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001
                    log.exception("[%s] consumer maintenance failed", self.topic)
            deadline = self._next_deadline(now)
            timeout = None if deadline is None else max(0.0, (deadline - now_ms()) / 1000)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    def _next_deadline(self, now: int) -> int | None:
        candidates = [self.tracker.flush_due_ms(), self.nacks.next_deadline_ms()]
        if self.unacked is not None:
            candidates.append(self.unacked.next_deadline_ms())
        if len(self.splitter.chunks):
            candidates.append(now + _CHUNK_EXPIRY_CHECK_MS)
        due = [c for c in candidates if c is not None]
        return min(due) if due else None

    async def _maintain(self, now: int) -> None:
        expired = self.nacks.expired(now)
        if self.unacked is not None:
            expired += self.unacked.expired(now)
        if expired:
            self.redeliver_unacknowledged(expired)
        if len(self.splitter.chunks):
            for mid in self.splitter.expire_chunks(now):
                if self.tracker.add_individual(mid, now):
                    self._flush_now = True
        requests = []
        if self._pending_flow:
            requests.append(pb.ConsumerRequest(flow=pb.Flow(permits=self._pending_flow)))
            self._pending_flow = 0
        due = self.tracker.flush_due_ms()
        if due is not None and (self._flush_now or now >= due):
            self._flush_now = False
            requests.extend(pb.ConsumerRequest(ack=ack) for ack in self._take_acks())
        if self._redeliver_all:
            self._redeliver_all = False
            self._pending_redeliver.clear()
            requests.append(pb.ConsumerRequest(redeliver=pb.RedeliverUnacknowledged(consumer_epoch=self._epoch)))
        elif self._pending_redeliver:
            positions = [_position(p) for p in self._pending_redeliver]
            self._pending_redeliver.clear()
            requests.append(pb.ConsumerRequest(redeliver=pb.RedeliverUnacknowledged(positions=positions)))
        for req in requests:
            await self._write(req)
