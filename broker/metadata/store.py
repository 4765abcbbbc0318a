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


class MetadataStore(abc.ABC):
    """Key/value store with versions, children and watches."""

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
        """Call ``callback(Notification)`` for each change under ``prefix`` made through
        this store; returns a function that cancels the watch. Coroutine callbacks are
        scheduled as tasks."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release resources; further calls raise MetadataStoreError."""
