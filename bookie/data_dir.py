"""A bookie's data directory: its lock and ``--format``.

BookKeeper concepts: a bookie's ledger directory belongs to one bookie
process at a time (BookKeeper locks its directories when the ``Bookie``
starts), and ``bookieformat`` wipes it to start a new, empty bookie instance
(the cookie goes with it, see :mod:`bookie.cookie`). Used by
:meth:`bookie.storage.LedgerStorage.open` / ``close``; the cookie check itself
is in :mod:`bookie.cookie`.

The lock is ``<data dir>/LOCK``: an ``flock`` (released by the kernel when the
process dies, so a crash never leaves a stale lock) on a file that names the
holder's pid, for the error message of the next process that tries.
"""

from __future__ import annotations

import logging
import os

from bookie import cookie as cookies
from bookie.ledger_db import DB_FILE_NAME
from bookie.storage_errors import DataDirInUse
from proto import data_dir_lock

__all__ = ["LOCK_FILE_NAME", "lock_data_dir", "unlock_data_dir", "format_data_dir"]

log = logging.getLogger("bookie.storage")   # the storage's logger, as before this module was split off

LOCK_FILE_NAME = "LOCK"


def lock_data_dir(path: str) -> int:
    """Hold ``<path>/LOCK`` (flock, released when the process dies) naming our pid
    (:func:`proto.data_dir_lock.lock_data_dir`; the lock of a dead bookie is taken over).

    ``path``: the data directory (must exist). Returns the lock's file
    descriptor, to pass to :func:`unlock_data_dir`. Raises
    :class:`bookie.storage.DataDirInUse` (with the holder's pid and how to stop it)
    when another process holds it, ``OSError`` when the file cannot be opened."""
    try:
        return data_dir_lock.lock_data_dir(path, "bookie", LOCK_FILE_NAME)
    except data_dir_lock.DataDirLocked as exc:
        raise DataDirInUse(str(exc)) from None


def unlock_data_dir(fd: int | None) -> None:
    """Release the lock taken by :func:`lock_data_dir` (``fd``; None: nothing held). Never raises
    for a valid descriptor."""
    data_dir_lock.unlock_data_dir(fd)


def format_data_dir(path: str) -> None:
    """Delete the ledger database (with its WAL and shared-memory files) and the cookie
    of the data dir ``path`` (``--format``, BookKeeper's bookieformat); the dir stays
    locked. Missing files are fine; raises ``OSError`` when one cannot be deleted."""
    for name in (DB_FILE_NAME, DB_FILE_NAME + "-wal", DB_FILE_NAME + "-shm", cookies.COOKIE_FILE_NAME):
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass
    log.warning("formatted data dir %s: every ledger stored on this bookie was deleted", path)
