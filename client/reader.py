"""Readers (Pulsar's ReaderImpl, the official Python client's ``Reader``): a
consumer on a non-durable, Exclusive subscription that starts at a chosen
message id and never persists its position.
"""
from __future__ import annotations

import uuid

from client.consumer_config import ConsumerConfig, ConsumerType
from client.consumer_impl import ConsumerImpl
from client.errors import AlreadyClosed, InvalidConfiguration
from client.message import Message
from client.message_id import MessageId
from client.topic_name import TopicName
from proto import broker_pb2 as pb

__all__ = ["Reader", "create_reader"]


def _entry_of(position: pb.Position) -> MessageId:
    return MessageId(position.ledger_id, position.entry_id)


class Reader:
    """Reads a topic from a message id (``create_reader``).  Async API:
    ``read_next``, ``async for``, ``has_message_available``, ``seek``,
    ``close``, ``topic()``."""

    def __init__(self, client, topic: str, impl: ConsumerImpl):
        self._client = client
        self._topic = topic
        self._impl = impl
        self._closed = False

    def topic(self) -> str:
        """Full topic name."""
        return self._topic

    def subscription_name(self) -> str:
        """The generated name of the reader's non-durable subscription."""
        return self._impl.conf.subscription_name

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed("reader is closed")
        if self._impl.failed is not None:
            raise self._impl.failed

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message, waiting up to ``timeout_millis`` ms (None =
        forever).  Raises ``Timeout`` on expiry, ``AlreadyClosed``."""
        self._check_open()
        msg = await self._impl.queue.get(None if timeout_millis is None else timeout_millis / 1000)
        self._impl.on_dequeued(msg)
        self._impl.ack_cumulative(msg.message_id())  # as ReaderImpl: lets the broker trim the non-durable cursor
        return msg

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.read_next()
        except AlreadyClosed:
            raise StopAsyncIteration from None

    async def has_message_available(self) -> bool:
        """Whether ``read_next`` would return a message now or later without
        new publishes: compares the last message read (or the start id) with
        the topic's last message id (GetLastMessageId, asked to the broker that
        serves the topic).  Raises the broker's error, ``Timeout``."""
        self._check_open()
        if len(self._impl.queue):
            return True
        resp = await self._client.last_message_id_response(self._topic)
        last = _entry_of(resp.last_message_id)
        if last.entry_id < 0:
            return False  # empty topic
        ref, inclusive = self._impl.last_dequeued, False
        if ref is None:
            ref, inclusive = self._impl._start_id or MessageId.latest, self._impl._start_inclusive
            if ref == MessageId.earliest:
                return True
        last_entry = (last.ledger_id, last.entry_id)
        ref_entry = (ref.ledger_id, ref.entry_id)
        if last_entry != ref_entry:
            return last_entry > ref_entry
        if inclusive:
            return True
        # same entry: more messages after ref only if ref is inside a batch and not its last message
        return 0 <= ref.batch_index < ref.batch_size - 1

    async def seek(self, target: MessageId | int) -> None:
        """Move the reader to a message id (read next, inclusive) or a publish
        time (ms).  Raises ``ValueError`` for another type, the broker's error."""
        self._check_open()
        await self._impl.seek(target)

    def is_connected(self) -> bool:
        """True while the stream is connected."""
        return not self._closed and self._impl._call is not None

    async def close(self) -> None:
        """Close the reader (its non-durable subscription disappears).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._client._unregister(self)
        except Exception:  # noqa: BLE001
            pass
        await self._impl.close(flush=False)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


async def create_reader(client, topic: str, start_message_id: MessageId, reader_name: str | None = None,
                        receiver_queue_size: int = 1000, start_message_id_inclusive: bool = False,
                        subscription_role_prefix: str = "reader") -> Reader:
    """Create a connected ``Reader`` of ``topic`` (what ``AsyncClient.create_reader`` calls).

    ``start_message_id``: ``MessageId.earliest``, ``MessageId.latest`` or the
    id of a message (from a received message or ``MessageId.parse``/``deserialize``);
    the first message read is the one after it, or that message itself with
    ``start_message_id_inclusive`` (``latest`` + inclusive = the topic's last
    entry).  ``receiver_queue_size``: messages.  A partitioned topic is not
    supported (read its partitions ``<topic>-partition-N``).

    Raises ``InvalidConfiguration``, ``InvalidTopicName``, ``AlreadyClosed``,
    ``TopicNotFound``, ``Timeout``.
    """
    client._check_open()
    if not isinstance(start_message_id, MessageId):
        raise InvalidConfiguration(f"start_message_id must be a MessageId, got {type(start_message_id).__name__}")
    name = TopicName.get(topic)
    if not name.is_partition and await client.get_partitioned_topic_metadata(str(name)) > 0:
        raise InvalidConfiguration(f"{name} is partitioned: create one reader per partition "
                                   f"('{name}-partition-N')")
    conf = ConsumerConfig(subscription_name=f"{subscription_role_prefix}-{uuid.uuid4().hex[:10]}",
                          consumer_type=ConsumerType.Exclusive, receiver_queue_size=receiver_queue_size,
                          consumer_name=reader_name).validate()
    start, inclusive = start_message_id, start_message_id_inclusive
    if start == MessageId.latest and inclusive:
        resp = await client.last_message_id_response(str(name))
        if resp.last_message_id.entry_id >= 0:
            start = _entry_of(resp.last_message_id)
    impl = ConsumerImpl(client, str(name), conf, partition=name.partition_index, durable=False,
                        start_message_id=start, start_inclusive=inclusive)
    await impl.start()
    reader = Reader(client, str(name), impl)
    client._register(reader)
    return reader
