"""Synchronous facade with the official pulsar-client Python names
(``Client``, ``Producer``, consumer/reader wrappers).

The asyncio client runs on one event loop in a daemon background thread (the
role of the official client's C++ I/O threads); every blocking call submits a
coroutine to that loop and waits for its result.  Send callbacks run on that
thread, as the official client's callbacks run on its internal threads.
"""
from __future__ import annotations

import inspect
import threading
from typing import Any, Callable

from client.errors import AlreadyClosed, PulsarException
from client.loop_thread import LoopThread  # re-exported: importers use client.sync.LoopThread

__all__ = ["Client", "Producer", "SyncWrapper", "LoopThread"]


class SyncWrapper:
    """Blocking view of an asyncio object (consumer, reader, ...): each coroutine
    method becomes a blocking method of the same name and signature (run on
    the client's loop); plain methods run on the loop thread; other attributes
    pass through.  ``for msg in wrapper`` calls ``receive()`` (or ``read_next()``)
    until the object is closed; ``with wrapper:`` closes it on exit."""

    def __init__(self, target: Any, loop_thread: LoopThread):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_lt", loop_thread)

    def __getattr__(self, name: str):
        attr = getattr(self._target, name)
        if inspect.iscoroutinefunction(attr):
            def blocking(*args, **kwargs):
                return self._lt.run(attr(*args, **kwargs))
        elif callable(attr) and not isinstance(attr, type):
            def blocking(*args, **kwargs):
                result = self._lt.call(attr, *args, **kwargs)
                if inspect.isawaitable(result):  # a plain method that returned a future/coroutine
                    return self._lt.run(_await(result))
                return result
        else:
            return attr
        blocking.__name__ = name
        blocking.__doc__ = getattr(attr, "__doc__", None)
        return blocking

    def __iter__(self):
        next_message = self.receive if hasattr(self._target, "receive") else self.read_next
        while True:
            try:
                yield next_message()
            except AlreadyClosed:
                return

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<sync {self._target!r}>"

    @property
    def async_object(self) -> Any:
        """The wrapped asyncio object."""
        return self._target


async def _await(awaitable):
    return await awaitable


class Producer:
    """Blocking producer (official ``pulsar.Producer``) around an asyncio
    ``Producer``/``PartitionedProducer``.

    ``send`` blocks until persisted and returns the ``MessageId``;
    ``send_async(content, callback, ...)`` returns at once and calls
    ``callback(exception_or_None, message_id)`` on the client thread.  With
    ``block_if_queue_full``, ``send_async`` blocks the caller while
    ``max_pending_messages`` messages are pending (as the official client).
    """

    def __init__(self, producer, loop_thread: LoopThread, block_if_queue_full: bool = False,
                 max_pending_messages: int = 1000):
        self._p = producer
        self._lt = loop_thread
        self._permits = (threading.BoundedSemaphore(max_pending_messages)
                         if block_if_queue_full and max_pending_messages > 0 else None)

    def send(self, content: bytes, properties: dict | None = None, partition_key: str | None = None,
             ordering_key=None, sequence_id: int | None = None, event_timestamp: int | None = None,
             replication_clusters: list[str] | None = None, disable_replication: bool = False,
             deliver_after=None, deliver_at: int | None = None):
        """Publish and wait (see the asyncio ``Producer.send``); returns the ``MessageId``."""
        return self._lt.run(self._p.send(
            content, properties=properties, partition_key=partition_key, ordering_key=ordering_key,
            sequence_id=sequence_id, event_timestamp=event_timestamp, replication_clusters=replication_clusters,
            disable_replication=disable_replication, deliver_after=deliver_after, deliver_at=deliver_at))

    def send_async(self, content: bytes, callback: Callable, properties: dict | None = None,
                   partition_key: str | None = None, ordering_key=None, sequence_id: int | None = None,
                   event_timestamp: int | None = None, replication_clusters: list[str] | None = None,
                   disable_replication: bool = False, deliver_after=None, deliver_at: int | None = None) -> None:
        """Publish without waiting; ``callback(exception_or_None, message_id)`` runs on the client thread."""
        if callback is None:
            callback = _ignore
        if self._permits is not None:
            self._permits.acquire()
            user_callback, permits = callback, self._permits

            def callback(exc, msg_id):
                permits.release()
                user_callback(exc, msg_id)
        kwargs = dict(properties=properties, partition_key=partition_key, ordering_key=ordering_key,
                      sequence_id=sequence_id, event_timestamp=event_timestamp,
                      replication_clusters=replication_clusters, disable_replication=disable_replication,
                      deliver_after=deliver_after, deliver_at=deliver_at)
        try:
            self._lt.call_soon(lambda: self._p.send_async(content, callback, **kwargs))
        except PulsarException:
            if self._permits is not None:
                self._permits.release()
            raise

    def flush(self) -> None:
        """Send the open batch and wait until every message sent so far is settled."""
        self._lt.run(self._p.flush())

    def close(self) -> None:
        """Flush and close the producer.  Idempotent."""
        if self._lt.running:
            self._lt.run(self._p.close())

    def topic(self) -> str:
        """Full topic name."""
        return self._p.topic()

    def producer_name(self) -> str:
        """The producer's name (given or broker-generated)."""
        return self._p.producer_name()

    def last_sequence_id(self) -> int:
        """Sequence id of the last message the broker acknowledged (-1 if none)."""
        return self._p.last_sequence_id()

    def is_connected(self) -> bool:
        """True while connected to the broker."""
        return self._p.is_connected()

    @property
    def async_producer(self):
        """The wrapped asyncio producer."""
        return self._p

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<sync {self._p!r}>"


