"""File I/O of a bookie's journal: the appending writer, the journal mark, replay reading.

BookKeeper concepts: :class:`JournalWriter` is the ``JournalChannel`` of the current
journal file plus the roll rule (``journalMaxSizeMB``) and preallocation
(``journalPreAllocSizeMB``): a group commit appends its records with ONE ``write`` and,
with ``journal_sync`` (``journalSyncData``), ONE ``fdatasync`` (the ``ForceWriteThread``'s
force write), so a group costs one page-granular disk write however many adds it holds.
:func:`write_mark` / :func:`read_mark` keep the last log mark (``lastMark`` in the data
dir: written to a temporary file, fsynced, renamed over, directory fsynced: the mark is
either the old or the new one after any crash). :func:`replay_records` reads the journal
from a mark for start-up replay. The format is :mod:`bookie.journal_format`.

Threads: ``append`` runs on the event loop's thread or the journal thread (one at a time,
the group-commit queue orders them), ``roll`` on the checkpoint thread; a lock orders the
two.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator

from bookie import journal_format as jf

__all__ = ["JournalWriter", "read_mark", "write_mark", "list_journal_files", "replay_records",
           "MARK_FILE_NAME", "wipe_journal"]

log = logging.getLogger("bookie.journal")

MARK_FILE_NAME = "lastMark"      # BookKeeper's name, in the ledger (data) directory


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_journal_files(journal_dir: str) -> list[int]:
    """Ids of the journal files in ``journal_dir``, ascending ([] when it does not exist)."""
    try:
        names = os.listdir(journal_dir)
    except FileNotFoundError:
        return []
    return sorted(i for i in (jf.file_id_of(n) for n in names) if i is not None)


def read_mark(data_dir: str) -> tuple[int, int]:
    """The persisted journal mark ``(file id, offset)`` of ``data_dir``; ``(0, 0)`` when
    there is none (a new bookie: replay everything). A corrupt mark also gives (0, 0),
    with a warning: replaying more than needed is safe (replay is idempotent)."""
    try:
        with open(os.path.join(data_dir, MARK_FILE_NAME), "rb") as f:
            return jf.decode_mark(f.read())
    except FileNotFoundError:
        return (0, 0)
    except jf.JournalFormatError as exc:
        log.warning("journal mark in %s is unreadable (%s): replaying the whole journal", data_dir, exc)
        return (0, 0)


def write_mark(data_dir: str, file_id: int, offset: int) -> None:
    """Persist the journal mark atomically (temp file + fsync + rename + directory fsync).
    Raises ``OSError`` (ENOSPC on a full disk)."""
    path = os.path.join(data_dir, MARK_FILE_NAME)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, jf.encode_mark(file_id, offset))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(data_dir)


def wipe_journal(journal_dir: str, data_dir: str) -> None:
    """Delete every journal file and the mark (``--format``). Missing files are fine;
    raises ``OSError`` when one cannot be deleted."""
    for file_id in list_journal_files(journal_dir):
        os.unlink(os.path.join(journal_dir, jf.file_name(file_id)))
    for name in (MARK_FILE_NAME, MARK_FILE_NAME + ".tmp"):
        try:
            os.unlink(os.path.join(data_dir, name))
        except FileNotFoundError:
            pass


class JournalWriter:
    """Appends group commits to the journal files of ``journal_dir`` (created if missing).

    ``instance_id``: the bookie's cookie instance id, written in each file header.
    ``first_file_id``: id of the first file this writer creates (one past every existing
    file: a restarted bookie never appends after a possibly torn tail).
    ``max_file_bytes``: a group that would take the file past it goes into a new file
    (BookKeeper ``journalMaxSizeMB``; a single larger group still fits in a file of its
    own). ``prealloc_bytes``: the file is extended in chunks of this size with
    ``posix_fallocate`` (``journalPreAllocSizeMB``; 0: not preallocated). ``sync``:
    ``fdatasync`` after each group (``journalSyncData``).

    :attr:`position` is ``(file id, offset)`` after the last appended group. Methods
    raise ``OSError`` (ENOSPC when the journal's disk is full).
    """

    def __init__(self, journal_dir: str, instance_id: str, first_file_id: int, max_file_bytes: int,
                 prealloc_bytes: int, sync: bool) -> None:
        self.journal_dir = journal_dir
        self.instance_id = instance_id
        self.max_file_bytes = max_file_bytes
        self.prealloc_bytes = prealloc_bytes
        self.sync = sync
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._file_id = first_file_id - 1
        self._offset = 0
        self._allocated = 0
        self._header_bytes = 0
        self.bytes_written = 0      # counters for logs and tests
        self.syncs = 0
        self.rolls = 0
        os.makedirs(journal_dir, exist_ok=True)

    @property
    def position(self) -> tuple[int, int]:
        """``(file id, offset)`` just after the last appended group (the current log mark)."""
        return (self._file_id, self._offset)

    @property
    def file_id(self) -> int:
        """Id of the current journal file."""
        return self._file_id

    def open(self) -> None:
        """Create the first journal file."""
        with self._lock:
            self._new_file()

    def _new_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._file_id += 1
        path = os.path.join(self.journal_dir, jf.file_name(self._file_id))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            header = jf.encode_header(self._file_id, self.instance_id)
            self._allocated = 0
            self._offset = 0
            self._fd = fd
            self._write(header)
            os.fsync(fd)
        except BaseException:
            self._fd = None
            os.close(fd)
            raise
        _fsync_dir(self.journal_dir)
        self._header_bytes = self._offset

    def _write(self, data: bytes) -> None:
        end = self._offset + len(data)
        if self.prealloc_bytes and end > self._allocated:
            grow = max(self.prealloc_bytes, end - self._allocated)
            os.posix_fallocate(self._fd, self._allocated, grow)
            self._allocated += grow
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, self._offset)
            self._offset += n
            view = view[n:]
        self.bytes_written += len(data)

    def append(self, data: bytes) -> tuple[int, int]:
        """Append one group's records (``data``: framed records, concatenated) with one
        write, and ``fdatasync`` with ``sync``. Rolls to a new file first when the group
        would take the current one past ``max_file_bytes``. Returns the new position.
        On error the file is left as it was before (a torn tail at most): raises ``OSError``."""
        with self._lock:
            if self._fd is None:        # creating the last file failed (a full disk): try again
                self._new_file()
            elif self._offset > self._header_bytes and self._offset + len(data) > self.max_file_bytes:
                self._roll_locked()
            start = self._offset
            try:
                self._write(data)
                if self.sync:
                    os.fdatasync(self._fd)
                    self.syncs += 1
            except BaseException:
                self._offset = start   # the next group overwrites whatever part was written
                raise
            return (self._file_id, self._offset)

    def _roll_locked(self) -> None:
        old = self._fd
        if old is not None and self.sync:
            os.fdatasync(old)
        self._new_file()
        self.rolls += 1

    def roll(self) -> tuple[int, int]:
        """Start a new journal file now (the checkpoint does, so the file before can be
        deleted once storage is flushed); nothing happens for a file holding no record.
        Returns the position at the start of the (new) current file."""
        with self._lock:
            if self._fd is None or self._offset > self._header_bytes:
                self._roll_locked()
            return (self._file_id, self._offset)

    def delete_before(self, file_id: int) -> int:
        """Delete the journal files whose id is below ``file_id`` (wholly behind the
        mark; never the current one). Returns how many were deleted."""
        n = 0
        for fid in list_journal_files(self.journal_dir):
            if fid < file_id and fid < self._file_id:
                try:
                    os.unlink(os.path.join(self.journal_dir, jf.file_name(fid)))
                    n += 1
                except FileNotFoundError:
                    pass
        return n

    def close(self) -> None:
        """Sync (with ``sync``) and close the current file. Idempotent."""
        with self._lock:
            if self._fd is not None:
                try:
                    if self.sync:
                        os.fdatasync(self._fd)
                finally:
                    os.close(self._fd)
                    self._fd = None


def replay_records(journal_dir: str, mark: tuple[int, int], instance_id: str) -> Iterator[tuple]:
    """Yield ``(file id, offset after the record, record)`` for every journal record at or
    after ``mark`` (``(file id, offset)``), file by file in id order (records as
    :func:`bookie.journal_format.decode_body`). Files behind the mark are skipped; a
    file of another bookie instance (header's instance id differs from ``instance_id``)
    or with an unreadable header is skipped with a warning; a torn record ends its
    file's replay with a warning. Never raises for bad content; ``OSError`` for I/O."""
    mark_id, mark_offset = mark
    for file_id in list_journal_files(journal_dir):
        if file_id < mark_id:
            continue
        path = os.path.join(journal_dir, jf.file_name(file_id))
        with open(path, "rb") as f:
            buf = f.read()
        try:
            header = jf.parse_header(buf)
        except jf.JournalFormatError as exc:
            log.warning("journal file %s skipped: %s", path, exc)
            continue
        if header.instance_id != instance_id:
            log.warning("journal file %s belongs to bookie instance %r, not %r: skipped", path,
                        header.instance_id, instance_id)
            continue
        start = max(header.length, mark_offset) if file_id == mark_id else header.length
        result: list = []
        n = 0
        for end, record in jf.scan_records(buf, start, result):
            n += 1
            yield file_id, end, record
        scan = result[0]
        if scan.torn is not None:
            log.warning("journal file %s: replay ends at offset %d, the tail is torn (%s; a write cut by a "
                        "crash: it was never acknowledged)", path, scan.end, scan.torn)
        log.info("journal file %s: replayed %d records from offset %d to %d", path, n, start, scan.end)
