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

import logging
import os
import sqlite3
import time

from bookie import journal_file, ledger_db

__all__ = ["Checkpointer", "replay"]

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
