"""One process per data dir: an ``flock`` on a lock file that names the holder's pid.

BookKeeper locks a bookie's directories when the ``Bookie`` starts; minipulsar
does the same for every process kind that owns a data dir (bookie:
``<dir>/LOCK``, see :mod:`bookie.data_dir`; broker: ``<dir>/broker.lock``;
standalone: ``<dir>/standalone.lock``). The kernel releases an ``flock`` when
its holder dies, however it dies, so the lock of a killed process is never
stale: the next process takes it over silently and rewrites the pid. A second
live process gets :class:`DataDirLocked`, whose message names the holder's pid,
its command line and how to stop it.
"""

from __future__ import annotations

import fcntl
import os

from proto.process_info import describe_pid, is_alive, stop_hint

__all__ = ["DataDirLocked", "lock_data_dir", "unlock_data_dir", "lock_holder"]


class DataDirLocked(OSError):
    """Another live process holds the data dir's lock. ``path`` (the dir), ``holder_pid``
    (int, or None when the lock file names none), ``what`` (the process kind)."""

    def __init__(self, path: str, holder_pid: int | None, what: str) -> None:
        self.path, self.holder_pid, self.what = str(path), holder_pid, what
        if holder_pid is None:
            who = "pid ?"
            hint = "stop that process first"
        else:
            who = describe_pid(holder_pid)
            hint = stop_hint([holder_pid])
        super().__init__(f"data dir {path} is in use by another {what} process ({who}); {hint}")

    def __str__(self) -> str:
        return self.args[0]


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    try:
        return int(text.split()[0])
    except (IndexError, ValueError):
        return None


def lock_data_dir(path: str | os.PathLike, what: str, lock_name: str) -> int:
    """Hold ``<path>/<lock_name>`` (exclusive ``flock``, released when this process dies) and
    write our pid in it. ``path``: an existing directory; ``what``: the process kind for the
    message (``"broker"``). Returns the lock's file descriptor (non-inheritable), to pass to
    :func:`unlock_data_dir`. Raises :class:`DataDirLocked` when another process holds it,
    ``OSError`` when the file cannot be opened or written."""
    fd = os.open(os.path.join(path, lock_name), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        raise DataDirLocked(str(path), holder, what) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock_data_dir(fd: int | None) -> None:
    """Release a lock of :func:`lock_data_dir` (``fd``; None: nothing held). The file stays
    (a later holder rewrites it). Never raises for a valid descriptor."""
    if fd is not None:
        os.close(fd)


def lock_holder(path: str | os.PathLike, lock_name: str) -> int | None:
    """The pid of the live process holding ``<path>/<lock_name>``, or None when nobody holds
    it (no file, a free lock, or a pid that is gone). Takes and releases the lock itself when
    it is free, so it never blocks."""
    try:
        fd = os.open(os.path.join(path, lock_name), os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            return pid if pid is not None and is_alive(pid) else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
