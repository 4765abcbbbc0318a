"""The asyncio producer of one topic or partition (Pulsar's ProducerImpl plus
its ConnectionHandler).

Moving parts (the pure ones: ``client.message_accumulator``, ``client.pending_queue``):

- ``send``/``send_async`` turn the arguments into a ``PendingMessage`` and give
  it to the ``MessageAccumulator`` (sequence id, batch container, compression,
  chunking), which hands back ``OpSendMsg``s for the ``PendingQueue``;
- a connection task keeps one bidi ``Produce`` stream, opened on the broker
  that serves the topic (``AsyncClient.lookup_topic``, looked up again after
  every failure, Pulsar's ConnectionHandler.grabCnx): ``create`` first, then
  a writer that coalesces every unsent op into one ``SendBatch`` frame and a
  reader that completes ops from ``ReceiptBatch``es in order; when the stream
  breaks it reconnects with ``Backoff`` and writes the whole pending queue
  again, in order (the broker deduplicates);
- loop timers close a batch after ``batching_max_publish_delay_ms`` and fail
  ops older than ``send_timeout_millis`` with ``Timeout``.

Everything runs on the client's event loop; callbacks are called there.
"""
from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections import deque

import grpc

from client.batching import PendingMessage
from client.connection import Backoff, is_retriable, map_rpc_error
from client.lookup import reconnect_delay
from client.errors import (AlreadyClosed, AuthenticationError, AuthorizationError, ConnectError, InvalidTopicName,
                           NotAllowed, ProducerQueueIsFull, PulsarException, ServiceNotReady, Timeout, TopicNotFound,
                           TopicTerminated, error_from_status)
from client.message_accumulator import MessageAccumulator, make_message
from client.message_id import MessageId
from client.pending_queue import OpSendMsg, PendingQueue, ReceiptAction, SendCallback, SendCompletion, is_duplicate
from client.producer_config import ProducerConfig
from proto import broker_pb2 as pb

__all__ = ["Producer", "SendCallback", "is_duplicate"]

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 8 * 1024 * 1024  # coalesce Sends into frames of up to this many bytes (one op may be larger)
_FATAL = (TopicTerminated, TopicNotFound, AuthorizationError, AuthenticationError, InvalidTopicName, NotAllowed)
_CONNECTING, _READY, _CLOSING, _CLOSED, _FAILED = "connecting", "ready", "closing", "closed", "failed"


def _future_callback(fut: asyncio.Future) -> SendCallback:
    def settle(exc, msg_id):
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(msg_id)
    return settle


