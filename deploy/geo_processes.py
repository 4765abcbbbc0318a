"""Local processes of a geo topology: the configuration-store etcd and, per
cluster, its etcd, bookies and brokers. Plan them from the topology, start
them detached with their logs and pid files under ``<data-dir>/<cluster>/``
(the configuration store under ``<data-dir>/configuration-store/``), wait
until they serve (etcd: ``/health``; bookies and brokers: their ready line),
stop them (SIGTERM, then SIGKILL after a grace period) and read their memory.

The etcd command line, its health check and the etcd binary lookup are
``minipulsar cluster``'s (:mod:`deploy.cluster`, :mod:`deploy.cluster_plan`).

Used by ``minipulsar geo`` (``deploy.geo``) and the flights demo
(``deploy.flights_replay``)."""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from deploy.cluster_plan import ClusterError, etcd_command, parse_ready_line
from deploy.topology import CONFIGURATION_STORE, Topology

__all__ = ["GeoError", "GeoProcess", "plan_processes", "start_processes", "stop_processes", "process_health",
           "READY_TIMEOUT_S", "STOP_TIMEOUT_S", "KINDS"]

READY_TIMEOUT_S = 180.0           # 19 processes starting on two shared cores: be generous
STOP_TIMEOUT_S = 20.0
PROGRESS_EVERY_S = 5.0
REPO_ROOT = Path(__file__).resolve().parent.parent
KINDS = ("etcd", "bookie", "broker")
_READY_PREFIX = {"bookie": "BOOKIE_READY", "broker": "BROKER_READY"}


class GeoError(Exception):
    """A geo command cannot go on; the message says what to do."""


