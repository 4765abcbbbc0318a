"""Ledger storage of a bookie: entries and ledger records in SQLite (WAL mode).

BookKeeper concepts: a *ledger* is an append-only log of *entries* (ids 0, 1,
2, ...) written by one writer who proves ownership with a *master key*. The
bookie keeps per ledger the master key, a *fenced* flag (set by ledger
recovery to cut off the old writer) and the highest *LastAddConfirmed* (LAC)
piggy-backed on the adds.

Write path (BookKeeper's journal + group commit): :meth:`LedgerStorage.add_entries`
only enqueues; one writer task drains everything queued, validates it against
the in-memory ledger records, inserts all accepted entries with one
``executemany`` in ONE transaction and commits. With ``journal_sync=True`` the
commit is fsynced (``PRAGMA synchronous=FULL`` in WAL mode) before any future
of the group resolves, so an acknowledged add survives ``kill -9`` and power
loss. Fence and delete go through the same queue, so they are ordered with the
adds. Reads use a second connection and only ever see committed data.

Nothing blocks the loop: the write connection is a plain ``sqlite3``
connection owned by ONE journal thread (a single-worker executor), and a whole
group commit -- inserts, ledger records and COMMIT (+fsync) -- is one call to
that thread, so a trickling add costs one thread hand-off instead of one per
statement. Reads go through aiosqlite's worker thread on a second connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import aiosqlite

from proto import bookie_pb2

log = logging.getLogger(__name__)

DB_FILE_NAME = "ledgers.db"
# 16 KiB pages keep entries of up to ~4 KB inline in the WITHOUT ROWID b-tree
# (with 4 KiB pages a 1 KB entry spills to an overflow page: 3x slower).
PAGE_SIZE_BYTES = 16384

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    ledger_id INTEGER NOT NULL,
    entry_id  INTEGER NOT NULL,
    payload   BLOB    NOT NULL,
    PRIMARY KEY (ledger_id, entry_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledgers (
    ledger_id     INTEGER PRIMARY KEY,
    master_key    BLOB    NOT NULL,
    fenced        INTEGER NOT NULL DEFAULT 0,
    lac           INTEGER NOT NULL DEFAULT -1,
    last_entry_id INTEGER NOT NULL DEFAULT -1
);
"""

_INSERT_ENTRY = "INSERT INTO entries (ledger_id, entry_id, payload) VALUES (?, ?, ?)"
_UPSERT_LEDGER = (
    "INSERT OR REPLACE INTO ledgers (ledger_id, master_key, fenced, lac, last_entry_id) "
    "VALUES (?, ?, ?, ?, ?)"
)

EOK = bookie_pb2.EOK
E_LEDGER_FENCED = bookie_pb2.E_LEDGER_FENCED
E_UNAUTHORIZED_ACCESS = bookie_pb2.E_UNAUTHORIZED_ACCESS
E_DUPLICATE_ENTRY = bookie_pb2.E_DUPLICATE_ENTRY
E_BOOKIE_ERROR = bookie_pb2.E_BOOKIE_ERROR


class StorageError(Exception):
    """Base of the bookie storage errors (maps to a gRPC status at the edge)."""


class StorageClosed(StorageError):
    """The storage was closed; the operation was not executed."""


class LedgerNotFound(StorageError):
    """This bookie holds no record of the ledger (never written, or deleted)."""


class UnauthorizedAccess(StorageError):
    """The master key differs from the one the ledger was created with."""


class EntriesNotStored(StorageError):
    """Some entry of a requested range is not stored on this bookie."""


class _Ledger:
    """In-memory ledger record (the writer task's view, mirrors table ``ledgers``)."""

    __slots__ = ("master_key", "fenced", "lac", "last_entry_id")

    def __init__(self, master_key: bytes, fenced: bool = False, lac: int = -1, last_entry_id: int = -1):
        self.master_key = master_key
        self.fenced = fenced
        self.lac = lac
        self.last_entry_id = last_entry_id

    def row(self, ledger_id: int) -> tuple:
        return (ledger_id, self.master_key, int(self.fenced), self.lac, self.last_entry_id)


