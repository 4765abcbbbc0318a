"""Disk space of a bookie's data dir: usage as the disk monitor sees it, and a reserve
that lets deletes and fences run on a full disk.

BookKeeper concepts: ``LedgerDirsMonitor`` measures each ledger dir's usage
(1 - usable/total) against ``diskUsageThreshold`` (read-only at or over it) and
``diskUsageLwmThreshold`` (writable again below it); a read-only bookie still
garbage-collects deleted ledgers, which is how space comes back.

Two things make that work on SQLite:

* **Free pages inside the database count as free.** Deleting a ledger puts its
  pages on SQLite's freelist; SQLite writes new entries there before it grows the
  file, so that space is usable at once, without a vacuum (which a full disk may
  not allow). :func:`usage` adds them to the filesystem's free bytes.
* **A reserve file** (``<data_dir>/RESERVED``, :class:`DiskReserve`): a few MiB
  allocated while the bookie is writable and released the moment it turns
  read-only. A write that fills the disk fails with SQLITE_FULL; so would the
  delete that should free space, since SQLite needs room in its write-ahead log
  even to delete. With the reserve released, deletes, fences and recovery adds
  have room. Its size counts as used space whether the file exists or not, so
  releasing it never looks like space freed (no read-only/writable flapping).
* **A write-ahead log sized to the disk** (:func:`wal_pages_for`): SQLite's checkpoint
  copies the WAL into the database, which grows by up to the WAL's size while the WAL
  file keeps its own; on a small disk a 16 MiB WAL alone would fill it.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil

__all__ = ["RESERVE_FILE_NAME", "DiskReserve", "usage", "reserve_size_for", "wal_pages_for"]

log = logging.getLogger("bookie.storage")

RESERVE_FILE_NAME = "RESERVED"
# Reserve size: 2 % of the filesystem, at least 1 MiB, at most 4 MiB (bytes), at most 5 % of it.
RESERVE_SHARE = 0.02
RESERVE_MIN_BYTES = 1024 * 1024
RESERVE_MAX_BYTES = 4 * 1024 * 1024


def reserve_size_for(fs_total_bytes: int) -> int:
    """The reserve for a filesystem of ``fs_total_bytes`` bytes: 2 % of it, clamped to
    1..4 MiB, and never over 5 % of the filesystem (bytes)."""
    size = min(RESERVE_MAX_BYTES, max(RESERVE_MIN_BYTES, fs_total_bytes * RESERVE_SHARE))
    return int(min(size, fs_total_bytes * 0.05))


def wal_pages_for(fs_total_bytes: int, page_size: int, max_pages: int) -> int:
    """SQLite ``wal_autocheckpoint`` (pages) for a database on a filesystem of ``fs_total_bytes``:
    at most ``max_pages``, and at most 2 % of the filesystem (at least 16 pages). A
    checkpoint copies the WAL into the database file, growing it by up to the WAL's size
    while the WAL still takes its own: with the default 1000 pages of 16 KiB, a 24 MiB disk
    fills at a third of its size. Pure."""
    return max(16, min(max_pages, int(fs_total_bytes * RESERVE_SHARE) // page_size))


def usage(fs_total: int, fs_free: int, reusable: int, reserve: int, reserve_held: bool) -> float:
    """Share (0..1) of the filesystem in use as the disk monitor counts it.

    ``fs_total`` / ``fs_free``: the filesystem's size and free bytes (``statvfs``);
    ``reusable``: bytes of free pages inside the database (SQLite freelist); ``reserve``:
    size of the reserve in bytes; ``reserve_held``: whether the reserve file exists now
    (it is counted as used either way). Pure."""
    if fs_total <= 0:
        return 0.0
    available = fs_free + reusable - (0 if reserve_held else reserve)
    return min(1.0, max(0.0, 1.0 - available / fs_total))


class DiskReserve:
    """The reserve file ``<data_dir>/RESERVED`` (see the module docstring).

    ``size``: bytes (None: :func:`reserve_size_for` the data dir's filesystem; 0: no
    reserve). :meth:`hold` allocates it (writable bookie), :meth:`release` deletes it
    (read-only bookie). Both never raise: a reserve that cannot be allocated (the disk is
    already full) is logged and tried again at the next :meth:`hold`."""

    def __init__(self, data_dir: str, size: int | None = None) -> None:
        self.path = os.path.join(data_dir, RESERVE_FILE_NAME)
        self.size = reserve_size_for(shutil.disk_usage(data_dir).total) if size is None else int(size)
        self._hold_failed = False

    @property
    def held(self) -> bool:
        """True when the reserve file exists with its full size."""
        try:
            return self.size > 0 and os.path.getsize(self.path) >= self.size
        except OSError:
            return False

    def hold(self) -> bool:
        """Allocate the reserve (``posix_fallocate``); returns whether it is held."""
        if self.size <= 0 or self.held:
            return self.size > 0
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
            self._hold_failed = False
            return True
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):   # no fallocate here: write zeros
                try:
                    with open(self.path, "wb") as f:
                        f.write(b"\0" * self.size)
                    self._hold_failed = False
                    return True
                except OSError as exc2:
                    exc = exc2
            if not self._hold_failed:   # once until it succeeds: the disk monitor retries often
                log.warning("cannot allocate the disk reserve %s (%d bytes): %s; retrying at each disk check",
                            self.path, self.size, exc)
            self._hold_failed = True
            self._unlink()
            return False

    def release(self) -> None:
        """Delete the reserve: its space is free for deletes, fences and recovery adds."""
        if self.size > 0 and os.path.exists(self.path):
            self._unlink()
            log.warning("released the disk reserve %s (%d bytes) for deletes and fences", self.path, self.size)

    def _unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot delete the disk reserve %s: %s", self.path, exc)
