"""Hop timestamps for scripts/hop-trace: ``T(tag, a, b)`` appends one line
``tag a b perf_counter_ns`` to ``$HOP_TRACE_DIR/out.<pid>`` (CLOCK_MONOTONIC,
shared by all processes of the machine, so hops between processes compare)."""

import os
import time

_dir = os.environ.get("HOP_TRACE_DIR", "/tmp/hop-trace")
os.makedirs(_dir, exist_ok=True)
_fd = os.open(os.path.join(_dir, f"out.{os.getpid()}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
_ns = time.perf_counter_ns


def T(tag: str, a=0, b=0) -> None:
    """Record event ``tag`` for key ``a`` (sequence id or entry id) and detail ``b``."""
    os.write(_fd, f"{tag} {a} {b} {_ns()}\n".encode())