# An add operation as accepted by LedgerStorage.add_entries: a plain tuple
# (ledger_id, entry_id, master_key, payload, last_add_confirmed, recovery).
AddOp = tuple[int, int, bytes, bytes, int, bool]
# Per-add errors of one add_entries call: {index in the ops list: (AddStatus, message)}.
AddErrors = dict[int, tuple[int, str]]


class LedgerStorage:
    """Durable ledger/entry store of one bookie, with group commit.

    ``path`` is the data directory (created if missing); the database is
    ``<path>/ledgers.db``. ``journal_sync`` (default True) fsyncs every group
    commit before acknowledging (SQLite ``synchronous=FULL``); False uses
    ``synchronous=OFF`` (fast, may lose recent adds on a machine crash, like
    BookKeeper's ``journalSyncData=false``). A group commit holds at most
    ``max_group_entries`` adds (count) and roughly ``max_group_bytes`` payload
    bytes. Call :meth:`open` before use and :meth:`close` at the end.
    """

    def __init__(
        self,
        path: str,
        journal_sync: bool = True,
        max_group_entries: int = 20_000,
        max_group_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.path = path
        self.db_path = os.path.join(path, DB_FILE_NAME)
        self.journal_sync = journal_sync
        self.max_group_entries = max_group_entries
        self.max_group_bytes = max_group_bytes
        self._wdb: sqlite3.Connection | None = None  # used only on the journal thread
        self._journal: ThreadPoolExecutor | None = None
        self._rdb: aiosqlite.Connection | None = None
        self._ledgers: dict[int, _Ledger] = {}
        self._queue: asyncio.Queue | None = None
        self._writer: asyncio.Task | None = None
        self._closing = False
        # counters for logs/metrics
        self.commits = 0
        self.committed_entries = 0

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        """Open (creating if needed) the database and start the writer task.

        Raises ``sqlite3.Error``/``OSError`` if the directory or file is unusable.
        """
        os.makedirs(self.path, exist_ok=True)
        sync = "FULL" if self.journal_sync else "OFF"
        self._journal = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bookie-journal")

        def connect() -> sqlite3.Connection:
            db = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
            db.execute(f"PRAGMA page_size={PAGE_SIZE_BYTES}")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={sync}")
            db.execute("PRAGMA journal_size_limit=67108864")
            db.executescript(_SCHEMA)
            return db

        self._wdb = await self._on_journal(connect)
        self._rdb = await aiosqlite.connect(self.db_path, isolation_level=None)
        await self._rdb.execute("PRAGMA query_only=ON")
        await self._load_ledgers()
        self._queue = asyncio.Queue()
        self._closing = False
        self._writer = asyncio.create_task(self._write_loop(), name="bookie-storage-writer")
        self._writer.add_done_callback(self._writer_done)
        log.info(
            "opened %s (journal_sync=%s, %d ledgers)", self.db_path, self.journal_sync, len(self._ledgers)
        )

    async def close(self) -> None:
        """Commit everything already queued, stop the writer and close the database.

        Operations submitted after close() starts fail with :class:`StorageClosed`.
        Idempotent.
        """
        if self._writer is None:
            return
        self._closing = True
        self._queue.put_nowait(None)
        try:
            await self._writer
        finally:
            self._writer = None
            if self._rdb is not None:
                await self._rdb.close()
            if self._wdb is not None:
                await self._on_journal(self._wdb.close)
            if self._journal is not None:
                self._journal.shutdown(wait=False)
            self._rdb = self._wdb = self._journal = None
            log.info("closed %s (%d commits, %d entries)", self.db_path, self.commits, self.committed_entries)

    async def _load_ledgers(self) -> None:
        db = self._wdb
        rows = await self._on_journal(
            lambda: db.execute("SELECT ledger_id, master_key, fenced, lac, last_entry_id FROM ledgers").fetchall()
        )
        self._ledgers = {r[0]: _Ledger(bytes(r[1]), bool(r[2]), r[3], r[4]) for r in rows}

    # ------------------------------------------------------------------ writes

    def _on_journal(self, fn, *args):
        """Run ``fn(*args)`` on the journal thread (the only user of the write connection)."""
        return asyncio.get_running_loop().run_in_executor(self._journal, fn, *args)

    @staticmethod
    def _write_group(db: sqlite3.Connection, deletes: list, rows: list, ledger_rows: list) -> None:
        """One group commit, on the journal thread: BEGIN, deletes, inserts, ledger
        records, COMMIT (fsynced with journal_sync). Rolls back and re-raises on error."""
        db.execute("BEGIN")
        try:
            for ledger_id in deletes:
                db.execute("DELETE FROM entries WHERE ledger_id = ?", (ledger_id,))
                db.execute("DELETE FROM ledgers WHERE ledger_id = ?", (ledger_id,))
            if rows:
                db.executemany(_INSERT_ENTRY, rows)
            if ledger_rows:
                db.executemany(_UPSERT_LEDGER, ledger_rows)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def add_entries(self, ops: Sequence[AddOp]) -> asyncio.Future:
        """Queue adds for the next group commit (BookKeeper addEntry).

        ``ops`` are tuples ``(ledger_id, entry_id, master_key, payload,
        last_add_confirmed, recovery)``; ids must already be checked to be
        >= 0, the key non-empty and the payload within the size limit (the
        servicer does that). Returns a future that resolves once the group
        holding these adds is committed (and fsynced with journal_sync) to
        ``AddErrors``: ``{index in ops: (AddStatus, message)}`` for the adds
        that were NOT stored; an empty dict means all EOK. Per-add statuses:
        E_UNAUTHORIZED_ACCESS (other master key), E_LEDGER_FENCED (fenced and
        not a recovery add), E_DUPLICATE_ENTRY (stored with other bytes; same
        bytes is EOK), E_BOOKIE_ERROR (the commit failed). The first add of an
        unknown ledger creates its record with that master key.
        """
        fut = asyncio.get_running_loop().create_future()
        if self._closing or self._queue is None:
            fut.set_result({i: (E_BOOKIE_ERROR, "bookie storage is closed") for i in range(len(ops))})
        else:
            self._queue.put_nowait(("add", ops, fut))
        return fut

    async def fence(self, ledger_id: int, master_key: bytes) -> tuple[int, int]:
        """Fence a ledger durably (BookKeeper ledger recovery, step 1).

        Returns ``(last_add_confirmed, last_entry_id)`` as stored here (-1 if
        none). An unknown ledger gets a record with this master key, fenced,
        returning ``(-1, -1)``. Afterwards normal adds get E_LEDGER_FENCED.
        Raises :class:`UnauthorizedAccess` for another master key,
        :class:`StorageClosed`, or ``sqlite3.Error`` if the commit failed.
        """
        return await self._submit(("fence", ledger_id, master_key))

    async def delete_ledger(self, ledger_id: int) -> bool:
        """Delete a ledger's entries and record. Idempotent.

        Returns True if the ledger existed. Raises :class:`StorageClosed` or
        ``sqlite3.Error``.
        """
        return await self._submit(("delete", ledger_id))

    async def _submit(self, item: tuple):
        if self._closing or self._queue is None:
            raise StorageClosed("bookie storage is closed")
        fut = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((*item, fut))
        return await fut

    def _writer_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.critical("storage writer task crashed; no more adds can be stored", exc_info=task.exception())
            self._closing = True

    async def _write_loop(self) -> None:
        queue = self._queue
        stop = False
        while not stop:
            item = await queue.get()
            if item is None:
                break
            group = [item]
            n = len(item[1]) if item[0] == "add" else 1
            while n < self.max_group_entries and not queue.empty():
                nxt = queue.get_nowait()
                if nxt is None:
                    stop = True
                    break
                group.append(nxt)
                n += len(nxt[1]) if nxt[0] == "add" else 1
            await self._commit_group(group)
        # fail whatever raced in after the sentinel
        while not queue.empty():
            item = queue.get_nowait()
            if item is not None:
                self._fail_item(item, StorageClosed("bookie storage is closed"))

    async def _commit_group(self, group: list) -> None:
        """Validate, write and commit one group; then resolve its futures."""
        db = self._wdb
        try:
            existing = await self._fetch_possible_duplicates(group)
            pending: dict[tuple[int, int], bytes] = {}
            deletes: list[int] = []
            touched: set[int] = set()
            outcomes: list = []
            for item in group:
                kind = item[0]
                if kind == "add":
                    outcomes.append(self._apply_adds(item[1], pending, existing, touched))
                elif kind == "fence":
                    outcomes.append(self._apply_fence(item[1], item[2], touched))
                else:
                    outcomes.append(self._apply_delete(item[1], pending, existing, touched, deletes))
            ledgers = self._ledgers
            await self._on_journal(
                self._write_group, db, deletes,
                [(k[0], k[1], p) for k, p in pending.items()],
                [ledgers[lid].row(lid) for lid in touched],
            )
        except Exception as exc:  # storage failure: fail the whole group, reload state
            log.exception("group commit of %d items failed", len(group))
            try:
                await self._load_ledgers()
            except Exception:
                log.exception("rollback after failed commit failed")
            for item in group:
                self._fail_item(item, exc)
            return
        self.commits += 1
        self.committed_entries += len(pending)
        for item, outcome in zip(group, outcomes):
            fut = item[-1]
            if fut.done():
                continue
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    @staticmethod
    def _fail_item(item: tuple, exc: BaseException) -> None:
        fut = item[-1]
        if fut.done():
            return
        if item[0] == "add":
            msg = f"bookie storage error: {exc}"
            fut.set_result({i: (E_BOOKIE_ERROR, msg) for i in range(len(item[1]))})
        else:
            fut.set_exception(exc if isinstance(exc, StorageError) else StorageError(str(exc)))

    async def _fetch_possible_duplicates(self, group: list) -> dict[tuple[int, int], bytes]:
        """Load stored payloads of adds whose id is not above the ledger's last entry.

        Entries above ``last_entry_id`` cannot be stored yet (the common,
        append-only case) and need no lookup.
        """
        wanted: dict[int, set[int]] = {}
        ledgers = self._ledgers
        for item in group:
            if item[0] != "add":
                continue
            for op in item[1]:
                st = ledgers.get(op[0])
                if st is not None and op[1] <= st.last_entry_id:
                    wanted.setdefault(op[0], set()).add(op[1])
        found: dict[tuple[int, int], bytes] = {}
        for ledger_id, ids in wanted.items():
            id_list = sorted(ids)
            for i in range(0, len(id_list), 500):
                chunk = id_list[i : i + 500]
                marks = ",".join("?" * len(chunk))
                db = self._wdb
                rows = await self._on_journal(
                    lambda q=f"SELECT entry_id, payload FROM entries WHERE ledger_id = ? AND entry_id IN ({marks})",
                    a=(ledger_id, *chunk): db.execute(q, a).fetchall()
                )
                for entry_id, payload in rows:
                    found[(ledger_id, entry_id)] = payload
        return found

    def _apply_adds(self, ops, pending, existing, touched) -> AddErrors:
        errors: AddErrors = {}
        ledgers = self._ledgers
        for i, (ledger_id, entry_id, key, payload, lac, recovery) in enumerate(ops):
            st = ledgers.get(ledger_id)
            if st is None:
                st = ledgers[ledger_id] = _Ledger(key)
            elif st.master_key != key:
                errors[i] = (E_UNAUTHORIZED_ACCESS, f"ledger {ledger_id}: master key does not match the ledger's")
                continue
            elif st.fenced and not recovery:
                errors[i] = (E_LEDGER_FENCED, f"ledger {ledger_id} is fenced: only recovery adds are accepted")
                continue
            k = (ledger_id, entry_id)
            old = pending.get(k)
            if old is None:
                old = existing.get(k)
            if old is None:
                pending[k] = payload
                if entry_id > st.last_entry_id:
                    st.last_entry_id = entry_id
            elif old != payload:
                errors[i] = (
                    E_DUPLICATE_ENTRY,
                    f"entry {ledger_id}:{entry_id} is already stored with different content",
                )
                continue
            if lac > st.lac:
                st.lac = lac
            touched.add(ledger_id)
        return errors

    def _apply_fence(self, ledger_id: int, key: bytes, touched: set):
        st = self._ledgers.get(ledger_id)
        if st is None:
            st = self._ledgers[ledger_id] = _Ledger(key)
        elif st.master_key != key:
            return UnauthorizedAccess(f"ledger {ledger_id}: master key does not match the ledger's")
        st.fenced = True
        touched.add(ledger_id)
        return (st.lac, st.last_entry_id)

    def _apply_delete(self, ledger_id, pending, existing, touched, deletes) -> bool:
        existed = self._ledgers.pop(ledger_id, None) is not None
        touched.discard(ledger_id)
        for k in [k for k in pending if k[0] == ledger_id]:
            del pending[k]
        for k in [k for k in existing if k[0] == ledger_id]:
            del existing[k]
        deletes.append(ledger_id)
        return existed

    # ------------------------------------------------------------------ reads

    async def read_lac(self, ledger_id: int) -> tuple[int, int]:
        """Committed ``(last_add_confirmed, last_entry_id)`` of a ledger (BookKeeper readLac).

        Raises :class:`LedgerNotFound` if this bookie has no record of it.
        """
        rows = await self._reader().execute_fetchall(
            "SELECT lac, last_entry_id FROM ledgers WHERE ledger_id = ?", (ledger_id,)
        )
        if not rows:
            raise LedgerNotFound(f"ledger {ledger_id} not found on this bookie")
        return rows[0][0], rows[0][1]

    async def check_range(self, ledger_id: int, first: int, last: int) -> None:
        """Check that every entry of ``[first, last]`` (inclusive) is stored.

        Raises :class:`LedgerNotFound` for an unknown ledger and
        :class:`EntriesNotStored` if any entry of the range is missing here.
        """
        db = self._reader()
        rows = await db.execute_fetchall("SELECT 1 FROM ledgers WHERE ledger_id = ?", (ledger_id,))
        if not rows:
            raise LedgerNotFound(f"ledger {ledger_id} not found on this bookie")
        rows = await db.execute_fetchall(
            "SELECT COUNT(*) FROM entries WHERE ledger_id = ? AND entry_id BETWEEN ? AND ?",
            (ledger_id, first, last),
        )
        stored = rows[0][0]
        if stored != last - first + 1:
            raise EntriesNotStored(
                f"ledger {ledger_id}: only {stored} of entries {first}..{last} "
                f"({last - first + 1}) are stored on this bookie"
            )

    async def read_entries(
        self, ledger_id: int, first: int, last: int, max_chunk_bytes: int = 1024 * 1024
    ) -> AsyncIterator[list[tuple[int, bytes]]]:
        """Yield the stored entries of ``[first, last]`` in id order, in chunks.

        Each chunk is a list of ``(entry_id, payload)`` of about
        ``max_chunk_bytes`` payload bytes (at least one entry). Each chunk is a
        separate short query, so a slow consumer never pins an old snapshot.
        Raises :class:`EntriesNotStored` if an entry vanished meanwhile
        (ledger deleted during the read).
        """
        db = self._reader()
        nxt = first
        limit = 64
        while nxt <= last:
            rows = await db.execute_fetchall(
                "SELECT entry_id, payload FROM entries WHERE ledger_id = ? AND entry_id BETWEEN ? AND ? "
                "ORDER BY entry_id LIMIT ?",
                (ledger_id, nxt, last, limit),
            )
            if not rows or rows[0][0] != nxt or rows[-1][0] != nxt + len(rows) - 1:
                raise EntriesNotStored(f"ledger {ledger_id}: entries from {nxt} vanished during the read")
            chunk: list[tuple[int, bytes]] = []
            size = 0
            for entry_id, payload in rows:
                if chunk and size + len(payload) > max_chunk_bytes:
                    yield chunk
                    chunk, size = [], 0
                chunk.append((entry_id, payload))
                size += len(payload)
            yield chunk
            nxt = rows[-1][0] + 1
            avg = max(1, sum(len(r[1]) for r in rows) // len(rows))
            limit = max(1, min(4096, max_chunk_bytes // avg))

    def _reader(self) -> aiosqlite.Connection:
        if self._rdb is None or self._closing:
            raise StorageClosed("bookie storage is closed")
        return self._rdb
