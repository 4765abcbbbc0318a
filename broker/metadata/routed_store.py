"""A broker's two metadata stores seen as one (Pulsar's local metadata store plus its
``configurationMetadataStoreUrl`` configuration store).

Pulsar keeps what every cluster of a geo-replicated instance shares -- the cluster
list, tenants, namespace policies, partitioned-topic metadata, topic policies -- in
one configuration store, and what belongs to one cluster -- managed ledgers,
cursors, ledger metadata, bundle ownership, load reports, local policies -- in the
cluster's own store. ``RoutedMetadataStore`` sends each path to the store that holds
it, so the rest of the broker keeps one ``MetadataStore``:

* configuration store: ``/admin/clusters``, ``/admin/policies``,
  ``/admin/partitioned-topics``, ``/admin/topic-policies`` and below;
* local store: everything else (``/managed-ledgers``, ``/ledgers``, ``/namespace``,
  ``/loadbalance``, ``/admin/local-policies``, ...).

Sessions and ephemeral nodes are the local store's (ownership lives there).
"""
from __future__ import annotations

from typing import Callable, Optional

from broker.metadata.store import GetResult, MetadataStore, Notification, SessionListener, WatchCallback

__all__ = ["RoutedMetadataStore", "CONFIGURATION_PATHS", "is_configuration_path"]

CONFIGURATION_PATHS = ("/admin/clusters", "/admin/policies", "/admin/partitioned-topics", "/admin/topic-policies")


def is_configuration_path(path: str) -> bool:
    """Whether ``path`` (absolute) lives in the configuration store."""
    return any(path == root or path.startswith(root + "/") for root in CONFIGURATION_PATHS)


def _overlaps_configuration(prefix: str) -> bool:
    """Whether a watch on ``prefix`` can see configuration paths."""
    return prefix == "/" or prefix == "/admin" or is_configuration_path(prefix)


class RoutedMetadataStore(MetadataStore):
    """``local`` and ``configuration`` stores behind one ``MetadataStore`` (see the module
    doc). ``shared`` and sessions are the local store's. ``close()`` closes both."""

    def __init__(self, local: MetadataStore, configuration: MetadataStore):
        self.local = local
        self.configuration = configuration
        self.shared = local.shared

    def _for(self, path: str) -> MetadataStore:
        return self.configuration if is_configuration_path(path) else self.local

    async def get(self, path: str) -> Optional[GetResult]:
        return await self._for(path).get(path)

    async def put(self, path: str, value: bytes, expected_version: Optional[int] = None) -> int:
        return await self._for(path).put(path, value, expected_version)

    async def delete(self, path: str, expected_version: Optional[int] = None) -> None:
        await self._for(path).delete(path, expected_version)

    async def get_children(self, path: str) -> list[str]:
        """Children of ``path``; for ``/`` and ``/admin``, those of both stores."""
        if path in ("/", "/admin"):
            return sorted(set(await self.local.get_children(path)) | set(await self.configuration.get_children(path)))
        return await self._for(path).get_children(path)

    async def exists(self, path: str) -> bool:
        return await self._for(path).exists(path)

    async def increment_counter(self, path: str) -> int:
        return await self._for(path).increment_counter(path)

    def watch(self, callback: WatchCallback, prefix: str = "/") -> Callable[[], None]:
        """Watch ``prefix`` on the store(s) that hold paths under it; each store reports
        only its own paths."""
        cancels = []
        if _overlaps_configuration(prefix):
            def from_configuration(n: Notification):
                return callback(n) if is_configuration_path(n.path) else None
            cancels.append(self.configuration.watch(from_configuration, prefix))
        if not is_configuration_path(prefix):
            def from_local(n: Notification):
                return None if is_configuration_path(n.path) else callback(n)
            cancels.append(self.local.watch(from_local, prefix))

        def cancel() -> None:
            for c in cancels:
                c()
        return cancel

    async def put_ephemeral(self, path: str, value: bytes, expected_version: Optional[int] = -1) -> int:
        return await self._for(path).put_ephemeral(path, value, expected_version)

    def add_session_listener(self, callback: SessionListener) -> Callable[[], None]:
        return self.local.add_session_listener(callback)

    async def close(self) -> None:
        try:
            await self.local.close()
        finally:
            await self.configuration.close()
