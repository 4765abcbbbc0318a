"""Helpers for the geo demo's end-to-end tests: topologies on ports free right
now, running ``minipulsar geo ...`` as the user would (a subprocess), and
cleaning up every process a test's data dir started."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from deploy.standalone import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TOPOLOGY = REPO_ROOT / "deploy" / "geo.toml"


def _default_ports() -> tuple[int, ...]:
    from deploy.topology import load_topology

    return tuple(port for _, port in load_topology(DEFAULT_TOPOLOGY).ports())


# every port of deploy/geo.toml: configuration-store etcd, per cluster etcd, bookies, brokers (gRPC, HTTP)
DEFAULT_PORTS = _default_ports()


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free right now on 127.0.0.1."""
    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


def topology_text(ports: dict[int, int] | None = None, text: str | None = None) -> tuple[str, dict[int, int]]:
    """deploy/geo.toml with each default port replaced (default: by free ports);
    returns (text, {default port: new port}). Only port values are replaced (the
    comments keep the default numbers)."""
    text = text if text is not None else DEFAULT_TOPOLOGY.read_text()
    if ports is None:
        ports = dict(zip(DEFAULT_PORTS, free_ports(len(DEFAULT_PORTS))))
    pattern = re.compile(r"\b(" + "|".join(str(p) for p in sorted(ports, reverse=True)) + r")\b")
    lines = []
    for line in text.splitlines(keepends=True):
        code, hash_, comment = line.partition("#")
        lines.append(pattern.sub(lambda m: str(ports[int(m.group(1))]), code) + hash_ + comment)
    return "".join(lines), ports


def write_topology(path: Path, text: str | None = None) -> dict[int, int]:
    """Write a free-port copy of deploy/geo.toml to ``path``; returns the port map."""
    text, ports = topology_text(text=text)
    path.write_text(text)
    return ports


def geo(*args: str, timeout: float = 300, check: bool = False, console: bool = False) -> subprocess.CompletedProcess:
    """Run ``python -m deploy.cli geo ARGS`` (= ``minipulsar geo ARGS``; with
    ``console`` the installed ``minipulsar`` script itself); output captured as text."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    script = Path(sys.executable).parent / "minipulsar"
    cmd = [str(script)] if console and script.exists() else [sys.executable, "-m", "deploy.cli"]
    proc = subprocess.run([*cmd, "geo", *args], cwd=str(REPO_ROOT), env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"geo {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr}")
    return proc


def kill_leftovers(data_dir: Path) -> None:
    """SIGKILL every process whose pid file is under ``data_dir`` (test teardown)."""
    for pid_file in Path(data_dir).glob("*/*.pid"):
        try:
            pid = int(pid_file.read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if str(data_dir).encode() in cmdline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def running_pids(data_dir: Path) -> list[int]:
    """Pids of live processes started from ``data_dir`` (by pid file)."""
    out = []
    for pid_file in Path(data_dir).glob("*/*.pid"):
        try:
            pid = int(pid_file.read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if str(data_dir).encode() in cmdline:
            out.append(pid)
    return out
