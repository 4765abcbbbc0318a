"""Group commit of a bookie's writes: the queue of adds, fences and deletes, and
where and how each group commits.

BookKeeper concepts: the bookie's *Journal* with group commit
(``Journal.QueueEntry`` / ``ForceWriteRequest``): :meth:`bookie.storage.LedgerStorage.add_entries`
only enqueues and schedules one flush callback on the event loop; the flush
takes everything queued (up to ``max_group_entries`` adds and about
``max_group_bytes``), validates it against the in-memory ledger records
(:mod:`bookie.ledger_records`) and commits the group (:meth:`GroupCommitJournal._commit_group`):

1. into ledger storage, SQLite, with one ``executemany`` in ONE transaction
   (:func:`bookie.ledger_db.write_group`), NOT synced (``synchronous=NORMAL``): a read
   sees the entry as soon as its add is acknowledged;
2. into the journal (:mod:`bookie.journal_file`): the group's records
   (:mod:`bookie.journal_format`) appended with one ``write`` and, with
   ``journal_sync=True``, one ``fdatasync`` -- the durability of the add. Only then
   does any future of the group resolve, so an acknowledged add survives ``kill -9``
   and power loss: SQLite pages lost with the power come back from the journal at
   start (:mod:`bookie.checkpoint`, which also syncs SQLite every ``flush_interval_ms``
   and deletes the journal behind it).

Fence and delete go through the same queue, so they are ordered with the adds in
storage and in the journal.

Group size (BookKeeper's ``journalMaxGroupWaitMSec`` / ``journalBufferedWritesThreshold``):
a group is taken at once when the previous one was taken ``journal_max_group_wait_ms``
or more ago (a trickle of adds waits for nothing), otherwise when that much time has
passed since it, or at once when ``journal_buffered_writes_threshold`` payload bytes
are queued. With a wait set, under load that is at most one journal write and
fdatasync per ``journal_max_group_wait_ms``: a page-granular disk write carries many
adds. The default wait is 0 (see ``bookie.storage.DEFAULT_JOURNAL_MAX_GROUP_WAIT_MS``):
a group is then whatever queued while the previous group was written.

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

Disk full: a commit that fails with SQLITE_FULL, or a journal write that fails
with ENOSPC, turns the storage read-only at once: its adds get E_READ_ONLY, its
fences/deletes are retried once in a group of their own (a delete frees space, it
must not fail because adds overflowed). After deletes, incremental-vacuum steps run
on the journal thread between groups (see :mod:`bookie.ledger_db`).

Queued items are tuples ``("add", ops, future)``, ``("fence", ledger_id,
master_key, future)`` and ``("delete", ledger_id, master_key or None, future)``.
"""

from __future__ import annotations

import asyncio
import logging
import os

from bookie import journal_format as jf
from bookie import ledger_db
from bookie.ledger_records import E_BOOKIE_ERROR, E_READ_ONLY, apply_adds, apply_delete, apply_fence
from bookie.storage_errors import StorageClosed, StorageError, is_disk_full

__all__ = ["GroupCommitJournal"]

log = logging.getLogger("bookie.storage")   # the storage's logger, as before this module was split off


class GroupCommitJournal:
    """The group-commit half of :class:`bookie.storage.LedgerStorage` (a mixin: it
    works on the storage's own state; see the module docstring).

    Uses these attributes of the storage: ``_items`` (deque of queued items),
    ``_flush_handle``, ``_loop``, ``_closing``, ``_wdb`` (write connection), ``_writer``
    (the :class:`bookie.journal_file.JournalWriter`, None before open), ``_queued_bytes``,
    ``_last_group_at``, ``journal_max_group_wait_s``, ``journal_buffered_writes_threshold``,
    ``_journal`` (the one-thread executor) and ``_journal_task``, ``_ledgers``
    (records), ``read_only`` / ``read_only_reason``, ``max_group_entries``
    (count), ``max_group_bytes`` and ``inline_commit_max_bytes`` (payload
    bytes), ``_incremental_vacuum`` / ``_vacuum_wanted``, ``_full_retried``, the
    counters ``commits`` / ``committed_entries``; and its methods
    ``_load_ledgers`` and ``set_read_only``.
    """

    # One group commit on the write connection (see bookie.ledger_db.write_group).
    _write_group = staticmethod(ledger_db.write_group)
    # One incremental-vacuum step (see bookie.ledger_db.vacuum_step).
    _vacuum_step = staticmethod(ledger_db.vacuum_step)

    async def _submit(self, item: tuple):
        if self._closing or self._wdb is None:
            raise StorageClosed("bookie storage is closed")
        fut = asyncio.get_running_loop().create_future()
        self._enqueue((*item, fut))
        return await fut

    def _enqueue(self, item: tuple) -> None:
        self._items.append(item)
        if item[0] == "add":
            for op in item[1]:
                self._queued_bytes += len(op[3])
        handle = self._flush_handle
        if handle is None:
            self._flush_handle = self._schedule_group()
        elif self._queued_bytes >= self.journal_buffered_writes_threshold and isinstance(handle, asyncio.TimerHandle):
            handle.cancel()   # journalBufferedWritesThreshold: enough is buffered, write it now
            self._flush_handle = self._loop.call_soon(self._flush)

    def _schedule_group(self) -> asyncio.Handle:
        """When the next group is taken (journalMaxGroupWaitMSec): at once when the last
        group was taken ``journal_max_group_wait_ms`` or more ago (a trickle waits for
        nothing), else when that much time has passed since it (under load: at most one
        group, one journal write and fdatasync, per wait), or at once when
        ``journal_buffered_writes_threshold`` payload bytes are queued."""
        wait = self._last_group_at + self.journal_max_group_wait_s - self._loop.time()
        if wait <= 0 or self._queued_bytes >= self.journal_buffered_writes_threshold:
            return self._loop.call_soon(self._flush)
        return self._loop.call_later(wait, self._flush)

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
        self._last_group_at = self._loop.time()
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
        self._queued_bytes = max(0, self._queued_bytes - nbytes) if items else 0
        if nbytes > self.inline_commit_max_bytes and not self._closing:
            self._journal_task = self._loop.create_task(self._commit_on_journal(group))
            self._journal_task.add_done_callback(lambda task, g=group: self._journal_done(task, g))
            return
        try:
            prepared = self._prepare_group(group)
            if prepared is not None:
                self._commit_group(self._wdb, *prepared[:3])
                self._finish_group(group, prepared)
        except Exception as exc:   # the commit (or a bug): no add of the group may hang
            self._fail_group(group, exc)
        finally:
            self._schedule_flush()

    def _commit_group(self, db, deletes: list, rows: list, ledger_rows: list) -> None:
        """Commit one group: into ledger storage (:meth:`_write_group`, not synced), then
        its records into the journal with one write (and one fdatasync with journal_sync,
        :meth:`bookie.journal_file.JournalWriter.append`). Storage first: a journal position
        then implies storage holds everything before it (the checkpoint's mark), and a read
        after the acknowledgment finds the entry. Raises ``sqlite3.Error`` / ``OSError``
        (ENOSPC: the journal's disk is full)."""
        self._write_group(db, deletes, rows, ledger_rows)
        writer = self._writer
        if writer is None:
            return
        parts = [jf.encode_delete(lid) for lid in deletes]
        parts.extend(jf.encode_ledger(row) for row in ledger_rows)
        jf.encode_adds_into(parts, rows)
        if parts:
            writer.append(b"".join(parts))

    def _schedule_flush(self) -> None:
        if self._closing:
            return
        if self._items:
            if self._flush_handle is None:
                self._flush_handle = self._schedule_group()
        elif self._vacuum_wanted and self._journal_task is None:
            self._start_vacuum_step()

    def _start_vacuum_step(self) -> None:
        """One incremental-vacuum step on the journal thread (nothing else is queued);
        groups queued meanwhile commit after it, then the next step runs."""
        self._journal_task = self._loop.create_task(self._vacuum_on_journal())
        self._journal_task.add_done_callback(self._vacuum_done)

    async def _vacuum_on_journal(self) -> bool:
        return await self._loop.run_in_executor(self._journal, self._vacuum_step, self._wdb,
                                                ledger_db.VACUUM_STEP_PAGES)

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
            await self._loop.run_in_executor(self._journal, self._commit_group, self._wdb, *prepared[:3])
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
            ledgers = self._ledgers
            for item in group:
                kind = item[0]
                if kind == "add":
                    outcomes.append(apply_adds(ledgers, item[1], pending, existing, touched, self.read_only,
                                               self.read_only_reason))
                elif kind == "fence":
                    outcomes.append(apply_fence(ledgers, item[1], item[2], touched))
                else:
                    outcomes.append(apply_delete(ledgers, item[1], item[2], pending, existing, touched, deletes))
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
        self._journal_grew()
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
        """Stored payloads of the group's adds that may be duplicates
        (:func:`bookie.ledger_db.fetch_possible_duplicates` on the write connection)."""
        return ledger_db.fetch_possible_duplicates(self._wdb, self._ledgers, group)
