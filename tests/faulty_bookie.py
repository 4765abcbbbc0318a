"""Test-only bookie that answers chosen adds with an error status: ``python -m tests.faulty_bookie``.

Runs the REAL bookie server (:class:`bookie.server.BookieServer`, real storage,
real gRPC) in its own process; only its ``LedgerStorage.add_entries`` is
wrapped, so that the chosen adds are NOT stored and are answered with the
chosen ``AddStatus`` (what a bookie with a failing disk or in read-only mode
answers). Product code has no fault-injection switch; this module is the only
place that knows about it.

Options (besides the usual ``python -m bookie`` ones: ``--port``,
``--data-dir``, ``--no-journal-sync``, ...):

--fail-status NAME   ``AddStatus`` name to answer with (default E_BOOKIE_ERROR)
--fail-first N       fail the first N adds this process receives (count, default 0)
--fail-ledger ID     fail every add of ledger ID (repeatable)

Prints ``BOOKIE_READY port=<port> pid=<pid>`` like a real bookie, so
:class:`FaultyBookieProcess` (a :class:`tests.procs.BookieProcess`) starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from bookie.__main__ import add_arguments, config_from_args
from bookie.server import BookieServer
from proto import bookie_pb2 as pb
from tests.procs import DEFAULT_READY_TIMEOUT_S, BookieProcess, ProcessTracker

log = logging.getLogger("tests.faulty_bookie")


def wrap_add_entries(storage, status: int, fail_first: int, fail_ledgers: set[int]) -> None:
    """Replace ``storage.add_entries`` (same contract: ``ops -> Future[AddErrors]``) by one
    that answers the chosen adds with ``status`` without storing them."""
    real = storage.add_entries
    remaining = [fail_first]

    def add_entries(ops):
        injected = {}
        for i, op in enumerate(ops):
            if remaining[0] > 0:
                remaining[0] -= 1
                injected[i] = (status, f"injected failure (first adds) of {op[0]}:{op[1]}")
            elif op[0] in fail_ledgers:
                injected[i] = (status, f"injected failure (ledger {op[0]}) of {op[0]}:{op[1]}")
        if not injected:
            return real(ops)
        log.info("injecting %s into %d of %d adds", pb.AddStatus.Name(status), len(injected), len(ops))
        out = asyncio.get_running_loop().create_future()
        keep = [i for i in range(len(ops)) if i not in injected]
        if not keep:
            out.set_result(injected)
            return out

        def done(fut):
            if fut.exception() is not None:
                out.set_exception(fut.exception())
                return
            errors = dict(injected)
            errors.update({keep[j]: err for j, err in fut.result().items()})
            out.set_result(errors)

        real([ops[i] for i in keep]).add_done_callback(done)
        return out

    storage.add_entries = add_entries


async def serve(args) -> None:
    server = BookieServer(config_from_args(args))
    wrap_add_entries(server.storage, pb.AddStatus.Value(args.fail_status), args.fail_first, set(args.fail_ledger))
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"BOOKIE_READY port={server.port} pid={os.getpid()}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faulty_bookie")
    add_arguments(parser)
    parser.add_argument("--fail-status", default="E_BOOKIE_ERROR", choices=list(pb.AddStatus.keys()))
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--fail-ledger", type=int, action="append", default=[])
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    asyncio.run(serve(args))
    return 0


class FaultyBookieProcess(BookieProcess):
    """A ``python -m tests.faulty_bookie`` process; ``fault_args`` are its --fail-* options.
    ``restart()`` starts a REAL bookie (no faults) on the same data dir (and port 0)."""

    name = "faulty-bookie"

    def __init__(self, data_dir, fault_args=(), extra_args=(), tracker=None,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> None:
        super().__init__(data_dir, True, extra_args, tracker, ready_timeout_s)
        self.fault_args = tuple(fault_args)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tests.faulty_bookie", "--port", "0", "--data-dir", str(self.data_dir),
                *self.fault_args, *self.extra_args]


def start_faulty_bookie(data_dir, *, fail_status: str = "E_BOOKIE_ERROR", fail_first: int = 0,
                        fail_ledgers=(), tracker: ProcessTracker | None = None) -> FaultyBookieProcess:
    """Start a faulty bookie on a free port and wait until it is ready (blocking, ~1 s)."""
    fault_args = ["--fail-status", fail_status, "--fail-first", str(fail_first)]
    for ledger_id in fail_ledgers:
        fault_args += ["--fail-ledger", str(ledger_id)]
    return FaultyBookieProcess(data_dir, fault_args, tracker=tracker).start()


if __name__ == "__main__":
    sys.exit(main())
