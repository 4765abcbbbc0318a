"""Consumers: ``create_consumer`` (what ``AsyncClient.subscribe`` calls) and the
single-topic ``Consumer`` (Pulsar's ConsumerImpl seen through the official
Python client's ``Consumer`` API).

A list of topics, a partitioned topic or a compiled regex pattern gives a
``MultiTopicsConsumer`` (client/multi_topics_consumer.py) with the same API.
The mechanisms live in small modules: receiver_queue (queue + flow permits),
entry_splitter (entries -> messages), ack_grouping, redelivery_trackers
(ack timeout, negative acks), dead_letter, consumer_impl (the bookkeeping) on
consumer_connection (the stream).
"""
from __future__ import annotations

import re

from client.consumer_base import ConsumerBase
from client.consumer_config import (BatchReceivePolicy, ConsumerBatchReceivePolicy, ConsumerConfig,
                                    ConsumerDeadLetterPolicy, ConsumerType, DeadLetterPolicy, InitialPosition)
from client.consumer_impl import ConsumerImpl
from client.dead_letter import DeadLetterPublisher
from client.errors import AlreadyClosed, InvalidConfiguration
from client.message import Message
from client.message_id import MessageId
from client.topic_name import TopicName

__all__ = ["ConsumerType", "InitialPosition", "DeadLetterPolicy", "BatchReceivePolicy", "ConsumerDeadLetterPolicy",
           "ConsumerBatchReceivePolicy", "Consumer", "create_consumer", "Message", "MessageId"]


