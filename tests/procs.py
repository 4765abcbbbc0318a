"""Start REAL server processes for integration tests (like nats.py's test helper).

A server process prints one line ``<NAME>_READY port=<port> pid=<pid>`` on
stdout once it listens. :class:`ServerProcess` starts the command, waits for
that line and exposes the port; stdout and stderr go to log files in the data
dir (``<name>.stdout.log`` / ``<name>.stderr.log``, appended across
restarts) so a failure can be inspected. Every process dies with the test
process, however it dies (:func:`proto.lifeline.popen`). Processes register with an optional
:class:`ProcessTracker`, which kills them all at test teardown (see the
``bookie_factory`` / ``process_tracker`` fixtures in ``tests/conftest.py``).

To add another kind (e.g. a broker), subclass ServerProcess with ``name``,
``ready_prefix`` and ``command()``, plus a ``start_<kind>()`` function.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from proto import lifeline

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_READY_TIMEOUT_S = 30.0


class ProcessTracker:
    """Remembers started processes and kills (SIGKILL) the live ones on :meth:`kill_all`."""

    def __init__(self) -> None:
        self.processes: list[ServerProcess] = []

    def add(self, proc: "ServerProcess") -> None:
        self.processes.append(proc)

    def kill_all(self) -> None:
        for proc in self.processes:
            proc.kill()
        self.processes.clear()


class ServerProcess:
    """One server subprocess that announces ``<ready_prefix> port=<port> pid=<pid>``.

    Subclasses set ``name`` (log file prefix), ``ready_prefix`` (e.g.
    ``"BOOKIE_READY"``) and implement :meth:`command` (argv list) and
    :meth:`restart`. After :meth:`start`: ``.port`` (int), ``.address``
    (``"127.0.0.1:<port>"``), ``.pid``, ``.popen``.
    """

    name = "server"
    ready_prefix = "SERVER_READY"
    start_new_session = False   # True: the process leads its own session and process group

    def __init__(self, data_dir: str | os.PathLike, extra_args=(), tracker: ProcessTracker | None = None,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> None:
        self.data_dir = Path(data_dir)
        self.extra_args = tuple(extra_args)
        self.tracker = tracker
        self.ready_timeout_s = ready_timeout_s
        self.popen: subprocess.Popen | None = None
        self.port: int | None = None
        self.pid: int | None = None

    # -- to override -------------------------------------------------------
    def command(self) -> list[str]:
        raise NotImplementedError

    # -- common --------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def stdout_log(self) -> Path:
        return self.data_dir / f"{self.name}.stdout.log"

    @property
    def stderr_log(self) -> Path:
        return self.data_dir / f"{self.name}.stderr.log"

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def is_running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> "ServerProcess":
        """Start the process and wait for its ready line.

        Raises ``RuntimeError`` (with the stderr tail) if it exits first and
        ``TimeoutError`` if no ready line comes within ``ready_timeout_s``.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        offset = self.stdout_log.stat().st_size if self.stdout_log.exists() else 0
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        with open(self.stdout_log, "ab") as out, open(self.stderr_log, "ab") as err:
            # dies with the test process, however it dies (proto.lifeline)
            self.popen = lifeline.popen(self.command(), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                        cwd=str(REPO_ROOT), env=env, start_new_session=self.start_new_session)
        if self.tracker is not None:
            self.tracker.add(self)
        pattern = re.compile(rf"^{re.escape(self.ready_prefix)} port=(\d+) pid=(\d+)(?: [^\n]*)?\r?\n", re.M)
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            with open(self.stdout_log, "rb") as f:
                f.seek(offset)
                m = pattern.search(f.read().decode(errors="replace"))
            if m:
                self.port, self.pid = int(m.group(1)), int(m.group(2))
                return self
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode} before ready:\n"
                                   f"{self.stderr_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{self.name} not ready after {self.ready_timeout_s}s:\n{self.stderr_tail()}")
            time.sleep(0.02)

    def stderr_tail(self, n_bytes: int = 4000) -> str:
        try:
            data = self.stderr_log.read_bytes()
        except OSError:
            return ""
        return data[-n_bytes:].decode(errors="replace")

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit status (SIGKILL after ``timeout_s``)."""
        if self.popen is None:
            return 0
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> int | None:
        """SIGKILL (like ``kill -9``) and reap; returns the exit status. No-op if not running."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.kill()
        return self.popen.wait()

    def wait(self, timeout_s: float | None = None) -> int:
        """Wait for exit and return the exit status (raises ``subprocess.TimeoutExpired``)."""
        return self.popen.wait(timeout_s)

    def restart(self) -> "ServerProcess":
        """Start a NEW process of the same kind on the same data dir (stop this one first)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.address} pid={self.pid} dir={self.data_dir}>"


class BookieProcess(ServerProcess):
    """A ``python -m bookie --port 0 --data-dir DIR`` process."""

    name = "bookie"
    ready_prefix = "BOOKIE_READY"

    def __init__(self, data_dir, journal_sync: bool = True, extra_args=(), tracker=None,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> None:
        super().__init__(data_dir, extra_args, tracker, ready_timeout_s)
        self.journal_sync = journal_sync

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "bookie", "--port", "0", "--data-dir", str(self.data_dir)]
        if not self.journal_sync:
            cmd.append("--no-journal-sync")
        return cmd + list(self.extra_args)

    def restart(self) -> "BookieProcess":
        if self.is_running():
            raise RuntimeError(f"{self!r} is still running: terminate() or kill() it first")
        return start_bookie(self.data_dir, self.journal_sync, self.extra_args, tracker=self.tracker,
                            ready_timeout_s=self.ready_timeout_s)


def start_bookie(data_dir, journal_sync: bool = True, extra_args=(), tracker: ProcessTracker | None = None,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> BookieProcess:
    """Start a bookie process on a free port and wait until it is ready (blocking, ~1 s)."""
    return BookieProcess(data_dir, journal_sync, extra_args, tracker, ready_timeout_s).start()


class StandaloneProcess(ServerProcess):
    """A ``python -m deploy.cli standalone --port 0 --http-port 0`` process
    (bookies + broker). ``.service_url`` is ``minipulsar://127.0.0.1:<port>``."""

    name = "standalone"
    ready_prefix = "STANDALONE_READY"

    def __init__(self, data_dir, extra_args=(), tracker=None, ready_timeout_s: float = 60.0,
                 port: int = 0, pulsar_port: int = 0) -> None:
        super().__init__(data_dir, extra_args, tracker, ready_timeout_s)
        self.requested_port = port
        self.requested_pulsar_port = pulsar_port   # Pulsar binary protocol (0 = any free port)
        self.pulsar_port: int | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "deploy.cli", "standalone", "--port", str(self.requested_port),
                "--http-port", "0", "--pulsar-port", str(self.requested_pulsar_port), "--pulsar-tls-port", "0",
                "--data-dir", str(self.data_dir), *self.extra_args]

    def start(self) -> "StandaloneProcess":
        super().start()
        try:
            text = self.stdout_log.read_text(errors="replace")
        except OSError:
            text = ""
        m = None
        for m in re.finditer(rf"^{re.escape(self.ready_prefix)} port={self.port} pid={self.pid} .*pulsar_port=(-?\d+)",
                             text, re.M):
            pass
        self.pulsar_port = int(m.group(1)) if m else None
        m = re.search(rf"^{re.escape(self.ready_prefix)} port={self.port} pid={self.pid} .*pulsar_tls_port=(-?\d+)",
                      text, re.M)
        self.pulsar_tls_port = int(m.group(1)) if m else None
        return self

    @property
    def service_url(self) -> str:
        return f"minipulsar://127.0.0.1:{self.port}"

    @property
    def pulsar_url(self) -> str:
        """``pulsar://127.0.0.1:<pulsar_port>`` (``pulsar+ssl://...:<pulsar_tls_port>`` when the
        broker serves TLS): the official Pulsar clients' service URL."""
        if (self.pulsar_port is None or self.pulsar_port < 0) and (self.pulsar_tls_port or -1) > 0:
            return f"pulsar+ssl://127.0.0.1:{self.pulsar_tls_port}"
        return f"pulsar://127.0.0.1:{self.pulsar_port}"

    def restart(self, same_port: bool = True) -> "StandaloneProcess":
        if self.is_running():
            raise RuntimeError(f"{self!r} is still running: terminate() or kill() it first")
        proc = StandaloneProcess(self.data_dir, self.extra_args, self.tracker, self.ready_timeout_s,
                                 port=self.port if same_port else 0,
                                 pulsar_port=(self.pulsar_port or 0) if same_port else 0)
        return proc.start()

    def kill(self) -> int | None:
        """SIGKILL the whole process group (the broker and its bookie children)."""
        if self.popen is not None and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.popen.kill()
        # bookies run in their own sessions: kill them by data dir
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                cmdline = (pid_dir / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"bookie" in cmdline and any(str(self.data_dir).encode() in a for a in cmdline):
                try:
                    os.kill(int(pid_dir.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return super().kill()


def start_standalone(data_dir, extra_args=(), tracker: ProcessTracker | None = None) -> StandaloneProcess:
    """Start a standalone cluster (2 bookies + broker) on free ports; ~2-4 s."""
    return StandaloneProcess(data_dir, extra_args, tracker).start()


class BrokerProcess(ServerProcess):
    """A ``python -m broker --bookies A,B --data-dir DIR --port P --http-port 0 [--config FILE]`` process.

    ``port`` 0 = any free port; :meth:`restart` (``same_port=True``) starts the
    new process on the same gRPC port so clients reconnect to it. After
    :meth:`start`: ``.port``, ``.http_port``, ``.service_url``
    (``minipulsar://127.0.0.1:<port>``). The data dir holds the broker's
    metadata store and the ``broker.*.log`` files.
    """

    name = "broker"
    ready_prefix = "BROKER_READY"

    def __init__(self, data_dir, bookies, config_file=None, extra_args=(), tracker=None,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S, port: int = 0, pulsar_port: int = 0) -> None:
        super().__init__(data_dir, extra_args, tracker, ready_timeout_s)
        self.bookies = [bookies] if isinstance(bookies, str) else list(bookies)
        self.config_file = None if config_file is None else Path(config_file)
        self.requested_port = port
        self.requested_pulsar_port = pulsar_port   # Pulsar binary protocol (0 = any free port)
        self.http_port: int | None = None
        self.pulsar_port: int | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "broker", *(["--bookies", ",".join(self.bookies)] if self.bookies else []),
               "--data-dir", str(self.data_dir), "--port", str(self.requested_port), "--http-port", "0",
               "--pulsar-port", str(self.requested_pulsar_port), "--pulsar-tls-port", "0"]
        if self.config_file is not None:
            cmd += ["--config", str(self.config_file)]
        return cmd + list(self.extra_args)

    def start(self) -> "BrokerProcess":
        super().start()
        # the ready line also names the HTTP port: take it from this process's line
        try:
            text = self.stdout_log.read_text(errors="replace")
        except OSError:
            text = ""
        m = None
        for m in re.finditer(rf"^{re.escape(self.ready_prefix)} port={self.port} pid={self.pid} http_port=(-?\d+)"
                             rf"(?: pulsar_port=(-?\d+))?", text, re.M):
            pass
        self.http_port = int(m.group(1)) if m else None
        self.pulsar_port = int(m.group(2)) if m and m.group(2) else None
        return self

    @property
    def service_url(self) -> str:
        return f"minipulsar://127.0.0.1:{self.port}"

    @property
    def pulsar_url(self) -> str:
        """``pulsar://127.0.0.1:<pulsar_port>``: the official Pulsar clients' service URL."""
        return f"pulsar://127.0.0.1:{self.pulsar_port}"

    def restart(self, same_port: bool = True) -> "BrokerProcess":
        if self.is_running():
            raise RuntimeError(f"{self!r} is still running: terminate() or kill() it first")
        proc = BrokerProcess(self.data_dir, self.bookies, self.config_file, self.extra_args, self.tracker,
                             self.ready_timeout_s, port=self.port if same_port else 0,
                             pulsar_port=(self.pulsar_port or 0) if same_port else 0)
        return proc.start()


def start_broker(data_dir, bookies, config_file=None, extra_args=(), tracker: ProcessTracker | None = None,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S, port: int = 0, pulsar_port: int = 0) -> BrokerProcess:
    """Start a broker process on ``bookies`` (addresses ``host:port``) and wait until it
    is ready (blocking, ~1-2 s). ``config_file``: a TOML file of BrokerConfig keys;
    ``pulsar_port``: its Pulsar-protocol port (0 = any free port)."""
    return BrokerProcess(data_dir, bookies, config_file, extra_args, tracker, ready_timeout_s, port,
                         pulsar_port).start()


def restart_bookie_same_port(proc: BookieProcess, extra_args=()) -> BookieProcess:
    """Start a stopped bookie again on its data dir and its port (ledger metadata names
    bookies by address), with the same tracker; ``extra_args`` e.g. ``("--format",)``."""
    return start_bookie(proc.data_dir, proc.journal_sync, ("--port", str(proc.port), *extra_args),
                        tracker=proc.tracker)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (bind to 0, close)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdProcess:
    """A real single-member ``etcd`` server (Debian's ``etcd-server``) on free loopback
    ports, data in ``data_dir/etcd``. ``.url`` is ``etcd://127.0.0.1:<client port>``
    (the broker's ``metadata_store_url``), ``.client_port``. ``restart()`` keeps the
    ports and the data; ``pause()``/``resume()`` SIGSTOP/SIGCONT it; ``kill()`` is kill -9.
    Raises RuntimeError naming what to install when ``etcd`` is not on the PATH."""

    def __init__(self, data_dir, tracker: ProcessTracker | None = None, ready_timeout_s: float = 20.0) -> None:
        import shutil

        self.binary = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
        if self.binary is None:
            raise RuntimeError("etcd is not installed: run scripts/setup.sh (installs Debian's etcd-server) "
                               "or apt-get install etcd-server")
        self.data_dir = Path(data_dir)
        self.tracker = tracker
        self.ready_timeout_s = ready_timeout_s
        self.client_port = free_port()
        self.peer_port = free_port()
        self.popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.client_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [self.binary, "--name", "default", "--data-dir", str(self.data_dir / "etcd"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"default={peer}", "--log-level", "warn"]

    def start(self) -> "EtcdProcess":
        """Start etcd and wait until it answers on its client port (raises TimeoutError /
        RuntimeError with the log tail)."""
        import socket

        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "etcd.log", "ab")
        env = dict(os.environ, ETCD_UNSUPPORTED_ARCH=os.environ.get("ETCD_UNSUPPORTED_ARCH", ""))
        self.popen = lifeline.popen(self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
        log.close()
        if self.tracker is not None:
            self.tracker.add(self)  # type: ignore[arg-type]
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.popen.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.popen.returncode}:\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.2):
                    pass
                if self._healthy():
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"etcd not ready after {self.ready_timeout_s}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.client_port}/health", timeout=1) as r:
                return b'"true"' in r.read()
        except OSError:
            return False

    def log_tail(self, n_bytes: int = 3000) -> str:
        try:
            return (self.data_dir / "etcd.log").read_bytes()[-n_bytes:].decode(errors="replace")
        except OSError:
            return ""

    def is_running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> int | None:
        """SIGKILL and reap (no-op when not running); resumes a paused etcd first."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            try:
                os.kill(self.popen.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.popen.kill()
        return self.popen.wait()

    def terminate(self, timeout_s: float = 10.0) -> int:
        if self.popen is None:
            return 0
        if self.popen.poll() is None:
            self.popen.terminate()
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return self.kill() or -9

    def pause(self) -> None:
        """SIGSTOP: etcd stops answering (leases are not expired while it is stopped)."""
        os.kill(self.popen.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.popen.pid, signal.SIGCONT)

    def restart(self) -> "EtcdProcess":
        """Start a new etcd process on the same ports and data dir (stop this one first)."""
        if self.is_running():
            raise RuntimeError("etcd is still running: kill() or terminate() it first")
        return self.start()


def start_etcd(data_dir, tracker: ProcessTracker | None = None) -> EtcdProcess:
    """Start a real etcd on free loopback ports (blocking, ~0.5-1 s)."""
    return EtcdProcess(data_dir, tracker).start()


async def ensure_namespace(service_url: str, namespace: str = "public/default") -> None:
    """Create ``namespace`` (``tenant/ns``) and its tenant on the broker at ``service_url``
    unless they exist: a broker started alone (not standalone) has no tenants."""
    from client.admin import AdminClient
    from client.errors import AlreadyExists

    async with AdminClient(service_url) as admin:
        for call, arg in ((admin.create_tenant, namespace.split("/")[0]), (admin.create_namespace, namespace)):
            try:
                await call(arg)
            except AlreadyExists:
                pass
