"""Broker metadata: the MetadataStore interface (Pulsar's MetadataStore, ZooKeeper-like:
versioned nodes, compare-and-set, children, watches, ephemeral nodes of a session), its
embedded SQLite implementation and the etcd one for broker clusters.

    store = await open_metadata_store(config.metadata_store_url, default_sqlite_path="data/metadata.db")
    version = await store.put("/admin/clusters/us-east", b"...", expected_version=-1)
"""
from __future__ import annotations

from typing import Optional

from broker.metadata.etcd_store import EtcdMetadataStore, MetadataStoreUnavailable
from broker.metadata.sqlite_store import SqliteMetadataStore
from broker.metadata.store import (
    BadVersion,
    GetResult,
    MetadataStore,
    MetadataStoreError,
    NotFound,
    Notification,
    NotificationType,
    SessionEvent,
)
from proto.metadata_url import ACCEPTED_FORMS, parse_metadata_store_url

__all__ = [
    "ACCEPTED_FORMS",
    "BadVersion",
    "EtcdMetadataStore",
    "GetResult",
    "MetadataStore",
    "MetadataStoreError",
    "MetadataStoreUnavailable",
    "NotFound",
    "Notification",
    "NotificationType",
    "SessionEvent",
    "SqliteMetadataStore",
    "open_metadata_store",
    "parse_metadata_store_url",
]


async def open_metadata_store(url: Optional[str], *, default_sqlite_path: str, session_timeout_ms: int = 5000,
                              connect_timeout_s: float = 30.0) -> MetadataStore:
    """Open the store named by Pulsar's ``metadataStoreUrl`` (see ``parse_metadata_store_url``):

    * ``""`` / None -> ``SqliteMetadataStore`` at ``default_sqlite_path``;
    * ``"sqlite:PATH"`` -> ``SqliteMetadataStore(PATH)``;
    * ``"etcd://host:port[,host:port...]"`` -> ``EtcdMetadataStore`` with a session of
      ``session_timeout_ms`` (etcd lease TTL), retrying ``connect_timeout_s`` seconds while
      etcd is unreachable.

    Raises ValueError naming the accepted forms for any other URL, MetadataStoreError when
    the store cannot be opened (e.g. "cannot reach etcd at ... after N s: start etcd or fix
    metadata_store_url").
    """
    kind, target = parse_metadata_store_url(url)
    if kind == "sqlite":
        return await SqliteMetadataStore.open(target or default_sqlite_path)
    return await EtcdMetadataStore.open(f"etcd://{target}", session_timeout_ms=session_timeout_ms,
                                        connect_timeout_s=connect_timeout_s)