def _ignore(exc, msg_id) -> None:
    pass


class Client:
    """Blocking client (official ``pulsar.Client``): ``Client(service_url,
    operation_timeout_seconds=30, connection_timeout_ms=10000, ...)``.

    Runs an ``AsyncClient`` on a background event-loop thread.
    ``create_producer``, ``subscribe``, ``create_reader`` take the official
    options and return blocking objects.  Raises ``InvalidConfiguration`` for a
    bad service URL.
    """

    def __init__(self, service_url: str, **options):
        from client.client import AsyncClient
        from client.connection import parse_service_url
        parse_service_url(service_url)  # fail in the caller's thread, before starting one
        self._lt = LoopThread()

        async def make():
            return AsyncClient(service_url, **options)
        try:
            self._async = self._lt.run(make())
        except BaseException:
            self._lt.stop()
            raise

    @property
    def async_client(self):
        """The wrapped ``AsyncClient`` (lives on the client thread's loop)."""
        return self._async

    def create_producer(self, topic: str, producer_name: str | None = None, **options) -> Producer:
        """Create a blocking ``Producer`` (see ``AsyncClient.create_producer``)."""
        p = self._lt.run(self._async.create_producer(topic, producer_name=producer_name, **options))
        return Producer(p, self._lt, bool(options.get("block_if_queue_full", False)),
                        int(options.get("max_pending_messages", 1000) or 0))

    def subscribe(self, topic, subscription_name: str, **options) -> SyncWrapper:
        """Subscribe; returns a blocking consumer (see ``AsyncClient.subscribe``)."""
        return SyncWrapper(self._lt.run(self._async.subscribe(topic, subscription_name, **options)), self._lt)

    def create_reader(self, topic: str, start_message_id, **options) -> SyncWrapper:
        """Create a blocking reader (see ``AsyncClient.create_reader``)."""
        return SyncWrapper(self._lt.run(self._async.create_reader(topic, start_message_id, **options)), self._lt)

    def get_topic_partitions(self, topic: str) -> list[str]:
        """Partition names of ``topic`` (``[topic]`` when not partitioned)."""
        return self._lt.run(self._async.get_topic_partitions(topic))

    def get_partitioned_topic_metadata(self, topic: str) -> int:
        """Number of partitions of ``topic`` (0 = not partitioned)."""
        return self._lt.run(self._async.get_partitioned_topic_metadata(topic))

    def get_last_message_id(self, topic: str):
        """``MessageId`` of the last entry of ``topic`` (-1:-1 when empty)."""
        return self._lt.run(self._async.get_last_message_id(topic))

    def get_topics_of_namespace(self, namespace: str) -> list[str]:
        """Topics of ``tenant/namespace`` (partitions individually)."""
        return self._lt.run(self._async.get_topics_of_namespace(namespace))

    def close(self) -> None:
        """Close producers, consumers, readers and the connection; stop the thread.  Idempotent."""
        if not self._lt.running:
            return
        try:
            self._lt.run(self._async.close())
        finally:
            self._lt.stop()

    def shutdown(self) -> None:
        """As ``close`` (official name for closing without waiting for pending work)."""
        self.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        lt = getattr(self, "_lt", None)
        if lt is not None and lt.running and threading.current_thread() is not lt.thread:
            try:
                lt.loop.call_soon_threadsafe(lt.loop.stop)
            except RuntimeError:
                pass
