"""MetadataStore interface (Pulsar's org.apache.pulsar.metadata.api.MetadataStore).

Paths are '/'-separated absolute strings, as ZooKeeper znodes:
``/managed-ledgers/<tenant>/<ns>/persistent/<topic>``, ``/ledgers/L<id>``,
``/admin/clusters/<name>``, ``/admin/policies/<tenant>/<ns>``.

Values are bytes. Every node has a version (int, 0 after creation, +1 per
put). ``put`` with ``expected_version`` is a compare-and-set:

* ``expected_version=None``  unconditional create-or-update;
* ``expected_version=-1``    create only (``BadVersion`` if the node exists);
* ``expected_version=N>=0``  update only if the current version is N.

Parents are implicit (no need to create them); ``get_children`` lists the
direct child names of a path (names, not full paths), sorted.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Awaitable, Callable, Optional


class MetadataStoreError(Exception):
    """Base of metadata store errors."""


class BadVersion(MetadataStoreError):
    """Compare-and-set failed: the node's version is not the expected one
    (or the node exists when creation was asked for)."""


class NotFound(MetadataStoreError):
    """The node does not exist (raised by delete / versioned put)."""


@dataclasses.dataclass(frozen=True)
class GetResult:
    """A node's value (bytes) and version (int >= 0)."""

    value: bytes
    version: int


class NotificationType:
    """Values of ``Notification.type`` (Pulsar's NotificationType): a node created,
    its value modified, or the node deleted."""

    CREATED = "created"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclasses.dataclass(frozen=True)
class Notification:
    """A change of one node (Pulsar's org.apache.pulsar.metadata.api.Notification)."""

    type: str
    path: str


WatchCallback = Callable[[Notification], Optional[Awaitable[None]]]


class SessionEvent:
    """Values passed to session listeners (Pulsar's
    ``org.apache.pulsar.metadata.api.extended.SessionEvent``).

    * ``CONNECTION_LOST``: the store cannot reach its server; the session may still live.
    * ``RECONNECTED``: reachable again within the session timeout; ephemeral nodes kept.
    * ``SESSION_LOST``: the session (etcd lease) expired or could not be kept alive for
      ``session_timeout_ms``: every ephemeral node of it is gone or about to be; a broker
      must stop serving what those nodes claimed (Pulsar's ZooKeeper session expiry).
    * ``SESSION_REESTABLISHED``: a new session is open (new lease); ephemeral nodes of the
      lost one are not restored: re-create what is still wanted.
    """

    CONNECTION_LOST = "ConnectionLost"
    RECONNECTED = "Reconnected"
    SESSION_LOST = "SessionLost"
    SESSION_REESTABLISHED = "SessionReestablished"


SessionListener = Callable[[str], Optional[Awaitable[None]]]


class MetadataStore(abc.ABC):
    """Key/value store with versions, children, watches and ephemeral nodes of a session.

    ``shared``: True when several broker processes use the same store at once (etcd:
    a broker cluster, with bundle ownership and lookup); False for the embedded SQLite
    file that one standalone broker owns (it then serves every topic itself).
    """

    shared: bool = False

    @abc.abstractmethod
    async def get(self, path: str) -> Optional[GetResult]:
        """Value and version of ``path``, or None when absent."""

    @abc.abstractmethod
    async def put(self, path: str, value: bytes, expected_version: Optional[int] = None) -> int:
        """Write ``value``; returns the new version. Raises BadVersion on a failed CAS,
        NotFound when ``expected_version >= 0`` and the node does not exist."""

    @abc.abstractmethod
    async def delete(self, path: str, expected_version: Optional[int] = None) -> None:
        """Delete ``path``. Raises NotFound if absent, BadVersion on a failed CAS."""

    @abc.abstractmethod
    async def get_children(self, path: str) -> list[str]:
        """Sorted names of the direct children of ``path`` (empty list if none)."""

    @abc.abstractmethod
    async def exists(self, path: str) -> bool:
        """True when ``path`` exists."""

    @abc.abstractmethod
    async def increment_counter(self, path: str) -> int:
        """Atomically increment the int64 counter stored at ``path`` and return the new
        value (1 the first time). Used for ledger ids, like BookKeeper's id generator."""

    @abc.abstractmethod
    def watch(self, callback: WatchCallback, prefix: str = "/") -> Callable[[], None]:
        """Call ``callback(Notification)`` for each change under ``prefix``; returns a
        function that cancels the watch. Coroutine callbacks are scheduled as tasks.
        The embedded SQLite store sees the changes made through this store object
        (synchronously, before the write returns); the etcd store sees the changes made by
        every etcd client, other processes included (asynchronously)."""

    @abc.abstractmethod
    async def put_ephemeral(self, path: str, value: bytes, expected_version: Optional[int] = -1) -> int:
        """Write ``path`` as an ephemeral node of this store's session (ZooKeeper's
        EPHEMERAL, an etcd key attached to the session lease): it is deleted when the
        session ends (``close``, lease expiry after ``session_timeout_ms`` without
        keep-alive, process death). ``expected_version`` as in ``put`` (default -1:
        create only, ``BadVersion`` when the node exists, e.g. owned by another broker).
        Returns the new version."""

    @abc.abstractmethod
    def add_session_listener(self, callback: SessionListener) -> Callable[[], None]:
        """Call ``callback(event)`` (a ``SessionEvent`` value) on each session change;
        returns a function that removes the listener. Coroutine callbacks are scheduled
        as tasks. The embedded SQLite store's session lasts as long as the open store
        and never emits events."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release resources; further calls raise MetadataStoreError."""
