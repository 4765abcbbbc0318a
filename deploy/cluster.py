"""``minipulsar cluster``: a local broker cluster (several brokers over one etcd and shared bookies).

    minipulsar cluster up     [--brokers N] [--bookies M] [--data-dir DIR] [--base-port P] [--cluster-name NAME]
    minipulsar cluster status [--data-dir DIR]
    minipulsar cluster down   [--data-dir DIR] [--timeout S] [--purge]

This is Pulsar's broker cluster on one machine: N stateless brokers sharing
one metadata store (a single-member etcd) and M bookies; each namespace
bundle is owned by one broker, any broker answers lookups, and clients use
the multi-host service URL naming every broker.

Every process runs detached from the command (its own session, so ``up``
returns and they keep running), with its data in ``<data-dir>/<name>/`` and
its output appended to ``<data-dir>/<name>.log``; ``<data-dir>/cluster.json``
records names, ports and pids (format: :mod:`deploy.cluster_plan`). A second
``up`` on the same data dir starts what is not running on the recorded ports
and resumes with everything stored. ``minipulsar standalone`` stays the
one-broker, SQLite-backed way to run minipulsar.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from deploy.cluster_plan import (HOST, READY_PREFIX, STATE_FILE, ClusterError, ClusterProcess, ClusterState,
                                 bookie_command, broker_command, broker_config_toml, etcd_command,
                                 parse_ready_line, plan_cluster)
from deploy.console import table

__all__ = ["add_arguments", "run_from_args", "main", "load_state", "save_state", "find_etcd",
           "start_processes", "stop_processes", "running_pid", "process_status", "etcd_healthy"]

DEFAULT_DATA_DIR = "data/cluster"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
PROGRESS_EVERY_S = 5.0
REPO_ROOT = Path(__file__).resolve().parent.parent
ETCD_MISSING = ("etcd is not installed (no `etcd` on the PATH or at /usr/bin/etcd): "
                "run scripts/setup.sh or apt-get install etcd-server")

# Popen objects of processes started by this command (to reap them when stopped here)
_children: dict[int, subprocess.Popen] = {}


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- state file ------------------------------------------------------------------------
def load_state(data: Path) -> ClusterState | None:
    """The cluster recorded in ``<data>/cluster.json``, or None when there is no such
    file. Raises ClusterError when the file cannot be read or parsed."""
    path = data / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ClusterError(f"cannot read {path}: {exc}") from None
    return ClusterState.from_json(text, str(path))


def save_state(data: Path, state: ClusterState) -> None:
    """Write ``state`` to ``<data>/cluster.json`` atomically (a reader sees the old or the new file)."""
    data.mkdir(parents=True, exist_ok=True)
    tmp = data / (STATE_FILE + ".tmp")
    tmp.write_text(state.to_json())
    os.replace(tmp, data / STATE_FILE)


# ---- processes --------------------------------------------------------------------------
def find_etcd() -> str:
    """Path of the etcd server binary (PATH, then /usr/bin/etcd); ClusterError saying how to install it."""
    found = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if found is None:
        raise ClusterError(ETCD_MISSING)
    return found


def bookie_registers() -> bool:
    """True when this checkout's bookie takes ``--metadata-store-url`` (it then registers
    itself in etcd, as BookKeeper bookies do under ``/ledgers/available``); older bookies
    only serve the brokers' static ``--bookies`` list."""
    from bookie.__main__ import add_arguments as bookie_arguments

    p = argparse.ArgumentParser(add_help=False)
    bookie_arguments(p)
    _, unknown = p.parse_known_args(["--metadata-store-url", "etcd://127.0.0.1:1"])
    return not unknown


def _dir(data: Path, p: ClusterProcess) -> Path:
    return data / p.name


def _log(data: Path, p: ClusterProcess) -> Path:
    return data / f"{p.name}.log"


