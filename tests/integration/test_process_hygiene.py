"""Process hygiene (issue 16 part 1), with real processes: the children of a foreground
command die with it however it dies, one process per data dir with errors that name the
holder's pid, stale locks and orphaned bookies of a killed standalone are taken over, and
a standalone killed with SIGKILL (its process group, or only its top process) comes back
on the same data dir with every acknowledged message."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import uuid

import pytest

from client import AsyncClient, InitialPosition
from client.consumer_config import ConsumerType
from client.errors import PulsarException
from proto.data_dir_lock import DataDirLocked, lock_data_dir, lock_holder, unlock_data_dir
from proto.process_info import is_alive, pids_listening_on
from tests.cluster import wait_for
from tests.procs import REPO_ROOT, BookieProcess, BrokerProcess, StandaloneProcess

pytestmark = pytest.mark.timeout(180)

N = 40


def bookie_pids(data_dir) -> list[int]:
    """The live bookie processes holding the locks of ``<data_dir>/bookie-<i>``."""
    pids = [lock_holder(data_dir / f"bookie-{i}", "LOCK") for i in range(2)]
    return [p for p in pids if p is not None]


def processes_naming(path) -> list[int]:
    """Live processes whose command line names ``path``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = open(f"/proc/{name}/cmdline", "rb").read()
        except OSError:
            continue
        if str(path).encode() in cmd and is_alive(int(name)):
            out.append(int(name))
    return out


def run_cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, *args], cwd=str(REPO_ROOT), env=env, capture_output=True, text=True,
                          timeout=timeout)


async def produce(url: str, topic: str, n: int) -> list[bytes]:
    """Send ``n`` messages, each acknowledged by the broker; returns them."""
    sent = []
    async with AsyncClient(url) as client:
        producer = await client.create_producer(topic, batching_enabled=False)
        for i in range(n):
            await producer.send(b"m-%d" % i)
            sent.append(b"m-%d" % i)
    return sent


async def consume_all(url: str, topic: str) -> list[bytes]:
    """Every message of ``topic`` from the earliest, until 3 s without one."""
    got = []
    async with AsyncClient(url, operation_timeout_seconds=60) as client:
        consumer = await client.subscribe(topic, f"check-{uuid.uuid4().hex[:6]}", consumer_type=ConsumerType.Exclusive,
                                          initial_position=InitialPosition.Earliest)
        while True:
            try:
                msg = await consumer.receive(timeout_millis=3000)
            except PulsarException:
                break
            got.append(msg.data())
            consumer.acknowledge(msg)
    return got


def start_own_session(data_dir, tracker) -> StandaloneProcess:
    proc = StandaloneProcess(data_dir, tracker=tracker)
    proc.start_new_session = True     # a process group of its own, as a shell job has
    return proc.start()


@pytest.mark.parametrize("how", ["process group", "top process only"])
async def test_standalone_killed_with_sigkill_leaves_no_process_and_restarts_with_every_message(
        tmp_path, process_tracker, how):
    data = tmp_path / "sa"
    sa = start_own_session(data, process_tracker)
    bookies = bookie_pids(data)
    assert len(bookies) == 2 and all(is_alive(p) for p in bookies)
    topic = f"persistent://public/default/hyg-{uuid.uuid4().hex[:8]}"
    sent = await produce(sa.service_url, topic, N)

    if how == "process group":
        os.killpg(sa.popen.pid, signal.SIGKILL)
    else:
        os.kill(sa.popen.pid, signal.SIGKILL)
    sa.popen.wait(10)
    # the bookies run in sessions of their own: only the death signal can stop them
    wait_for(lambda: not any(is_alive(p) for p in bookies), 30, what=f"the bookies {bookies} to die")
    wait_for(lambda: not processes_naming(data), 30, what="every process of the data dir to be gone")

    again = sa.restart()            # same data dir, same broker port; no error, nothing to stop by hand
    assert sorted(bookie_pids(data)) != sorted(bookies) and len(bookie_pids(data)) == 2
    assert await consume_all(again.service_url, topic) == sent
    assert again.terminate() == 0
    wait_for(lambda: not processes_naming(data), 30, what="a clean stop to stop the bookies")


def test_ctrl_c_to_the_standalone_s_process_group_stops_everything_cleanly(tmp_path, process_tracker):
    """Ctrl-C in a terminal sends SIGINT to the foreground process group: the standalone
    stops its broker and its bookies (in sessions of their own) and exits 0."""
    data = tmp_path / "sa"
    sa = start_own_session(data, process_tracker)
    bookies = bookie_pids(data)
    assert len(bookies) == 2
    os.killpg(sa.popen.pid, signal.SIGINT)
    assert sa.wait(60) == 0
    wait_for(lambda: not processes_naming(data), 30, what="the bookies to be stopped")
    assert "stopping broker and bookies" in sa.stderr_tail()
    assert lock_holder(data, "standalone.lock") is None


