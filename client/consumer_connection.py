"""The gRPC stream of one consumer (Pulsar's ConnectionHandler plus the
ClientCnx side of ConsumerImpl): look up the broker that serves the topic
(``AsyncClient.lookup_topic``; forgotten and looked up again whenever a
stream fails or breaks), open the bidi ``Consume`` stream there and
subscribe, read it and dispatch each response, reconnect with ``Backoff``
when it breaks, give up on a non-retriable error, write requests, and match
requests carrying a request id (seek, unsubscribe, acks that wait) with the
broker's CommandSuccess / CommandError.

``ConsumerConnection`` is the base class of ``client.consumer_impl.ConsumerImpl``,
which keeps the receive / ack / redelivery bookkeeping and provides the
hooks this class calls (see its docstring).  Everything runs on the client's
event loop.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Callable

import grpc

from client.connection import Backoff
from client.lookup import reconnect_delay
from client.errors import AlreadyClosed, ConnectError, PulsarException, ServiceNotReady, Timeout, \
    error_from_status
from proto import broker_pb2 as pb

__all__ = ["ConsumerConnection"]

log = logging.getLogger("client.consumer_impl")  # the logger name of before the split


class ConsumerConnection:
    """The stream of one consumer of ``topic`` on ``client`` (the AsyncClient:
    ``lookup_topic``, ``broker_stub``, ``invalidate_lookup``,
    ``operation_timeout_seconds`` in seconds); ``on_failed(consumer, exc)``:
    called once when reconnecting is given up.  Must be created on the
    client's running event loop (``RuntimeError`` otherwise).

    State: ``closed``, ``failed`` (the ``PulsarException`` it gave up on), the counts
    ``frames_received``, ``entries_received``, ``stale_entries_dropped`` and ``reconnections``,
    ``_call`` (the current stream, None while disconnected), ``broker`` (the
    ``client.lookup.LookupResult`` of the last connection attempt, None before
    its lookup answered), ``_connected``
    (event), ``_requests`` (request id -> future) with ``_on_success``
    callbacks, ``_request_ids``, ``_run_task``; ``_stopping`` (unsubscribed:
    the broker ends the stream, do not reconnect).

    Hooks and attributes the subclass (``ConsumerImpl``) provides:
    ``conf`` (subscription name), ``consumer_name``, ``queue`` / ``_owns_queue``,
    ``_subscribe_request()`` (the Subscribe), ``async _on_subscribed(call,
    timeout)`` (first requests of a new stream), ``_on_connection_lost()``,
    ``_requeue_acks()``, ``_on_entries(entries)``, ``_drop_stale(entries)``,
    ``_epoch``, ``_ack_answered(request_id, error)`` (acks in flight, True if it was one),
    ``active`` and ``reached_end_of_topic``.
    """

    def __init__(self, client, topic: str,
                 on_failed: Callable[["ConsumerConnection", PulsarException], None] | None = None):
        self._client = client
        self._loop = asyncio.get_running_loop()
        self.topic = topic
        self._on_failed = on_failed
        self.closed = False
        self._stopping = False  # unsubscribed: the broker ends the stream, do not reconnect
        self.failed: PulsarException | None = None
        self._call = None
        self.broker = None  # client.lookup.LookupResult of the current / last connection attempt
        self._connected = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._request_ids = itertools.count(1)
        self._requests: dict[int, asyncio.Future] = {}
        self._on_success: dict[int, Callable[[], None]] = {}
        self._run_task: asyncio.Task | None = None
        # What this consumer's streams brought (counts, across reconnections; for stats and
        # diagnosis): MessageBatch frames, their entries, and entries dropped as frames of an
        # older consumer epoch (PIP-84). Pulsar's ConsumerStats keeps similar totals.
        self.frames_received = 0
        self.entries_received = 0
        self.stale_entries_dropped = 0
        self.reconnections = 0   # streams opened again after one broke (count)

    # ------------------------------------------------------------------ stream
    async def _connect(self) -> None:
        """Look the topic up, open a Consume stream on its broker, subscribe
        (``_subscribe_request``), then let ``_on_subscribed`` resend pending acks
        and grant the first permits.

        Timeouts use ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11,
        ``wait_for`` returns the inner result when the task is cancelled in the same
        loop iteration as the answer arrives, swallowing the cancellation; a
        consumer closed at that moment then kept its stream (and an Exclusive
        subscription: ConsumerBusy for everyone after it).  Raises the lookup's or
        the broker's error, ``Timeout``, or ``AlreadyClosed`` when the consumer was
        closed meanwhile."""
        timeout = self._client.operation_timeout_seconds
        self.broker = None
        self.broker = await self._client.lookup_topic(self.topic)
        call = (await self._client.connected_stub(self.broker)).Consume()
        try:
            async with asyncio.timeout(timeout):
                await call.write(self._subscribe_request())
                while True:
                    resp = await call.read()
                    if resp is grpc.aio.EOF:
                        raise ConnectError(f"broker closed the consumer stream of {self.topic} while subscribing")
                    kind = resp.WhichOneof("response")
                    if kind == "subscribed":
                        break
                    if kind == "error":
                        raise error_from_status(resp.error.error, resp.error.message)
                    self._handle(resp)
            if self.closed:
                raise AlreadyClosed(f"consumer of {self.topic} was closed while subscribing")
            await self._on_subscribed(call, timeout)
        except grpc.aio.AioRpcError as e:
            self._connect_failed(call)
            raise error_from_status(e.code(), e.details()) from None
        except TimeoutError:
            self._connect_failed(call)
            raise Timeout(f"subscribing to {self.topic} took more than {timeout} s") from None
        except BaseException:
            self._connect_failed(call)
            raise
        self._call = call
        self._connected.set()

    def _connect_failed(self, call) -> None:
        """Subscribing on ``call`` failed: cancel it; acks written on it are pending again;
        the topic is looked up again next time."""
        call.cancel()
        self._client.invalidate_lookup(self.topic)
        self._requeue_acks()

    async def _connect_first(self) -> None:
        """The first ``_connect`` of a consumer.  Errors raise at once, as before
        lookups, except while the topic's owner is not settled (Pulsar retries
        subscribing on retriable errors): a lookup refused with
        ``ServiceNotReady`` (no broker can take the topic yet), or a looked-up
        owner other than the service URL that refuses (``ServiceNotReady``: not
        served there) or cannot be reached (``ConnectError``); those are retried
        with ``Backoff(0.1, 30.0)`` (seconds), the topic looked up again each
        time, until ``operation_timeout_seconds`` have passed (then the last
        error is raised)."""
        timeout = self._client.operation_timeout_seconds
        backoff = Backoff(0.1, 30.0, mandatory_stop=timeout)
        while True:
            try:
                await self._connect()
                return
            except (ServiceNotReady, ConnectError) as e:
                owner_moving = isinstance(e, ServiceNotReady) if self.broker is None \
                    else not self.broker.proxy_through_service_url
                if self.closed or not owner_moving or backoff.elapsed() >= timeout:
                    raise
                delay = backoff.next()
                log.info("[%s][%s] subscribing failed (%s); looking the topic up again in %.2fs", self.topic,
                         self.conf.subscription_name, e, delay)
                await asyncio.sleep(delay)

    async def _run(self) -> None:
        """Read the stream; on a break, reconnect with backoff."""
        while True:
            call = self._call
            try:
                while True:
                    resp = await call.read()
                    if resp is grpc.aio.EOF:
                        break
                    self._handle(resp)
                error: PulsarException = ConnectError("broker ended the consumer stream")
            except grpc.aio.AioRpcError as e:
                error = error_from_status(e.code(), e.details())
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise
                # the call was cancelled locally (grpc.aio cancels it when a write is cancelled)
                error = ConnectError("consumer stream cancelled")
            except Exception as e:  # noqa: BLE001 - keep the consumer alive, reconnect
                log.exception("[%s][%s] consumer stream failed", self.topic, self.conf.subscription_name)
                error = ConnectError(str(e))
            if self.closed or self._stopping:
                return
            log.info("[%s][%s] consumer disconnected (%s); reconnecting", self.topic,
                     self.conf.subscription_name, error)
            self._on_disconnected(error)
            if not await self._reconnect():
                return

    def _on_disconnected(self, error: PulsarException) -> None:
        """The stream broke with ``error``: forget it, fail the requests waiting on it
        (``ConnectError``), then ``_on_connection_lost``."""
        call, self._call = self._call, None
        self._connected.clear()
        self._client.invalidate_lookup(self.topic)  # unloaded, moved, broker gone: look it up again
        if call is not None:
            call.cancel()
        for fut in self._requests.values():
            if not fut.done():
                fut.set_exception(ConnectError(f"connection to the broker lost: {error}"))
        self._on_connection_lost()

    async def _reconnect(self) -> bool:
        """Reconnect with ``Backoff(0.1, 30.0)`` (seconds) until it works (True) or
        the consumer is closed or gives up on a non-retriable error (``_fail``, False)."""
        backoff = Backoff(0.1, 30.0)
        last_error: BaseException | None = None
        while not self.closed:
            await asyncio.sleep(reconnect_delay(backoff.next(), self.broker, last_error))
            if self.closed:
                return False
            try:
                await self._connect()
                self.reconnections += 1
                log.info("[%s][%s] consumer %s reconnected", self.topic, self.conf.subscription_name,
                         self.consumer_name)
                return True
            except PulsarException as e:
                if self.closed:
                    return False
                if not e.retriable and not isinstance(e, Timeout):
                    log.error("[%s][%s] giving up reconnecting: %s", self.topic, self.conf.subscription_name, e)
                    self._fail(e)
                    return False
                last_error = e
                log.info("[%s][%s] reconnect failed (%s)", self.topic, self.conf.subscription_name, e)
            except Exception as e:  # noqa: BLE001 - e.g. the channel was closed under us
                if self.closed:
                    return False
                log.warning("[%s][%s] reconnect failed: %r", self.topic, self.conf.subscription_name, e)
        return False

    def _fail(self, exc: PulsarException) -> None:
        """Give up for good with ``exc``: ``failed`` is raised by later requests, an own
        queue is closed with it (receive raises it), ``on_failed(self, exc)`` is called."""
        self.failed = exc
        if self._owns_queue:
            self.queue.close(exc)
        if self._on_failed is not None:
            self._on_failed(self, exc)

    # ------------------------------------------------------------------ event loop
    def in_loop(self, fn, *args) -> None:
        """Run ``fn(*args)`` now if on the loop's thread, else schedule it there."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    # ------------------------------------------------------------------ sending
    async def _write(self, request: pb.ConsumerRequest) -> None:
        """Write one request on the current stream (serialised by the write lock);
        raises ``ConnectError`` when there is none or it broke."""
        call = self._call
        if call is None:
            raise ConnectError(f"consumer of {self.topic} is not connected")
        try:
            async with self._write_lock:
                await call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as e:
            raise ConnectError(f"consumer stream of {self.topic} is broken: {e}") from None
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise
            # grpc.aio raises CancelledError on a call cancelled under us (stream replaced)
            raise ConnectError(f"consumer stream of {self.topic} was cancelled") from None

    async def _wait_connected(self) -> None:
        """Wait (operation timeout) for a stream; raises ``AlreadyClosed``, the
        failure of a consumer that gave up, or ``Timeout``."""
        if self.closed:
            raise AlreadyClosed("consumer is closed")
        if self.failed is not None:
            raise self.failed
        if self._call is None:
            try:
                await asyncio.wait_for(self._connected.wait(), self._client.operation_timeout_seconds)
            except asyncio.TimeoutError:
                raise Timeout(f"consumer of {self.topic} is not connected to the broker") from None

    async def request(self, **command) -> None:
        """Send a command carrying a request id (``seek=pb.Seek(...)``,
        ``unsubscribe=...``, ``ack=...``) and wait for CommandSuccess; raises
        the CommandError as its client exception, ``Timeout`` after the
        operation timeout, ``ConnectError`` if the stream breaks meanwhile,
        ``AlreadyClosed``.  ``on_success=callable`` may be given (see ``_request``)."""
        await self._wait_connected()
        await self._request(**command)

    async def _request(self, on_success: Callable[[], None] | None = None, **command) -> None:
        """``request`` without the open/connected checks (used while closing).
        ``on_success`` runs when the CommandSuccess is read, before any later
        response of the stream is handled."""
        (field, body), = command.items()
        rid = next(self._request_ids)
        body.request_id = rid
        fut = self._loop.create_future()
        self._requests[rid] = fut
        if on_success is not None:
            self._on_success[rid] = on_success
        try:
            await self._write(pb.ConsumerRequest(**{field: body}))
            await asyncio.wait_for(fut, self._client.operation_timeout_seconds)
        except asyncio.TimeoutError:
            raise Timeout(f"{field} on {self.topic}: no answer within "
                          f"{self._client.operation_timeout_seconds} s") from None
        finally:
            self._requests.pop(rid, None)
            self._on_success.pop(rid, None)

    # ------------------------------------------------------------------ receiving
    def _handle(self, resp: pb.ConsumerResponse) -> None:
        """Dispatch one response of the stream (Pulsar's ClientCnx handlers): entries to
        ``_on_entries`` (or ``_drop_stale`` for an older consumer epoch), CommandSuccess /
        CommandError to the ack receipts and waiting requests, active-consumer changes
        (Failover) and end of topic to their flags."""
        kind = resp.WhichOneof("response")
        if kind == "messages":
            batch = resp.messages
            self.frames_received += 1
            self.entries_received += len(batch.entries)
            if batch.consumer_epoch < self._epoch:
                self.stale_entries_dropped += len(batch.entries)
                self._drop_stale(batch.entries)
            else:
                self._on_entries(batch.entries)
        elif kind in ("success", "error"):
            body = getattr(resp, kind)
            if self._ack_answered(body.request_id,
                                  error_from_status(body.error, body.message) if kind == "error" else None):
                return
            fut = self._requests.get(body.request_id)
            if fut is not None and not fut.done():
                if kind == "success":
                    callback = self._on_success.pop(body.request_id, None)
                    if callback is not None:
                        callback()
                    fut.set_result(None)
                else:
                    fut.set_exception(error_from_status(body.error, body.message))
            elif kind == "error":
                log.warning("[%s][%s] broker error: %s: %s", self.topic, self.conf.subscription_name,
                            body.error, body.message)
        elif kind == "active_change":
            self.active = resp.active_change.is_active
        elif kind == "end_of_topic":
            self.reached_end_of_topic = True