def running_pid(data: Path, p: ClusterProcess) -> int | None:
    """``p.pid`` if that process is alive (not a zombie) and is ``p``: its command
    line has ``<data>/<name>`` (its data dir) as one argument, so a recycled pid
    never counts. None otherwise."""
    if not p.pid or not _alive(p.pid):
        return None
    try:
        argv = Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return p.pid if not Path("/proc").is_dir() else None   # no /proc (macOS): trust a live pid
    return p.pid if str(_dir(data, p)).encode() in argv else None


def _alive(pid: int) -> bool:
    """True when ``pid`` runs: a child of this command that exited is reaped and gone; a
    zombie (exited, not reaped by its parent) counts as gone too."""
    popen = _children.get(pid)
    if popen is not None and popen.poll() is not None:
        return False
    from proto.process_info import is_alive
    return is_alive(pid)


def _port_open(port: int, timeout: float = 1.0) -> bool:
    import socket

    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def etcd_healthy(port: int, host: str = HOST, timeout: float = 1.0) -> bool:
    """True when the etcd serving clients on ``host:port`` answers ``/health`` with health true."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout) as r:
            return b'"true"' in r.read()
    except (OSError, ValueError):
        return False


def _log_tail(path: Path, n_bytes: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return "(no log)"


def _start(data: Path, p: ClusterProcess, cmd: list[str], extra_env: dict | None = None) -> int:
    """Start ``cmd`` for ``p`` detached (own session, stdin from /dev/null, stdout and
    stderr appended to its log), record its pid in ``p``; returns the log offset
    where this run's output begins."""
    _dir(data, p).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
    if (REPO_ROOT / "broker").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    with open(_log(data, p), "ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} minipulsar cluster up: {' '.join(cmd)}\n".encode())
        log.flush()
        offset = log.tell()
        popen = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env=env, cwd=str(data))
    _children[popen.pid] = popen
    p.pid = popen.pid
    return offset


def _ready(data: Path, p: ClusterProcess, offset: int) -> bool:
    """True once ``p`` serves: etcd answers /health, a bookie/broker printed its ready
    line since ``offset`` (the ports it reports are recorded in ``p``)."""
    if p.kind == "etcd":
        return etcd_healthy(p.port)
    with open(_log(data, p), "rb") as f:
        f.seek(offset)
        found = parse_ready_line(READY_PREFIX[p.kind], f.read().decode(errors="replace"))
    if found is None:
        return False
    p.port = found.get("port", p.port)
    if p.kind == "broker":
        p.http_port = found.get("http_port", p.http_port)
    return True


def start_processes(data: Path, state: ClusterState, todo: list[tuple[ClusterProcess, list[str]]],
                    timeout_s: float = READY_TIMEOUT_S, extra_env: dict | None = None) -> None:
    """Start every ``(process, argv)`` of ``todo`` together and wait until all are
    ready, saving ``state`` (pids, then reported ports) as it goes; prints a
    progress line every 5 s while waiting. Raises ClusterError with the log tail
    when one exits before it is ready or is not ready within ``timeout_s``
    (the caller stops what was started)."""
    t0 = time.monotonic()
    offsets = {}
    for p, cmd in todo:
        offsets[p.name] = _start(data, p, cmd, extra_env)
    save_state(data, state)
    waiting = [p for p, _ in todo]
    next_progress = t0 + PROGRESS_EVERY_S
    while waiting:
        for p in list(waiting):
            if _ready(data, p, offsets[p.name]):
                waiting.remove(p)
            elif not _alive(p.pid):
                code = _children[p.pid].poll() if p.pid in _children else None
                raise ClusterError(f"{p.name} exited (status {code}) before it was ready; "
                                   f"the end of its log {_log(data, p)}:\n{_log_tail(_log(data, p))}")
        now = time.monotonic()
        if waiting and now - t0 > timeout_s:
            p = waiting[0]
            raise ClusterError(f"{', '.join(w.name for w in waiting)} not ready after {timeout_s:g}s "
                               f"(raise --timeout if this machine is slow); the end of {_log(data, p)}:\n"
                               f"{_log_tail(_log(data, p))}")
        if waiting and now >= next_progress:
            _say(f"  ... waiting for {', '.join(w.name for w in waiting)} ({now - t0:.0f}s of {timeout_s:g}s)")
            next_progress = now + PROGRESS_EVERY_S
        if waiting:
            time.sleep(0.05)
    save_state(data, state)


