"""Run one bookie process: ``python -m bookie --port 0 --data-dir DIR``.

After the port is bound, prints exactly one line ``BOOKIE_READY port=<port>
pid=<pid>`` to stdout (flushed); logs go to stderr. SIGTERM/SIGINT stop the
server, commit what is queued, close the database and exit with status 0.
The same options serve ``minipulsar bookie`` (see :mod:`deploy.cli`).

With ``--metadata-store-url etcd://host:port[,host:port...]`` the bookie registers
itself under ``/ledgers/available/<advertised host>:<port>`` in etcd (an ephemeral key
kept alive while it runs, see :mod:`bookie.registration`), so that brokers without a
static bookie list find it. Exit status 4: etcd could not be reached at start.

Exit status 3: the data dir is refused (cookie check failed, see
:mod:`bookie.cookie`, or another process holds it); the message on stderr says
why and what to do. To re-initialize a bookie on purpose (all its ledgers are
deleted), start it once with ``--format``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from bookie.cookie import InvalidCookieError
from bookie.registration import RegistrationError
from bookie.server import BookieConfig, BookieServer
from bookie.storage import DataDirInUse
from proto.channels import TlsConfigError
from proto.common import run_async

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
    parser.add_argument("--journal-directory", default=None, metavar="DIR",
                        help="directory of the journal files (default: <data dir>/journal; may be on its own disk)")
    parser.add_argument("--journal-max-size-mb", type=int, default=None,
                        help="roll a journal file at this size in MiB (default 512)")
    parser.add_argument("--journal-pre-alloc-size-mb", type=int, default=None,
                        help="preallocate journal files in chunks of this many MiB (default 16)")
    parser.add_argument("--journal-max-group-wait-ms", type=float, default=None,
                        help="under load, at most one journal write + fdatasync per this many ms (default 0: "
                             "a group is what queued while the previous one was written)")
    parser.add_argument("--journal-buffered-writes-threshold", type=int, default=None,
                        help="queued payload bytes that start a journal write at once (default 524288)")
    parser.add_argument("--flush-interval-ms", type=int, default=None,
                        help="checkpoint period in ms: ledger storage synced, journal behind it deleted "
                             "(default 2000)")
    parser.add_argument("--max-entry-size-bytes", type=int, default=None,
                        help="largest accepted entry payload in bytes (default 5 MiB)")
    parser.add_argument("--disk-usage-threshold", type=float, default=None,
                        help="disk usage share (0..1) at which the bookie turns read-only (default 0.95)")
    parser.add_argument("--disk-usage-lwm-threshold", type=float, default=None,
                        help="disk usage share below which it is writable again (default 0.90)")
    parser.add_argument("--disk-check-interval-s", type=float, default=None,
                        help="seconds between disk usage checks (default 10)")
    parser.add_argument("--max-db-size-bytes", type=int, default=None,
                        help="cap of the ledger database in bytes; its share in use counts as disk usage "
                             "(default: none, the disk is the limit)")
    parser.add_argument("--metadata-store-url", default=None, metavar="etcd://HOST:PORT[,HOST:PORT...]",
                        help="register this bookie as available in that etcd (/ledgers/available/<host:port>); "
                             "default: no registration")
    parser.add_argument("--advertised-address", default=None, metavar="HOST",
                        help="host name or IP to register (default: --host)")
    parser.add_argument("--format", action="store_true", default=False,
                        help="DELETE every ledger in the data dir and start as a new bookie instance "
                             "(new cookie, also replacing the one kept in the metadata store under "
                             "/ledgers/cookies/<address>), like BookKeeper's bookieformat; for a bookie whose "
                             "data was lost or is no longer needed")
    parser.add_argument("--create-cookie", action="store_true", default=False,
                        help="adopt a ledger database that has no cookie (a data dir from a minipulsar "
                             "version before cookies): write a cookie for it")
    parser.add_argument("--tls-enabled", dest="tls_enabled", action="store_true", default=None,
                        help="serve TLS only, with --tls-certificate-file-path and --tls-key-file-path")
    parser.add_argument("--tls-certificate-file-path", default=None, metavar="CERT.pem",
                        help="PEM certificate of the bookie (with --tls-enabled)")
    parser.add_argument("--tls-key-file-path", default=None, metavar="KEY.pem", help="PEM private key of it")
    parser.add_argument("--tls-trust-certs-file-path", default=None, metavar="CA.pem",
                        help="PEM CA bundle of the client certificates")
    parser.add_argument("--tls-require-trusted-client-cert-on-connect", action="store_true", default=None,
                        help="mutual TLS: refuse clients (brokers) without a certificate signed by that CA")
    parser.add_argument("--authentication-enabled", dest="authentication_enabled", action="store_true", default=None,
                        help="refuse every call without a valid token (the brokers' "
                             "bookkeeper_client_authentication_parameters)")
    parser.add_argument("--token-secret-key", default=None, metavar="file:///path | data:;base64,...",
                        help="the HS256 secret key tokens are checked with (with --authentication-enabled)")
    parser.add_argument("--token-public-key", default=None, metavar="file:///path | data:;base64,...",
                        help="the public key RS256 tokens are checked with (with --authentication-enabled)")
    parser.add_argument("--authorized-roles", default=None, metavar="ROLE[,ROLE...]",
                        help="with --authentication-enabled (required then): the only roles served, the brokers' "
                             "token subjects; every other role gets PERMISSION_DENIED (BookKeeper's authorizedRoles)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def config_from_args(args: argparse.Namespace) -> BookieConfig:
    """Build the BookieConfig: dataclass defaults < --config file < CLI flags."""
    overrides = {
        "port": args.port,
        "host": args.host,
        "data_dir": args.data_dir,
        "journal_sync": args.journal_sync,
        "max_entry_size_bytes": args.max_entry_size_bytes,
        "journal_directory": getattr(args, "journal_directory", None),
        "journal_max_size_mb": getattr(args, "journal_max_size_mb", None),
        "journal_pre_alloc_size_mb": getattr(args, "journal_pre_alloc_size_mb", None),
        "journal_max_group_wait_ms": getattr(args, "journal_max_group_wait_ms", None),
        "journal_buffered_writes_threshold": getattr(args, "journal_buffered_writes_threshold", None),
        "flush_interval_ms": getattr(args, "flush_interval_ms", None),
        "disk_usage_threshold": getattr(args, "disk_usage_threshold", None),
        "disk_usage_lwm_threshold": getattr(args, "disk_usage_lwm_threshold", None),
        "disk_check_interval_s": getattr(args, "disk_check_interval_s", None),
        "max_db_size_bytes": getattr(args, "max_db_size_bytes", None),
        "metadata_store_url": getattr(args, "metadata_store_url", None),
        "advertised_address": getattr(args, "advertised_address", None),
        "tls_enabled": getattr(args, "tls_enabled", None),
        "tls_certificate_file_path": getattr(args, "tls_certificate_file_path", None),
        "tls_key_file_path": getattr(args, "tls_key_file_path", None),
        "tls_trust_certs_file_path": getattr(args, "tls_trust_certs_file_path", None),
        "tls_require_trusted_client_cert_on_connect": getattr(args, "tls_require_trusted_client_cert_on_connect",
                                                              None),
        "authentication_enabled": getattr(args, "authentication_enabled", None),
        "token_secret_key": getattr(args, "token_secret_key", None),
        "token_public_key": getattr(args, "token_public_key", None),
        "authorized_roles": (None if getattr(args, "authorized_roles", None) is None
                             else [r.strip() for r in args.authorized_roles.split(",") if r.strip()]),
    }
    if args.config:
        return BookieConfig.from_toml(args.config, **overrides)
    return BookieConfig(**{k: v for k, v in overrides.items() if v is not None})


def config_problems(config: BookieConfig) -> list[str]:
    """Every problem of ``config`` (file values and flags merged), one line each:
    a value whose type is not its field's annotation (an int is fine for a float;
    a str is not an int, an int is not a bool), a port outside 0..65535, a size
    or limit below 1, an empty data dir or host, authentication without
    authorized_roles. [] when the bookie can start."""
    import dataclasses
    import types
    import typing

    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    problems = []
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, hint = getattr(config, field.name), hints.get(field.name)
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            if value is None:
                continue
            hint = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
        ok = isinstance(value, hint) and (hint is bool or not isinstance(value, bool)) if hint in names else True
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            problems.append(f"{field.name}: expected {names[hint]}, got {type(value).__name__} {value!r}")
    bad = {p.split(":", 1)[0] for p in problems}
    rules = [("port", lambda v: 0 <= v <= 65535, "must be a TCP port in 0..65535 (0 = any free port)"),
             ("max_entry_size_bytes", lambda v: v >= 1, "must be >= 1"),
             ("max_inflight_requests_per_stream", lambda v: v >= 1, "must be >= 1"),
             ("max_inflight_bytes_per_stream", lambda v: v >= 1, "must be >= 1"),
             ("data_dir", lambda v: bool(v.strip()), "must not be empty"),
             ("host", lambda v: bool(v.strip()), "must not be empty"),
             ("disk_usage_threshold", lambda v: 0 < v <= 1, "must be in (0, 1]"),
             ("disk_usage_lwm_threshold", lambda v: 0 < v <= _number(getattr(config, "disk_usage_threshold", 1)),
              "must be in (0, disk_usage_threshold]"),
             ("disk_check_interval_s", lambda v: v > 0, "must be > 0 seconds"),
             ("journal_max_size_mb", lambda v: v >= 1, "must be >= 1 (MiB)"),
             ("journal_pre_alloc_size_mb", lambda v: v >= 0, "must be >= 0 (MiB; 0: no preallocation)"),
             ("journal_max_group_wait_ms", lambda v: v >= 0, "must be >= 0 ms"),
             ("journal_buffered_writes_threshold", lambda v: v >= 1, "must be >= 1 (bytes)"),
             ("flush_interval_ms", lambda v: v >= 1, "must be >= 1 ms"),
             ("max_db_size_bytes", lambda v: v is None or v >= 1, "must be >= 1 (or unset)"),
             ("metadata_store_url", _is_registration_url,
              'must be "" (no registration) or "etcd://host:port[,host:port...]"'),
             ("advertised_address", _is_host_or_empty, 'must be a host name or IP without a port ("" = host)')]
    for name, ok, rule in rules:
        if hasattr(config, name) and name not in bad and not ok(getattr(config, name)):
            problems.append(f"{name} = {getattr(config, name)!r}: {rule}")
    if getattr(config, "authentication_enabled", False) is True and "authentication_enabled" not in bad:
        from proto.auth_server import AuthenticationService
        from proto.auth_tokens import TokenError
        try:
            AuthenticationService.from_config(config)
        except TokenError as exc:
            problems.append(f"authentication_enabled = true: {exc}")
    from bookie.authorization import authorization_problem
    if authorization_problem(config):
        problems.append(authorization_problem(config))
    if getattr(config, "tls_enabled", False) is True and not (config.tls_certificate_file_path and
                                                              config.tls_key_file_path):
        problems.append("tls_enabled = true needs tls_certificate_file_path and tls_key_file_path (PEM files; "
                        "`minipulsar tls create-cert`)")
    if getattr(config, "tls_require_trusted_client_cert_on_connect", False) is True and \
            not config.tls_trust_certs_file_path:
        problems.append("tls_require_trusted_client_cert_on_connect = true needs tls_trust_certs_file_path (the CA "
                        "of the brokers' client certificates)")
    return problems


def _is_host_or_empty(v: str) -> bool:
    import re

    return v == "" or bool(re.fullmatch(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+", v))


def _is_registration_url(url: str) -> bool:
    if url == "":
        return True
    from proto.metadata_url import parse_etcd_endpoints

    try:
        parse_etcd_endpoints(url)
    except ValueError:
        return False
    return url.strip().startswith("etcd:")


def _number(v) -> float:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else 1.0


async def serve(config: BookieConfig, format: bool = False, create_cookie: bool = False) -> None:
    """Start a bookie, print the ready line, serve until SIGTERM/SIGINT, stop cleanly."""
    server = BookieServer(config, format=format, create_cookie=create_cookie)
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
    problems = config_problems(config)
    if problems:
        print(f"bookie: bad configuration ({args.config or 'flags'}), {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"bookie:   - {problem}", file=sys.stderr)
        return 2
    try:
        run_async(serve(config, format=getattr(args, "format", False), create_cookie=getattr(args, "create_cookie", False)))
    except (InvalidCookieError, DataDirInUse) as exc:
        print(f"bookie: refusing to start on data dir {config.data_dir}: {exc}", file=sys.stderr)
        return 3
    except RegistrationError as exc:
        print(f"bookie: {exc}", file=sys.stderr)
        return 4
    except TlsConfigError as exc:
        print(f"bookie: bad TLS configuration: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        if "cannot bind bookie" not in str(exc):
            raise
        print(f"bookie: {exc}", file=sys.stderr)     # names the port's holder when it can be found
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bookie``."""
    parser = argparse.ArgumentParser(prog="python -m bookie", description="Run a minipulsar bookie")
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
