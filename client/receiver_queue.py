"""The consumer's receive queue and its flow permits (Pulsar's ConsumerImpl
``incomingMessages`` + ``availablePermits`` / ``increaseAvailablePermits``).

- ``FlowPermits`` (sans-I/O): the consumer first grants ``receiver_queue_size``
  permits (one Flow), then counts the messages the application took (or that
  the client dropped) and grants them back in one Flow once half the queue
  size is reached.  Permits count messages, not entries: a batch of 10 uses 10.
- ``ReceiverQueue``: a FIFO of received ``Message`` objects with awaitable
  ``get``; several single-topic consumers may share one (multi-topic consumer).
"""
from __future__ import annotations

import asyncio
import collections
from typing import Callable, Iterable

from client.errors import AlreadyClosed, PulsarException, Timeout

__all__ = ["FlowPermits", "ReceiverQueue"]


class FlowPermits:
    """Flow-permit accounting of one consumer (Pulsar's availablePermits and
    receiverQueueRefillThreshold = receiverQueueSize / 2).  No I/O.

    ``receiver_queue_size``: messages (>= 1).
    """

    def __init__(self, receiver_queue_size: int):
        if receiver_queue_size < 1:
            raise ValueError(f"receiver_queue_size must be >= 1, got {receiver_queue_size}")
        self.receiver_queue_size = receiver_queue_size
        self.refill_threshold = max(1, receiver_queue_size // 2)
        self.available = 0  # permits earned back, not yet sent

    def initial(self) -> int:
        """Permits of the first Flow after (re)subscribing: the queue size.
        Forgets any permits not yet sent (the broker's count restarts too)."""
        self.available = 0
        return self.receiver_queue_size

    def processed(self, count: int = 1) -> int:
        """``count`` messages left the queue (taken by the application, or
        dropped by the client: acked batch indexes, dead-lettered, corrupt).
        Returns the permits to send now in a Flow (0: not yet)."""
        if count <= 0:
            return 0
        self.available += count
        if self.available >= self.refill_threshold:
            permits, self.available = self.available, 0
            return permits
        return 0

    def take_all(self) -> int:
        """Return and reset every earned permit (e.g. after clearing the queue,
        to give the broker back what the cleared messages used)."""
        permits, self.available = self.available, 0
        return permits


class ReceiverQueue:
    """FIFO of received messages with awaitable ``get`` (Pulsar's
    ``incomingMessages`` GrowableArrayBlockingQueue).

    Unbounded: the flow permits bound what the broker pushes.  Must be used from
    the event loop's thread.  After ``close(exc)`` the waiting and future
    ``get`` calls raise ``exc`` (default ``AlreadyClosed``) once the queue is empty.
    """

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._closed: PulsarException | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item) -> None:
        """Append one message and wake one waiter."""
        if self._closed is not None:
            return
        self._items.append(item)
        self._wake()

    def put_many(self, items: Iterable) -> None:
        """Append messages in order."""
        if self._closed is not None:
            return
        self._items.extend(items)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._items:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                break

    def get_nowait(self):
        """Pop the oldest message; raises ``IndexError`` when empty (or the
        close exception when closed and empty)."""
        if self._items:
            return self._items.popleft()
        if self._closed is not None:
            raise self._closed
        raise IndexError("receiver queue is empty")

    async def get(self, timeout_s: float | None = None):
        """Pop the oldest message, waiting up to ``timeout_s`` seconds (None =
        forever).  Raises ``Timeout`` on expiry and the close exception
        (``AlreadyClosed``) when closed."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + max(0.0, timeout_s)
        while True:
            if self._items:
                return self._items.popleft()
            if self._closed is not None:
                raise self._closed
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise Timeout(f"no message received within {timeout_s * 1000:.0f} ms")
            fut = loop.create_future()
            self._waiters.append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._wake()  # pass the wake-up on
                raise
            finally:
                if not fut.done():
                    fut.cancel()
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass

    def remove_if(self, predicate: Callable[[object], bool]) -> list:
        """Remove and return (in order) the messages matching ``predicate``
        (e.g. one sub-consumer's messages on reconnect)."""
        kept, removed = collections.deque(), []
        for item in self._items:
            (removed if predicate(item) else kept).append(item)
        self._items = kept
        return removed

    def clear(self) -> list:
        """Remove and return every message."""
        items = list(self._items)
        self._items.clear()
        return items

    def close(self, exc: PulsarException | None = None) -> None:
        """Drop the messages and make ``get`` raise ``exc`` (default AlreadyClosed)."""
        self._closed = exc or AlreadyClosed("consumer is closed")
        self._items.clear()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    @property
    def closed(self) -> bool:
        """True after ``close``."""
        return self._closed is not None