def stop_processes(data: Path, procs: list[ClusterProcess], timeout_s: float = STOP_TIMEOUT_S) -> list[tuple]:
    """SIGTERM every running process of ``procs`` at once, wait up to ``timeout_s``
    seconds, SIGKILL what is left; clears their pids. Returns ``(name, pid,
    outcome)`` rows, outcome "stopped in 0.4s", "killed ..." or "not running"."""
    rows, live = [], {}
    for p in procs:
        pid = running_pid(data, p)
        if pid is None:
            rows.append((p.name, "-", "not running"))
            p.pid = None
            continue
        try:
            os.kill(pid, signal.SIGCONT)        # a paused (SIGSTOPped) process could not act on SIGTERM
            os.kill(pid, signal.SIGTERM)
            live[p.name] = (p, pid, time.monotonic())
        except ProcessLookupError:
            rows.append((p.name, pid, "not running"))
            p.pid = None
    deadline = time.monotonic() + timeout_s
    while live and time.monotonic() < deadline:
        for name, (p, pid, t0) in list(live.items()):
            if not _alive(pid):
                rows.append((name, pid, f"stopped in {time.monotonic() - t0:.1f}s"))
                p.pid = None
                del live[name]
        time.sleep(0.05)
    for name, (p, pid, _) in live.items():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if pid in _children:
            _children[pid].wait()
        rows.append((name, pid, f"killed (still running {timeout_s:g}s after SIGTERM)"))
        p.pid = None
    for p in procs:
        popen = _children.pop(p.pid, None) if p.pid else None
        if popen is not None:
            popen.poll()
    order = {p.name: i for i, p in enumerate(procs)}
    return sorted(rows, key=lambda r: order[r[0]])


def process_status(data: Path, p: ClusterProcess) -> tuple[bool, str]:
    """``(healthy, text)`` of one process: alive and answering on its port (etcd:
    its /health says true), or why not ("dead", "alive, port ... not answering")."""
    pid = running_pid(data, p)
    if pid is None:
        return False, "dead"
    if not p.port:
        return False, "alive, port unknown (never got ready)"
    ok = etcd_healthy(p.port) if p.kind == "etcd" else _port_open(p.port)
    return (True, "alive") if ok else (False, f"alive, not answering on port {p.port}")


def _busy_ports(procs: list[ClusterProcess]) -> list[tuple[str, int]]:
    from deploy.standalone import port_is_free

    wanted = []
    for p in procs:
        wanted += [(p.name, p.port), (f"{p.name} peer", p.peer_port), (f"{p.name} http", p.http_port)]
    return [(what, port) for what, port in wanted if port > 0 and not port_is_free(port, HOST)]