@dataclasses.dataclass(eq=False)
class GeoProcess:
    """One local process of the topology: ``kind`` etcd, bookie or broker of ``cluster``
    (``configuration-store`` for the shared etcd), ``index`` within its kind, its
    client-facing ``port`` (etcd client port, bookie port, broker gRPC port)."""

    cluster: str
    kind: str                       # "etcd" | "bookie" | "broker"
    index: int
    port: int
    root: Path                      # <data-dir>/<cluster>
    topology: Topology

    @property
    def name(self) -> str:
        """``etcd`` / ``bookie-0`` / ``broker-1`` (unique within the cluster)."""
        return "etcd" if self.kind == "etcd" else f"{self.kind}-{self.index}"

    @property
    def label(self) -> str:
        """``us-east/bookie-0``, ``configuration-store/etcd``."""
        return f"{self.cluster}/{self.name}"

    @property
    def dir(self) -> Path:
        """The process's own data directory."""
        return self.root / self.name

    @property
    def log_file(self) -> Path:
        """``<cluster dir>/<name>.log``: stdout and stderr, appended across restarts."""
        return self.root / f"{self.name}.log"

    @property
    def pid_file(self) -> Path:
        """``<cluster dir>/<name>.pid``: the pid while it runs."""
        return self.root / f"{self.name}.pid"

    @property
    def config_file(self) -> Path:
        """A broker's ``<cluster dir>/broker-<i>.toml`` (written from the topology at each start)."""
        return self.root / f"{self.name}.toml"

    @property
    def peer_port(self) -> int:
        """An etcd's peer port (0 for the others)."""
        if self.kind != "etcd":
            return 0
        topo = self.topology
        spec = topo.configuration_store if self.cluster == CONFIGURATION_STORE else topo.cluster(self.cluster).etcd
        return spec.peer_port

    @property
    def http_port(self) -> int:
        """A broker's HTTP port (-1 = off; 0 for the others)."""
        if self.kind != "broker":
            return 0
        return self.topology.cluster(self.cluster).brokers[self.index].http_port

    @property
    def pulsar_port(self) -> int:
        """A broker's Pulsar-protocol port (-1 = off; 0 for the others)."""
        if self.kind != "broker":
            return 0
        return self.topology.cluster(self.cluster).brokers[self.index].pulsar_port

    @property
    def url(self) -> str:
        """How clients reach it: ``etcd://h:p``, ``h:p`` (bookie), ``minipulsar://h:p`` (broker)."""
        address = f"{self.topology.host}:{self.port}"
        return {"etcd": f"etcd://{address}", "broker": f"{self.topology.scheme}://{address}"}.get(self.kind, address)

    def command(self) -> list[str]:
        """The argv that runs this process (a broker: writes its config file first)."""
        topo = self.topology
        if self.kind == "etcd":
            from deploy.cluster import find_etcd

            try:
                binary = find_etcd()
            except ClusterError as exc:
                raise GeoError(str(exc)) from None
            return etcd_command(binary, str(self.dir), self.port, self.peer_port, topo.host)
        if self.kind == "bookie":
            cmd = [sys.executable, "-m", "bookie", "--host", topo.host, "--port", str(self.port),
                   "--data-dir", str(self.dir), "--metadata-store-url", topo.metadata_store_url(self.cluster),
                   "--log-level", "INFO"]
            if not topo.journal_sync:
                cmd.append("--no-journal-sync")
            return cmd + topo.bookie_tls_args() + topo.bookie_auth_args()
        config = topo.broker_config(self.cluster, self.index, str(self.dir))
        self.config_file.write_text(_toml(dataclasses.asdict(config)))
        return [sys.executable, "-m", "broker", "--config", str(self.config_file), "--log-level", "INFO"]

    def _needle(self) -> str:
        """What this process's command line holds (its data dir, a broker its config file)."""
        return str(self.config_file) if self.kind == "broker" else str(self.dir)

    def running_pid(self) -> int | None:
        """The pid from the pid file if that process is alive and is this one
        (its command line names this process's data dir or config file), else None."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) and _pid_matches(pid, self._needle()) else None

    def start(self) -> subprocess.Popen:
        """Start detached (own session; survives this command); stdout and
        stderr append to the log file; writes the pid file."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(exist_ok=True)
        cmd = self.command()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if (REPO_ROOT / "broker").is_dir():
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        if self.kind == "etcd":
            env.setdefault("ETCD_UNSUPPORTED_ARCH", "")
        with open(self.log_file, "ab") as log:
            log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
            log.flush()
            self._log_offset = log.tell()
            popen = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=env, cwd=str(self.root))
        self.pid_file.write_text(f"{popen.pid}\n")
        self.popen = popen
        return popen

    def ready(self) -> bool:
        """True once it serves: etcd answers ``/health``; a bookie or broker printed
        its ready line in the log since ``start``."""
        if self.kind == "etcd":
            from deploy.cluster import etcd_healthy

            return etcd_healthy(self.port, self.topology.host)
        with open(self.log_file, "rb") as f:
            f.seek(getattr(self, "_log_offset", 0))
            return parse_ready_line(_READY_PREFIX[self.kind], f.read().decode(errors="replace")) is not None

    def log_tail(self, n_bytes: int = 1500) -> str:
        """The end of the log file (for error messages)."""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n_bytes))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def _pid_matches(pid: int, needle: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        try:
            os.kill(pid, 0)        # no /proc (macOS): trust a live pid
            return True
        except OSError:
            return False
    return needle.encode() in cmdline      # one argument of its command line, exactly


def _toml(values: dict) -> str:
    """A flat dict as TOML (str, bool, int, float, list of str)."""
    import json

    lines = ["# written by `minipulsar geo up` from the topology; edit the topology instead"]
    for k, v in values.items():
        if isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, (int, float)):
            lines.append(f"{k} = {v}")
        elif isinstance(v, str):
            lines.append(f"{k} = {json.dumps(v)}")
        elif isinstance(v, (list, tuple)):
            lines.append(f"{k} = [{', '.join(json.dumps(x) for x in v)}]")
    return "\n".join(lines) + "\n"


def plan_processes(topology: Topology, data_dir: Path) -> list[GeoProcess]:
    """Every process of the topology in start order: the etcds (configuration store
    first), then every bookie, then every broker."""
    etcds, bookies, brokers = [], [], []
    if topology.configuration_store is not None:
        etcds.append(GeoProcess(CONFIGURATION_STORE, "etcd", 0, topology.configuration_store.port,
                                data_dir / CONFIGURATION_STORE, topology))
    for c in topology.clusters:
        root = data_dir / c.name
        etcds.append(GeoProcess(c.name, "etcd", 0, c.etcd.port, root, topology))
        bookies += [GeoProcess(c.name, "bookie", i, p, root, topology) for i, p in enumerate(c.bookie_ports)]
        brokers += [GeoProcess(c.name, "broker", i, b.port, root, topology) for i, b in enumerate(c.brokers)]
    return etcds + bookies + brokers


