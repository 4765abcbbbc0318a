"""Producer settings (Pulsar's ProducerConfigurationData), with the official
pulsar-client Python option names and checks that fail early with
``InvalidConfiguration``."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

from client.compression import CompressionType
from client.errors import InvalidConfiguration
from client.producer_state import BatchingType
from client.routing import HashingScheme, PartitionsRoutingMode

__all__ = ["ProducerConfig"]


@dataclass
class ProducerConfig:
    """Every producer option (official pulsar-client names and defaults, except
    batching on and LZ4 compression by default).

    Sizes in bytes, times in ms, counts as counts; ``send_timeout_millis`` 0 =
    no send timeout; ``max_pending_messages`` <= 0 = unbounded;
    ``initial_sequence_id`` None = continue after the broker's last persisted id
    for ``producer_name``; ``properties``: producer metadata (str -> str);
    ``message_router``: for CustomPartition, an object with
    ``choose_partition(key, num_partitions)`` or a function
    ``(message, num_partitions) -> int`` (the official client's signature).
    """

    producer_name: str | None = None
    initial_sequence_id: int | None = None
    send_timeout_millis: int = 30000
    compression_type: CompressionType = CompressionType.LZ4
    max_pending_messages: int = 1000
    max_pending_messages_across_partitions: int = 50000
    block_if_queue_full: bool = False
    batching_enabled: bool = True
    batching_max_messages: int = 1000
    batching_max_allowed_size_in_bytes: int = 131072
    batching_max_publish_delay_ms: int = 10
    batching_type: BatchingType = BatchingType.Default
    chunking_enabled: bool = False
    message_routing_mode: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution
    hashing_scheme: HashingScheme = HashingScheme.Murmur3_32Hash
    lazy_start_partitioned_producers: bool = False
    properties: dict[str, str] = field(default_factory=dict)
    message_router: Any = None
    is_replicator: bool = False

    @classmethod
    def from_options(cls, **options) -> "ProducerConfig":
        """Build from keyword options; raises ``InvalidConfiguration`` for an
        unknown option or a bad value."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidConfiguration(f"unknown producer option(s) {', '.join(unknown)}; "
                                       f"known: {', '.join(sorted(known))}")
        conf = cls(**{k: v for k, v in options.items() if v is not None or k in ("producer_name",
                                                                                   "initial_sequence_id",
                                                                                   "message_router")})
        conf.validate()
        return conf

    def validate(self) -> None:
        """Normalize enums and check values; raises ``InvalidConfiguration``."""
        self.compression_type = CompressionType.parse(self.compression_type)
        if self.compression_type is CompressionType.SNAPPY:
            raise InvalidConfiguration("SNAPPY compression is not supported, use LZ4, ZLIB or ZSTD")
        self.batching_type = _enum(BatchingType, self.batching_type, "batching_type")
        self.message_routing_mode = _enum(PartitionsRoutingMode, self.message_routing_mode, "message_routing_mode")
        self.hashing_scheme = _enum(HashingScheme, self.hashing_scheme, "hashing_scheme")
        for name in ("send_timeout_millis", "batching_max_publish_delay_ms"):
            if not isinstance(getattr(self, name), (int, float)) or getattr(self, name) < 0:
                raise InvalidConfiguration(f"{name} must be >= 0 (ms), got {getattr(self, name)!r}")
        for name in ("max_pending_messages", "max_pending_messages_across_partitions", "batching_max_messages",
                     "batching_max_allowed_size_in_bytes"):
            if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool):
                raise InvalidConfiguration(f"{name} must be an int, got {getattr(self, name)!r}")
        if self.initial_sequence_id is not None and (not isinstance(self.initial_sequence_id, int)
                                                     or self.initial_sequence_id < -1):
            raise InvalidConfiguration(f"initial_sequence_id must be an int >= -1, got {self.initial_sequence_id!r}")
        if self.producer_name is not None and (not isinstance(self.producer_name, str) or not self.producer_name):
            raise InvalidConfiguration(f"producer_name must be a non-empty str or None, got {self.producer_name!r}")
        self.properties = {str(k): str(v) for k, v in (self.properties or {}).items()}
        if self.message_router is not None:
            if self.message_routing_mode is PartitionsRoutingMode.RoundRobinDistribution:
                self.message_routing_mode = PartitionsRoutingMode.CustomPartition  # as the official client
            if not (callable(self.message_router) or hasattr(self.message_router, "choose_partition")):
                raise InvalidConfiguration("message_router must be a function (message, num_partitions) -> int "
                                           "or have choose_partition(key, num_partitions)")
        elif self.message_routing_mode is PartitionsRoutingMode.CustomPartition:
            raise InvalidConfiguration("CustomPartition routing needs a message_router")

    def router_function(self) -> Callable | None:
        """The official-style router function, when ``message_router`` is one."""
        r = self.message_router
        return r if r is not None and not hasattr(r, "choose_partition") else None


def _enum(enum_cls, value, name):
    """Accept a member, its value or its name; raise InvalidConfiguration otherwise."""
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value)
    except ValueError:
        pass
    try:
        return enum_cls[str(value)]
    except KeyError:
        raise InvalidConfiguration(f"invalid {name} {value!r}; use one of "
                                   f"{', '.join(m.name for m in enum_cls)}") from None
