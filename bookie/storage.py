"""Ledger storage of a bookie: entries and ledger records in SQLite (WAL mode).

BookKeeper concepts: a *ledger* is an append-only log of *entries* (ids 0, 1,
2, ...) written by one writer who proves ownership with a *master key*. The
bookie keeps per ledger the master key, a *fenced* flag (set by ledger
recovery to cut off the old writer) and the highest *LastAddConfirmed* (LAC)
piggy-backed on the adds.

Write path (BookKeeper's journal + group commit): :meth:`LedgerStorage.add_entries`
only enqueues and schedules one flush callback on the event loop; the flush
takes everything queued (up to ``max_group_entries`` adds and about
``max_group_bytes``), validates it against the in-memory ledger records,
inserts all accepted entries with one ``executemany`` in ONE transaction and
commits. With ``journal_sync=True`` the commit is fsynced (``PRAGMA
synchronous=FULL`` in WAL mode: one fdatasync of the WAL) before any future of
the group resolves, so an acknowledged add survives ``kill -9`` and power loss.
Fence and delete go through the same queue, so they are ordered with the adds.
Reads use a second connection (aiosqlite) and only ever see committed data.

Where the commit runs: a small group (at most ``inline_commit_max_bytes``,
default 64 KiB, of payload: the trickle of a latency-bound workload) commits
right on the event loop's thread; a larger one on the single journal thread.
A bookie's loop exists to serve adds and every add of a group waits for its
commit anyway, and for a small group the thread hand-off cost more than it
saved in Python: measured, about 150 us of extra latency and 100 us of bookie
CPU per add for the hand-off and GIL switches, against a commit of 20-30 us
(plus the fdatasync with journal_sync, 0.2-0.4 ms on these machines). For
large groups the thread wins: SQLite releases the GIL, so reading and parsing
the next requests overlaps the commit (122k vs 97k adds/s of 1 KB). Groups
commit one at a time in queue order; adds arriving meanwhile wait in the
queue (or gRPC's buffers) and join the next group. The WAL checkpoint that
SQLite runs inside the commit that fills the WAL past 1000 pages (16 MiB)
holds that commit for some ms, wherever it runs.

Checksums (BookKeeper's DigestManager): an add may carry the CRC32C its writer
computed over the payload; it is stored with the entry (column ``crc``, NULL
when the add had none) and returned with it on read, for the reader to verify.
The bookie does not compute or check it (one C call per entry on the client).

Cookie (see :mod:`bookie.cookie`): :meth:`LedgerStorage.open` refuses a data dir
whose cookie and database do not belong together; the instance id is also in
the database (table ``bookie_instance``). The data dir is locked (``LOCK``,
``flock`` naming the pid) while open, so two processes never share it.

Disk full (BookKeeper's LedgerDirsManager / LedgerDirsMonitor): the bookie
server measures :meth:`LedgerStorage.disk_usage` and sets
:meth:`set_read_only`; while read-only, normal adds get E_READ_ONLY without
being queued, recovery adds, fences and deletes still run. A commit that fails
with SQLITE_FULL turns the storage read-only at once: its adds get E_READ_ONLY,
its fences/deletes are retried once in a group of their own (a delete frees
space, it must not fail because adds overflowed). ``max_db_size_bytes`` caps the
database (SQLite ``max_page_count``; a test knob that acts like a small disk).

Space of deleted ledgers (vacuum policy): new databases use
``auto_vacuum=INCREMENTAL`` (an older database is converted by one VACUUM at
open). Pages freed by a delete are reused by later adds at once; after a
delete, the journal thread also runs ``PRAGMA incremental_vacuum`` in steps of
``VACUUM_STEP_PAGES`` (4 MiB), one step at a time between group commits, until
the free list is empty, then checkpoints the WAL, which truncates the file: the
filesystem gets the space back.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import fcntl
import logging
import os
import shutil
import sqlite3
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import aiosqlite

from bookie import cookie as cookies
from proto import bookie_pb2

log = logging.getLogger(__name__)

DB_FILE_NAME = "ledgers.db"
# 16 KiB pages keep entries of up to ~4 KB inline in the WITHOUT ROWID b-tree
# (with 4 KiB pages a 1 KB entry spills to an overflow page: 3x slower).
PAGE_SIZE_BYTES = 16384
# SQLite's default: the commit that leaves the WAL over 1000 pages (16 MiB) checkpoints it.
# Measured: a PASSIVE checkpoint on another thread was worse, because with a steady
# writer it never catches up, so the WAL never restarts and every commit grows the file.
WAL_AUTOCHECKPOINT_PAGES = 1000
# Pages (16 KiB) returned to the filesystem per incremental-vacuum step after deletes (4 MiB:
# adds queued meanwhile wait for one step only).
VACUUM_STEP_PAGES = 256
LOCK_FILE_NAME = "LOCK"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    ledger_id INTEGER NOT NULL,
    entry_id  INTEGER NOT NULL,
    payload   BLOB    NOT NULL,
    crc       INTEGER,
    PRIMARY KEY (ledger_id, entry_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledgers (
    ledger_id     INTEGER PRIMARY KEY,
    master_key    BLOB    NOT NULL,
    fenced        INTEGER NOT NULL DEFAULT 0,
    lac           INTEGER NOT NULL DEFAULT -1,
    last_entry_id INTEGER NOT NULL DEFAULT -1
);
CREATE TABLE IF NOT EXISTS bookie_instance (
    id          INTEGER PRIMARY KEY CHECK (id = 0),
    instance_id TEXT    NOT NULL,
    created_ms  INTEGER NOT NULL
);
"""