def _port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def process_health(p: GeoProcess) -> tuple[bool, str]:
    """``(healthy, text)`` of a process by its port: etcd's ``/health``, a bookie's or
    broker's port accepting connections (``geo status`` asks brokers more)."""
    if p.kind == "etcd":
        from deploy.cluster import etcd_healthy

        ok = etcd_healthy(p.port, p.topology.host)
        return ok, "healthy" if ok else "not answering /health"
    ok = _port_open(p.topology.host, p.port)
    return ok, "listening" if ok else "not answering"


def start_processes(procs: list[GeoProcess], timeout_s: float = READY_TIMEOUT_S,
                    say: Callable[[str], None] | None = None) -> None:
    """Start ``procs`` together and wait for all to be ready, printing (``say``) which
    ones it still waits for every 5 s; on failure stop the ones started here and
    raise GeoError with the failing log's tail."""
    for p in procs:
        p.start()
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    next_progress = t0 + PROGRESS_EVERY_S
    waiting = list(procs)
    while waiting:
        for p in list(waiting):
            if p.ready():
                waiting.remove(p)
            elif p.popen.poll() is not None:
                stop_processes(procs, quiet=True)
                raise GeoError(f"{p.label} exited with status {p.popen.returncode} before it was ready; "
                               f"log {p.log_file}:\n{p.log_tail()}")
        now = time.monotonic()
        if waiting and now > deadline:
            stop_processes(procs, quiet=True)
            raise GeoError(f"{', '.join(p.label for p in waiting)} not ready after {timeout_s:g}s (raise --timeout "
                           f"on a slow machine); log {waiting[0].log_file}:\n{waiting[0].log_tail()}")
        if waiting and say is not None and now >= next_progress:
            shown = ", ".join(p.label for p in waiting[:6]) + (f" and {len(waiting) - 6} more" if len(waiting) > 6
                                                               else "")
            say(f"    ... waiting for {shown} ({now - t0:.0f}s of {timeout_s:g}s)")
            next_progress = now + PROGRESS_EVERY_S
        if waiting:
            time.sleep(0.05)


def stop_processes(procs: list[GeoProcess], timeout_s: float = STOP_TIMEOUT_S, quiet: bool = False) -> list[tuple]:
    """SIGTERM every running process of ``procs``, wait up to ``timeout_s``,
    SIGKILL what is left; removes pid files. Returns (label, pid, outcome) rows."""
    rows = []
    live = {}
    for p in procs:
        pid = p.running_pid()
        if pid is None:
            p.pid_file.unlink(missing_ok=True)
            rows.append((p.label, "-", "not running"))
            continue
        try:
            os.kill(pid, signal.SIGCONT)       # a paused (SIGSTOPped) process could not act on SIGTERM
            os.kill(pid, signal.SIGTERM)
            live[p] = (pid, time.monotonic())
        except ProcessLookupError:
            rows.append((p.label, pid, "not running"))
    deadline = time.monotonic() + timeout_s
    while live and time.monotonic() < deadline:
        for p, (pid, t0) in list(live.items()):
            popen = getattr(p, "popen", None)
            if popen is not None:
                popen.poll()        # reap our own children
            if not _alive(pid):
                rows.append((p.label, pid, f"stopped in {time.monotonic() - t0:.1f}s"))
                p.pid_file.unlink(missing_ok=True)
                del live[p]
        time.sleep(0.05)
    for p, (pid, _) in live.items():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        popen = getattr(p, "popen", None)
        if popen is not None:
            popen.wait()
        rows.append((p.label, pid, f"killed (no exit {timeout_s:g}s after SIGTERM)"))
        p.pid_file.unlink(missing_ok=True)
    order = {p.label: i for i, p in enumerate(procs)}
    return sorted(rows, key=lambda r: order.get(r[0], 0))


def _memory(pid: int) -> tuple[int | None, int | None]:
    """(resident, peak resident) bytes of ``pid`` from /proc (None where unknown)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":" in line)
    except OSError:
        return None, None

    def kib(name):
        """Bytes of the ``/proc/<pid>/status`` field ``name`` (given there in kB), or None."""
        v = fields.get(name, "").split()
        return int(v[0]) * 1024 if v else None
    return kib("VmRSS"), kib("VmHWM")


def _alive(pid: int) -> bool:
    """True when ``pid`` runs (a zombie, exited but not reaped, counts as stopped)."""
    from proto.process_info import is_alive
    return is_alive(pid)