# ---- commands ----------------------------------------------------------------------------
def cmd_up(args) -> int:
    """``cluster up``: start etcd, then the bookies, then the brokers (what is not
    running yet), wait for each group, print the URLs. Everything this command
    started is stopped again when one of them fails."""
    t0 = time.monotonic()
    data = Path(args.data_dir).resolve()
    previous = load_state(data)
    from deploy.standalone import free_port

    state = plan_cluster(args.brokers, args.bookies, args.base_port, args.cluster_name, previous, free_port)
    for p in state.processes:
        if running_pid(data, p) is None:
            p.pid = None
    to_start = [p for p in state.processes if p.pid is None]
    if not to_start:
        _print_summary(data, state, args, f"already running (nothing to start, {STATE_FILE} in {data})")
        return 0
    etcd_binary = find_etcd() if state.etcd in to_start else None
    busy = _busy_ports(to_start)
    if busy:
        lines = "\n".join(f"  - port {port} ({what})" for what, port in busy)
        hint = ("the recorded ports of this data dir" if previous else
                "--base-port 0 (free ports) or another --base-port")
        raise ClusterError(f"port(s) already in use on {HOST}, nothing was started:\n{lines}\n"
                           f"Stop what uses them (find it with `ss -ltnp`; another cluster: "
                           f"`minipulsar cluster down --data-dir ...`), or use {hint}"
                           + ("" if not previous else " (or another --data-dir)") + ".")
    data.mkdir(parents=True, exist_ok=True)
    _say(f"cluster up: starting {len(to_start)} process(es) of cluster {state.cluster_name!r} "
         f"({'existing' if previous else 'new'} data in {data})")
    started: list[ClusterProcess] = []
    try:
        if state.etcd in to_start:
            p = state.etcd
            started.append(p)
            start_processes(data, state, [(p, etcd_command(etcd_binary, str(_dir(data, p)), p.port, p.peer_port))],
                            args.timeout, {"ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")})
            _say(f"  etcd ready on {p.address} ({time.monotonic() - t0:.1f}s)")
        bookies = [p for p in state.bookies if p in to_start]
        if bookies:
            registry = state.etcd_url if bookie_registers() else None
            started += bookies
            start_processes(data, state, [(p, bookie_command(sys.executable, str(_dir(data, p)), p.port, registry))
                                          for p in bookies], args.timeout)
            _say(f"  {len(bookies)} bookie(s) ready ({time.monotonic() - t0:.1f}s)")
        brokers = [p for p in state.brokers if p in to_start]
        if brokers:
            config = data / "broker.toml"
            config.write_text(broker_config_toml(len(state.bookies)))
            addresses = state.bookie_addresses()
            started += brokers
            start_processes(data, state, [(p, broker_command(sys.executable, p, str(_dir(data, p)), state.etcd_url,
                                                             addresses, state.cluster_name, str(config)))
                                          for p in brokers], args.timeout)
            _say(f"  {len(brokers)} broker(s) ready ({time.monotonic() - t0:.1f}s)")
    except BaseException as exc:
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        _say(f"cluster up: {what}; stopping the {len(started)} process(es) started by this command")
        stop_processes(data, list(reversed(started)), timeout_s=5.0)
        save_state(data, state)
        raise
    _print_summary(data, state, args, f"ready in {time.monotonic() - t0:.1f}s ({len(to_start)} started, "
                                      f"{len(state.processes) - len(to_start)} already running)")
    return 0


def _print_summary(data: Path, state: ClusterState, args, how: str) -> None:
    rows = [(p.name, p.address, f"{HOST}:{p.http_port}" if p.kind == "broker" and p.http_port > 0 else "-",
             p.pid or "-", str(_log(data, p))) for p in state.processes]
    print(table(["process", "address", "http", "pid", "log"], rows))
    print()
    print(f"service URL: {state.service_url}")
    print(f"etcd URL:    {state.etcd_url}   (the brokers' metadata store; etcdctl --endpoints "
          f"http://{HOST}:{state.etcd.port})")
    print(f"cluster up: {state.cluster_name!r} with {len(state.brokers)} broker(s) and {len(state.bookies)} "
          f"bookie(s) {how}; data and logs in {data}")
    d = args.data_dir
    print(f"next: minipulsar-client produce my-topic -m hello --service-url {state.service_url}\n"
          f"      minipulsar cluster status --data-dir {d}   |   minipulsar cluster down --data-dir {d}")


def cmd_status(args) -> int:
    """``cluster status``: every process alive/dead with its port and pid, the URLs;
    exit status 1 when a process is down (or there is no cluster in the data dir)."""
    data = Path(args.data_dir).resolve()
    state = load_state(data)
    if state is None:
        print(f"cluster status: no cluster in {data} (no {STATE_FILE}); start one with "
              f"`minipulsar cluster up --data-dir {args.data_dir}`", file=sys.stderr)
        return 1
    rows, down = [], []
    for p in state.processes:
        ok, text = process_status(data, p)
        if not ok:
            down.append(p.name)
        rows.append((p.name, p.address, f"{HOST}:{p.http_port}" if p.kind == "broker" and p.http_port > 0 else "-",
                     running_pid(data, p) or (f"({p.pid})" if p.pid else "-"), text))
    print(table(["process", "address", "http", "pid", "status"], rows))
    print()
    print(f"service URL: {state.service_url}")
    print(f"etcd URL:    {state.etcd_url}")
    if down:
        print(f"cluster status: {len(down)} of {len(state.processes)} process(es) DOWN ({', '.join(down)}); "
              f"`minipulsar cluster up --data-dir {args.data_dir}` starts them again, logs in {data}")
        return 1
    print(f"cluster status: all {len(state.processes)} processes alive (data {data})")
    return 0


