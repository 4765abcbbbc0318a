"""Managed-ledger settings (Pulsar's ``ManagedLedgerConfig`` and the
broker.conf keys that fill it): rollover, ensemble/quorums, entry cache,
cursor ledgers and retention. Pure data, no I/O."""
from __future__ import annotations

import dataclasses

__all__ = ["ManagedLedgerSettings", "ManagedLedgerConfig"]


@dataclasses.dataclass
class ManagedLedgerSettings:
    """The broker.conf keys (snake_case) that configure managed ledgers; the
    broker's own config (``broker.config.BrokerConfig``) inherits them.

    Rollover when a ledger holds ``managed_ledger_max_entries_per_ledger``
    entries or ``..._max_size_per_ledger_mb`` MiB, once it is at least
    ``..._min_ledger_rollover_time_minutes`` old, and at the latest after
    ``..._max_ledger_rollover_time_minutes``; new ledgers get ensemble size E,
    write quorum Qw and ack quorum Qa; the entry cache holds up to
    ``managed_ledger_cache_size_mb`` MiB; a cursor ledger rolls over after
    ``managed_ledger_cursor_max_entries_per_ledger`` entries.
    """

    managed_ledger_max_entries_per_ledger: int = 50000
    managed_ledger_max_size_per_ledger_mb: int = 2048
    managed_ledger_min_ledger_rollover_time_minutes: float = 10.0
    managed_ledger_max_ledger_rollover_time_minutes: float = 240.0
    managed_ledger_default_ensemble_size: int = 2
    managed_ledger_default_write_quorum: int = 2
    managed_ledger_default_ack_quorum: int = 2
    managed_ledger_cache_size_mb: int = 256
    # Entry cache eviction (Pulsar's managedLedgerCacheEvictionIntervalMs, ...TimeThresholdMillis,
    # ...Watermark, cacheEvictionByMarkDeletedPosition); see broker/ledger/entry_cache.py.
    managed_ledger_cache_eviction_interval_ms: int = 10
    managed_ledger_cache_eviction_time_threshold_millis: int = 1000
    managed_ledger_cache_eviction_watermark: float = 0.9
    cache_eviction_by_mark_deleted_position: bool = False
    managed_ledger_cursor_max_entries_per_ledger: int = 50000
    # Pulsar's defaultRetentionTimeInMinutes / defaultRetentionSizeInMB:
    # consumed ledgers are kept while within either limit; -1 = keep forever.
    default_retention_time_in_minutes: int = 0
    default_retention_size_in_mb: int = 0


@dataclasses.dataclass
class ManagedLedgerConfig(ManagedLedgerSettings):
    """Managed-ledger settings (Pulsar's ManagedLedgerConfig): the broker.conf
    keys of :class:`ManagedLedgerSettings` plus the largest entry accepted,
    ``max_entry_size_bytes`` (the broker derives it from max_message_size)."""

    max_entry_size_bytes: int = 5 * 1024 * 1024