class Consumer(ConsumerBase):
    """Consumer of one topic (or one partition), from ``create_consumer``
    (Pulsar's ConsumerImpl; the work is in ``client.consumer_impl`` and its stream
    ``client.consumer_connection``).

    Async API: ``receive``, ``batch_receive``, ``async for``, ``acknowledge``,
    ``acknowledge_cumulative``, ``negative_acknowledge`` (plain methods that
    enqueue), ``acknowledge_and_wait`` / ``acknowledge_cumulative_and_wait``,
    ``seek``, ``unsubscribe``, ``close``, ``topic()``, ``subscription_name()``,
    ``consumer_name()``, ``is_active()``.
    """

    def __init__(self, client, topic: str, conf: ConsumerConfig):
        super().__init__(client, conf)
        self._topic = topic
        self._dead_letter = (DeadLetterPublisher(client, conf.dead_letter_policy, topic, conf.subscription_name)
                             if conf.dead_letter_policy else None)
        partition = TopicName.get(topic).partition_index
        self._impl = ConsumerImpl(client, topic, conf, partition=partition, dead_letter=self._dead_letter)
        self._queue = self._impl.queue

    async def _start(self) -> None:
        await self._impl.start()

    def _impls(self) -> list:
        return [self._impl]

    def _impl_for_id(self, mid: MessageId):
        return self._impl

    def topic(self) -> str:
        """Full topic name."""
        return self._topic

    def consumer_name(self) -> str:
        """This consumer's name (given, or 5 random letters as Pulsar)."""
        return self._impl.consumer_name

    def is_active(self) -> bool:
        """Exclusive/Failover: whether the broker dispatches to this consumer
        (last ActiveConsumerChange; a Failover consumer starts inactive until
        told).  Always True for Shared/KeyShared."""
        return self._impl.active

    async def seek(self, target: MessageId | int) -> None:
        """Reset the subscription to a message id (``MessageId.earliest`` /
        ``latest`` too; that message comes next) or a publish time in ms.
        Raises ``ValueError`` for another type, the broker's error, ``Timeout``."""
        self._check_open()
        await self._impl.seek(target)

    async def unsubscribe(self) -> None:
        """Delete the subscription and close the consumer.  Raises the
        broker's error (e.g. other consumers are connected)."""
        self._check_open()
        await self._impl.unsubscribe()
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed("consumer is closed")
        failed = self._failed()
        if failed is not None:
            raise failed

    async def close(self) -> None:
        """Flush pending acks, close the stream.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._client._unregister(self)
        except Exception:  # noqa: BLE001 - the client may be closing us itself
            pass
        await self._impl.close()
        if self._dead_letter is not None:
            await self._dead_letter.close()


async def create_consumer(client, topics_or_pattern, subscription_name: str,
                          consumer_type: ConsumerType = ConsumerType.Exclusive,
                          initial_position: InitialPosition = InitialPosition.Latest,
                          receiver_queue_size: int = 1000, negative_ack_redelivery_delay_ms: int = 60000,
                          unacked_messages_timeout_ms: int | None = None,
                          dead_letter_policy: DeadLetterPolicy | None = None, batch_index_ack_enabled: bool = False,
                          replicate_subscription_state_enabled: bool = False, consumer_name: str | None = None,
                          priority_level: int = 0, ack_group_time_ms: int = 100, max_pending_chunked_message: int = 10,
                          auto_ack_oldest_chunked_message_on_queue_full: bool = False,
                          expire_time_of_incomplete_chunked_message_ms: int = 60000,
                          pattern_auto_discovery_period: int = 60,
                          batch_receive_policy: BatchReceivePolicy | None = None,
                          properties: dict | None = None):
    """Subscribe and return a connected consumer (what ``AsyncClient.subscribe`` calls).

    ``topics_or_pattern``: a topic name (str) -> ``Consumer``, or for a
    partitioned topic a ``MultiTopicsConsumer`` with one consumer per
    partition; a list of names -> ``MultiTopicsConsumer``; a compiled
    ``re.Pattern`` (e.g. ``re.compile("persistent://public/default/orders-.*")``,
    without a namespace ``public/default``) -> ``MultiTopicsConsumer`` over the
    matching topics of that namespace, rediscovered every
    ``pattern_auto_discovery_period`` seconds.

    Options (units): ``receiver_queue_size`` messages (initial Flow; refilled
    when half is consumed); ``negative_ack_redelivery_delay_ms`` ms;
    ``unacked_messages_timeout_ms`` ms ack timeout (None/0 = off, else >= 1000;
    as for negative acks, Exclusive/Failover then redeliver everything
    unacknowledged, Shared/KeyShared only the expired messages);
    ``dead_letter_policy``; ``batch_index_ack_enabled`` (PIP-54);
    ``replicate_subscription_state_enabled`` (PIP-33); ``consumer_name``
    (default random); ``priority_level`` (Failover: lower = preferred);
    ``ack_group_time_ms`` ms (0 = send each ack at once);
    ``max_pending_chunked_message``, ``auto_ack_oldest_chunked_message_on_queue_full``,
    ``expire_time_of_incomplete_chunked_message_ms`` ms (chunked messages);
    ``batch_receive_policy`` (default 100 messages / 100 ms); ``properties``
    (consumer metadata).

    Raises ``InvalidConfiguration``, ``InvalidTopicName``, ``AlreadyClosed``
    (client closed), and the broker's ``ConsumerBusy`` (Exclusive taken),
    ``NotAllowed`` (other subscription type), ``TopicNotFound``, ``Timeout``.
    """
    from client.multi_topics_consumer import MultiTopicsConsumer

    client._check_open()
    conf = ConsumerConfig(
        subscription_name=subscription_name, consumer_type=consumer_type, initial_position=initial_position,
        receiver_queue_size=receiver_queue_size, negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
        unacked_messages_timeout_ms=unacked_messages_timeout_ms, dead_letter_policy=dead_letter_policy,
        batch_index_ack_enabled=batch_index_ack_enabled,
        replicate_subscription_state_enabled=replicate_subscription_state_enabled, consumer_name=consumer_name,
        priority_level=priority_level, ack_group_time_ms=ack_group_time_ms,
        max_pending_chunked_message=max_pending_chunked_message,
        auto_ack_oldest_chunked_message_on_queue_full=auto_ack_oldest_chunked_message_on_queue_full,
        expire_time_of_incomplete_chunked_message_ms=expire_time_of_incomplete_chunked_message_ms,
        pattern_auto_discovery_period=pattern_auto_discovery_period,
        batch_receive_policy=batch_receive_policy or BatchReceivePolicy(), properties=properties).validate()
    if isinstance(topics_or_pattern, re.Pattern):
        consumer = MultiTopicsConsumer(client, conf, pattern=topics_or_pattern)
    elif isinstance(topics_or_pattern, (list, tuple)):
        if not topics_or_pattern:
            raise InvalidConfiguration("the list of topics is empty")
        names = list(dict.fromkeys(str(TopicName.get(t)) for t in topics_or_pattern))
        consumer = MultiTopicsConsumer(client, conf, topics=names)
    elif isinstance(topics_or_pattern, str):
        name = TopicName.get(topics_or_pattern)
        partitions = 0 if name.is_partition else await client.get_partitioned_topic_metadata(str(name))
        if partitions > 0:
            consumer = MultiTopicsConsumer(client, conf, topics=[str(name)])
        else:
            consumer = Consumer(client, str(name), conf)
    else:
        raise InvalidConfiguration(f"topic must be a str, a list of str or a compiled re.Pattern, "
                                   f"got {type(topics_or_pattern).__name__}")
    await consumer._start()
    client._register(consumer)
    return consumer
