"""The consumer API shared by ``Consumer`` (one topic) and
``MultiTopicsConsumer`` (several topics, partitions or a pattern), as Pulsar's
ConsumerBase: receive, batch receive, acks, negative acks, seek, close.

Subclasses provide ``_queue`` (the ``ReceiverQueue`` messages arrive in),
``_impls()`` (their single-topic ``ConsumerImpl``s) and ``_impl_for_id(mid)``.
"""
from __future__ import annotations

import asyncio

from client.consumer_config import ConsumerConfig
from client.errors import AlreadyClosed, NotAllowed, PulsarException, Timeout
from client.message import Message
from client.message_id import MessageId
from client.receiver_queue import ReceiverQueue

__all__ = ["ConsumerBase"]


class ConsumerBase:
    """Async consumer API (pulsar-client's ``Consumer`` names).  Not instantiated directly."""

    _queue: ReceiverQueue
    _conf: ConsumerConfig

    def __init__(self, client, conf: ConsumerConfig):
        self._client = client
        self._conf = conf
        self._closed = False

    # -- for subclasses ------------------------------------------------------------
    def _impls(self) -> list:
        raise NotImplementedError

    def _impl_for_id(self, mid: MessageId):
        raise NotImplementedError

    def _resolve(self, msg_or_id):
        """-> (impl, message id, Message or None); raises AlreadyClosed / TypeError."""
        if self._closed:
            raise AlreadyClosed("consumer is closed")
        if isinstance(msg_or_id, Message):
            impl = msg_or_id._consumer
            if impl is None or impl not in self._impls():
                impl = self._impl_for_id(msg_or_id.message_id())
            return impl, msg_or_id.message_id(), msg_or_id
        if isinstance(msg_or_id, MessageId):
            return self._impl_for_id(msg_or_id), msg_or_id, None
        raise TypeError(f"expected a Message or a MessageId, got {type(msg_or_id).__name__}")

    # -- receiving -------------------------------------------------------------------
    async def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message, waiting up to ``timeout_millis`` ms (None = forever).
        Raises ``Timeout`` on expiry, ``AlreadyClosed`` once closed."""
        if self._closed:
            raise AlreadyClosed("consumer is closed")
        msg = await self._queue.get(None if timeout_millis is None else timeout_millis / 1000)
        msg._consumer.on_dequeued(msg)
        return msg

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except AlreadyClosed:
            raise StopAsyncIteration from None

    async def batch_receive(self) -> list[Message]:
        """Up to ``batch_receive_policy.max_num_messages`` messages (default
        100) or ``max_num_bytes``, waiting at most ``timeout_ms`` (default 100
        ms) for them: returns what arrived, possibly ``[]`` (Pulsar's
        batchReceive).  Raises ``AlreadyClosed``."""
        if self._closed:
            raise AlreadyClosed("consumer is closed")
        policy = self._conf.batch_receive_policy
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, policy.timeout_ms) / 1000
        out: list[Message] = []
        size = 0
        while True:
            if 0 < policy.max_num_messages <= len(out) or 0 < policy.max_num_bytes <= size:
                break
            remaining = deadline - loop.time()
            try:
                msg = self._queue.get_nowait() if remaining <= 0 else await self._queue.get(remaining)
            except (IndexError, Timeout):
                break
            msg._consumer.on_dequeued(msg)
            out.append(msg)
            size += len(msg.data())
        return out

    # -- acknowledging ---------------------------------------------------------------
    def acknowledge(self, msg_or_id: Message | MessageId) -> None:
        """Acknowledge one message (grouped: sent within ``ack_group_time_ms``).
        A message of a batch entry: see ``batch_index_ack_enabled``.  Raises
        ``AlreadyClosed``."""
        impl, mid, msg = self._resolve(msg_or_id)
        impl.in_loop(impl.ack_individual, mid, msg)

    def acknowledge_cumulative(self, msg_or_id: Message | MessageId) -> None:
        """Acknowledge every message up to and including this one (grouped).
        Raises ``NotAllowed`` on Shared/KeyShared subscriptions (as Pulsar,
        locally), ``AlreadyClosed``."""
        self._check_cumulative()
        impl, mid, _ = self._resolve(msg_or_id)
        impl.in_loop(impl.ack_cumulative, mid)

    def _check_cumulative(self) -> None:
        if not self._conf.consumer_type.allows_cumulative_ack:
            raise NotAllowed(f"cumulative ack is not allowed on a {self._conf.consumer_type.name} subscription; "
                             f"use acknowledge()")

    async def acknowledge_and_wait(self, msg_or_id: Message | MessageId) -> None:
        """``acknowledge`` then send it (and every pending ack) at once and
        wait for the broker's CommandSuccess: the ack is durable on return.
        Raises the broker's error, ``Timeout``, ``ConnectError``, ``AlreadyClosed``."""
        impl, mid, msg = self._resolve(msg_or_id)
        impl.ack_individual(mid, msg)
        await impl.flush_acks_and_wait()

    async def acknowledge_cumulative_and_wait(self, msg_or_id: Message | MessageId) -> None:
        """``acknowledge_cumulative`` and wait for the broker (see
        ``acknowledge_and_wait``).  Raises ``NotAllowed`` on Shared/KeyShared."""
        self._check_cumulative()
        impl, mid, _ = self._resolve(msg_or_id)
        impl.ack_cumulative(mid)
        await impl.flush_acks_and_wait()

    def negative_acknowledge(self, msg_or_id: Message | MessageId) -> None:
        """Ask for redelivery of this message after
        ``negative_ack_redelivery_delay_ms`` (on Exclusive/Failover everything
        unacknowledged is redelivered then, as Pulsar).  Raises ``AlreadyClosed``."""
        impl, mid, msg = self._resolve(msg_or_id)
        impl.in_loop(impl.negative_ack, mid, msg)

    def redeliver_unacknowledged_messages(self) -> None:
        """Redeliver every message received and not acknowledged (Pulsar's
        redeliverUnacknowledgedMessages)."""
        if self._closed:
            raise AlreadyClosed("consumer is closed")
        for impl in self._impls():
            impl.in_loop(impl.redeliver_unacknowledged, None)

    # -- state -------------------------------------------------------------------------
    def subscription_name(self) -> str:
        """The subscription's name."""
        return self._conf.subscription_name

    def is_connected(self) -> bool:
        """True when every underlying stream is connected."""
        return not self._closed and all(i._call is not None for i in self._impls())

    def has_reached_end_of_topic(self) -> bool:
        """True once the broker said the (terminated) topic has no more messages."""
        impls = self._impls()
        return bool(impls) and all(i.reached_end_of_topic for i in impls)

    def _failed(self) -> PulsarException | None:
        return next((i.failed for i in self._impls() if i.failed is not None), None)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self) -> None:  # pragma: no cover - subclasses
        raise NotImplementedError
