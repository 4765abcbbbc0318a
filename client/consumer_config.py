"""Consumer options, named as the official pulsar-client Python API
(``pulsar.ConsumerType``, ``pulsar.InitialPosition``, ``pulsar.ConsumerDeadLetterPolicy``,
``pulsar.ConsumerBatchReceivePolicy``) and Pulsar's ConsumerConfigurationData.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from client.errors import InvalidConfiguration
from client.redelivery_trackers import MIN_ACK_TIMEOUT_MS
from client.topic_name import TopicName
from proto import broker_pb2

__all__ = ["ConsumerType", "InitialPosition", "DeadLetterPolicy", "BatchReceivePolicy", "ConsumerConfig",
           "ConsumerDeadLetterPolicy", "ConsumerBatchReceivePolicy"]


class ConsumerType(enum.Enum):
    """Subscription type (pulsar-client's ``ConsumerType``); the value is the
    broker protocol's ``SubType`` number (KeyShared = ``Key_Shared``)."""

    Exclusive = broker_pb2.Exclusive
    Shared = broker_pb2.Shared
    Failover = broker_pb2.Failover
    KeyShared = broker_pb2.Key_Shared

    @property
    def allows_cumulative_ack(self) -> bool:
        """False for Shared and KeyShared (Pulsar rejects cumulative acks there)."""
        return self in (ConsumerType.Exclusive, ConsumerType.Failover)


class InitialPosition(enum.Enum):
    """Where a new subscription starts (pulsar-client's ``InitialPosition``);
    value = the protocol's ``InitialPosition`` number."""

    Latest = broker_pb2.Latest
    Earliest = broker_pb2.Earliest


@dataclass(frozen=True)
class DeadLetterPolicy:
    """Dead-letter policy (Pulsar's DeadLetterPolicy / pulsar-client's
    ``ConsumerDeadLetterPolicy``).

    ``max_redeliver_count`` (>= 1): as Pulsar's ConsumerImpl, a message is
    still delivered with a redelivery count equal to it; one that arrives with
    a redelivery count above it is published to the dead-letter topic and
    acknowledged instead of being delivered, so the application sees it at
    most ``max_redeliver_count + 1`` times (if the publish fails, it is
    redelivered after ``negative_ack_redelivery_delay_ms`` and tried again);
    ``dead_letter_topic``: default ``"<topic>-<subscription>-DLQ"``
    (topic = the full, partitioned-parent name); ``initial_subscription_name``:
    subscription created on the dead-letter topic before the first message is
    published there, so none is lost.  Raises ``InvalidConfiguration``.
    """

    max_redeliver_count: int
    dead_letter_topic: str | None = None
    initial_subscription_name: str | None = None

    def __post_init__(self):
        if not isinstance(self.max_redeliver_count, int) or self.max_redeliver_count < 1:
            raise InvalidConfiguration(f"DeadLetterPolicy.max_redeliver_count must be >= 1, "
                                       f"got {self.max_redeliver_count!r}")

    def topic_for(self, topic: str, subscription: str) -> str:
        """The dead-letter topic for ``topic`` (a partition maps to its parent)."""
        if self.dead_letter_topic:
            return str(TopicName.get(self.dead_letter_topic))
        parent = TopicName.get(topic).partitioned_topic_name
        return f"{parent}-{subscription}-DLQ"


@dataclass(frozen=True)
class BatchReceivePolicy:
    """``batch_receive()`` limits (pulsar-client's ``ConsumerBatchReceivePolicy``):
    at most ``max_num_messages`` messages (<= 0: no limit) and
    ``max_num_bytes`` payload bytes (<= 0: no limit), waiting at most
    ``timeout_ms`` ms.  At least one of them must be positive."""

    max_num_messages: int = 100
    max_num_bytes: int = 10 * 1024 * 1024
    timeout_ms: int = 100

    def __post_init__(self):
        if self.max_num_messages <= 0 and self.max_num_bytes <= 0 and self.timeout_ms <= 0:
            raise InvalidConfiguration("BatchReceivePolicy needs a positive max_num_messages, "
                                       "max_num_bytes or timeout_ms")


ConsumerDeadLetterPolicy = DeadLetterPolicy  # the official pulsar-client name
ConsumerBatchReceivePolicy = BatchReceivePolicy  # the official pulsar-client name


@dataclass
class ConsumerConfig:
    """Every option of ``create_consumer`` (see its docstring; Pulsar's
    ConsumerConfigurationData), checked by ``validate()``."""

    subscription_name: str
    consumer_type: ConsumerType = ConsumerType.Exclusive
    initial_position: InitialPosition = InitialPosition.Latest
    receiver_queue_size: int = 1000
    negative_ack_redelivery_delay_ms: int = 60000
    unacked_messages_timeout_ms: int | None = None
    dead_letter_policy: DeadLetterPolicy | None = None
    batch_index_ack_enabled: bool = False
    replicate_subscription_state_enabled: bool = False
    consumer_name: str | None = None
    priority_level: int = 0
    ack_group_time_ms: int = 100
    max_pending_chunked_message: int = 10
    auto_ack_oldest_chunked_message_on_queue_full: bool = False
    expire_time_of_incomplete_chunked_message_ms: int = 60000
    pattern_auto_discovery_period: int = 60
    batch_receive_policy: BatchReceivePolicy = BatchReceivePolicy()
    properties: dict | None = None

    def validate(self) -> "ConsumerConfig":
        """Check and normalize; raises ``InvalidConfiguration`` naming the bad option."""
        if not isinstance(self.subscription_name, str) or not self.subscription_name:
            raise InvalidConfiguration("subscription_name must be a non-empty string")
        if isinstance(self.consumer_type, int) and not isinstance(self.consumer_type, ConsumerType):
            self.consumer_type = ConsumerType(self.consumer_type)
        if not isinstance(self.consumer_type, ConsumerType):
            raise InvalidConfiguration(f"consumer_type must be a ConsumerType, got {self.consumer_type!r}")
        if not isinstance(self.initial_position, InitialPosition):
            raise InvalidConfiguration(f"initial_position must be an InitialPosition, got {self.initial_position!r}")
        if not isinstance(self.receiver_queue_size, int) or self.receiver_queue_size < 0:
            raise InvalidConfiguration(f"receiver_queue_size must be >= 0, got {self.receiver_queue_size!r}")
        self.receiver_queue_size = max(1, self.receiver_queue_size)  # no zero-queue consumer: 0 acts as 1
        if self.negative_ack_redelivery_delay_ms < 0:
            raise InvalidConfiguration("negative_ack_redelivery_delay_ms must be >= 0")
        if self.unacked_messages_timeout_ms is not None and self.unacked_messages_timeout_ms != 0 \
                and self.unacked_messages_timeout_ms < MIN_ACK_TIMEOUT_MS:
            raise InvalidConfiguration(f"unacked_messages_timeout_ms must be >= {MIN_ACK_TIMEOUT_MS} ms "
                                       f"(or None/0 to disable), got {self.unacked_messages_timeout_ms}")
        if self.ack_group_time_ms < 0:
            raise InvalidConfiguration("ack_group_time_ms must be >= 0")
        if self.pattern_auto_discovery_period <= 0:
            raise InvalidConfiguration("pattern_auto_discovery_period must be > 0 seconds")
        if self.dead_letter_policy is not None and not isinstance(self.dead_letter_policy, DeadLetterPolicy):
            raise InvalidConfiguration("dead_letter_policy must be a DeadLetterPolicy")
        if not isinstance(self.batch_receive_policy, BatchReceivePolicy):
            raise InvalidConfiguration("batch_receive_policy must be a BatchReceivePolicy")
        return self
