"""Broker configuration: one dataclass, loadable from TOML, overridable by flags.

Field names are Pulsar's broker.conf keys in snake_case.
"""
from __future__ import annotations

import dataclasses
import tomllib
from typing import Any, Optional

from broker.ledger.managed_ledger import ManagedLedgerConfig, ManagedLedgerSettings


@dataclasses.dataclass
class BrokerConfig(ManagedLedgerSettings):
    """Settings of one broker process (Pulsar's ServiceConfiguration); the
    managed-ledger keys come from :class:`ManagedLedgerSettings`."""

    cluster_name: str = "standalone"
    bookies: list[str] = dataclasses.field(default_factory=list)     # host:port of every bookie
    data_dir: str = "data/broker"                                   # metadata store lives here
    bind_address: str = "127.0.0.1"
    advertised_address: str = "127.0.0.1"
    broker_service_port: int = 6600                                 # gRPC; 6650 stays for a Pulsar-protocol listener
    web_service_port: int = 8080                                    # HTTP: Prometheus /metrics
    allow_auto_topic_creation: bool = True
    broker_deduplication_enabled: bool = False
    broker_deduplication_entries_interval: int = 1000               # entries between dedup snapshots
    max_message_size: int = 5 * 1024 * 1024                         # bytes
    dispatcher_max_read_batch_size: int = 100                       # entries per cursor read
    max_unacked_messages_per_consumer: int = 50000
    enable_fault_injection: bool = False                            # tests: admin topics.inject_send_failure
    # bookie client: an add or read a bookie has not answered in this time counts as that
    # bookie failing (ensemble change); Pulsar's bookkeeperClientTimeoutInSeconds
    bookkeeper_client_timeout_in_seconds: float = 30.0
    # geo-replication / replicated subscriptions
    replication_policy_check_duration_seconds: int = 600
    replication_producer_queue_size: int = 1000
    # persists/s of a replicator cursor (Pulsar's managedLedgerDefaultMarkDeleteRateLimit, applied to
    # replicator cursors only: re-sent entries after a crash are dropped by the remote's source-position dedup)
    replicator_mark_delete_rate_limit: float = 10.0
    enable_replicated_subscriptions: bool = True
    replicated_subscriptions_snapshot_frequency_millis: int = 1000
    replicated_subscriptions_snapshot_timeout_seconds: int = 30
    replicated_subscriptions_snapshot_max_cached_per_subscription: int = 30
    # beyond PIP-33: UPDATEs between snapshots carrying acknowledged origins, at most this often
    replicated_subscriptions_update_interval_millis: int = 100
    # managed ledger / bookkeeper keys: inherited from ManagedLedgerSettings

    def managed_ledger_config(self) -> ManagedLedgerConfig:
        """The ManagedLedgerConfig of this broker's topics: its managed-ledger keys,
        and entries of up to ``max_message_size`` + 64 KiB of metadata (bytes)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(ManagedLedgerSettings)}
        return ManagedLedgerConfig(**values, max_entry_size_bytes=self.max_message_size + 64 * 1024)

    @classmethod
    def from_toml(cls, path: str) -> "BrokerConfig":
        """Load a TOML file (keys at top level or under ``[broker]``); unknown keys
        raise ValueError naming them."""
        with open(path, "rb") as f:
            data = tomllib.load(f)
        if "broker" in data and isinstance(data["broker"], dict):
            data = data["broker"]
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BrokerConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown broker config keys: {', '.join(unknown)}")
        return cls(**data)

    def override(self, **values: Optional[Any]) -> "BrokerConfig":
        """A copy with the non-None ``values`` applied (CLI flags)."""
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})
