"""Child processes that die with their parent, however the parent dies.

A foreground command (``minipulsar standalone``, a test) that starts helper
processes must not leave them running when it is killed with SIGKILL (an OOM
killer, a closed terminal's hard kill, a crashed supervisor): they would keep
their ports and data dirs, and the next start on the same data dir would fail.
:func:`popen` starts a command through a tiny exec wrapper that sets Linux's
``PR_SET_PDEATHSIG`` (the kernel sends the child ``SIGKILL`` when its parent
dies), checks that the parent is still the one that started it (closing the
race where the parent died before the setting took effect) and then
``exec``\\ s the command, so the child keeps its pid and command line. No
``preexec_fn``: the parent never runs Python code in a forked child, which is
unsafe in a process with gRPC threads.

``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child ends, not
the process: :func:`popen` called from a thread other than the main thread
forks from one long-lived daemon thread of this module instead, so a
short-lived worker thread (``asyncio.to_thread``) ending does not kill the
child. Elsewhere than Linux the wrapper is skipped and the child is a plain
subprocess (no guarantee). Background daemons (``geo up``, ``cluster up``)
outlive their command by design and do not use this module.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future

__all__ = ["popen", "supported", "PR_SET_PDEATHSIG"]

PR_SET_PDEATHSIG = 1

# argv: <parent pid> <signal number> <command...>. Run with -E -S: no site, no PYTHON* variables
# for the wrapper itself; the command gets the environment given to popen().
_WRAPPER = (
    "import ctypes, os, sys\n"
    "parent, sig = int(sys.argv[1]), int(sys.argv[2])\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0) != 0:\n"
    "    sys.exit('lifeline: prctl(PR_SET_PDEATHSIG) failed: errno %d' % ctypes.get_errno())\n"
    "if os.getppid() != parent:\n"
    "    os._exit(125)  # the parent died before the death signal was set: do not start\n"
    "try:\n"
    "    os.execvp(sys.argv[3], sys.argv[3:])\n"
    "except OSError as exc:\n"
    "    sys.exit('lifeline: cannot run %s: %s' % (sys.argv[3], exc))\n"
)


def supported() -> bool:
    """True where children can be tied to their parent (Linux)."""
    return sys.platform.startswith("linux")


def wrap(cmd: list[str], death_signal: int = signal.SIGKILL) -> list[str]:
    """``cmd`` (argv list) prefixed by the exec wrapper that makes it receive ``death_signal``
    when the calling process (its thread, see the module doc) dies; ``cmd`` unchanged where
    not :func:`supported`. Raises ValueError for an empty ``cmd``."""
    if not cmd:
        raise ValueError("wrap: empty command")
    if not supported():
        return list(cmd)
    return [sys.executable, "-E", "-S", "-c", _WRAPPER, str(os.getpid()), str(int(death_signal)), *map(str, cmd)]


_requests: "queue.Queue[tuple[Future, list, dict]]" = queue.Queue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _spawn_forever() -> None:
    while True:
        future, args, kwargs = _requests.get()
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(subprocess.Popen(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)


def _from_long_lived_thread(args: list, kwargs: dict) -> subprocess.Popen:
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(*args, **kwargs)
    with _spawner_lock:
        if _spawner is None:
            _spawner = threading.Thread(target=_spawn_forever, name="lifeline-spawner", daemon=True)
            _spawner.start()
    future: Future = Future()
    _requests.put((future, args, kwargs))
    return future.result()


def popen(cmd: list[str], death_signal: int = signal.SIGKILL, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kwargs)`` whose process gets ``death_signal`` (default
    SIGKILL) when this process dies, by any cause (Linux ``PR_SET_PDEATHSIG``).

    ``cmd``: argv list (no shell). The returned Popen's ``pid`` is the command's own pid (the
    wrapper ``exec``\\ s it). If this process dies before the child is set up, the child exits
    with status 125 without running ``cmd``. Raises what ``subprocess.Popen`` raises (the
    wrapper reports a missing executable on the child's stderr and exits 1)."""
    if isinstance(cmd, (str, bytes)):
        raise ValueError("lifeline.popen: cmd must be an argv list")
    return _from_long_lived_thread([wrap(list(cmd), death_signal)], kwargs)
