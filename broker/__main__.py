"""Run one broker: ``python -m broker --config FILE.toml [flags]`` (``minipulsar broker``).

Prints ``BROKER_READY port=<grpc port> pid=<pid> http_port=<port>`` once serving.
SIGTERM/SIGINT stop it cleanly.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from broker.config import BrokerConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE.toml", help="TOML file with BrokerConfig keys (broker.conf names)")
    p.add_argument("--cluster-name", default=None)
    p.add_argument("--bookies", default=None, help="comma-separated bookie addresses host:port")
    p.add_argument("--data-dir", default=None, help="directory of the metadata store")
    p.add_argument("--port", type=int, default=None, help="gRPC port (default 6600; 0 = any free port)")
    p.add_argument("--http-port", type=int, default=None, help="HTTP /metrics port (default 8080; 0 = any, -1 = off)")
    p.add_argument("--bind-address", default=None)
    p.add_argument("--advertised-address", default=None)
    p.add_argument("--log-level", default="INFO")


def config_from_args(args) -> BrokerConfig:
    config = BrokerConfig.from_toml(args.config) if args.config else BrokerConfig()
    return config.override(
        cluster_name=args.cluster_name,
        bookies=[b.strip() for b in args.bookies.split(",") if b.strip()] if args.bookies else None,
        data_dir=args.data_dir, broker_service_port=args.port, web_service_port=args.http_port,
        bind_address=args.bind_address, advertised_address=args.advertised_address)


async def serve(config: BrokerConfig, ready_line: bool = True) -> None:
    from broker.server import BrokerServer

    server = BrokerServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready_line:
        print(f"BROKER_READY port={server.port} pid={os.getpid()} http_port={server.http_port}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def run_from_args(args) -> int:
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        config = config_from_args(args)
    except (OSError, ValueError, TypeError) as exc:
        print(f"broker: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(serve(config))
    except (OSError, ValueError) as exc:
        print(f"broker: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="minipulsar broker", description="Run a minipulsar broker")
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
