"""Checkpoints of a bookie's ledger storage behind its journal, and start-up replay.

BookKeeper concepts: the ``SyncThread`` checkpoints every ``flushInterval``: it takes
the journal's current mark (``Journal.markLog``), flushes ledger storage, then persists
the mark (``LastLogMark.rollLog``) and deletes the journal files wholly behind it
(``JournalRollingFilter``). At start the bookie replays the journal from the persisted
mark (``Journal.replay``).

Here ledger storage is the SQLite database (:mod:`bookie.ledger_db`), written with
``synchronous=NORMAL`` (commits are not fsynced; the journal makes adds durable).
:meth:`Checkpointer.checkpoint`, on its own thread and its own connection (adds keep
committing meanwhile):

1. rolls the journal to a new file (:meth:`bookie.journal_file.JournalWriter.roll`) and
   takes the position at its start as the mark: every group in the files before it was
   committed to SQLite before it was appended to the journal (the group commit writes
   SQLite first, :mod:`bookie.journal`);
2. runs a WAL checkpoint (``PRAGMA wal_checkpoint(PASSIVE)``) and fsyncs the database
   file and its WAL (``os.fsync``): what those groups wrote is on the disk;
3. persists the mark atomically (:func:`bookie.journal_file.write_mark`);
4. deletes the journal files before the mark.

Rolling at each checkpoint keeps the journal to about one flush interval of adds, so a
small disk gets its space back after deletes without waiting for ``journal_max_size_mb``.
:func:`replay` applies the journal from the mark at start (idempotent: see
:func:`bookie.ledger_db.apply_journal_records`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

from bookie import journal_file, ledger_db
from bookie.storage_errors import is_disk_full

__all__ = ["Checkpointer", "replay", "JournalCheckpoints", "JOURNAL_PREALLOC_FS_SHARE",
           "JOURNAL_CHECKPOINT_FS_SHARE"]

# Journal preallocation on a small filesystem: at most this share of it.
JOURNAL_PREALLOC_FS_SHARE = 0.01
# A checkpoint also starts once the journal holds this share of its filesystem since the last
# one (at most journal_max_size_mb): the journal doubles what the disk holds of the newest adds
# until a checkpoint deletes it; kept under the 5 % between disk_usage_threshold and
# disk_usage_lwm_threshold, deleting it cannot flip a full bookie back to writable.
JOURNAL_CHECKPOINT_FS_SHARE = 0.02

log = logging.getLogger("bookie.journal")


def replay(db: sqlite3.Connection, journal_dir: str, data_dir: str, instance_id: str) -> tuple[int, int]:
    """Replay the journal of ``journal_dir`` from the mark kept in ``data_dir`` into the
    database ``db`` (the write connection; committed, not synced: the checkpoint that
    follows syncs it). ``instance_id``: files of another bookie instance are skipped.
    Returns ``(records applied, first free journal file id)``. Raises ``sqlite3.Error`` /
    ``OSError``; never for a torn or garbled journal tail (replay of that file ends there)."""
    mark = journal_file.read_mark(data_dir)
    t0 = time.monotonic()
    records = journal_file.replay_records(journal_dir, mark, instance_id)
    n = ledger_db.apply_journal_records(db, (r[2] for r in records))
    ids = journal_file.list_journal_files(journal_dir)
    next_id = max(ids + [mark[0]]) + 1
    if n:
        log.info("journal replay from mark %s applied %d records in %.3f s", mark, n, time.monotonic() - t0)
    return n, next_id


class Checkpointer:
    """Checkpoints of one bookie's storage (see the module docstring).

    ``db_path``: the SQLite database; ``data_dir``: where the mark is kept;
    ``writer``: the storage's :class:`bookie.journal_file.JournalWriter`. Opens its own
    connection; :meth:`checkpoint` runs on any one thread at a time (the storage's
    checkpoint thread). Counters: ``checkpoints``, ``last_mark``, ``last_duration_s``.
    """

    def __init__(self, db_path: str, data_dir: str, writer: journal_file.JournalWriter) -> None:
        self.db_path = db_path
        self.data_dir = data_dir
        self.writer = writer
        self._db: sqlite3.Connection | None = None
        self.checkpoints = 0
        self.bytes_at_mark = 0          # writer.bytes_written when the last checkpoint rolled (about)
        self.last_mark: tuple[int, int] | None = None
        self.last_duration_s = 0.0

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA synchronous=NORMAL")
            self._db = db
        return self._db

    def checkpoint(self) -> tuple[int, int]:
        """One checkpoint: roll, sync SQLite, persist the mark, delete old journal files.
        Returns the mark ``(file id, offset)``. Raises ``sqlite3.Error`` / ``OSError``
        (ENOSPC: nothing is deleted, the previous mark stays)."""
        t0 = time.monotonic()
        written = self.writer.bytes_written
        mark = self.writer.roll()
        db = self._conn()
        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        for path in (self.db_path, self.db_path + "-wal"):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        journal_file.write_mark(self.data_dir, *mark)
        deleted = self.writer.delete_before(mark[0])
        self.checkpoints += 1
        self.bytes_at_mark = written
        self.last_mark = mark
        self.last_duration_s = time.monotonic() - t0
        log.debug("checkpoint at journal mark %s in %.3f s (%d journal files deleted)", mark,
                  self.last_duration_s, deleted)
        return mark

    def close(self) -> None:
        """Close the checkpoint connection. Idempotent."""
        if self._db is not None:
            self._db.close()
            self._db = None


class JournalCheckpoints:
    """The journal and checkpoint half of :class:`bookie.storage.LedgerStorage` (a mixin
    working on the storage's state): start-up replay and the journal writer
    (:meth:`_start_journal`), the periodic checkpoint (:meth:`checkpoint`, BookKeeper's
    SyncThread), and the journal filesystem's usage for the disk monitor.

    Uses the storage's ``path``, ``db_path``, ``journal_dir``, ``journal_sync``,
    ``journal_max_size_mb``, ``journal_pre_alloc_size_mb``, ``flush_interval_s``,
    ``instance_id``, ``_wdb``, ``_loop``, ``_writer``, ``_checkpointer``,
    ``_checkpoint_thread``, ``_checkpoint_wanted`` (asyncio.Event), ``_checkpoint_bytes``,
    ``_journal_separate_fs``, ``replayed_records`` and ``set_read_only``.
    """

    def _start_journal(self) -> None:
        """Replay the journal into the database (:func:`bookie.checkpoint.replay`), open a
        new journal file and checkpoint once (the replayed groups are synced, the journal
        before the new file is deleted). Runs off the loop, in open(). Raises
        ``sqlite3.Error`` / ``OSError``."""
        os.makedirs(self.journal_dir, exist_ok=True)
        self._journal_separate_fs = os.stat(self.journal_dir).st_dev != os.stat(self.path).st_dev
        self.replayed_records, next_id = replay(self._wdb, self.journal_dir, self.path, self.instance_id or "")
        fs_total = shutil.disk_usage(self.journal_dir).total
        prealloc = min(self.journal_pre_alloc_size_mb * 1024 * 1024, int(fs_total * JOURNAL_PREALLOC_FS_SHARE))
        max_file = max(1, self.journal_max_size_mb) * 1024 * 1024
        self._checkpoint_bytes = max(64 * 1024, min(max_file, int(fs_total * JOURNAL_CHECKPOINT_FS_SHARE)))
        self._writer = journal_file.JournalWriter(self.journal_dir, self.instance_id or "", next_id, max_file,
                                                  prealloc, self.journal_sync)
        self._writer.open()
        self._checkpointer = Checkpointer(self.db_path, self.path, self._writer)
        self._checkpointer.checkpoint()
        self._checkpoint_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bookie-checkpoint")

    def _stop_journal_files(self) -> None:
        """Close the journal writer and the checkpoint connection (open failed, or close)."""
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._checkpoint_thread is not None:
            self._checkpoint_thread.shutdown(wait=False)
            self._checkpoint_thread = None

    async def _checkpoint_loop(self) -> None:
        """Checkpoint every ``flush_interval_ms`` on the checkpoint thread (BookKeeper's
        SyncThread); a failure is logged (a full disk turns the storage read-only) and the
        next interval tries again: the journal keeps everything since the last mark."""
        wanted = self._checkpoint_wanted
        while True:
            try:
                await asyncio.wait_for(wanted.wait(), self.flush_interval_s)
            except asyncio.TimeoutError:
                pass
            wanted.clear()
            await self.checkpoint()

    def _journal_grew(self) -> None:
        """After a group commit (on the loop): start a checkpoint now when the journal grew by
        ``_checkpoint_bytes`` since the last one (see JOURNAL_CHECKPOINT_FS_SHARE)."""
        writer, cp = self._writer, self._checkpointer
        if writer is not None and cp is not None and \
                writer.bytes_written - cp.bytes_at_mark >= self._checkpoint_bytes:
            self._checkpoint_wanted.set()

    async def checkpoint(self) -> tuple[int, int] | None:
        """Run one checkpoint now (:meth:`bookie.checkpoint.Checkpointer.checkpoint`) on the
        checkpoint thread. Returns the new journal mark, or None when it failed (logged)."""
        cp, pool = self._checkpointer, self._checkpoint_thread
        if cp is None or pool is None:
            return None
        try:
            return await self._loop.run_in_executor(pool, cp.checkpoint)
        except Exception as exc:   # noqa: BLE001 - logged; the journal still holds everything
            log.warning("checkpoint of %s failed: %r (the journal keeps the adds since the last mark)",
                        self.db_path, exc)
            if is_disk_full(exc):
                self.set_read_only(True, f"disk full: {exc}")
            return None

    def _journal_fs_usage(self) -> tuple[float, str] | None:
        """``(usage, description)`` of the journal directory's filesystem when it is not the
        data dir's (BookKeeper checks journal and ledger dirs alike), else None. A full
        journal disk turns the bookie read-only like a full ledger disk. Raises ``OSError``."""
        try:
            separate = os.stat(self.journal_dir).st_dev != os.stat(self.path).st_dev
        except FileNotFoundError:
            return None
        if not separate:
            return None
        fs = shutil.disk_usage(self.journal_dir)
        usage = 1.0 - fs.free / fs.total if fs.total else 1.0
        return usage, (f"journal filesystem of {self.journal_dir} is {usage:.1%} full "
                       f"({fs.free} bytes free of {fs.total})")