def cmd_down(args) -> int:
    """``cluster down``: stop the brokers, then the bookies, then etcd (SIGTERM,
    SIGKILL after ``--timeout``), say what was stopped; ``--purge`` deletes the data dir."""
    data = Path(args.data_dir).resolve()
    state = load_state(data)
    if state is None:
        print(f"cluster down: no cluster in {data} (no {STATE_FILE}); nothing to stop")
        return 0
    rows = (stop_processes(data, state.brokers, args.timeout) + stop_processes(data, state.bookies, args.timeout)
            + stop_processes(data, [state.etcd], args.timeout))
    save_state(data, state)
    print(table(["process", "pid", "result"], rows))
    stopped = sum(1 for r in rows if r[2] != "not running")
    if args.purge:
        shutil.rmtree(data)
        print(f"cluster down: stopped {stopped} process(es) and deleted {data}")
    else:
        print(f"cluster down: stopped {stopped} process(es); data kept in {data} "
              f"(`minipulsar cluster up --data-dir {args.data_dir}` resumes it, --purge deletes it)")
    return 0


# ---- argument parsing ------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``cluster`` actions (up, status, down) and their flags to parser ``p``."""
    sub = p.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    data_help = f"data, logs and {STATE_FILE} (default {DEFAULT_DATA_DIR})"
    up = sub.add_parser("up", help="start etcd, bookies and brokers as background processes",
                        description="Start a local broker cluster: one etcd, M bookies, N brokers. On an existing "
                                    "data dir, starts what is not running on the recorded ports.")
    up.add_argument("--brokers", type=int, default=None, help="number of brokers (default 2)")
    up.add_argument("--bookies", type=int, default=None, help="number of bookies (default 2; Qw=Qa=min(2, M))")
    up.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=data_help)
    up.add_argument("--base-port", type=int, default=None,
                    help="first of the consecutive ports (etcd client, etcd peer, bookies, broker gRPC, broker "
                         "HTTP); 0 = free ports (default 0)")
    up.add_argument("--cluster-name", default=None, help="the brokers' cluster name (default standalone)")
    up.add_argument("--timeout", type=float, default=READY_TIMEOUT_S,
                    help=f"seconds each group of processes may take to get ready (default {READY_TIMEOUT_S:g})")
    up.set_defaults(cluster_func=cmd_up)
    st = sub.add_parser("status", help="each process alive or dead, its port and pid; exit 1 if one is down")
    st.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=data_help)
    st.set_defaults(cluster_func=cmd_status)
    down = sub.add_parser("down", help="stop every process (SIGTERM, then SIGKILL)")
    down.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=data_help)
    down.add_argument("--timeout", type=float, default=STOP_TIMEOUT_S,
                      help=f"seconds before SIGKILL (default {STOP_TIMEOUT_S:g})")
    down.add_argument("--purge", action="store_true", help="also delete the data dir")
    down.set_defaults(cluster_func=cmd_down)


def run_from_args(args) -> int:
    """Run the parsed ``cluster`` action; errors are one message on stderr
    (``cluster <action>: ...``) and exit status 1; Ctrl-C exits with 130."""
    try:
        return args.cluster_func(args)
    except ClusterError as exc:
        print(f"cluster {args.cluster_command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"cluster {args.cluster_command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:          # e.g. `minipulsar cluster status | head`
        sys.stdout = open(os.devnull, "w")
        return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m deploy.cluster ...`` (same as ``minipulsar cluster ...``)."""
    p = argparse.ArgumentParser(prog="minipulsar cluster", description="a local broker cluster")
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
