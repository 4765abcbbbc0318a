"""Errors of a bookie's ledger storage (:mod:`bookie.storage`), and the test
for "the disk is full".

BookKeeper concepts: these are the storage-side failures a bookie maps to
status codes at its RPC edge (``bookie.server``): BookKeeper's
``NoLedgerException`` (:class:`LedgerNotFound`), ``UnauthorizedAccessException``
(:class:`UnauthorizedAccess`), ``NoEntryException`` (:class:`EntriesNotStored`),
and the data-dir lock of its ``Bookie`` (:class:`DataDirInUse`). A full disk
(:func:`is_disk_full`) turns the bookie read-only, as BookKeeper's
``LedgerDirsManager`` does. Every name here is re-exported by
:mod:`bookie.storage`, where callers import them from.
"""

from __future__ import annotations

import errno
import sqlite3

__all__ = ["StorageError", "StorageClosed", "LedgerNotFound", "UnauthorizedAccess", "EntriesNotStored",
           "DataDirInUse", "is_disk_full"]


class StorageError(Exception):
    """Base of the bookie storage errors (maps to a gRPC status at the edge, ``bookie.server``);
    also raised, with the message of the cause, for a failed commit of a fence or delete."""


class StorageClosed(StorageError):
    """The storage was closed (or is closing); the operation was not executed (gRPC UNAVAILABLE)."""


class LedgerNotFound(StorageError):
    """This bookie holds no record of the ledger (never written, or deleted): BookKeeper's
    NoSuchLedgerExistsException (gRPC NOT_FOUND)."""


class UnauthorizedAccess(StorageError):
    """The master key differs from the one the ledger was created with: BookKeeper's
    UnauthorizedAccessException (gRPC PERMISSION_DENIED)."""


class EntriesNotStored(StorageError):
    """Some entry of a requested range is not stored on this bookie: BookKeeper's
    NoSuchEntryException (gRPC OUT_OF_RANGE)."""


class DataDirInUse(StorageError):
    """Another process holds the data dir's lock (``LOCK``, see :mod:`bookie.data_dir`);
    the bookie refuses to start."""


def is_disk_full(exc: BaseException) -> bool:
    """True for SQLite's SQLITE_FULL (database or disk is full) and ENOSPC.

    ``exc``: any exception (never raises). BookKeeper's
    ``LedgerDirsManager.NoWritableLedgerDirException`` situation: the caller
    turns the storage read-only."""
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC
