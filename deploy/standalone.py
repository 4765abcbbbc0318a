"""``minipulsar standalone``: one cluster in one command (like ``pulsar standalone``).

Starts N bookie processes (default 2, Qw=Qa=2) and a broker in this process,
all with data under ``--data-dir``; creates tenant ``public`` and namespace
``public/default``; prints the service URL; Ctrl-C stops everything.
Restarted on the same data dir it recovers everything: the bookies' ports are
chosen once and kept in ``<data-dir>/standalone.json`` (ledger metadata names
bookies by address, as BookKeeper does).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from proto import lifeline
from proto.common import run_async
from proto.data_dir_lock import lock_data_dir, lock_holder, unlock_data_dir
from proto.process_info import command_line, describe_pid, is_alive, pids_listening_on, stop_hint

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a TCP socket (SO_REUSEADDR) can bind ``host:port`` right now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def start_bookie_process(data_dir: Path, port: int, journal_sync: bool, log_file: Path,
                         timeout_s: float = 30.0) -> subprocess.Popen:
    """Start ``python -m bookie`` (dies with this process, see :mod:`proto.lifeline`) and wait
    for its BOOKIE_READY line; RuntimeError with the tail of its log when it does not come up."""
    cmd = [sys.executable, "-m", "bookie", "--port", str(port), "--data-dir", str(data_dir)]
    if not journal_sync:
        cmd.append("--no-journal-sync")
    err = open(log_file, "ab")
    # its own session (Ctrl-C in the terminal reaches only the standalone, which stops it cleanly),
    # and tied to this process: SIGKILL when the standalone dies without stopping it (proto.lifeline)
    proc = lifeline.popen(cmd, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    err.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(b"BOOKIE_READY"):
            return proc
    proc.kill()
    tail = log_file.read_bytes()[-2000:].decode(errors="replace")
    raise RuntimeError(f"bookie on port {port} did not start; log {log_file}:\n{tail}")


async def ensure_namespace(service, tenant: str, namespace: str, clusters: list[str]) -> None:
    """Create tenant/namespace if missing (idempotent), replicated to ``clusters``."""
    from broker.service.errors import AlreadyExists
    from broker.service.resources import Policies

    try:
        await service.resources.create_tenant(tenant, clusters)
    except AlreadyExists:
        pass
    try:
        await service.resources.create_namespace(f"{tenant}/{namespace}", Policies(replication_clusters=clusters))
    except AlreadyExists:
        pass


def standalone_config(args, bookie_ports: list[int], data: Path):
    """The broker's BrokerConfig: --broker-config file < the standalone's own
    settings (bookies, ports, data dir, Qw = Qa = E = min(2, N)). Raises
    ConfigError listing every problem of the file and the flags."""
    from broker.config import BrokerConfig, ConfigError

    base = BrokerConfig.load_toml(args.broker_config) if args.broker_config else {}
    decided = [f"{key} is set by minipulsar standalone itself ({how}); remove it from the file"
               for key, how in _STANDALONE_KEYS.items() if key in base]
    quorum = min(2, len(bookie_ports))
    values = {**base, "cluster_name": args.cluster_name, "bookies": [f"127.0.0.1:{p}" for p in bookie_ports],
              "data_dir": str(data / "broker"), "broker_service_port": args.port, "web_service_port": args.http_port,
              "broker_service_port_pulsar": args.pulsar_port, "broker_service_port_pulsar_tls": args.pulsar_tls_port,
              "managed_ledger_default_ensemble_size": quorum, "managed_ledger_default_write_quorum": quorum,
              "managed_ledger_default_ack_quorum": quorum}
    if args.deduplication:
        values["broker_deduplication_enabled"] = True
    config, problems = BrokerConfig.parse(values, complete=True)
    if decided or problems:
        raise ConfigError(decided + problems, args.broker_config or "standalone flags")
    return config


# BrokerConfig keys the standalone decides (a --broker-config file may not set them), and how to change them
_STANDALONE_KEYS = {"cluster_name": "--cluster-name", "bookies": "--bookies N starts N local bookies",
                    "data_dir": "--data-dir", "broker_service_port": "--port", "web_service_port": "--http-port",
                    "broker_service_port_pulsar": "--pulsar-port", "broker_service_port_pulsar_tls": "--pulsar-tls-port",
                    "managed_ledger_default_ensemble_size": "min(2, --bookies)",
                    "managed_ledger_default_write_quorum": "min(2, --bookies)",
                    "managed_ledger_default_ack_quorum": "min(2, --bookies)"}


# the standalone's data-dir lock (``<data-dir>/standalone.lock``, see proto.data_dir_lock)
STANDALONE_LOCK_FILE_NAME = "standalone.lock"


def stop_orphan_bookies(data: Path, n_bookies: int, timeout_s: float = 15.0) -> list[int]:
    """Stop the bookies left running on ``<data>/bookie-<i>`` by a standalone that died
    without stopping them (the caller holds the standalone lock, so no live standalone owns
    them): SIGTERM, SIGKILL after ``timeout_s``. A bookie is recognized by the pid in its data
    dir's held lock and its command line naming that dir. Returns the pids stopped."""
    from bookie.data_dir import LOCK_FILE_NAME

    found = []
    for i in range(n_bookies):
        bdir = data / f"bookie-{i}"
        pid = lock_holder(bdir, LOCK_FILE_NAME)
        if pid is None or pid == os.getpid() or str(bdir) not in (command_line(pid, limit=10_000) or ""):
            continue
        print(f"standalone: stopping bookie {describe_pid(pid)} left running on {bdir} by a standalone "
              f"that did not stop it", file=sys.stderr, flush=True)
        try:
            os.kill(pid, signal.SIGCONT)    # a stopped (SIGSTOP) bookie could not act on SIGTERM
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        found.append(pid)
    deadline = time.monotonic() + timeout_s
    for pid in found:
        while is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if is_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for pid in found:
        while is_alive(pid) and time.monotonic() < deadline + 5:
            time.sleep(0.05)
    return found


async def run(args) -> int:
    """Run the standalone for parsed ``args`` until SIGTERM / SIGINT: lock the data dir
    (``standalone.lock``), stop bookies a killed standalone left on it, reuse or choose the
    bookie ports (``standalone.json``), check the config, start the bookie processes (tied to
    this process: they die with it, :mod:`proto.lifeline`) and the broker, create
    ``public/default``, print the ready lines; stop everything on the way out. Returns the exit
    status: 2 for a bad configuration, 1 when a bookie port is in use (the message names the
    holder's pid), 0 after a stop. Raises :class:`proto.data_dir_lock.DataDirLocked` when
    another standalone uses the data dir; a bookie or broker that does not start raises
    (RuntimeError, OSError, ...)."""
    data = Path(args.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    # one standalone per data dir; the lock of a killed standalone is taken over (raises DataDirLocked)
    lock_fd = lock_data_dir(data, "standalone", STANDALONE_LOCK_FILE_NAME)
    try:
        return await _run_locked(args, data)
    finally:
        unlock_data_dir(lock_fd)


async def _run_locked(args, data: Path) -> int:
    """:func:`run` once this process holds the data dir's lock."""
    from broker.config import ConfigError
    from broker.server import BrokerServer

    state_file = data / "standalone.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    ports = state.get("bookie_ports") or []
    while len(ports) < args.bookies:
        ports.append(free_port())
    ports = ports[:max(args.bookies, len(ports))]
    try:
        # checked before anything starts: a bad setting never leaves bookies running
        config = standalone_config(args, ports, data)
    except ConfigError as exc:
        from broker.__main__ import print_config_error
        print_config_error("standalone", exc)
        return 2
    stop_orphan_bookies(data, len(ports))
    busy = [p for p in ports if not port_is_free(p)]
    if busy:
        holders = sorted({pid for p in busy for pid in pids_listening_on(p)})
        who = (f"held by {', '.join(describe_pid(p) for p in holders)}; {stop_hint(holders)}"
               if holders else "by a process this user cannot see; stop it first")
        print(f"standalone: bookie port(s) {busy} of {data} are in use, {who}", file=sys.stderr)
        return 1
    state["bookie_ports"] = ports
    state_file.write_text(json.dumps(state))
    bookies = []
    try:
        for i, port in enumerate(ports):
            bdir = data / f"bookie-{i}"
            bdir.mkdir(exist_ok=True)
            bookies.append(start_bookie_process(bdir, port, args.journal_sync, data / f"bookie-{i}.log"))
        server = BrokerServer(config)
        try:
            await server.start()
            await ensure_namespace(server.service, "public", "default", [args.cluster_name])
        except BaseException:
            await server.stop()     # a half-started broker would keep this process alive
            raise
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        pulsar = f"  Pulsar clients {server.pulsar_url}" if server.pulsar_url else ""
        print(f"minipulsar standalone is ready: service URL {server.service_url}{pulsar}  "
              f"metrics http://127.0.0.1:{server.http_port}/metrics  data {data}  (Ctrl-C stops)",
              file=sys.stderr, flush=True)
        print(f"STANDALONE_READY port={server.port} pid={os.getpid()} http_port={server.http_port} "
              f"pulsar_port={server.pulsar_port} pulsar_tls_port={server.pulsar_tls_port}", flush=True)
        try:
            await stop.wait()
        finally:
            print("standalone: stopping broker and bookies", file=sys.stderr, flush=True)
            await server.stop()
    finally:
        for proc in bookies:
            proc.terminate()
        for proc in bookies:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``minipulsar standalone`` flags to ``p``."""
    p.add_argument("--data-dir", default="data/standalone", help="where everything is stored (default data/standalone)")
    p.add_argument("--port", type=int, default=6600, help="broker gRPC port (default 6600; 0 = any free port)")
    p.add_argument("--http-port", type=int, default=8080, help="HTTP /metrics port (default 8080; 0 = any, -1 = off)")
    p.add_argument("--pulsar-port", type=int, default=6650,
                   help="Pulsar binary protocol port for the official clients (default 6650; 0 = any, -1 = off)")
    p.add_argument("--pulsar-tls-port", type=int, default=6651,
                   help="the same over TLS when the broker config has tls_enabled (default 6651; 0 = any, -1 = off)")
    p.add_argument("--bookies", type=int, default=2, help="number of bookies (default 2; Qw=Qa=min(2, N))")
    p.add_argument("--cluster-name", default="standalone")
    p.add_argument("--no-journal-sync", dest="journal_sync", action="store_false", default=True,
                   help="bookies do not fsync before acknowledging (faster, less durable)")
    p.add_argument("--deduplication", action="store_true", default=False,
                   help="broker_deduplication_enabled for every namespace")
    p.add_argument("--broker-config", metavar="FILE.toml", default=None,
                   help="extra broker settings (broker.conf names in snake_case)")
    p.add_argument("--log-level", default="WARNING")


def run_from_args(args) -> int:
    """Set up logging and run the standalone; returns the exit status: 2 for bad flags or
    configuration, 1 when it cannot start (one line on stderr), 0 after a clean stop."""
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.bookies < 1:
        print("standalone: --bookies must be >= 1", file=sys.stderr)
        return 2
    try:
        return run_async(run(args))
    except Exception as exc:  # noqa: BLE001 - one clear line and a non-zero exit, never a hung process
        log.debug("start failed", exc_info=True)
        reason = f"{exc}" if isinstance(exc, (OSError, RuntimeError)) else f"{type(exc).__name__}: {exc}"
        print(f"standalone: cannot start: {reason}", file=sys.stderr)
        return 1
