"""Partition routing for partitioned topics, as Pulsar's client.

Hashes match Pulsar's Java client bit for bit (``Murmur3_32Hash``,
``JavaStringHash``; vectors from Pulsar's HashTest), routers follow
``RoundRobinPartitionMessageRouterImpl`` and ``SinglePartitionMessageRouterImpl``.
A router's ``choose_partition(key, num_partitions)`` takes the message's
partition key (str or None) and returns an index in ``[0, num_partitions)``.
"""
from __future__ import annotations

import enum
import random
import time
from typing import Callable, Protocol


from client.errors import InvalidConfiguration
from proto.hashing import java_string_hash, murmur3_32_hash

__all__ = ["HashingScheme", "PartitionsRoutingMode", "murmur3_32_hash", "java_string_hash", "sign_safe_mod",
           "MessageRouter", "RoundRobinPartitionMessageRouter", "SinglePartitionMessageRouter",
           "partition_switch_ms", "create_router"]



class HashingScheme(enum.Enum):
    """Key hash used for keyed messages (Pulsar's ``HashingScheme``)."""

    JavaStringHash = "JavaStringHash"
    Murmur3_32Hash = "Murmur3_32Hash"


class PartitionsRoutingMode(enum.Enum):
    """How keyless messages are spread (Pulsar's ``MessageRoutingMode``)."""

    RoundRobinDistribution = "RoundRobinDistribution"
    UseSinglePartition = "UseSinglePartition"
    CustomPartition = "CustomPartition"




_HASHES: dict[HashingScheme, Callable[[str | bytes], int]] = {
    HashingScheme.JavaStringHash: java_string_hash,
    HashingScheme.Murmur3_32Hash: murmur3_32_hash,
}


def sign_safe_mod(n: int, m: int) -> int:
    """Pulsar's ``MathUtils.signSafeMod``: ``n mod m`` in ``[0, m)`` even for
    negative ``n``.  Raises ``ValueError`` if ``m <= 0``."""
    if m <= 0:
        raise ValueError(f"modulus must be positive, got {m}")
    return n % m  # Python's % already has the divisor's sign


class MessageRouter(Protocol):
    """A custom router (Pulsar's ``MessageRouter``)."""

    def choose_partition(self, key: str | None, num_partitions: int) -> int:
        """Partition index in ``[0, num_partitions)`` for partition key ``key``."""
        ...


def _check(num_partitions: int) -> None:
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def partition_switch_ms(batching_max_publish_delay_ms: float, frequency_by_publish_delay: int = 10) -> int:
    """Round-robin switch interval for batching producers, as Pulsar's
    ``batchingPartitionSwitchFrequencyIntervalMicros``: publish delay (ms) times
    ``frequency_by_publish_delay`` (Pulsar's
    ``roundRobinRouterBatchingPartitionSwitchFrequency``, default 10), at least 1 ms."""
    return max(1, int(batching_max_publish_delay_ms * frequency_by_publish_delay))


class RoundRobinPartitionMessageRouter:
    """Pulsar's ``RoundRobinPartitionMessageRouterImpl``.

    Keyed messages go to ``hash(key) mod num_partitions``.  Keyless messages:
    with batching, every message within the same ``partition_switch_ms`` window
    (ms of the clock) goes to the same partition, so batches fill up; without
    batching, one partition after the other.  ``start_partition_index`` defaults
    to a random one (as Pulsar); ``clock`` returns ms and is injectable for tests.
    """

    def __init__(self, hashing_scheme: HashingScheme = HashingScheme.Murmur3_32Hash,
                 start_partition_index: int | None = None, batching_enabled: bool = True,
                 partition_switch_ms: int = 10, clock: Callable[[], int] = _now_ms):
        self._hash = _HASHES[HashingScheme(hashing_scheme)]
        self.start_partition_index = (random.randrange(1 << 31) if start_partition_index is None
                                      else start_partition_index)
        self._next = self.start_partition_index
        self.batching_enabled = batching_enabled
        self.partition_switch_ms = max(1, int(partition_switch_ms))
        self._clock = clock

    def choose_partition(self, key: str | None, num_partitions: int) -> int:
        """Partition index in ``[0, num_partitions)`` for a message with partition
        key ``key`` (None = keyless).  Raises ``ValueError`` if num_partitions <= 0."""
        _check(num_partitions)
        if key is not None:
            return sign_safe_mod(self._hash(key), num_partitions)
        if self.batching_enabled:
            return sign_safe_mod(int(self._clock()) // self.partition_switch_ms + self.start_partition_index,
                                 num_partitions)
        index, self._next = self._next, self._next + 1
        return sign_safe_mod(index, num_partitions)


class SinglePartitionMessageRouter:
    """Pulsar's ``SinglePartitionMessageRouterImpl``: keyed messages by
    ``hash(key) mod num_partitions``, keyless ones always to one partition
    (``partition_index``, random by default, taken mod num_partitions)."""

    def __init__(self, partition_index: int | None = None,
                 hashing_scheme: HashingScheme = HashingScheme.Murmur3_32Hash):
        self._hash = _HASHES[HashingScheme(hashing_scheme)]
        self.partition_index = random.randrange(1 << 31) if partition_index is None else partition_index

    def choose_partition(self, key: str | None, num_partitions: int) -> int:
        """Partition index in ``[0, num_partitions)``; raises ``ValueError`` if
        num_partitions <= 0."""
        _check(num_partitions)
        if key is not None:
            return sign_safe_mod(self._hash(key), num_partitions)
        return sign_safe_mod(self.partition_index, num_partitions)


def create_router(mode: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution,
                  hashing_scheme: HashingScheme = HashingScheme.Murmur3_32Hash, *,
                  batching_enabled: bool = True, partition_switch_ms: int = 10,
                  custom_router: MessageRouter | None = None,
                  clock: Callable[[], int] = _now_ms) -> MessageRouter:
    """The router a partitioned producer uses for ``mode`` (as Pulsar's
    PartitionedProducerImpl.getMessageRouter).  Raises ``InvalidConfiguration``
    when CustomPartition has no ``custom_router`` or a custom router is given
    with another mode."""
    mode = PartitionsRoutingMode(mode)
    if mode is PartitionsRoutingMode.CustomPartition:
        if custom_router is None or not callable(getattr(custom_router, "choose_partition", None)):
            raise InvalidConfiguration("CustomPartition routing needs a message_router with choose_partition()")
        return custom_router
    if custom_router is not None:
        raise InvalidConfiguration("a custom message_router requires routing mode CustomPartition")
    if mode is PartitionsRoutingMode.UseSinglePartition:
        return SinglePartitionMessageRouter(hashing_scheme=hashing_scheme)
    return RoundRobinPartitionMessageRouter(hashing_scheme, batching_enabled=batching_enabled,
                                            partition_switch_ms=partition_switch_ms, clock=clock)
