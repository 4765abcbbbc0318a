"""Received messages, as the official pulsar-client's ``pulsar.Message``
(Pulsar's MessageImpl / TopicMessageImpl).

A ``Message`` is built by the consumer from one entry (or one message of a
batch entry, or the chunks of a chunked message) and handed to the
application; the accessors carry the official names (``data()``,
``properties()``, ``message_id()``, ``publish_timestamp()``, ...).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from client.message_id import MessageId

__all__ = ["Message", "TopicMessageId", "TopicChunkMessageId"]


@dataclass(frozen=True, slots=True, eq=False)
class TopicMessageId(MessageId):
    """A ``MessageId`` that also names the topic (or partition) it belongs to,
    as Pulsar's TopicMessageIdImpl: messages of a multi-topic consumer carry it
    so that ``acknowledge(message_id)`` finds the right sub-consumer.

    ``topic``: full topic name (``persistent://t/ns/x-partition-0``).  Equality,
    order and hash are those of ``MessageId`` (the topic is ignored), so a
    ``TopicMessageId`` equals the plain ``MessageId`` with the same fields.
    """

    topic: str = ""

    def __eq__(self, other):  # dataclass(eq=False) keeps MessageId's, restated for clarity
        return MessageId.__eq__(self, other)

    def __hash__(self):
        return MessageId.__hash__(self)

    def plain(self) -> MessageId:
        """The same id without the topic."""
        return MessageId(self.ledger_id, self.entry_id, self.partition, self.batch_index, self.batch_size)


@dataclass(frozen=True, slots=True, eq=False)
class TopicChunkMessageId(TopicMessageId):
    """A chunked message's id in a multi-topic consumer: a ``TopicMessageId``
    with the chunk ids of ``ChunkMessageId`` (``first_chunk_message_id``,
    ``chunk_message_ids``); acknowledging it acknowledges every chunk."""

    first_chunk_message_id: MessageId | None = None
    chunk_message_ids: tuple = ()

    @property
    def last_chunk_message_id(self) -> MessageId:
        """The last chunk's id as a plain ``MessageId``."""
        return self.plain()


_new = object.__new__
_NO_PROPERTIES: dict[str, str] = {}  # shared, never mutated: properties() returns a copy


class Message:
    """One received message (Pulsar's MessageImpl; pulsar-client's ``Message``).

    Built by the consumer, read by the application.  Timestamps are
    milliseconds since the epoch; ``event_timestamp()`` is 0 when the producer
    set none.  Internal fields (``_entry_ids``: positions of the entries that
    carried the message — several for a chunked message, ``_consumer``: the
    single-topic consumer that received it) are used to acknowledge it.
    """

    __slots__ = ("_data", "_message_id", "_topic", "_properties", "_partition_key", "_ordering_key",
                 "_publish_time", "_event_time", "_redelivery_count", "_producer_name", "_replicated_from",
                 "_sequence_id", "_chunk_ids", "_consumer", "_schema_value")

    def __init__(self, data: bytes, message_id: MessageId, topic: str, *, properties: dict[str, str] | None = None,
                 partition_key: str | None = None, ordering_key: bytes | None = None, publish_time: int = 0,
                 event_time: int = 0, redelivery_count: int = 0, producer_name: str = "",
                 replicated_from: str | None = None, sequence_id: int = 0,
                 chunk_ids: tuple[MessageId, ...] | None = None, consumer: Any = None):
        self._data = data
        self._message_id = message_id
        self._topic = topic
        self._properties = properties or {}
        self._partition_key = partition_key
        self._ordering_key = ordering_key
        self._publish_time = publish_time
        self._event_time = event_time
        self._redelivery_count = redelivery_count
        self._producer_name = producer_name
        self._replicated_from = replicated_from
        self._sequence_id = sequence_id
        self._chunk_ids = chunk_ids
        self._consumer = consumer
        self._schema_value = None

    @classmethod
    def _received(cls, data: bytes, message_id: MessageId, topic: str, ordering_key: bytes | None,
                  publish_time: int, event_time: int, redelivery_count: int, producer_name: str,
                  replicated_from: str | None, sequence_id: int) -> "Message":
        """Internal fast constructor for a batched message without properties,
        partition key or chunks (the consumer's hot path); fields as ``__init__``."""
        msg = _new(cls)
        msg._data = data
        msg._message_id = message_id
        msg._topic = topic
        msg._properties = _NO_PROPERTIES
        msg._partition_key = None
        msg._ordering_key = ordering_key
        msg._publish_time = publish_time
        msg._event_time = event_time
        msg._redelivery_count = redelivery_count
        msg._producer_name = producer_name
        msg._replicated_from = replicated_from
        msg._sequence_id = sequence_id
        msg._chunk_ids = None
        msg._consumer = None
        msg._schema_value = None
        return msg

    # -- the official accessors ----------------------------------------------------
    def data(self) -> bytes:
        """The payload (bytes, decompressed; a chunked message reassembled)."""
        return self._data

    def value(self) -> Any:
        """The decoded value; with the bytes schema (the only one here) the payload."""
        return self._data if self._schema_value is None else self._schema_value

    def properties(self) -> dict[str, str]:
        """The application properties (str -> str; a fresh dict each call)."""
        return dict(self._properties)

    def partition_key(self) -> str:
        """The partition (routing) key, ``""`` when none was set (pulsar-client behaviour)."""
        return self._partition_key or ""

    def has_partition_key(self) -> bool:
        """True if the producer set a partition key."""
        return self._partition_key is not None

    def ordering_key(self) -> bytes | None:
        """The Key_Shared ordering key (bytes) or None."""
        return self._ordering_key

    def message_id(self) -> MessageId:
        """The id: ``(ledger_id, entry_id, partition, batch_index)``; partition is
        the partition index (-1 for a non-partitioned topic), batch_index -1 when
        the entry was not a batch.  A ``TopicMessageId`` in multi-topic consumers."""
        return self._message_id

    def publish_timestamp(self) -> int:
        """Publish time set by the producer, ms since the epoch."""
        return self._publish_time

    def event_timestamp(self) -> int:
        """Event time set by the application, ms since the epoch, 0 if unset."""
        return self._event_time

    def redelivery_count(self) -> int:
        """How many times the broker redelivered this message (0 on first delivery)."""
        return self._redelivery_count

    def topic_name(self) -> str:
        """Full name of the topic (the partition, for a partitioned topic)."""
        return self._topic

    def producer_name(self) -> str:
        """Name of the producer that published the message."""
        return self._producer_name

    def replicated_from(self) -> str | None:
        """Cluster the message was geo-replicated from, None if published locally."""
        return self._replicated_from

    def sequence_id(self) -> int:
        """Producer sequence id of the message."""
        return self._sequence_id

    # -- internal ------------------------------------------------------------------
    def _entry_positions(self) -> tuple[MessageId, ...]:
        """Entry-level ids (no batch index) this message occupies: one, or every
        chunk's for a chunked message."""
        if self._chunk_ids:
            return tuple(i.entry_id_only() for i in self._chunk_ids)
        return (self._message_id.entry_id_only(),)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return (f"Message(topic={self._topic!r}, id={self._message_id}, len={len(self._data)}, "
                f"redelivery_count={self._redelivery_count})")
