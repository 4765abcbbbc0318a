"""Publishing to the dead-letter topic (Pulsar's ConsumerImpl
``deadLetterProducer`` / ``processPossibleToDLQ``).

The producer is created lazily on the first dead letter; with
``initial_subscription_name`` that subscription is created on the
dead-letter topic first (Pulsar's producer ``initialSubscriptionName``), so a
DLQ consumer subscribed later still finds every dead letter.
"""
from __future__ import annotations

import asyncio
import logging

from client.consumer_config import DeadLetterPolicy, InitialPosition
from client.message import Message

__all__ = ["DeadLetterPublisher", "PROPERTY_ORIGIN_MESSAGE_ID", "PROPERTY_REAL_TOPIC"]

log = logging.getLogger(__name__)

PROPERTY_REAL_TOPIC = "REAL_TOPIC"  # Pulsar's RetryMessageUtil.SYSTEM_PROPERTY_REAL_TOPIC
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"  # RetryMessageUtil.PROPERTY_ORIGIN_MESSAGE_ID


class DeadLetterPublisher:
    """Publishes dead letters of one subscription to ``policy.topic_for(topic, subscription)``
    (Pulsar's ConsumerImpl ``deadLetterProducer``).

    ``client``: the AsyncClient (``create_producer``; ``subscribe`` for the
    policy's ``initial_subscription_name``); ``topic``: the consumer's topic
    (the partitioned topic's name for its partitions); ``subscription``: its
    subscription name.  Shared by the partition consumers of one partitioned
    topic.
    """

    def __init__(self, client, policy: DeadLetterPolicy, topic: str, subscription: str):
        self.client = client
        self.policy = policy
        self.topic = policy.topic_for(topic, subscription)
        self._producer = None
        self._lock = asyncio.Lock()

    async def _get_producer(self):
        async with self._lock:
            if self._producer is None:
                if self.policy.initial_subscription_name:
                    # through the client (AsyncClient.subscribe -> consumer.create_consumer), not an
                    # import of client.consumer, which imports this module
                    sub = await self.client.subscribe(self.topic, self.policy.initial_subscription_name,
                                                      initial_position=InitialPosition.Earliest,
                                                      receiver_queue_size=1)
                    await sub.close()
                # as Pulsar's DLQ producer: no batching (one entry per dead letter), chunking on
                self._producer = await self.client.create_producer(self.topic, batching_enabled=False,
                                                                   chunking_enabled=True)
            return self._producer

    async def publish(self, msg: Message) -> None:
        """Publish ``msg`` (same payload, key and properties, plus ``REAL_TOPIC`` =
        its topic and ``ORIGIN_MESSAGE_ID`` = its id as ``ledger:entry:partition:batch``)
        and wait for the broker's receipt.  Raises what the producer raises."""
        producer = await self._get_producer()
        properties = msg.properties()
        properties.setdefault(PROPERTY_REAL_TOPIC, msg.topic_name())
        properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, str(msg.message_id()))
        kwargs = {"properties": properties}
        if msg.has_partition_key():
            kwargs["partition_key"] = msg.partition_key()
        if msg.ordering_key() is not None:
            kwargs["ordering_key"] = msg.ordering_key()
        if msg.event_timestamp():
            kwargs["event_timestamp"] = msg.event_timestamp()
        await producer.send(msg.data(), **kwargs)

    async def close(self) -> None:
        """Close the producer if one was created (errors are logged)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await producer.close()
            except Exception as e:  # noqa: BLE001 - closing must not fail the consumer's close
                log.warning("closing dead-letter producer of %s: %s", self.topic, e)
