"""Run one bookie process: ``python -m bookie --port 0 --data-dir DIR``.

After the port is bound, prints exactly one line ``BOOKIE_READY port=<port>
pid=<pid>`` to stdout (flushed); logs go to stderr. SIGTERM/SIGINT stop the
server, commit what is queued, close the database and exit with status 0.
The same options serve ``minipulsar bookie`` (see :mod:`deploy.cli`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from bookie.server import BookieConfig, BookieServer

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the bookie options to ``parser`` (CLI flags override --config values)."""
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file with BookieConfig keys")
    parser.add_argument("--port", type=int, default=None, help="TCP port, 0 = any free port (default 3181)")
    parser.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--data-dir", default=None, help="directory of the ledger database")
    parser.add_argument("--journal-sync", dest="journal_sync", action="store_true", default=None,
                        help="fsync every group commit before acknowledging (default)")
    parser.add_argument("--no-journal-sync", dest="journal_sync", action="store_false",
                        help="do not fsync commits (faster; recent adds may be lost on a machine crash)")
    parser.add_argument("--max-entry-size-bytes", type=int, default=None,
                        help="largest accepted entry payload in bytes (default 5 MiB)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def config_from_args(args: argparse.Namespace) -> BookieConfig:
    """Build the BookieConfig: dataclass defaults < --config file < CLI flags."""
    overrides = {
        "port": args.port,
        "host": args.host,
        "data_dir": args.data_dir,
        "journal_sync": args.journal_sync,
        "max_entry_size_bytes": args.max_entry_size_bytes,
    }
    if args.config:
        return BookieConfig.from_toml(args.config, **overrides)
    return BookieConfig(**{k: v for k, v in overrides.items() if v is not None})


async def serve(config: BookieConfig) -> None:
    """Start a bookie, print the ready line, serve until SIGTERM/SIGINT, stop cleanly."""
    server = BookieServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"BOOKIE_READY port={server.port} pid={os.getpid()}", flush=True)
    try:
        await stop.wait()
        log.info("signal received, stopping")
    finally:
        await server.stop()


def run_from_args(args: argparse.Namespace) -> int:
    """Run a bookie for parsed arguments; returns the process exit status."""
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = config_from_args(args)
    except (OSError, ValueError, TypeError) as exc:
        print(f"bookie: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bookie``."""
    parser = argparse.ArgumentParser(prog="python -m bookie", description="Run a minipulsar bookie")
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
