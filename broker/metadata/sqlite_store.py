"""Embedded MetadataStore on one SQLite file (the broker's default metadata store).

Plays the role ZooKeeper (or Pulsar's ``LocalMemoryMetadataStore`` /
``RocksdbMetadataStore``) plays for a Pulsar broker: a tree of versioned
nodes holding the managed-ledger lists, ManagedCursorInfo, ledger metadata,
cluster registry and namespace policies.

Semantics beyond the ``MetadataStore`` contract, all following ZooKeeper:

* Parents are materialized: writing ``/a/b/c`` creates the missing ancestors
  ``/a`` and ``/a/b`` with an empty value at version 0 (and emits a CREATED
  notification for each of them, parents first). They stay after their
  children are deleted.
* ``delete`` refuses a node that still has children (MetadataStoreError);
  delete the children first.
* The root ``/`` always exists (empty value, version 0) and cannot be written
  or deleted (ValueError).
* A deleted and re-created node starts again at version 0.

Ephemeral nodes (``put_ephemeral``): the session is the open store. Their paths
are recorded in the ``ephemeral`` table in the same transaction as the node;
``close()`` deletes them, and ``open()`` deletes those a crashed (``kill -9``)
owner left behind, before anyone can read them (a node that got children is
kept, as ZooKeeper never gives an ephemeral node children).

Durability: WAL journal with ``synchronous=FULL``, so a change whose
``put``/``delete``/``increment_counter`` has returned survives a ``kill -9``
or a power cut.

Concurrency: one aiosqlite connection, every operation serialized by one
``asyncio.Lock``; each write is one ``BEGIN IMMEDIATE`` ... ``COMMIT``
transaction (IMMEDIATE also guards against another process writing the same
file). A write that has started runs to completion (commit and
notifications) even if the awaiting task is cancelled.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import struct
from typing import Any, AsyncIterator, Callable, Optional

import aiosqlite

from broker.metadata.paths import check_path, check_writable, is_under, split_path
from broker.metadata.store import (
    BadVersion,
    GetResult,
    MetadataStore,
    MetadataStoreError,
    NotFound,
    Notification,
    NotificationType,
    WatchCallback,
)

__all__ = ["SqliteMetadataStore"]

log = logging.getLogger(__name__)

# 1: nodes; 2: + ephemeral (paths of ephemeral nodes, removed at close or, after a crash, at the next open).
# A version-1 file is upgraded in place at open; older code refuses a version-2 file.
_SCHEMA_VERSION = 2
_COUNTER = struct.Struct(">q")

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS nodes (
        path    TEXT PRIMARY KEY,
        parent  TEXT NOT NULL,
        name    TEXT NOT NULL,
        value   BLOB NOT NULL,
        version INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
    "CREATE INDEX IF NOT EXISTS nodes_by_parent ON nodes(parent, name)",
    "CREATE TABLE IF NOT EXISTS ephemeral (path TEXT PRIMARY KEY) WITHOUT ROWID",
    # The root: parent '' so it is nobody's child.
    "INSERT OR IGNORE INTO nodes(path, parent, name, value, version) VALUES ('/', '', '', x'', 0)",
)


_check_path = check_path
_check_writable = check_writable
_split = split_path
_under = is_under


class SqliteMetadataStore(MetadataStore):
    """MetadataStore on one SQLite file through aiosqlite (WAL, synchronous=FULL).

    Create with ``await SqliteMetadataStore.open(path)``; the constructor is
    private. Node values are ``bytes``, versions ``int >= 0``. Paths are
    validated: they must start with ``/``, have no empty, ``.`` or ``..``
    segment and no trailing ``/`` (except the root ``/``); a bad path raises
    ``ValueError``. After ``close()`` every call raises
    ``MetadataStoreError("metadata store is closed")``.

    Watches see the changes made through this store object only (not by another
    process on the same file), after they are committed, in commit order.
    """

    def __init__(self, db: aiosqlite.Connection, path: str) -> None:
        self._db = db
        self._path = path
        self._lock = asyncio.Lock()
        self._closed = False  # no new calls accepted
        self._db_closed = False  # connection closed
        self._writes: set[asyncio.Task] = set()  # started writes, finished before close
        self._watches: dict[int, tuple[str, WatchCallback]] = {}
        self._next_watch_id = 0
        self._tasks: set[asyncio.Task] = set()

    @classmethod
    async def open(cls, path: str) -> "SqliteMetadataStore":
        """Open (creating if needed) the store in the SQLite file ``path``.

        Missing parent directories are created. Raises MetadataStoreError if the
        file cannot be put in WAL mode or has a newer schema than this code.
        """
        directory = os.path.dirname(os.path.abspath(path))
        if path != ":memory:":
            os.makedirs(directory, exist_ok=True)
        db = await aiosqlite.connect(path, isolation_level=None)
        try:
            await db.execute("PRAGMA busy_timeout = 10000")
            async with db.execute("PRAGMA journal_mode = WAL") as cur:
                mode = (await cur.fetchone())[0]
            if mode.lower() != "wal" and path != ":memory:":
                raise MetadataStoreError(f"cannot enable WAL journal on {path!r} (got {mode!r})")
            await db.execute("PRAGMA synchronous = FULL")
            async with db.execute("PRAGMA user_version") as cur:
                schema_version = (await cur.fetchone())[0]
            if schema_version > _SCHEMA_VERSION:
                raise MetadataStoreError(
                    f"{path!r} has metadata schema {schema_version}, "
                    f"this code knows up to {_SCHEMA_VERSION}"
                )
            await db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    await db.execute(statement)
                await db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
                await cls._remove_stale_ephemerals(db, path)
                await db.execute("COMMIT")
            except BaseException:
                await db.execute("ROLLBACK")
                raise
        except BaseException:
            await db.close()
            raise
        return cls(db, path)

    @staticmethod
    async def _remove_stale_ephemerals(db: aiosqlite.Connection, path: str) -> None:
        """Inside the open transaction: delete the ephemeral nodes of a previous session
        that ended without ``close()`` (crash, kill -9), deepest first; a node with
        children is kept (as persistent)."""
        async with db.execute("SELECT path FROM ephemeral ORDER BY path DESC") as cur:
            stale = [row[0] for row in await cur.fetchall()]
        removed = 0
        for node in stale:
            async with db.execute("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (node,)) as cur:
                if await cur.fetchone() is not None:
                    continue
            async with db.execute("DELETE FROM nodes WHERE path = ?", (node,)) as cur:
                removed += cur.rowcount
        await db.execute("DELETE FROM ephemeral")
        if removed:
            log.info("metadata store %s: removed %d ephemeral node(s) left by a previous session", path, removed)

    # ------------------------------------------------------------------ reads

    async def get(self, path: str) -> Optional[GetResult]:
        """``GetResult(value: bytes, version: int)`` of ``path``, or None when absent.

        Raises ValueError on a bad path, MetadataStoreError when closed.
        """
        path = _check_path(path)
        async with self._reading():
            async with self._db.execute(
                "SELECT value, version FROM nodes WHERE path = ?", (path,)
            ) as cur:
                row = await cur.fetchone()
        return None if row is None else GetResult(bytes(row[0]), row[1])

    async def exists(self, path: str) -> bool:
        """True when ``path`` exists (the root always does).

        Raises ValueError on a bad path, MetadataStoreError when closed.
        """
        path = _check_path(path)
        async with self._reading():
            async with self._db.execute("SELECT 1 FROM nodes WHERE path = ?", (path,)) as cur:
                row = await cur.fetchone()
        return row is not None

    async def get_children(self, path: str) -> list[str]:
        """Sorted names (not full paths) of the direct children of ``path``.

        An index lookup on the parent column; an absent node has no children
        (empty list). Raises ValueError on a bad path, MetadataStoreError when closed.
        """
        path = _check_path(path)
        async with self._reading():
            async with self._db.execute(
                "SELECT name FROM nodes WHERE parent = ? ORDER BY name", (path,)
            ) as cur:
                rows = await cur.fetchall()
        # BINARY collation orders UTF-8 bytes, which is code point (Python str) order.
        return [row[0] for row in rows]

    # ----------------------------------------------------------------- writes

    async def put(self, path: str, value: bytes, expected_version: Optional[int] = None) -> int:
        """Write ``value`` (bytes-like) at ``path``; return the new version.

        ``expected_version``: None = create or update; -1 = create only
        (BadVersion if the node exists); N >= 0 = update only if the version is
        N (BadVersion if it differs, NotFound if the node is absent). Missing
        parents are created (empty value, version 0). Raises ValueError on a bad
        path or expected_version < -1, TypeError if ``value`` is not bytes-like,
        MetadataStoreError when closed.
        """
        return await self._put(path, value, expected_version, ephemeral=False)

    async def _put(self, path: str, value: bytes, expected_version: Optional[int], ephemeral: bool) -> int:
        path = _check_writable(path)
        if expected_version is not None and (
            not isinstance(expected_version, int) or expected_version < -1
        ):
            raise ValueError(f"expected_version must be None, -1 or >= 0, got {expected_version!r}")
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"metadata value must be bytes, got {type(value).__name__}")
        data = bytes(value)

        async def txn(notes: list[Notification]) -> int:
            current = await self._version_of(path)
            if ephemeral:
                await self._db.execute("INSERT OR IGNORE INTO ephemeral(path) VALUES (?)", (path,))
            if current is None:
                if expected_version is not None and expected_version >= 0:
                    raise NotFound(f"{path} does not exist (expected version {expected_version})")
                await self._create(path, data, notes)
                return 0
            if expected_version == -1:
                raise BadVersion(f"{path} already exists (version {current})")
            if expected_version is not None and expected_version != current:
                raise BadVersion(f"{path} is at version {current}, expected {expected_version}")
            await self._db.execute(
                "UPDATE nodes SET value = ?, version = ? WHERE path = ?", (data, current + 1, path)
            )
            notes.append(Notification(NotificationType.MODIFIED, path))
            return current + 1

        return await self._write(txn)

    async def delete(self, path: str, expected_version: Optional[int] = None) -> None:
        """Delete ``path``; ``expected_version`` None = unconditional, N >= 0 = CAS.

        Raises NotFound if absent, BadVersion if the version differs,
        MetadataStoreError if the node has children (as ZooKeeper's NotEmpty) or
        the store is closed, ValueError on a bad path / the root / a negative
        expected_version.
        """
        path = _check_writable(path)
        if expected_version is not None and (
            not isinstance(expected_version, int) or expected_version < 0
        ):
            raise ValueError(f"expected_version must be None or >= 0, got {expected_version!r}")

        async def txn(notes: list[Notification]) -> None:
            current = await self._version_of(path)
            if current is None:
                raise NotFound(f"{path} does not exist")
            if expected_version is not None and expected_version != current:
                raise BadVersion(f"{path} is at version {current}, expected {expected_version}")
            async with self._db.execute(
                "SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (path,)
            ) as cur:
                if await cur.fetchone() is not None:
                    raise MetadataStoreError(f"cannot delete {path}: it has children")
            await self._db.execute("DELETE FROM nodes WHERE path = ?", (path,))
            await self._db.execute("DELETE FROM ephemeral WHERE path = ?", (path,))
            notes.append(Notification(NotificationType.DELETED, path))

        await self._write(txn)

    async def increment_counter(self, path: str) -> int:
        """Atomically add 1 to the counter at ``path`` and return the new value.

        The value is stored as 8 bytes, big-endian signed int64 (absent node =
        0, so the first call returns 1); each increment is a put (version + 1,
        CREATED/MODIFIED notification). Like BookKeeper's ledger id generator.
        Raises MetadataStoreError if the node holds something other than 8
        bytes or the store is closed, ValueError on a bad path.
        """
        path = _check_writable(path)

        async def txn(notes: list[Notification]) -> int:
            async with self._db.execute(
                "SELECT value, version FROM nodes WHERE path = ?", (path,)
            ) as cur:
                row = await cur.fetchone()
            if row is None:
                await self._create(path, _COUNTER.pack(1), notes)
                return 1
            raw, version = bytes(row[0]), row[1]
            if len(raw) != _COUNTER.size:
                raise MetadataStoreError(f"{path} does not hold a counter ({len(raw)} bytes)")
            value = _COUNTER.unpack(raw)[0] + 1
            await self._db.execute(
                "UPDATE nodes SET value = ?, version = ? WHERE path = ?",
                (_COUNTER.pack(value), version + 1, path),
            )
            notes.append(Notification(NotificationType.MODIFIED, path))
            return value

        return await self._write(txn)

    # ---------------------------------------------------------------- watches

    def watch(self, callback: WatchCallback, prefix: str = "/") -> Callable[[], None]:
        """Call ``callback(Notification)`` for every committed change of a node at
        or under ``prefix`` (``/a`` matches ``/a`` and ``/a/x``, not ``/ab``).

        Plain callbacks run synchronously after the commit, in commit order;
        coroutine callbacks are scheduled as tasks. Exceptions raised by a
        callback are logged, never propagated to the writer. Returns an
        idempotent function that cancels the watch (Pulsar's
        ``registerListener``). Raises ValueError on a bad prefix,
        MetadataStoreError when closed.
        """
        prefix = _check_path(prefix)
        self._check_open()
        if not callable(callback):
            raise TypeError("watch callback must be callable")
        watch_id = self._next_watch_id
        self._next_watch_id += 1
        self._watches[watch_id] = (prefix, callback)

        def cancel() -> None:
            self._watches.pop(watch_id, None)

        return cancel

    # ------------------------------------------------------------ sessions

    async def put_ephemeral(self, path: str, value: bytes, expected_version: Optional[int] = -1) -> int:
        """``put`` of a node that this open store deletes again on ``close()`` (the
        session of the embedded store is the open store); if the process dies without
        ``close()``, the next ``open()`` of the file deletes it. A later plain ``put``
        keeps the node ephemeral (ZooKeeper's setData). Same errors as ``put``."""
        return await self._put(path, value, expected_version, ephemeral=True)

    def add_session_listener(self, callback) -> Callable[[], None]:
        """The embedded store's session never changes: the listener is kept and never
        called. Returns a function that removes it."""
        self._check_open()
        return lambda: None

    # ------------------------------------------------------------------ close

    async def close(self) -> None:
        """Close the database after the calls already made have finished. Idempotent.

        Further calls raise MetadataStoreError("metadata store is closed"). Writes
        called before close() still complete and notify; watch callback tasks
        already scheduled are left to finish.
        """
        if self._closed:
            return
        try:
            async with self._reading():
                async with self._db.execute("SELECT path FROM ephemeral ORDER BY path DESC") as cur:
                    ephemeral = [row[0] for row in await cur.fetchall()]
        except MetadataStoreError:
            ephemeral = []
        for path in ephemeral:
            try:
                await self.delete(path)
            except MetadataStoreError:  # gone already, or it has children: stays
                pass
        self._closed = True
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        self._watches.clear()
        async with self._lock:
            self._db_closed = True
            await self._db.close()

    # -------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataStoreError("metadata store is closed")

    @contextlib.asynccontextmanager
    async def _reading(self) -> AsyncIterator[None]:
        """Hold the lock for a read, so that it never sees another task's
        uncommitted transaction on the shared connection."""
        self._check_open()
        async with self._lock:
            if self._db_closed:
                raise MetadataStoreError("metadata store is closed")
            yield

    async def _version_of(self, path: str) -> Optional[int]:
        async with self._db.execute("SELECT version FROM nodes WHERE path = ?", (path,)) as cur:
            row = await cur.fetchone()
        return None if row is None else row[0]

    async def _create(self, path: str, data: bytes, notes: list[Notification]) -> None:
        """Insert the absent node ``path`` and its missing ancestors (inside a txn)."""
        missing: list[str] = []
        parent, _ = _split(path)
        while parent != "/" and await self._version_of(parent) is None:
            missing.append(parent)
            parent, _ = _split(parent)
        for node in reversed(missing):
            node_parent, name = _split(node)
            await self._db.execute(
                "INSERT INTO nodes(path, parent, name, value, version) VALUES (?, ?, ?, x'', 0)",
                (node, node_parent, name),
            )
            notes.append(Notification(NotificationType.CREATED, node))
        node_parent, name = _split(path)
        await self._db.execute(
            "INSERT INTO nodes(path, parent, name, value, version) VALUES (?, ?, ?, ?, 0)",
            (path, node_parent, name, data),
        )
        notes.append(Notification(NotificationType.CREATED, path))

    async def _write(self, txn: Callable[[list[Notification]], Any]) -> Any:
        """Run ``txn`` in one IMMEDIATE transaction under the lock, then notify.

        Shielded: once started, the transaction commits (or rolls back) and
        notifies even if the caller is cancelled.
        """
        self._check_open()
        task = asyncio.get_running_loop().create_task(self._run_write(txn))
        self._writes.add(task)
        task.add_done_callback(self._write_done)
        return await asyncio.shield(task)

    def _write_done(self, task: asyncio.Task) -> None:
        self._writes.discard(task)
        # Retrieve the outcome (the caller may have been cancelled) to avoid
        # "exception was never retrieved" warnings.
        if not task.cancelled():
            task.exception()

    async def _run_write(self, txn: Callable[[list[Notification]], Any]) -> Any:
        async with self._lock:
            if self._db_closed:
                raise MetadataStoreError("metadata store is closed")
            notes: list[Notification] = []
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                result = await txn(notes)
                await self._db.execute("COMMIT")
            except BaseException:
                try:
                    await self._db.execute("ROLLBACK")
                except Exception:  # no transaction active (e.g. COMMIT failed and rolled back)
                    log.debug("rollback after failed metadata write", exc_info=True)
                raise
            self._notify(notes)
            return result

    def _notify(self, notes: list[Notification]) -> None:
        if not self._watches:
            return
        watches = list(self._watches.values())
        for note in notes:
            for prefix, callback in watches:
                if not _under(note.path, prefix):
                    continue
                try:
                    outcome = callback(note)
                except Exception:
                    log.exception("metadata watch callback failed for %s %s", note.type, note.path)
                    continue
                if inspect.isawaitable(outcome):
                    task = asyncio.ensure_future(outcome)
                    self._tasks.add(task)
                    task.add_done_callback(self._callback_done)

    def _callback_done(self, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("metadata watch callback failed", exc_info=task.exception())