_INSERT_ENTRY = "INSERT INTO entries (ledger_id, entry_id, payload, crc) VALUES (?, ?, ?, ?)"
_UPSERT_LEDGER = (
    "INSERT OR REPLACE INTO ledgers (ledger_id, master_key, fenced, lac, last_entry_id) "
    "VALUES (?, ?, ?, ?, ?)"
)

EOK = bookie_pb2.EOK
E_LEDGER_FENCED = bookie_pb2.E_LEDGER_FENCED
E_UNAUTHORIZED_ACCESS = bookie_pb2.E_UNAUTHORIZED_ACCESS
E_DUPLICATE_ENTRY = bookie_pb2.E_DUPLICATE_ENTRY
E_BOOKIE_ERROR = bookie_pb2.E_BOOKIE_ERROR
E_READ_ONLY = bookie_pb2.E_READ_ONLY


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


class DataDirInUse(StorageError):
    """Another process holds the data dir's lock."""


def is_disk_full(exc: BaseException) -> bool:
    """True for SQLite's SQLITE_FULL (database or disk is full) and ENOSPC."""
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


class _Ledger:
    """In-memory ledger record (the writer task's view, mirrors table ``ledgers``)."""

    __slots__ = ("master_key", "fenced", "lac", "last_entry_id")

    def __init__(self, master_key: bytes, fenced: bool = False, lac: int = -1, last_entry_id: int = -1):
        self.master_key = master_key
        self.fenced = fenced
        self.lac = lac
        self.last_entry_id = last_entry_id

    def row(self, ledger_id: int) -> tuple:
        """This record as a ``ledgers`` table row: ``(ledger_id, master_key, fenced 0/1, lac, last_entry_id)``."""
        return (ledger_id, self.master_key, int(self.fenced), self.lac, self.last_entry_id)


