"""Broker metadata: the MetadataStore interface (Pulsar's MetadataStore, ZooKeeper-like:
versioned nodes, compare-and-set, children, watches) and its embedded SQLite implementation.

    store = await SqliteMetadataStore.open("data/metadata.db")
    version = await store.put("/admin/clusters/us-east", b"...", expected_version=-1)
"""
from broker.metadata.sqlite_store import SqliteMetadataStore
from broker.metadata.store import (
    BadVersion,
    GetResult,
    MetadataStore,
    MetadataStoreError,
    NotFound,
    Notification,
    NotificationType,
)

__all__ = [
    "BadVersion",
    "GetResult",
    "MetadataStore",
    "MetadataStoreError",
    "NotFound",
    "Notification",
    "NotificationType",
    "SqliteMetadataStore",
]