class Producer:
    """Asyncio producer of one topic or one partition (Pulsar's ProducerImpl).

    Create with ``await AsyncClient.create_producer(topic, **options)`` (options:
    ``client.producer_config.ProducerConfig``).  Message ids it returns carry
    ``partition`` (-1 unless created by a ``PartitionedProducer``), and for a
    batched message ``batch_index``/``batch_size``; a send the broker's
    deduplication dropped gets ``MessageId(-1, -1)`` (``is_duplicate(id)``;
    see ``send``).
    """

    def __init__(self, client, topic: str, conf: ProducerConfig, partition: int = -1):
        self._client = client
        self._topic = topic
        self._conf = conf
        self._partition = partition
        self._name = conf.producer_name or ""
        self._acc = MessageAccumulator(
            producer_name=self._name, partition=partition, batching_enabled=conf.batching_enabled,
            batching_type=conf.batching_type, batching_max_messages=conf.batching_max_messages,
            batching_max_bytes=conf.batching_max_allowed_size_in_bytes, compression=conf.compression_type,
            chunking_enabled=conf.chunking_enabled)
        self._queue = PendingQueue()
        self._state = _CONNECTING
        self._error: PulsarException | None = None  # why the producer failed
        self._num_pending = 0  # messages holding a permit
        self._blocked: deque[PendingMessage] = deque()  # waiting for a permit (block_if_queue_full)
        self._last: SendCompletion | None = None
        self._wakeup = asyncio.Event()
        self._call = None
        self._abandon: asyncio.Future | None = None   # set by _abandon_stream: leave the current stream
        self._broker = None  # client.lookup.LookupResult of the current / last connection attempt
        self._created: asyncio.Future | None = None
        self._task: asyncio.Task | None = None
        self._batch_timer: asyncio.TimerHandle | None = None
        self._timeout_timer: asyncio.TimerHandle | None = None
        self._last_send_error: str | None = None  # the broker's last retriable SendError, for Timeout
        self._loop = client.loop

    # -- life cycle -------------------------------------------------------------
    async def _start(self) -> "Producer":
        """Connect and wait for ``ProducerSuccess``.  Raises the broker's error
        (``ProducerBusy``, ``TopicNotFound``, ...) or ``ConnectError``/``Timeout``
        when the broker is unreachable for ``operation_timeout_seconds``."""
        self._created = self._loop.create_future()
        self._task = self._loop.create_task(self._run(), name=f"producer {self._topic}")
        try:
            await self._created
        except BaseException:
            self._state = _CLOSED
            self._task.cancel()
            raise
        return self

    async def close(self) -> None:
        """Flush (bounded by ``operation_timeout_seconds``), half-close the stream
        so the broker releases the producer name, and fail what is left with
        ``AlreadyClosed``.  Idempotent."""
        if self._state in (_CLOSED, _CLOSING):
            return
        if self._state != _FAILED:
            try:
                await asyncio.wait_for(self.flush(), self._client.operation_timeout_seconds)
            except (PulsarException, asyncio.TimeoutError):
                pass
        connected = self._state == _READY
        self._state = _CLOSING
        self._wakeup.set()  # the writer half-closes the stream
        if self._task is not None and not self._task.done():
            try:
                if not connected:  # nothing to half-close: stop reconnecting now
                    raise asyncio.TimeoutError
                await asyncio.wait_for(asyncio.shield(self._task), min(5.0, self._client.operation_timeout_seconds))
            except (asyncio.TimeoutError, Exception):
                pass
            self._task.cancel()
        self._state = _CLOSED
        self._fail_everything(AlreadyClosed(f"producer {self._name} on {self._topic} was closed"))
        self._client._unregister(self)

    async def flush(self) -> None:
        """Send the open batch now and wait until every message given so far is
        settled (persisted, failed or timed out); errors go to their sends.
        Raises ``AlreadyClosed`` after close."""
        self._check_usable()
        self._enqueue(self._acc.flush())
        last = self._last
        if last is not None and not last.done:
            fut = self._loop.create_future()
            last.waiters.append(fut)
            await fut

    # -- sending ------------------------------------------------------------------
    async def send(self, content: bytes, properties: dict | None = None, partition_key: str | None = None,
                   ordering_key: bytes | str | None = None, sequence_id: int | None = None,
                   event_timestamp: int | None = None, replication_clusters: list[str] | None = None,
                   disable_replication: bool = False, deliver_after: datetime.timedelta | None = None,
                   deliver_at: int | None = None) -> MessageId:
        """Publish ``content`` (bytes) and wait until it is persisted; returns its
        ``MessageId``.  ``properties``: str -> str; ``event_timestamp``: ms since
        epoch; ``deliver_after``: timedelta, ``deliver_at``: ms since epoch
        (delayed messages are sent unbatched); ``replication_clusters``: geo
        targets; ``disable_replication``: keep local.  Raises ``MessageTooBig``,
        ``ProducerQueueIsFull``, ``Timeout``, ``AlreadyClosed``,
        ``TopicTerminated`` or the broker's error.

        Duplicates: a send the broker drops because it already stored this
        producer name's ``sequence_id`` returns ``MessageId(-1, -1)`` (Pulsar's
        ``-1:-1`` receipt; ``client.producer.is_duplicate(id)`` is True, and the
        id is not a position: do not seek or acknowledge with it).  Nothing new
        was stored by this call and the stored copy's id is unknown.  That
        happens when the application sends a sequence id again (at or below
        ``last_sequence_id()``, deduplication on), and after a reconnect for a
        message whose first transmission was stored but whose receipt was
        lost: it is stored once and not sent again.  Every other successful
        send returns the id of the stored message: with deduplication on the
        SDK sends generated sequence ids so that the broker never takes a new
        message for a duplicate (KeyBased batches go out under their highest
        sequence id, in increasing order, Pulsar #15413).  A message the broker
        refused and then dropped as a duplicate of later messages it stored
        meanwhile was never stored: that send raises ``ServiceNotReady``, it
        does not return -1:-1.  An application ``sequence_id`` below ids the
        broker stored after it, that was itself never stored (skipped, or failed
        by a send timeout while later sends got through), is refused with
        ``PreconditionFailed``, not answered -1:-1.  A send timeout
        (``send_timeout_millis``) fails every pending message of the producer
        with ``Timeout``, in send order (Pulsar's failPendingMessages), and the
        producer looks its topic up again through another host."""
        fut = self._loop.create_future()
        self._send(content, _future_callback(fut), properties, partition_key, ordering_key, sequence_id,
                   event_timestamp, replication_clusters, disable_replication, deliver_after, deliver_at)
        return await fut

    def send_async(self, content: bytes, callback: SendCallback, properties: dict | None = None,
                   partition_key: str | None = None, ordering_key: bytes | str | None = None,
                   sequence_id: int | None = None, event_timestamp: int | None = None,
                   replication_clusters: list[str] | None = None, disable_replication: bool = False,
                   deliver_after: datetime.timedelta | None = None, deliver_at: int | None = None) -> None:
        """Publish without waiting: ``callback(exception_or_None, message_id_or_None)``
        is called on the event loop once the message is persisted or failed
        (also for immediate errors such as ``ProducerQueueIsFull``).  Arguments as
        ``send``; a dropped duplicate gets ``MessageId(-1, -1)`` as there.  Call
        from the client's event loop."""
        if callback is None:
            callback = _ignore
        try:
            self._send(content, callback, properties, partition_key, ordering_key, sequence_id,
                       event_timestamp, replication_clusters, disable_replication, deliver_after, deliver_at)
        except PulsarException as exc:
            self._loop.call_soon(_safe_call, callback, exc, None)

    def _send(self, content, callback, properties, partition_key, ordering_key, sequence_id, event_timestamp,
              replication_clusters, disable_replication, deliver_after, deliver_at) -> None:
        self._check_usable()
        msg = make_message(content, properties, partition_key, ordering_key, sequence_id, event_timestamp,
                            replication_clusters, disable_replication, deliver_after, deliver_at)
        done = msg.callback = SendCompletion(callback)
        limit = self._conf.max_pending_messages
        if self._blocked or (limit > 0 and self._num_pending >= limit):
            if not self._conf.block_if_queue_full:
                raise ProducerQueueIsFull(f"producer {self._name} on {self._topic} has {self._num_pending} pending "
                                          f"messages (max_pending_messages={limit}); wait for pending sends, raise "
                                          "max_pending_messages, or enable block_if_queue_full")
            self._blocked.append(msg)
        else:
            self._accept(msg)  # may raise MessageTooBig: nothing was queued
        self._last = done

    def _accept(self, msg: PendingMessage) -> None:
        ops = self._acc.add(msg)
        msg.callback.counted = True
        self._num_pending += 1
        self._enqueue(ops)
        if self._acc.has_batch():
            self._arm_batch_timer()

    def _enqueue(self, ops: list[OpSendMsg]) -> None:
        if not ops:
            return
        self._queue.extend(ops)
        if self._state == _READY:
            self._wakeup.set()
        if self._timeout_timer is None and self._conf.send_timeout_millis > 0:
            self._arm_timeout_timer()

    def _settle(self, msg: PendingMessage, exc: PulsarException | None, msg_id: MessageId | None) -> None:
        done: SendCompletion = msg.callback
        counted = done.counted
        if done.fire(exc, msg_id) and counted:
            self._num_pending -= 1
            self._admit_blocked()

    def _admit_blocked(self) -> None:
        limit = self._conf.max_pending_messages
        while self._blocked and (limit <= 0 or self._num_pending < limit) and self._state in (_READY, _CONNECTING):
            msg = self._blocked.popleft()
            try:
                self._accept(msg)
            except PulsarException as exc:
                self._settle(msg, exc, None)

    # -- timers -----------------------------------------------------------------
    def _arm_batch_timer(self) -> None:
        if self._batch_timer is not None:
            return
        delay = self._conf.batching_max_publish_delay_ms / 1000.0
        self._batch_timer = self._loop.call_later(delay, self._on_batch_timer)

    def _on_batch_timer(self) -> None:
        self._batch_timer = None
        if self._state not in (_READY, _CONNECTING) or not self._acc.has_batch():
            return
        delay = self._conf.batching_max_publish_delay_ms
        if self._acc.batch_due(delay):
            self._enqueue(self._acc.flush())
        else:  # a newer batch: wait for the rest of its delay
            remaining = delay - (time.monotonic() * 1000 - (self._acc.batch_created_ms or 0))
            self._batch_timer = self._loop.call_later(max(0.0, remaining) / 1000.0, self._on_batch_timer)

    def _arm_timeout_timer(self) -> None:
        oldest = self._queue.oldest_created_ms()
        if oldest is None:
            self._timeout_timer = None
            return
        delay = oldest + self._conf.send_timeout_millis - time.monotonic() * 1000
        self._timeout_timer = self._loop.call_later(max(0.0, delay) / 1000.0 + 0.001, self._on_timeout_timer)

    def _on_timeout_timer(self) -> None:
        self._timeout_timer = None
        if self._state in (_CLOSED, _FAILED):
            return
        expired = self._queue.expire(time.monotonic() * 1000, self._conf.send_timeout_millis)
        if expired:
            cause = f"; the broker's last answer: {self._last_send_error}" if self._last_send_error else ""
            exc = Timeout(f"message(s) not persisted within send_timeout_millis={self._conf.send_timeout_millis} "
                          f"on {self._topic} (producer {self._name}){cause}; check the broker, or raise the timeout")
            # ProducerImpl.failPendingMessages: a send timeout fails every pending message, in order
            # (the batch being built included), so that nothing sent later is stored while an
            # earlier one failed: the application's resends keep its order
            expired += self._queue.clear()
            for op in expired:
                self._settle_op_failure(op, exc)
            for msg in self._acc.take_batch():
                self._settle(msg, exc, None)
            # the stream that left them unanswered is not trusted any more (a paused owner keeps
            # its TCP connection open): drop it and look the topic up again through another host
            self._abandon_stream(f"no receipt within send_timeout_millis={self._conf.send_timeout_millis}")
        if self._timeout_timer is None:
            self._arm_timeout_timer()

    # -- connection -----------------------------------------------------------------
    async def _run(self) -> None:
        timeout = self._client.operation_timeout_seconds
        backoff = Backoff(0.1, 30.0, mandatory_stop=timeout)
        while self._state in (_CONNECTING, _READY):
            call = None
            self._broker = None
            try:
                self._broker = await self._client.lookup_topic(self._topic)
                call = (await self._client.connected_stub(self._broker)).Produce()
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
                # cancellation that lands as the answer arrives, and a producer closed
                # then would keep its stream (ProducerBusy for its name).
                async with asyncio.timeout(timeout):
                    await self._create(call)
                if self._state not in (_CONNECTING, _READY):
                    call.cancel()
                    return
                backoff.reset()
                await self._serve(call)
                if self._state == _CLOSING:
                    return
                raise ConnectError(f"broker closed the producer stream of {self._topic}")
            except asyncio.CancelledError:
                if call is not None:
                    call.cancel()
                raise
            except Exception as exc:  # decide between retry and fail
                if call is not None:
                    call.cancel()
                err = _as_pulsar(exc, f"producer on {self._topic}")
            # not served there any more, connection lost, owner gone...: look the topic up again
            self._client.invalidate_lookup(self._topic)
            if self._state not in (_CONNECTING, _READY):
                return
            self._state = _CONNECTING
            first = not self._created.done()
            if first and (not err.retriable_at_creation or backoff.elapsed() >= timeout):
                self._created.set_exception(err)
                return
            if not first and isinstance(err, _FATAL):
                self._fail(err)
                return
            delay = reconnect_delay(backoff.next(), self._broker, err)
            log.info("[%s] [%s] producer disconnected (%s); reconnecting in %.2fs", self._topic, self._name,
                     err, delay)
            await asyncio.sleep(delay)

    async def _create(self, call) -> None:
        create = pb.CreateProducer(topic=self._topic, producer_name=self._name, metadata=self._conf.properties,
                                   is_replicator=self._conf.is_replicator)
        await call.write(pb.ProducerRequest(create=create))
        resp = await call.read()
        if resp is grpc.aio.EOF:
            raise ConnectError(f"broker ended the stream before creating the producer on {self._topic}")
        kind = resp.WhichOneof("response")
        if kind == "send_error":
            raise error_from_status(resp.send_error.error, resp.send_error.message)
        if kind != "success":
            raise ConnectError(f"unexpected first answer {kind!r} on the producer stream of {self._topic}")
        ok = resp.success
        first = not self._created.done()
        self._name = ok.producer_name or self._name
        self._acc.producer_name = self._name
        self._acc.set_max_message_size(ok.max_message_size)
        if ok.topic:
            self._topic = ok.topic
        if first:
            self._acc.init_sequence_ids(ok.last_sequence_id, self._conf.initial_sequence_id)
        else:
            self._settle_stored(self._queue.drop_stored(_signed(ok.last_sequence_id)))
        self._queue.mark_all_unsent()
        if self._state == _CONNECTING:
            self._state = _READY
        self._wakeup.set()
        if first:
            self._created.set_result(None)
        log.info("[%s] [%s] producer ready on %s (last sequence id %s, max message size %s bytes)", self._topic,
                 self._name, getattr(self._broker, "broker_url", "?"), ok.last_sequence_id, ok.max_message_size)

    def _abandon_stream(self, why: str) -> None:
        """Give up the current stream (``why``: no answer in time): the connection task looks the
        topic up again, starting at another host of the service URL than this owner's."""
        abandon = self._abandon
        if abandon is not None and not abandon.done():
            if self._broker is not None and not self._broker.proxy_through_service_url:
                self._client.mark_host_unresponsive(self._broker.target)
            abandon.set_result(why)

    async def _serve(self, call) -> None:
        self._call = call
        self._abandon = self._loop.create_future()
        writer = self._loop.create_task(self._write_loop(call))
        reader = self._loop.create_task(self._read_loop(call))
        try:
            done, _ = await asyncio.wait({writer, reader, self._abandon}, return_when=asyncio.FIRST_COMPLETED)
            if self._abandon.done():
                raise ConnectError(f"producer stream of {self._topic} abandoned: {self._abandon.result()}; "
                                   "looking the topic up again")
            if reader not in done:  # writer ended: half-closed on close(), or failed
                if writer.exception() is not None:
                    raise writer.exception()
                await reader
            elif reader.exception() is not None:
                raise reader.exception()
        finally:
            self._call = None
            for t in (writer, reader):
                t.cancel()

    async def _write_loop(self, call) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while True:
                ops = self._queue.take_unsent(MAX_FRAME_BYTES)
                if not ops:
                    break
                await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=[op.to_proto() for op in ops])))
            if self._state == _CLOSING:
                await call.done_writing()
                return

    async def _read_loop(self, call) -> None:
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                return
            kind = resp.WhichOneof("response")
            if kind == "receipts":
                for r in resp.receipts.receipts:
                    self._on_receipt(r)
            elif kind == "send_error":
                self._on_send_error(resp.send_error)
            elif kind == "send_errors":
                for e in resp.send_errors.errors:
                    self._on_send_error(e)

    def _on_receipt(self, r: pb.SendReceipt) -> None:
        self._last_send_error = None
        seq, highest = _signed(r.sequence_id), _signed(r.highest_sequence_id)
        action, op = self._queue.on_receipt(seq, highest)
        if action is ReceiptAction.IGNORE:
            return
        if action is ReceiptAction.RECONNECT:
            raise ConnectError(f"receipt for sequence id {seq}..{highest} does not match the pending message "
                               f"on {self._topic}; reconnecting to resend")
        self._acc.on_published(op.highest_sequence_id)
        if op.is_last_chunk:
            ledger_id, entry_id = r.message_id.ledger_id, r.message_id.entry_id
            if (ledger_id < 0 or entry_id < 0) and op.lost_as_duplicate:
                # Never stored: refused, then dropped as a duplicate of later sends the broker
                # stored meanwhile.  Not a duplicate (-1:-1): fail it so the application knows.
                self._settle_op_failure(op, ServiceNotReady(
                    f"message with sequence id {op.sequence_id} on {self._topic} was refused by the broker, "
                    f"which then stored later messages of producer {self._name}; deduplication now drops it "
                    "as a duplicate although it was never stored: it is lost, send it again"))
            else:
                ids = op.message_ids(ledger_id, entry_id, self._partition)
                for msg, mid in zip(op.messages, ids):
                    self._settle(msg, None, mid)
        _release(op)
        if self._timeout_timer is None and self._queue and self._conf.send_timeout_millis > 0:
            self._arm_timeout_timer()

    def _on_send_error(self, e: pb.SendError) -> None:
        exc = error_from_status(e.error, e.message)
        seq = _signed(e.sequence_id)
        if is_retriable(exc):
            # The broker ends the stream: reconnect and send this message again (it is not
            # stored by this transmission), then everything after it not stored meanwhile.
            self._last_send_error = f"{type(exc).__name__}: {exc}"
            self._queue.mark_refused(seq)
            raise exc
        if isinstance(exc, TopicTerminated):
            self._fail(exc)
            raise exc
        ops = self._queue.pop_sequence(seq)
        if not ops:
            raise ConnectError(f"send error for sequence id {seq} that is not the next pending message: {exc}")
        for op in ops:
            self._settle_op_failure(op, exc)

    def _settle_stored(self, ops: list[OpSendMsg]) -> None:
        """Settle ops that ``PendingQueue.drop_stored`` found stored by an
        earlier transmission whose receipt was lost: they resolve as a duplicate
        receipt would (``MessageId(-1, -1)``, see ``is_duplicate``)."""
        if ops:
            log.info("[%s] [%s] %d pending send(s) up to sequence id %s were stored before the reconnect; "
                     "not sending them again", self._topic, self._name, len(ops), ops[-1].highest_sequence_id)
        for op in ops:
            self._acc.on_published(op.highest_sequence_id)
            if op.is_last_chunk:
                for msg, mid in zip(op.messages, op.message_ids(-1, -1, self._partition)):
                    self._settle(msg, None, mid)
            _release(op)

    # -- failure -----------------------------------------------------------------
    def _settle_op_failure(self, op: OpSendMsg, exc: PulsarException) -> None:
        for msg in op.messages:
            self._settle(msg, exc, None)
        _release(op)

    def _fail(self, exc: PulsarException) -> None:
        """The producer cannot continue (topic terminated or deleted, not authorized)."""
        self._state = _FAILED
        self._error = exc
        self._fail_everything(exc)

    def _fail_everything(self, exc: PulsarException) -> None:
        for timer in (self._batch_timer, self._timeout_timer):
            if timer is not None:
                timer.cancel()
        self._batch_timer = self._timeout_timer = None
        for op in self._queue.clear():
            self._settle_op_failure(op, exc)
        for msg in self._acc.take_batch():
            self._settle(msg, exc, None)
        while self._blocked:
            self._settle(self._blocked.popleft(), exc, None)

    def _check_usable(self) -> None:
        if self._state == _FAILED and self._error is not None:
            raise type(self._error)(self._error.message)
        if self._state in (_CLOSING, _CLOSED, _FAILED):
            raise AlreadyClosed(f"producer {self._name} on {self._topic} is closed")

    # -- accessors (official names) -----------------------------------------------------
    def topic(self) -> str:
        """Full topic (or partition) name."""
        return self._topic

    def producer_name(self) -> str:
        """The producer's name (given, or generated by the broker)."""
        return self._name

    def last_sequence_id(self) -> int:
        """Sequence id of the last message the broker acknowledged (-1 if none)."""
        return self._acc.last_sequence_id_published

    def is_connected(self) -> bool:
        """True while the Produce stream is established."""
        return self._state == _READY

    @property
    def partition(self) -> int:
        """Partition index (-1 when not part of a partitioned producer)."""
        return self._partition

    @property
    def pending_count(self) -> int:
        """Messages accepted but not settled yet (count), plus blocked ones."""
        return self._num_pending + len(self._blocked)

    def __repr__(self) -> str:
        return f"<Producer {self._name!r} on {self._topic} {self._state}>"


def _as_pulsar(exc: BaseException, what: str) -> PulsarException:
    if isinstance(exc, PulsarException):
        return exc
    if isinstance(exc, grpc.aio.AioRpcError):
        return map_rpc_error(exc, what)
    if isinstance(exc, asyncio.TimeoutError):
        return Timeout(f"{what}: no answer from the broker in time")
    return ConnectError(f"{what}: {type(exc).__name__}: {exc}")


def _release(op: OpSendMsg) -> None:
    for w in op.waiters:
        if not w.done():
            w.set_result(None)


def _ignore(exc, msg_id) -> None:
    pass


def _safe_call(callback, exc, msg_id) -> None:
    try:
        callback(exc, msg_id)
    except Exception:
        log.exception("send callback raised")


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= (1 << 63) else v
