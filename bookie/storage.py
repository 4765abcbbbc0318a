"""Ledger storage of a bookie: entries and ledger records in SQLite (WAL mode).

BookKeeper concepts: a *ledger* is an append-only log of *entries* (ids 0, 1,
2, ...) written by one writer who proves ownership with a *master key*. The
bookie keeps per ledger the master key, a *fenced* flag (set by ledger
recovery to cut off the old writer) and the highest *LastAddConfirmed* (LAC)
piggy-backed on the adds.

:class:`LedgerStorage` is the bookie's storage as its server sees it (open,
close, adds, fence, delete, reads, read-only mode, disk usage). Its parts, as
BookKeeper separates ``Journal``, ``LedgerStorage`` and ``Cookie``:

* :mod:`bookie.journal`: the write path, group commit (BookKeeper's journal +
  group commit): ``add_entries`` only enqueues; one flush commits everything
  queued in ONE SQLite transaction (not synced) and appends its records to the
  journal with one write, fdatasynced with ``journal_sync=True``, before any
  future of the group resolves, so an acknowledged add survives ``kill -9``
  and power loss. Fence and delete go through the same queue, so they are
  ordered with the adds. Small groups commit on the event loop's thread,
  large ones on the journal thread (measurements there).
* :mod:`bookie.journal_format` / :mod:`bookie.journal_file`: the journal's records
  and files (``journal_directory``, default ``<data dir>/journal``).
* :mod:`bookie.checkpoint`: every ``flush_interval_ms`` SQLite is synced and the
  journal mark persisted (``<data dir>/lastMark``); the journal behind it is
  deleted; at open the journal is replayed from the mark.
* :mod:`bookie.ledger_records`: the per-ledger records and the rules adds,
  fences and deletes are checked against.
* :mod:`bookie.ledger_db`: the SQLite database (schema, migration, the
  group-commit transaction, incremental vacuum of deleted ledgers' space).
* :mod:`bookie.data_dir` and :mod:`bookie.cookie`: the data dir's lock,
  ``--format``, and the cookie check.
* :mod:`bookie.storage_errors`: the errors (re-exported here).

Reads use a second connection (aiosqlite) and only ever see committed data; a group is
committed to SQLite before its adds are acknowledged, so an acknowledged entry is read
at once.

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

Space of deleted ledgers (vacuum policy): see :mod:`bookie.ledger_db`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import shutil
import sqlite3
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import aiosqlite

from bookie import cookie as cookies
from bookie import checkpoint, data_dir, disk_space, journal_file, ledger_db
from bookie.checkpoint import JournalCheckpoints
from bookie.data_dir import LOCK_FILE_NAME
from bookie.journal import GroupCommitJournal
from bookie.ledger_db import (_INSERT_ENTRY, _SCHEMA, _UPSERT_LEDGER, DB_FILE_NAME, PAGE_SIZE_BYTES,
                              VACUUM_STEP_PAGES)
from bookie.ledger_records import (E_BOOKIE_ERROR, E_DUPLICATE_ENTRY, E_LEDGER_FENCED, E_READ_ONLY,
                                   E_UNAUTHORIZED_ACCESS, EOK, AddErrors, AddOp, _Ledger)
from bookie.storage_errors import (DataDirInUse, EntriesNotStored, LedgerNotFound, StorageClosed, StorageError,
                                   UnauthorizedAccess, is_disk_full)

# What this module offered before it was split (its callers import these from here); the
# private names are used by tests.
__all__ = ["LedgerStorage", "StorageError", "StorageClosed", "LedgerNotFound", "UnauthorizedAccess",
           "EntriesNotStored", "DataDirInUse", "is_disk_full", "AddOp", "AddErrors", "DB_FILE_NAME",
           "PAGE_SIZE_BYTES", "WAL_AUTOCHECKPOINT_PAGES", "VACUUM_STEP_PAGES", "LOCK_FILE_NAME", "EOK",
           "E_LEDGER_FENCED", "E_UNAUTHORIZED_ACCESS", "E_DUPLICATE_ENTRY", "E_BOOKIE_ERROR", "E_READ_ONLY",
           "_SCHEMA", "_INSERT_ENTRY", "_UPSERT_LEDGER", "_Ledger"]

log = logging.getLogger(__name__)

# SQLite's default: the commit that leaves the WAL over 1000 pages (16 MiB) checkpoints it.
# Measured: a PASSIVE checkpoint on another thread was worse, because with a steady
# writer it never catches up, so the WAL never restarts and every commit grows the file.
# (Read by LedgerStorage._connect from this module: tests patch it here.)
WAL_AUTOCHECKPOINT_PAGES = 1000

# The journal (bookie.journal_file) and checkpoint (bookie.checkpoint) defaults; BookKeeper's
# names in the comments.
JOURNAL_DIR_NAME = "journal"                        # journalDirectories: <data dir>/journal
DEFAULT_JOURNAL_MAX_SIZE_MB = 512                   # journalMaxSizeMB (BookKeeper: 2048)
DEFAULT_JOURNAL_PRE_ALLOC_SIZE_MB = 16              # journalPreAllocSizeMB
# journalMaxGroupWaitMSec. BookKeeper's default is 2 ms; 0 here: a group is what queued while the
# previous one was written (BookKeeper's journalFlushWhenQueueEmpty). Measured (bench_bookie, one
# trickling 200 B add at a time): 2 ms held each add ~1.4 ms longer (p50 2.0 vs 0.6 ms), as a
# sequential writer's next add always came less than 2 ms after the last group.
DEFAULT_JOURNAL_MAX_GROUP_WAIT_MS = 0.0
DEFAULT_JOURNAL_BUFFERED_WRITES_THRESHOLD = 512 * 1024   # journalBufferedWritesThreshold (bytes)
DEFAULT_FLUSH_INTERVAL_MS = 2000                    # flushInterval (checkpoint period)


class LedgerStorage(GroupCommitJournal, JournalCheckpoints):
    """Durable ledger/entry store of one bookie, with group commit.

    ``path`` is the data directory (created if missing); the database is
    ``<path>/ledgers.db``. ``journal_sync`` (default True) fdatasyncs the journal after
    every group commit before acknowledging; False does not (fast, may lose recent adds
    on a machine crash, like BookKeeper's ``journalSyncData=false``). ``journal_dir``
    (None: ``<path>/journal``), ``journal_max_size_mb``, ``journal_pre_alloc_size_mb``,
    ``journal_max_group_wait_ms``, ``journal_buffered_writes_threshold`` (payload bytes)
    and ``flush_interval_ms``: the journal and checkpoint settings (see
    :class:`bookie.server.BookieConfig`). A group commit holds at most
    ``max_group_entries`` adds (count) and roughly ``max_group_bytes`` payload
    bytes (one add over that limit still forms a group of its own); groups of
    at most ``inline_commit_max_bytes`` commit on the event loop's thread,
    larger ones on the journal thread (see the module docstring).
    ``max_db_size_bytes`` (None = no cap) limits the database file (SQLite
    ``max_page_count``); :meth:`disk_usage` then also reports the share of it in
    use. ``reserve_bytes``: size of the disk reserve released when the storage turns
    read-only (:mod:`bookie.disk_space`; None: 2 % of the filesystem, 1..4 MiB; 0: none).
    Call :meth:`open` before use and :meth:`close` at the end, on one event loop.
    """

    def __init__(
        self,
        path: str,
        journal_sync: bool = True,
        max_group_entries: int = 20_000,
        max_group_bytes: int = 4 * 1024 * 1024,
        inline_commit_max_bytes: int = 64 * 1024,
        max_db_size_bytes: int | None = None,
        reserve_bytes: int | None = None,
        journal_dir: str | None = None,
        journal_max_size_mb: int = DEFAULT_JOURNAL_MAX_SIZE_MB,
        journal_pre_alloc_size_mb: int = DEFAULT_JOURNAL_PRE_ALLOC_SIZE_MB,
        journal_max_group_wait_ms: float = DEFAULT_JOURNAL_MAX_GROUP_WAIT_MS,
        journal_buffered_writes_threshold: int = DEFAULT_JOURNAL_BUFFERED_WRITES_THRESHOLD,
        flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS,
    ) -> None:
        self.path = path
        self.journal_dir = journal_dir or os.path.join(path, JOURNAL_DIR_NAME)
        self.journal_max_size_mb = journal_max_size_mb
        self.journal_pre_alloc_size_mb = journal_pre_alloc_size_mb
        self.journal_max_group_wait_s = journal_max_group_wait_ms / 1000.0
        self.journal_buffered_writes_threshold = journal_buffered_writes_threshold
        self.flush_interval_s = flush_interval_ms / 1000.0
        self._writer: journal_file.JournalWriter | None = None      # the journal files (bookie.journal_file)
        self._checkpointer: checkpoint.Checkpointer | None = None
        self._checkpoint_thread: ThreadPoolExecutor | None = None
        self._checkpoint_task: asyncio.Task | None = None
        self._checkpoint_wanted = asyncio.Event()   # set: checkpoint now (the journal grew)
        self._checkpoint_bytes = 64 * 1024 * 1024   # journal bytes that start a checkpoint (set at open)
        self._queued_bytes = 0          # payload bytes queued for the next group
        self._last_group_at = 0.0       # loop time the last group was taken
        self.replayed_records = 0       # journal records applied at open
        self._journal_separate_fs = False   # the journal dir is on another filesystem than the data dir
        self.db_path = os.path.join(path, DB_FILE_NAME)
        self.journal_sync = journal_sync
        self.max_group_entries = max_group_entries
        self.max_group_bytes = max_group_bytes
        self.inline_commit_max_bytes = inline_commit_max_bytes
        self.max_db_size_bytes = max_db_size_bytes
        self.reserve_bytes = reserve_bytes   # see bookie.disk_space (None: 2 % of the filesystem, 1..4 MiB)
        self._reserve: disk_space.DiskReserve | None = None
        self._reusable_bytes = 0             # free pages inside the database, as last measured
        self.instance_id: str | None = None   # cookie instance id, set by open()
        self.cookie_address = ""
        # Read-only mode (BookKeeper's read-only bookie): normal adds get E_READ_ONLY.
        self.read_only = False
        self.read_only_reason = ""
        # Called with the new state whenever read_only changes (the server re-registers the
        # bookie as read-only / writable, BookKeeper's /ledgers/available/readonly).
        self.on_read_only_change = None
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
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # new databases only; see ledger_db.migrate
            db.execute("PRAGMA journal_mode=WAL")
            # Debian's SQLite zeroes every freed page (secure_delete=1), so deleting a ledger wrote
            # about its whole size to the WAL: on a full disk it could never run. A freed page is
            # only put on the freelist now (a few pages written per delete).
            db.execute("PRAGMA secure_delete=OFF")
            # Commits are not fsynced: the journal makes adds durable (bookie.journal_file). NORMAL
            # (not OFF) so that SQLite still syncs the WAL before and the database after each
            # of its checkpoints: a WAL restarting over frames the database file does not hold
            # on the disk yet would lose data the journal mark says is flushed.
            db.execute("PRAGMA synchronous=NORMAL")
            # On a small filesystem the WAL is kept to a small share of it (bookie.disk_space):
            # a checkpoint grows the database by up to the WAL's size, which must fit.
            wal_pages = disk_space.wal_pages_for(shutil.disk_usage(self.path).total, PAGE_SIZE_BYTES,
                                                 WAL_AUTOCHECKPOINT_PAGES)
            db.execute(f"PRAGMA journal_size_limit={min(67108864, 2 * wal_pages * PAGE_SIZE_BYTES)}")
            db.execute(f"PRAGMA wal_autocheckpoint={wal_pages}")
        except BaseException:
            db.close()
            raise
        return db

    def _init_schema(self, db: sqlite3.Connection) -> None:
        self._incremental_vacuum = ledger_db.init_schema(db, self.db_path, self.max_db_size_bytes)

    def _lock_data_dir(self) -> None:
        """Hold ``<path>/LOCK`` (see :func:`bookie.data_dir.lock_data_dir`)."""
        self._lock_fd = data_dir.lock_data_dir(self.path)

    def _unlock_data_dir(self) -> None:
        data_dir.unlock_data_dir(self._lock_fd)
        self._lock_fd = None

    def _format(self) -> None:
        """Delete the ledger database and the cookie (``--format``); the dir stays locked."""
        data_dir.format_data_dir(self.path)
        journal_file.wipe_journal(self.journal_dir, self.path)

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
                await self._loop.run_in_executor(None, self._start_journal)
            except BaseException:
                self._stop_journal_files()
                self._wdb.close()
                self._wdb = None
                raise
        except BaseException:
            self._unlock_data_dir()
            raise
        self._reserve = disk_space.DiskReserve(self.path, self.reserve_bytes)
        if not self.read_only:
            self._reserve.hold()
        self._journal = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bookie-journal")
        self._rdb = await aiosqlite.connect(self.db_path, isolation_level=None)
        await self._rdb.execute("PRAGMA query_only=ON")
        self._load_ledgers()
        self._closing = False
        self._checkpoint_task = self._loop.create_task(self._checkpoint_loop())
        log.info(
            "opened %s (instance %s, journal_sync=%s, journal %s, %d journal records replayed, %d ledgers)",
            self.db_path, self.instance_id, self.journal_sync, self.journal_dir, self.replayed_records,
            len(self._ledgers)
        )

    async def close(self) -> None:
        """Commit everything already queued and close the database (BookKeeper's
        ``Bookie.shutdown``: the journal is drained before the ledger storage closes).

        Operations submitted after close() starts fail with :class:`StorageClosed`
        (adds: E_BOOKIE_ERROR). Releases the data dir's lock. Idempotent; raises
        ``sqlite3.Error`` only if closing the database fails.
        """
        if self._wdb is None:
            return
        self._closing = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._checkpoint_task is not None:
            self._checkpoint_task.cancel()
            await asyncio.gather(self._checkpoint_task, return_exceptions=True)
            self._checkpoint_task = None
        try:
            if self._journal_task is not None:
                await asyncio.wait([self._journal_task])
            while self._items:
                self._flush()  # inline, whatever the size: closing
            await self.checkpoint()   # the next start replays nothing
        finally:
            self._stop_journal_files()
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
        self._ledgers = ledger_db.load_ledgers(self._wdb)

    # ------------------------------------------------------------------ writes

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
        """Enter or leave read-only mode (the bookie server's disk monitor decides;
        BookKeeper's read-only bookie, LedgerDirsMonitor). ``reason``: logged and kept in
        ``read_only_reason`` (the E_READ_ONLY messages). A change is reported to
        ``on_read_only_change(read_only)`` when set. Never raises."""
        if read_only != self.read_only:
            if read_only:
                log.warning("bookie storage %s is now READ-ONLY: %s", self.path, reason)
            else:
                log.warning("bookie storage %s is writable again: %s", self.path, reason)
        changed = read_only != self.read_only
        self.read_only = read_only
        self.read_only_reason = reason if read_only else ""
        if changed and self._reserve is not None:
            # read-only: give the reserve to deletes/fences; writable: take it back
            self._reserve.release() if read_only else self._reserve.hold()
        if changed and self.on_read_only_change is not None:
            try:
                self.on_read_only_change(read_only)
            except Exception:  # a listener must not break the storage
                log.exception("read-only listener failed")

    async def disk_usage(self) -> tuple[float, str]:
        """``(usage, description)``: the share (0..1) of the space this bookie may write
        that is taken (BookKeeper's ``LedgerDirsMonitor``: 1 - usable/total).

        Free pages inside the database file (SQLite's freelist: pages of deleted
        ledgers) count as usable: SQLite writes new entries into them before it grows
        the file, so deleting a ledger frees space at once, without the vacuum that a
        full filesystem may not allow. Without ``max_db_size_bytes`` that is
        ``1 - (filesystem free bytes + freelist bytes) / filesystem size``; with it, the
        larger of that and the share of ``max_db_size_bytes`` the database's pages in use
        take. Raises ``OSError``/``sqlite3.Error``."""
        db = self._reader()
        if self._reserve is not None and not self.read_only and not self._reserve.held:
            self._reserve.hold()   # taken back (it could not be allocated when the storage turned writable)
        pages = (await db.execute_fetchall("PRAGMA page_count"))[0][0]
        free = (await db.execute_fetchall("PRAGMA freelist_count"))[0][0]
        self._reusable_bytes = reusable = free * PAGE_SIZE_BYTES
        fs = shutil.disk_usage(self.path)
        fs_usage = self._fs_usage(fs.total, fs.free)
        usage, what = fs_usage, (f"filesystem of {self.path} is {fs_usage:.1%} full ({fs.free} bytes free + "
                                 f"{reusable} reusable in the database, of {fs.total})")
        j_usage = self._journal_fs_usage()
        if j_usage is not None and j_usage[0] > usage:
            usage, what = j_usage
        if self.max_db_size_bytes:
            db_usage = (pages - free) * PAGE_SIZE_BYTES / self.max_db_size_bytes
            if db_usage > usage:
                usage, what = db_usage, (f"database uses {(pages - free) * PAGE_SIZE_BYTES} of "
                                         f"max_db_size_bytes={self.max_db_size_bytes} ({db_usage:.1%})")
        return usage, what

    def _fs_usage(self, total: int, free: int) -> float:
        reserve = self._reserve
        return disk_space.usage(total, free, self._reusable_bytes, reserve.size if reserve else 0,
                                reserve.held if reserve else False)

    def quick_usage(self) -> float:
        """The filesystem share in use (as :meth:`disk_usage`, without ``max_db_size_bytes``)
        from one ``statvfs`` and the database's free pages as last measured: cheap enough
        for the add path (a few microseconds). Raises ``OSError``."""
        st = os.statvfs(self.path)
        usage = self._fs_usage(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)
        if self._journal_separate_fs:
            js = os.statvfs(self.journal_dir)
            if js.f_blocks:
                usage = max(usage, 1.0 - js.f_bavail / js.f_blocks)
        return usage

    # ------------------------------------------------------------------ reads

    async def read_lac(self, ledger_id: int) -> tuple[int, int]:
        """``(last_add_confirmed, last_entry_id)`` of a ledger (BookKeeper readLac).

        ``last_entry_id``: the highest entry id committed here (-1 for none).
        ``last_add_confirmed``: the highest LAC piggy-backed on the adds seen
        (as BookKeeper, from memory: a LAC speaks of entries the writer already
        had acknowledged, whether or not the add carrying it commits here), or
        the row's value, a lower bound, for a ledger not in memory.
        Raises :class:`LedgerNotFound` if this bookie has no committed record of it.
        """
        db = self._reader()
        rows = await db.execute_fetchall(
            "SELECT lac, last_entry_id FROM ledgers WHERE ledger_id = ?", (ledger_id,)
        )
        if not rows:
            raise LedgerNotFound(f"ledger {ledger_id} not found on this bookie")
        lac, last = rows[0]
        stored = await db.execute_fetchall("SELECT max(entry_id) FROM entries WHERE ledger_id = ?", (ledger_id,))
        if stored and stored[0][0] is not None:
            last = max(last, stored[0][0])
        record = self._ledgers.get(ledger_id)
        if record is not None:
            lac = max(lac, record.lac)
        return lac, last

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