# An add operation as accepted by LedgerStorage.add_entries: a plain tuple
# (ledger_id, entry_id, master_key, payload, last_add_confirmed, recovery[, crc32c]);
# crc32c (int) is the writer's checksum of the payload, None or left out when it sent none.
AddOp = tuple
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
    bytes (one add over that limit still forms a group of its own); groups of
    at most ``inline_commit_max_bytes`` commit on the event loop's thread,
    larger ones on the journal thread (see the module docstring).
    ``max_db_size_bytes`` (None = no cap) limits the database file (SQLite
    ``max_page_count``); :meth:`disk_usage` then also reports the share of it in
    use. Call :meth:`open` before use and :meth:`close` at the end, on one event loop.
    """

    def __init__(
        self,
        path: str,
        journal_sync: bool = True,
        max_group_entries: int = 20_000,
        max_group_bytes: int = 4 * 1024 * 1024,
        inline_commit_max_bytes: int = 64 * 1024,
        max_db_size_bytes: int | None = None,
    ) -> None:
        self.path = path
        self.db_path = os.path.join(path, DB_FILE_NAME)
        self.journal_sync = journal_sync
        self.max_group_entries = max_group_entries
        self.max_group_bytes = max_group_bytes
        self.inline_commit_max_bytes = inline_commit_max_bytes
        self.max_db_size_bytes = max_db_size_bytes
        self.instance_id: str | None = None   # cookie instance id, set by open()
        self.cookie_address = ""
        # Read-only mode (BookKeeper's read-only bookie): normal adds get E_READ_ONLY.
        self.read_only = False
        self.read_only_reason = ""
        self._lock_fd: int | None = None
        self._incremental_vacuum = False   # the database has auto_vacuum=INCREMENTAL
        self._vacuum_wanted = False        # deletes freed pages: give them back to the filesystem
        self._full_retried: set[int] = set()   # ids of futures of fences/deletes retried after SQLITE_FULL
        self._journal: ThreadPoolExecutor | None = None
        self._journal_task: asyncio.Task | None = None  # a group committing on the journal thread
        # the write connection: used on the loop's thread, or on the journal thread while
        # _journal_task runs (never both at once)
        self._wdb: sqlite3.Connection | None = None
        self._rdb: aiosqlite.Connection | None = None
        self._ledgers: dict[int, _Ledger] = {}
        self._items: collections.deque = collections.deque()
        self._flush_handle: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        # counters for logs/metrics/tests
        self.commits = 0
        self.committed_entries = 0

    # ------------------------------------------------------------------ lifecycle

    def _connect(self) -> sqlite3.Connection:
        """The write connection, configured; the schema is created by :meth:`_init_schema`
        once the cookie check accepted the database."""
        db = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
        try:
            db.execute(f"PRAGMA page_size={PAGE_SIZE_BYTES}")
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # new databases only; see _migrate
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'FULL' if self.journal_sync else 'OFF'}")
            db.execute("PRAGMA journal_size_limit=67108864")
            db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        except BaseException:
            db.close()
            raise
        return db

    def _init_schema(self, db: sqlite3.Connection) -> None:
        db.executescript(_SCHEMA)
        self._migrate(db)
        if self.max_db_size_bytes:
            db.execute(f"PRAGMA max_page_count={max(1, self.max_db_size_bytes // PAGE_SIZE_BYTES)}")

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Bring a database of an older version up to date: the ``crc`` column, and
        auto_vacuum=INCREMENTAL (one VACUUM; skipped with a warning if it fails)."""
        columns = {r[1] for r in db.execute("PRAGMA table_info(entries)")}
        if "crc" not in columns:
            db.execute("ALTER TABLE entries ADD COLUMN crc INTEGER")
        if db.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
            log.info("converting %s to auto_vacuum=INCREMENTAL (one-time VACUUM)", self.db_path)
            try:
                db.execute("VACUUM")
            except sqlite3.Error as exc:
                log.warning("VACUUM of %s failed (%s): deleted ledgers' pages are reused but the file "
                            "will not shrink", self.db_path, exc)
        self._incremental_vacuum = db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2

    def _lock_data_dir(self) -> None:
        """Hold ``<path>/LOCK`` (flock, released when the process dies) naming our pid."""
        fd = os.open(os.path.join(self.path, LOCK_FILE_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DataDirInUse(f"data dir {self.path} is in use by another bookie process (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _format(self) -> None:
        """Delete the ledger database and the cookie (``--format``); the dir stays locked."""
        for name in (DB_FILE_NAME, DB_FILE_NAME + "-wal", DB_FILE_NAME + "-shm", cookies.COOKIE_FILE_NAME):
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass
        log.warning("formatted data dir %s: every ledger stored on this bookie was deleted", self.path)

    async def open(self, address: str = "", format: bool = False, create_cookie: bool = False) -> None:
        """Lock the data dir, open (creating if needed) the database, check the cookie
        (:func:`bookie.cookie.validate`) and load the ledger records.

        ``address``: host:port written into a new cookie. ``format``: first delete
        the database and the cookie (BookKeeper's bookieformat: a new, empty bookie
        instance). ``create_cookie``: adopt an existing database that has no cookie.
        Raises :class:`bookie.cookie.InvalidCookieError` when the data dir does not
        belong to this bookie, :class:`DataDirInUse`, and ``sqlite3.Error``/``OSError``
        if the directory or file is unusable.
        """
        os.makedirs(self.path, exist_ok=True)
        self._loop = asyncio.get_running_loop()
        self._lock_data_dir()
        try:
            if format:
                self._format()
            db_existed = os.path.exists(self.db_path)
            if db_existed:
                cookies.check_db_file(self.db_path)
            elif cookies.read_cookie(self.path) is not None:
                # Refuse before creating an empty database in its place.
                cookies.validate(self.path, self.db_path, False, None, address, create_cookie)
            try:
                self._wdb = self._connect()
            except sqlite3.DatabaseError as exc:
                raise cookies.InvalidCookieError(
                    f"ledger database {self.db_path} is unusable ({exc}). Restore it, or start once with "
                    f"--format to re-initialize this bookie (every ledger on it is deleted)") from None
            try:
                # checked before anything is written to a database that may not be ours
                self.instance_id = cookies.validate(self.path, self.db_path, db_existed, self._wdb, address,
                                                    create_cookie)
                self.cookie_address = (cookies.read_cookie(self.path) or cookies.Cookie("", "", 0)).bookie_address
                self._init_schema(self._wdb)
            except BaseException:
                self._wdb.close()
                self._wdb = None
                raise
        except BaseException:
            self._unlock_data_dir()
            raise
        self._journal = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bookie-journal")
        self._rdb = await aiosqlite.connect(self.db_path, isolation_level=None)
        await self._rdb.execute("PRAGMA query_only=ON")
        self._load_ledgers()
        self._closing = False
        log.info(
            "opened %s (instance %s, journal_sync=%s, %d ledgers)", self.db_path, self.instance_id,
            self.journal_sync, len(self._ledgers)
        )

    async def close(self) -> None:
        """Commit everything already queued and close the database.

        Operations submitted after close() starts fail with :class:`StorageClosed`.
        Idempotent.
        """
        if self._wdb is None:
            return
        self._closing = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        try:
            if self._journal_task is not None:
                await asyncio.wait([self._journal_task])
            while self._items:
                self._flush()  # inline, whatever the size: closing
        finally:
            rdb, wdb, journal = self._rdb, self._wdb, self._journal
            self._rdb = self._wdb = self._journal = None
            if rdb is not None:
                await rdb.close()
            # the last connection to close checkpoints and removes the WAL: off the loop
            await self._loop.run_in_executor(journal, wdb.close)
            journal.shutdown(wait=False)
            self._unlock_data_dir()
            log.info("closed %s (%d commits, %d entries)", self.db_path, self.commits, self.committed_entries)

    def _load_ledgers(self) -> None:
        rows = self._wdb.execute("SELECT ledger_id, master_key, fenced, lac, last_entry_id FROM ledgers").fetchall()
        self._ledgers = {r[0]: _Ledger(bytes(r[1]), bool(r[2]), r[3], r[4]) for r in rows}

    # ------------------------------------------------------------------ writes

    @staticmethod
    def _write_group(db: sqlite3.Connection, deletes: list, rows: list, ledger_rows: list) -> None:
        """One group commit: BEGIN, deletes, inserts, ledger records, COMMIT
        (fsynced with journal_sync). Rolls back and re-raises on error."""
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
        last_add_confirmed, recovery[, crc32c])``; ids must already be checked to be
        >= 0, the key non-empty and the payload within the size limit (the
        servicer does that). Returns a future that resolves once the group
        holding these adds is committed (and fsynced with journal_sync) to
        ``AddErrors``: ``{index in ops: (AddStatus, message)}`` for the adds
        that were NOT stored; an empty dict means all EOK. Per-add statuses:
        E_UNAUTHORIZED_ACCESS (other master key), E_LEDGER_FENCED (fenced and
        not a recovery add), E_DUPLICATE_ENTRY (stored with other bytes; same
        bytes is EOK), E_READ_ONLY (the storage is read-only and it is not a
        recovery add, or the commit failed because the disk is full),
        E_BOOKIE_ERROR (the commit failed). The first add of an unknown ledger
        creates its record with that master key.
        """
        fut = asyncio.get_running_loop().create_future()
        if self._closing or self._wdb is None:
            fut.set_result({i: (E_BOOKIE_ERROR, "bookie storage is closed") for i in range(len(ops))})
        else:
            self._enqueue(("add", ops, fut))
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

    async def delete_ledger(self, ledger_id: int, master_key: bytes | None = None) -> bool:
        """Delete a ledger's entries and record. Idempotent.

        Returns True if the ledger existed. With ``master_key`` (the servicer always
        passes one), raises :class:`UnauthorizedAccess` and deletes nothing when the
        ledger exists with another key. Works while read-only (it frees space).
        Raises :class:`StorageClosed` or ``sqlite3.Error``.
        """
        return await self._submit(("delete", ledger_id, master_key))

    def set_read_only(self, read_only: bool, reason: str = "") -> None:
        """Enter or leave read-only mode (the bookie server's disk monitor decides)."""
        if read_only != self.read_only:
            if read_only:
                log.warning("bookie storage %s is now READ-ONLY: %s", self.path, reason)
            else:
                log.warning("bookie storage %s is writable again: %s", self.path, reason)
        self.read_only = read_only
        self.read_only_reason = reason if read_only else ""

    async def disk_usage(self) -> tuple[float, str]:
        """``(usage, description)``: the larger of the filesystem's used share (as
        BookKeeper: 1 - usable/total) and, with ``max_db_size_bytes``, the share of
        it the database's pages in use take (free pages do not count: SQLite reuses
        them). Raises ``OSError``/``sqlite3.Error``."""
        fs = shutil.disk_usage(self.path)
        fs_usage = 1.0 - fs.free / fs.total if fs.total else 0.0
        usage, what = fs_usage, f"filesystem of {self.path} is {fs_usage:.1%} full"
        if self.max_db_size_bytes:
            db = self._reader()
            pages = (await db.execute_fetchall("PRAGMA page_count"))[0][0]
            free = (await db.execute_fetchall("PRAGMA freelist_count"))[0][0]
            db_usage = (pages - free) * PAGE_SIZE_BYTES / self.max_db_size_bytes
            if db_usage > usage:
                usage, what = db_usage, (f"database uses {(pages - free) * PAGE_SIZE_BYTES} of "
                                         f"max_db_size_bytes={self.max_db_size_bytes} ({db_usage:.1%})")
        return usage, what

    async def _submit(self, item: tuple):
        if self._closing or self._wdb is None:
            raise StorageClosed("bookie storage is closed")
        fut = asyncio.get_running_loop().create_future()
        self._enqueue((*item, fut))
        return await fut

    def _enqueue(self, item: tuple) -> None:
        self._items.append(item)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Commit one group: everything queued, up to max_group_entries adds and
        about max_group_bytes payload bytes; schedule the next group if more is queued.

        A group of at most ``inline_commit_max_bytes`` payload bytes commits right
        here, on the loop; a larger one on the journal thread, so that reading and
        parsing the next requests overlaps SQLite's work (throughput). Groups
        commit one at a time, in queue order."""
        self._flush_handle = None
        if self._journal_task is not None:
            return  # the running journal-thread commit schedules the next flush
        items = self._items
        group: list = []
        n = nbytes = 0
        max_n, max_bytes = self.max_group_entries, self.max_group_bytes
        while items and (not group or (n < max_n and nbytes < max_bytes)):
            item = items.popleft()
            group.append(item)
            if item[0] == "add":
                n += len(item[1])
                for op in item[1]:
                    nbytes += len(op[3])
            else:
                n += 1
        if nbytes > self.inline_commit_max_bytes and not self._closing:
            self._journal_task = self._loop.create_task(self._commit_on_journal(group))
            self._journal_task.add_done_callback(lambda task, g=group: self._journal_done(task, g))
            return
        try:
            prepared = self._prepare_group(group)
            if prepared is not None:
                self._write_group(self._wdb, *prepared[:3])
                self._finish_group(group, prepared)
        except Exception as exc:   # the commit (or a bug): no add of the group may hang
            self._fail_group(group, exc)
        finally:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._closing:
            return
        if self._items:
            if self._flush_handle is None:
                self._flush_handle = self._loop.call_soon(self._flush)
        elif self._vacuum_wanted and self._journal_task is None:
            self._start_vacuum_step()

    def _start_vacuum_step(self) -> None:
        """One incremental-vacuum step on the journal thread (nothing else is queued);
        groups queued meanwhile commit after it, then the next step runs."""
        self._journal_task = self._loop.create_task(self._vacuum_on_journal())
        self._journal_task.add_done_callback(self._vacuum_done)

    async def _vacuum_on_journal(self) -> bool:
        return await self._loop.run_in_executor(self._journal, self._vacuum_step, self._wdb, VACUUM_STEP_PAGES)

    @staticmethod
    def _vacuum_step(db: sqlite3.Connection, pages: int) -> bool:
        """Return up to ``pages`` free pages to the filesystem; True if free pages remain.
        The last step checkpoints the WAL (PASSIVE), which truncates the database file."""
        db.executescript(f"PRAGMA incremental_vacuum({pages});")  # executescript: runs every step
        if db.execute("PRAGMA freelist_count").fetchone()[0] > 0:
            return True
        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        return False

    def _vacuum_done(self, task: asyncio.Task) -> None:
        self._journal_task = None
        if task.cancelled():
            self._vacuum_wanted = False
        elif task.exception() is not None:
            log.warning("incremental vacuum of %s failed: %r (freed pages are still reused by adds)",
                        self.db_path, task.exception())
            self._vacuum_wanted = False
        else:
            self._vacuum_wanted = task.result()
            if not self._vacuum_wanted:
                log.info("incremental vacuum of %s done: database file is %d bytes", self.db_path,
                         os.path.getsize(self.db_path))
        self._schedule_flush()

    async def _commit_on_journal(self, group: list) -> None:
        prepared = self._prepare_group(group)
        if prepared is None:
            return
        try:
            await self._loop.run_in_executor(self._journal, self._write_group, self._wdb, *prepared[:3])
        except Exception as exc:
            self._fail_group(group, exc)
        else:
            self._finish_group(group, prepared)

    def _journal_done(self, task: asyncio.Task, group: list) -> None:
        self._journal_task = None
        exc = asyncio.CancelledError() if task.cancelled() else task.exception()
        if exc is not None:   # a bug or shutdown: no add of the group may hang
            log.error("journal commit of %d items ended abnormally: %r", len(group), exc)
            self._fail_group(group, exc)
        self._schedule_flush()

    def _prepare_group(self, group: list):
        """Validate a group against the ledger records (updating them).

        Returns ``(deletes, entry rows, ledger rows, outcomes, entry count)``,
        or None after failing the group (a lookup failed)."""
        try:
            existing = self._fetch_possible_duplicates(group)
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
                    outcomes.append(self._apply_delete(item[1], item[2], pending, existing, touched, deletes))
            ledgers = self._ledgers
            rows = [(k[0], k[1], p[0], p[1]) for k, p in pending.items()]
            return deletes, rows, [ledgers[lid].row(lid) for lid in touched], outcomes, len(rows)
        except Exception as exc:
            self._fail_group(group, exc)
            return None

    def _fail_group(self, group: list, exc: BaseException) -> None:
        """Storage failure: fail the whole group and reload the ledger records
        (the in-memory view may hold the group's uncommitted changes).

        Disk full (SQLITE_FULL): the storage turns read-only, the adds get
        E_READ_ONLY, and fences/deletes are queued again, ahead of everything,
        once (a delete is what frees space)."""
        log.error("group commit of %d items failed: %r", len(group), exc)
        try:
            self._load_ledgers()
        except Exception:
            log.exception("reloading the ledger records after a failed commit failed")
        full = is_disk_full(exc)
        if full:
            self.set_read_only(True, f"disk full: {exc}")
        retry = []
        for item in group:
            fut = item[-1]
            if full and item[0] != "add" and id(fut) not in self._full_retried and not fut.done():
                self._full_retried.add(id(fut))
                fut.add_done_callback(lambda f: self._full_retried.discard(id(f)))
                retry.append(item)
            elif full and item[0] == "add" and not fut.done():
                msg = f"bookie is read-only: disk full ({exc})"
                fut.set_result({i: (E_READ_ONLY, msg) for i in range(len(item[1]))})
            else:
                self._fail_item(item, exc)
        if retry:
            self._items.extendleft(reversed(retry))
            self._schedule_flush()

    def _finish_group(self, group: list, prepared: tuple) -> None:
        """Resolve the futures of a committed group."""
        self.commits += 1
        self.committed_entries += prepared[4]
        if prepared[0] and self._incremental_vacuum:
            self._vacuum_wanted = True   # started by _schedule_flush once nothing is queued
        for item, outcome in zip(group, prepared[3]):
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

    def _fetch_possible_duplicates(self, group: list) -> dict[tuple[int, int], bytes]:
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
        db = self._wdb
        for ledger_id, ids in wanted.items():
            id_list = sorted(ids)
            for i in range(0, len(id_list), 500):
                chunk = id_list[i : i + 500]
                marks = ",".join("?" * len(chunk))
                rows = db.execute(
                    f"SELECT entry_id, payload FROM entries WHERE ledger_id = ? AND entry_id IN ({marks})",
                    (ledger_id, *chunk),
                ).fetchall()
                for entry_id, payload in rows:
                    found[(ledger_id, entry_id)] = payload
        return found

    def _apply_adds(self, ops, pending, existing, touched) -> AddErrors:
        errors: AddErrors = {}
        ledgers = self._ledgers
        read_only = self.read_only
        for i, op in enumerate(ops):
            ledger_id, entry_id, key, payload, lac, recovery = op[:6]
            if read_only and not recovery:
                errors[i] = (E_READ_ONLY, f"bookie is read-only: {self.read_only_reason}")
                continue
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
            if old is not None:
                old = old[0]
            else:
                old = existing.get(k)
            if old is None:
                pending[k] = (payload, op[6] if len(op) > 6 else None)
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

    def _apply_delete(self, ledger_id, key, pending, existing, touched, deletes):
        st = self._ledgers.get(ledger_id)
        if st is not None and key is not None and st.master_key != key:
            return UnauthorizedAccess(f"ledger {ledger_id}: master key does not match the ledger's; not deleted")
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
        self, ledger_id: int, first: int, last: int, max_chunk_bytes: int = 1024 * 1024,
        with_checksums: bool = False,
    ) -> AsyncIterator[list[tuple]]:
        """Yield the stored entries of ``[first, last]`` in id order, in chunks.

        Each chunk is a list of ``(entry_id, payload)`` (``(entry_id, payload,
        crc32c or None)`` with ``with_checksums``) of about ``max_chunk_bytes``
        payload bytes (at least one entry). Each chunk is a separate short query,
        so a slow consumer never pins an old snapshot. Raises
        :class:`EntriesNotStored` if an entry vanished meanwhile (ledger deleted
        during the read).
        """
        db = self._reader()
        nxt = first
        limit = 64
        query = ("SELECT entry_id, payload, crc FROM entries WHERE ledger_id = ? AND entry_id BETWEEN ? AND ? "
                 "ORDER BY entry_id LIMIT ?") if with_checksums else (
                 "SELECT entry_id, payload FROM entries WHERE ledger_id = ? AND entry_id BETWEEN ? AND ? "
                 "ORDER BY entry_id LIMIT ?")
        while nxt <= last:
            rows = await db.execute_fetchall(query, (ledger_id, nxt, last, limit))
            if not rows or rows[0][0] != nxt or rows[-1][0] != nxt + len(rows) - 1:
                raise EntriesNotStored(f"ledger {ledger_id}: entries from {nxt} vanished during the read")
            chunk: list[tuple] = []
            size = 0
            for row in rows:
                n = len(row[1])
                if chunk and size + n > max_chunk_bytes:
                    yield chunk
                    chunk, size = [], 0
                chunk.append(tuple(row))
                size += n
            yield chunk
            nxt = rows[-1][0] + 1
            avg = max(1, sum(len(r[1]) for r in rows) // len(rows))
            limit = max(1, min(4096, max_chunk_bytes // avg))

    def _reader(self) -> aiosqlite.Connection:
        if self._rdb is None or self._closing:
            raise StorageClosed("bookie storage is closed")
        return self._rdb
