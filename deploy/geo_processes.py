"""Local processes of a geo topology (bookies and brokers of every cluster):
plan them from the topology, start them detached with their logs and pid
files under ``<data-dir>/<cluster>/``, wait until their ports answer, stop
them (SIGTERM, then SIGKILL after a grace period) and read their memory.

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

from deploy.topology import Topology

__all__ = ["GeoError", "GeoProcess", "plan_processes", "start_processes", "stop_processes",
           "READY_TIMEOUT_S", "STOP_TIMEOUT_S"]

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
REPO_ROOT = Path(__file__).resolve().parent.parent


class GeoError(Exception):
    """A geo command cannot go on; the message says what to do."""


@dataclasses.dataclass(eq=False)
class GeoProcess:
    """One local process of the topology (a bookie or a broker)."""

    cluster: str
    kind: str                       # "bookie" | "broker"
    index: int
    port: int
    root: Path                      # <data-dir>/<cluster>
    topology: Topology

    @property
    def name(self) -> str:
        """``bookie-0`` / ``broker`` (unique within the cluster)."""
        return f"bookie-{self.index}" if self.kind == "bookie" else "broker"

    @property
    def label(self) -> str:
        """``us-east/bookie-0``."""
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
    def ready_prefix(self) -> str:
        """The line the process prints once it serves."""
        return "BOOKIE_READY" if self.kind == "bookie" else "BROKER_READY"

    def command(self) -> list[str]:
        """The argv that runs this process (broker: writes its ``broker.toml`` first)."""
        if self.kind == "bookie":
            cmd = [sys.executable, "-m", "bookie", "--host", self.topology.host, "--port", str(self.port),
                   "--data-dir", str(self.dir), "--log-level", "INFO"]
            if not self.topology.journal_sync:
                cmd.append("--no-journal-sync")
            return cmd
        config_file = self.root / "broker.toml"
        config = self.topology.broker_config(self.cluster, str(self.dir))
        config_file.write_text(_toml(dataclasses.asdict(config)))
        return [sys.executable, "-m", "broker", "--config", str(config_file), "--log-level", "INFO"]

    def running_pid(self) -> int | None:
        """The pid from the pid file if that process is alive and is this one
        (its command line names this process's data dir), else None."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _pid_matches(pid, str(self.dir) if self.kind == "bookie" else str(self.root / "broker.toml")) \
            else None

    def start(self) -> subprocess.Popen:
        """Start detached (own session; survives this command); stdout and
        stderr append to the log file; writes the pid file."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(exist_ok=True)
        cmd = self.command()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if (REPO_ROOT / "broker").is_dir():
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
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
        """True once the ready line appeared in the log since ``start``."""
        with open(self.log_file, "rb") as f:
            f.seek(getattr(self, "_log_offset", 0))
            return any(line.startswith(self.ready_prefix.encode()) for line in f)

    def log_tail(self, n_bytes: int = 1500) -> str:
        """The end of the log file (for error messages)."""
        try:
            data = self.log_file.read_bytes()
        except OSError:
            return ""
        return data[-n_bytes:].decode(errors="replace")


def _pid_matches(pid: int, needle: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        try:
            os.kill(pid, 0)        # no /proc (macOS): trust a live pid
            return True
        except OSError:
            return False
    return any(needle.encode() in part for part in cmdline)


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
    """Every process of the topology: all bookies, then all brokers."""
    bookies, brokers = [], []
    for c in topology.clusters:
        root = data_dir / c.name
        bookies += [GeoProcess(c.name, "bookie", i, p, root, topology) for i, p in enumerate(c.bookie_ports)]
        brokers.append(GeoProcess(c.name, "broker", 0, c.broker_port, root, topology))
    return bookies + brokers


def _port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def start_processes(procs: list[GeoProcess], timeout_s: float = READY_TIMEOUT_S) -> None:
    """Start ``procs`` together and wait for all ready lines; on failure stop
    the ones started here and raise GeoError with the failing log's tail."""
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    waiting = list(procs)
    while waiting:
        for p in list(waiting):
            if p.ready():
                waiting.remove(p)
            elif p.popen.poll() is not None:
                stop_processes(procs, quiet=True)
                raise GeoError(f"{p.label} exited with status {p.popen.returncode} before it was ready; "
                               f"log {p.log_file}:\n{p.log_tail()}")
        if waiting and time.monotonic() > deadline:
            stop_processes(procs, quiet=True)
            raise GeoError(f"{', '.join(p.label for p in waiting)} not ready after {timeout_s:g}s; "
                           f"log {waiting[0].log_file}:\n{waiting[0].log_tail()}")
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
    return rows


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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie (exited, not reaped by its parent) counts as stopped
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return True
