"""Which process holds a TCP port, what a pid is: for error messages that say what to stop.

Reads Linux's ``/proc`` (``/proc/net/tcp{,6}`` for the listening sockets and their
inodes, ``/proc/<pid>/fd`` for who holds them, ``/proc/<pid>/cmdline``); only
processes of the same user are visible. Elsewhere every function returns "unknown"
(an empty list, None) rather than raising.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pids_listening_on", "command_line", "is_alive", "describe_pid", "stop_hint"]

_LISTEN = "0A"


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            try:
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
            except (IndexError, ValueError):
                continue
    return inodes


def pids_listening_on(port: int) -> list[int]:
    """The pids (sorted) of the processes holding a socket that listens on TCP ``port``
    (any address); [] when none is found or /proc cannot tell."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") in wanted:
                    pids.append(int(name))
                    break
            except OSError:
                continue
    return sorted(pids)


def command_line(pid: int, limit: int = 160) -> str | None:
    """The command line of ``pid`` (arguments joined by spaces, runs of whitespace inside one
    argument shown as one space, cut to ``limit`` characters), or None when it is gone or not
    visible."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    text = " ".join(" ".join(a.decode(errors="replace").split()) for a in raw.split(b"\0") if a)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def is_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def describe_pid(pid: int) -> str:
    """``"pid 123 (python -m bookie ...)"``, or ``"pid 123"`` when its command is unknown."""
    cmd = command_line(pid)
    return f"pid {pid} ({cmd})" if cmd else f"pid {pid}"


def stop_hint(pids: list[int]) -> str:
    """How to stop ``pids``: ``"stop it with `kill 123` (`kill -9 123` if it does not exit)"``."""
    ids = " ".join(str(p) for p in pids)
    return f"stop it with `kill {ids}` (`kill -9 {ids}` if it does not exit)"