def test_second_standalone_and_second_broker_on_a_live_data_dir_fail_naming_the_pid(tmp_path, process_tracker):
    data = tmp_path / "sa"
    sa = StandaloneProcess(data, tracker=process_tracker).start()

    second = run_cli("-m", "deploy.cli", "standalone", "--port", "0", "--http-port", "0", "--data-dir", str(data))
    assert second.returncode == 1, second.stderr
    assert f"data dir {data} is in use by another standalone process (pid {sa.pid} " in second.stderr
    assert f"kill {sa.pid}" in second.stderr

    # the standalone's own broker holds <data>/broker; a broker process on it is refused too
    broker = run_cli("-m", "broker", "--bookies", "127.0.0.1:1,127.0.0.1:2", "--data-dir", str(data / "broker"),
                     "--port", "0", "--http-port", "-1", "--log-level", "ERROR")
    assert broker.returncode == 1, broker.stderr
    assert f"in use by another broker process (pid {sa.pid} " in broker.stderr and f"kill {sa.pid}" in broker.stderr

    # two broker processes on one data dir: the second is refused, naming the first
    bookies = [f"127.0.0.1:{p}" for p in bookie_ports(data)]
    first = BrokerProcess(tmp_path / "b", bookies, tracker=process_tracker).start()
    other = run_cli("-m", "broker", "--bookies", ",".join(bookies), "--data-dir", str(tmp_path / "b"),
                    "--port", "0", "--http-port", "-1", "--log-level", "ERROR")
    assert other.returncode == 1 and f"(pid {first.pid} " in other.stderr, other.stderr
    assert first.is_running() and sa.is_running()


def bookie_ports(data) -> list[int]:
    """The standalone's bookie ports (kept in ``standalone.json``)."""
    return json.loads((data / "standalone.json").read_text())["bookie_ports"]


_HOLDER = textwrap.dedent("""
    import sys, time
    from proto.data_dir_lock import lock_data_dir
    lock_data_dir(sys.argv[1], sys.argv[2], sys.argv[3])
    print("LOCKED", flush=True)
    time.sleep(600)
""")


