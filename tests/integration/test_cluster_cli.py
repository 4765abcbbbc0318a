"""``minipulsar cluster up|status|down`` with real processes: one etcd (Debian's
etcd-server), two bookies and two brokers come up detached and ready, status
sees them (and sees a killed one as dead), down stops every one. The brokers'
cluster behaviour (ownership, lookup, failover) is tested elsewhere."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "deploy.cli", "cluster", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO_ROOT), env=env, stdin=subprocess.DEVNULL)


def processes_using(path: Path) -> dict[int, str]:
    """pid -> command line of every live (non-zombie) process whose argv names ``path``."""
    found = {}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
            zombie = (pid_dir / "stat").read_text().rsplit(") ", 1)[1][0] == "Z"
        except (OSError, IndexError):
            continue
        if not zombie and any(str(path).encode() in a for a in argv):
            found[int(pid_dir.name)] = " ".join(a.decode(errors="replace") for a in argv)
    return found


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.timeout(300)
def test_cluster_up_status_down(tmp_path):
    data = tmp_path / "cluster"
    try:
        up = cli("up", "--data-dir", str(data), "--base-port", "0", "--brokers", "2", "--bookies", "2")
        assert up.returncode == 0, f"stdout:\n{up.stdout}\nstderr:\n{up.stderr}"
        # progress on stderr, the URLs on stdout
        assert "etcd ready" in up.stderr and "2 bookie(s) ready" in up.stderr and "2 broker(s) ready" in up.stderr
        state = json.loads((data / "cluster.json").read_text())
        procs = {p["name"]: p for p in state["processes"]}
        assert sorted(procs) == ["bookie-0", "bookie-1", "broker-0", "broker-1", "etcd"]
        brokers = [procs["broker-0"], procs["broker-1"]]
        url = f"minipulsar://127.0.0.1:{brokers[0]['port']},127.0.0.1:{brokers[1]['port']}"
        assert re.search(rf"^service URL: {re.escape(url)}$", up.stdout, re.M), up.stdout
        assert f"etcd://127.0.0.1:{procs['etcd']['port']}" in up.stdout
        # every process detached from `up`, alive, answering on its port, with its log
        running = processes_using(data)
        for name, p in procs.items():
            assert p["pid"] in running, (name, running)
            assert p["port"] > 0 and answers(p["port"]), name
            assert os.getsid(p["pid"]) == p["pid"], f"{name} runs in its own session"
            assert (data / f"{name}.log").exists()
        for b in brokers:
            assert b["http_port"] > 0 and answers(b["http_port"])
            assert f"BROKER_READY port={b['port']}" in (data / "broker-0.log").read_text() + \
                (data / "broker-1.log").read_text()

        status = cli("status", "--data-dir", str(data), timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        assert len(re.findall(r" alive$", status.stdout, re.M)) == 5, status.stdout
        assert f"service URL: {url}" in status.stdout and "all 5 processes alive" in status.stdout

        os.kill(procs["bookie-1"]["pid"], signal.SIGKILL)
        status = cli("status", "--data-dir", str(data), timeout=60)
        assert status.returncode == 1, status.stdout
        assert re.search(r"^bookie-1 .* dead$", status.stdout, re.M), status.stdout
        assert "1 of 5 process(es) DOWN (bookie-1)" in status.stdout

        down = cli("down", "--data-dir", str(data), timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        for name in ("etcd", "bookie-0", "broker-0", "broker-1"):
            assert re.search(rf"^{name} +{procs[name]['pid']} +stopped in", down.stdout, re.M), down.stdout
        assert re.search(r"^bookie-1 +- +not running$", down.stdout, re.M), down.stdout
        assert "stopped 4 process(es)" in down.stdout
        assert processes_using(data) == {}
        assert all(p["pid"] is None for p in json.loads((data / "cluster.json").read_text())["processes"])
        status = cli("status", "--data-dir", str(data), timeout=60)
        assert status.returncode == 1 and len(re.findall(r" dead$", status.stdout, re.M)) == 5, status.stdout
    finally:
        for pid in processes_using(data):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
