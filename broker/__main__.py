"""Run one broker: ``python -m broker --config FILE.toml [flags]`` (``minipulsar broker``).

Prints ``BROKER_READY port=<grpc port> pid=<pid> http_port=<port> pulsar_port=<port>`` once serving.
SIGTERM/SIGINT stop it cleanly.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from broker.config import BrokerConfig, ConfigError
from proto.common import run_async


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the broker flags to ``p`` (each overrides the --config file's key of the same meaning)."""
    p.add_argument("--config", metavar="FILE.toml", help="TOML file with BrokerConfig keys (broker.conf names)")
    p.add_argument("--cluster-name", default=None)
    p.add_argument("--bookies", default=None, help="comma-separated bookie addresses host:port")
    p.add_argument("--data-dir", default=None, help="directory of the metadata store")
    p.add_argument("--metadata-store-url", default=None,
                   help="etcd://host:port[,host:port] to join a broker cluster (default: SQLite in --data-dir)")
    p.add_argument("--configuration-metadata-store-url", default=None,
                   help="etcd://host:port[,...] of the configuration store shared by geo-replicated clusters "
                        "(clusters, tenants, namespace policies); default: the metadata store")
    p.add_argument("--port", type=int, default=None, help="gRPC port (default 6600; 0 = any free port)")
    p.add_argument("--http-port", type=int, default=None, help="HTTP /metrics port (default 8080; 0 = any, -1 = off)")
    p.add_argument("--pulsar-port", type=int, default=None,
                   help="Pulsar binary protocol port for the official clients (broker_service_port_pulsar; "
                        "default 6650; 0 = any, -1 = off)")
    p.add_argument("--pulsar-tls-port", type=int, default=None,
                   help="Pulsar binary protocol over TLS, with --tls-enabled (broker_service_port_pulsar_tls; "
                        "default 6651; 0 = any, -1 = off)")
    p.add_argument("--bind-address", default=None)
    p.add_argument("--advertised-address", default=None)
    p.add_argument("--tls-enabled", action="store_true", default=None,
                   help="serve TLS only on the gRPC and HTTP ports (minipulsar+ssl://); needs the next two")
    p.add_argument("--tls-certificate-file-path", default=None, metavar="CERT.pem")
    p.add_argument("--tls-key-file-path", default=None, metavar="KEY.pem")
    p.add_argument("--tls-trust-certs-file-path", default=None, metavar="CA.pem",
                   help="CA of the client certificates (mutual TLS)")
    p.add_argument("--log-level", default="INFO")


def config_from_args(args) -> BrokerConfig:
    """The config of ``args``: defaults < --config file < flags. Raises ConfigError
    (a ValueError) listing every problem: unknown keys, wrong types, values out of
    range, quorums, missing bookies."""
    data = BrokerConfig.load_toml(args.config) if args.config else {}
    flags = {"cluster_name": args.cluster_name,
             "bookies": [b.strip() for b in args.bookies.split(",") if b.strip()] if args.bookies else None,
             "data_dir": args.data_dir, "metadata_store_url": args.metadata_store_url,
             "configuration_metadata_store_url": args.configuration_metadata_store_url,
             "broker_service_port": args.port, "web_service_port": args.http_port,
             "broker_service_port_pulsar": getattr(args, "pulsar_port", None),
             "broker_service_port_pulsar_tls": getattr(args, "pulsar_tls_port", None),
             "bind_address": args.bind_address, "advertised_address": args.advertised_address,
             "tls_enabled": getattr(args, "tls_enabled", None),
             "tls_certificate_file_path": getattr(args, "tls_certificate_file_path", None),
             "tls_key_file_path": getattr(args, "tls_key_file_path", None),
             "tls_trust_certs_file_path": getattr(args, "tls_trust_certs_file_path", None)}
    data = {**data, **{k: v for k, v in flags.items() if v is not None}}
    config, problems = BrokerConfig.parse(data, complete=True)
    if problems:
        raise ConfigError(problems, args.config or "broker flags")
    return config


async def serve(config: BrokerConfig, ready_line: bool = True) -> None:
    """Start a BrokerServer, print the BROKER_READY line (``ready_line``), serve until SIGTERM /
    SIGINT, then stop it. A failed start releases what was started and re-raises."""
    from broker.server import BrokerServer

    server = BrokerServer(config)
    try:
        await server.start()
    except BaseException:
        # A half-started broker (metadata store open, gRPC server created) would keep
        # the process alive serving nothing: release everything, then report.
        try:
            await server.stop()
        except Exception as exc:  # noqa: BLE001 - the start error is the one to report
            logging.getLogger(__name__).warning("cleaning up after a failed start: %s", exc)
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready_line:
        print(f"BROKER_READY port={server.port} pid={os.getpid()} http_port={server.http_port} "
              f"pulsar_port={server.pulsar_port} pulsar_tls_port={server.pulsar_tls_port}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def print_config_error(prog: str, exc: ConfigError) -> None:
    """Every problem of ``exc`` on stderr, one line each, under one header line."""
    print(f"{prog}: bad configuration ({exc.source}), {len(exc.problems)} problem(s):", file=sys.stderr)
    for problem in exc.problems:
        print(f"{prog}:   - {problem}", file=sys.stderr)
    sys.stderr.flush()


def run_from_args(args) -> int:
    """Run a broker for parsed arguments; returns the exit status: 2 for a bad
    configuration (every problem printed, nothing started), 1 when it cannot
    start (e.g. the port is taken), 0 after a clean stop."""
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print_config_error("broker", exc)
        return 2
    try:
        run_async(serve(config))
    except Exception as exc:  # noqa: BLE001 - one clear line and a non-zero exit, never a hung process
        logging.getLogger(__name__).debug("start failed", exc_info=True)
        if "Failed to bind" in str(exc):
            from proto.process_info import describe_pid, pids_listening_on, stop_hint

            holders = pids_listening_on(config.broker_service_port) if config.broker_service_port else []
            who = (f"it is held by {', '.join(describe_pid(p) for p in holders)}: {stop_hint(holders)}, or"
                   if holders else "is another process using the port?")
            reason = (f"cannot listen on {config.bind_address}:{config.broker_service_port} ({who} "
                      f"choose another with --port, or 0 for any free port)")
        else:
            reason = f"{exc}" if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
        print(f"broker: cannot start: {reason}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    """Entry point of ``python -m broker``: parse ``argv`` (None = sys.argv) and run; returns
    the exit status (see ``run_from_args``)."""
    p = argparse.ArgumentParser(prog="minipulsar broker", description="Run a minipulsar broker")
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