def hold_lock_then_die(path, what: str, name: str) -> int:
    """A process that takes the lock ``path/name`` and is then killed -9; returns its pid."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), what, name], cwd=str(REPO_ROOT),
                              stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    try:
        assert holder.stdout.readline().strip() == b"LOCKED"
        with pytest.raises(DataDirLocked) as err:
            lock_data_dir(path, what, name)
        assert err.value.holder_pid == holder.pid and f"pid {holder.pid} " in str(err.value)
        assert lock_holder(path, name) == holder.pid
    finally:
        holder.kill()
        holder.wait()
    return holder.pid


def test_stale_locks_of_dead_processes_are_taken_over_silently(tmp_path, process_tracker):
    data = tmp_path / "sa"
    data.mkdir()
    dead = hold_lock_then_die(data, "standalone", "standalone.lock")
    assert lock_holder(data, "standalone.lock") is None
    (data / "broker").mkdir()
    hold_lock_then_die(data / "broker", "broker", "broker.lock")
    (data / "bookie-0").mkdir()
    hold_lock_then_die(data / "bookie-0", "bookie", "LOCK")

    sa = StandaloneProcess(data, tracker=process_tracker).start()
    assert (data / "standalone.lock").read_text().split() == [str(sa.pid)] != [str(dead)]
    assert lock_holder(data, "standalone.lock") == sa.pid
    assert lock_holder(data / "broker", "broker.lock") == sa.pid
    assert len(bookie_pids(data)) == 2

    # a lock file naming a dead pid that nobody holds: taken over too
    fd = lock_data_dir(tmp_path, "test", "x.lock")
    unlock_data_dir(fd)
    (tmp_path / "x.lock").write_text(f"{dead}\n")
    fd = lock_data_dir(tmp_path, "test", "x.lock")
    try:
        assert (tmp_path / "x.lock").read_text() == f"{os.getpid()}\n"
    finally:
        unlock_data_dir(fd)


async def test_bookies_a_killed_standalone_left_running_are_stopped_by_the_next_one(tmp_path, process_tracker):
    """A bookie on the standalone's bookie dir and port that nobody owns (left by an older
    version or a standalone killed where the death signal does not exist) is stopped."""
    data = tmp_path / "sa"
    sa = StandaloneProcess(data, tracker=process_tracker).start()
    topic = f"persistent://public/default/hyg-{uuid.uuid4().hex[:8]}"
    sent = await produce(sa.service_url, topic, N)
    port0 = bookie_ports(data)[0]
    assert pids_listening_on(port0) == [lock_holder(data / "bookie-0", "LOCK")]
    assert sa.terminate() == 0
    wait_for(lambda: not processes_naming(data), 30, what="a clean stop")
    orphan = BookieProcess(data / "bookie-0", extra_args=("--port", str(port0)), tracker=process_tracker).start()

    again = sa.restart()
    wait_for(lambda: not orphan.is_running(), 30, what="the orphaned bookie to be stopped")
    assert "left running on" in again.stderr_tail() and f"pid {orphan.pid} " in again.stderr_tail()
    assert await consume_all(again.service_url, topic) == sent


def test_a_busy_bookie_port_names_its_holder(tmp_path, process_tracker):
    data = tmp_path / "sa"
    sa = StandaloneProcess(data, tracker=process_tracker).start()
    port = bookie_ports(data)[1]
    assert sa.terminate() == 0
    wait_for(lambda: not processes_naming(data), 30, what="a clean stop")
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        proc = run_cli("-m", "deploy.cli", "standalone", "--port", "0", "--http-port", "0", "--data-dir", str(data))
        # a bookie or a broker on a busy port says who holds it too
        bookie = run_cli("-m", "bookie", "--port", str(port), "--data-dir", str(tmp_path / "bk"))
        broker = run_cli("-m", "broker", "--bookies", "127.0.0.1:1,127.0.0.1:2", "--data-dir", str(tmp_path / "br"),
                         "--port", str(port), "--http-port", "-1", "--log-level", "ERROR")
    me = f"pid {os.getpid()} ("
    assert proc.returncode == 1
    assert f"[{port}]" in proc.stderr and me in proc.stderr and f"kill {os.getpid()}" in proc.stderr, proc.stderr
    assert bookie.returncode == 1 and f"cannot bind bookie to 127.0.0.1:{port}" in bookie.stderr, bookie.stderr
    assert me in bookie.stderr and "Traceback" not in bookie.stderr, bookie.stderr
    assert broker.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in broker.stderr, broker.stderr
    assert me in broker.stderr and f"kill {os.getpid()}" in broker.stderr, broker.stderr


_PARENT = textwrap.dedent("""
    import sys, threading, time
    from tests.procs import start_bookie
    where = sys.argv[2]
    if where == "thread":          # started from a thread that ends at once: the bookie must live on
        box = []
        t = threading.Thread(target=lambda: box.append(start_bookie(sys.argv[1])))
        t.start(); t.join()
        bookie = box[0]
    else:
        bookie = start_bookie(sys.argv[1])
    print("BOOKIE", bookie.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("where", ["main thread", "thread"])
def test_a_test_helper_child_dies_when_its_parent_is_killed(tmp_path, where):
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path / "bookie"), where.split()[0]],
                              cwd=str(REPO_ROOT), stdout=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    try:
        line = parent.stdout.readline().split()
        assert line[:1] == [b"BOOKIE"], line
        bookie = int(line[1])
        assert is_alive(bookie)
        # alive while the parent lives, even when the thread that started it has ended
        wait_for(lambda: lock_holder(tmp_path / "bookie", "LOCK") == bookie, 10, what="the bookie's lock")
        assert is_alive(bookie)
    finally:
        parent.kill()
        parent.wait()
    wait_for(lambda: not is_alive(bookie), 30, what=f"bookie {bookie} to die with its parent")


@pytest.mark.timeout(240)
def test_geo_down_after_a_partial_crash_stops_the_rest(tmp_path):
    """``geo up`` daemons outlive the command by design; after some of them crashed
    (kill -9), ``geo down`` reports those as not running and stops every other one."""
    from deploy.geo import resolve_topology
    from deploy.geo_processes import plan_processes, start_processes
    from tests.e2e.geo_helpers import geo, kill_leftovers, running_pids, write_topology

    topology, data = tmp_path / "geo.toml", tmp_path / "data"
    write_topology(topology)
    topo = resolve_topology(str(topology), data, for_up=True)
    procs = [p for p in plan_processes(topo, data)
             if p.kind == "etcd" or (p.kind == "bookie" and p.cluster == "us-east")]
    try:
        start_processes(procs, 120)
        pids = {p.label: p.running_pid() for p in procs}
        assert all(pids.values()) and sorted(running_pids(data)) == sorted(pids.values())
        crashed = [next(p for p in procs if p.kind == "bookie"), next(p for p in procs if p.kind == "etcd"
                                                                       and p.cluster == "eu-central")]
        for p in crashed:
            os.kill(pids[p.label], signal.SIGKILL)
            p.popen.wait(10)
        down = geo("down", "--data-dir", str(data), "--timeout", "20", timeout=180)
        assert down.returncode == 0, down.stderr
        assert running_pids(data) == [] and not any(is_alive(pid) for pid in pids.values())
        assert not list(data.glob("*/*.pid"))
        lines = down.stdout.splitlines()
        for p in procs:
            row = next(line for line in lines if line.split()[:1] == [p.label])
            assert ("not running" in row) == (p in crashed), row
            assert p in crashed or "stopped in" in row, row
    finally:
        kill_leftovers(data)
