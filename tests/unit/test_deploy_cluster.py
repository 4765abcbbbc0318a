"""Unit tests of ``minipulsar cluster``: the pure plan (ports, state file, URLs,
command lines, ready lines) of deploy/cluster_plan.py, and the process helpers
of deploy/cluster.py on tiny stand-in processes (no etcd, bookie or broker)."""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time
import tomllib
from types import SimpleNamespace

import pytest

from deploy import cluster
from deploy.cluster_plan import (ClusterError, ClusterProcess, ClusterState, bookie_command, broker_command,
                                 broker_config_toml, etcd_command, etcd_url, parse_ready_line, plan_cluster,
                                 plan_ports, service_url)


def ports_of(state: ClusterState) -> dict:
    return {p.name: (p.port, p.peer_port, p.http_port) for p in state.processes}


def no_free_port():
    raise AssertionError("free_port must not be called")


# ---- port plan -------------------------------------------------------------------------
def test_plan_ports_with_a_base_port_is_consecutive():
    plan = plan_ports(brokers=2, bookies=3, base_port=7000)
    assert plan == {"etcd": {"port": 7000, "peer_port": 7001},
                    "bookie-0": {"port": 7002}, "bookie-1": {"port": 7003}, "bookie-2": {"port": 7004},
                    "broker-0": {"port": 7005, "http_port": 7007}, "broker-1": {"port": 7006, "http_port": 7008}}


def test_plan_ports_base_zero_means_any_free_port():
    plan = plan_ports(brokers=3, bookies=2, base_port=0)
    assert list(plan) == ["etcd", "bookie-0", "bookie-1", "broker-0", "broker-1", "broker-2"]
    assert all(v == 0 for ports in plan.values() for v in ports.values())


@pytest.mark.parametrize("brokers,bookies,base,match", [
    (0, 2, 0, "--brokers must be between 1 and 64"),
    (2, 0, 0, "--bookies must be between 1 and 64"),
    (65, 2, 0, "--brokers"),
    (2, 2, 65530, r"needs ports 65530\.\.65537"),
    (1, 1, -5, "does not fit"),
])
def test_plan_ports_refuses_bad_counts_and_ports(brokers, bookies, base, match):
    with pytest.raises(ClusterError, match=match):
        plan_ports(brokers, bookies, base)


def test_plan_cluster_new_defaults_and_free_etcd_ports():
    ports = iter([5000, 5000, 5001])            # a repeated port is not used twice
    state = plan_cluster(None, None, None, None, None, lambda: next(ports))
    assert state.cluster_name == "standalone"
    assert [p.name for p in state.processes] == ["etcd", "bookie-0", "bookie-1", "broker-0", "broker-1"]
    assert [p.kind for p in state.processes] == ["etcd", "bookie", "bookie", "broker", "broker"]
    assert (state.etcd.port, state.etcd.peer_port) == (5000, 5001)
    assert all(p.port == 0 and p.pid is None for p in state.bookies + state.brokers)
    assert state.etcd_url == "etcd://127.0.0.1:5000"


def test_plan_cluster_new_with_base_port_and_name():
    state = plan_cluster(1, 1, 9000, "east", None, no_free_port)
    assert state.cluster_name == "east"
    assert ports_of(state) == {"etcd": (9000, 9001, 0), "bookie-0": (9002, 0, 0), "broker-0": (9003, 0, 9004)}
    assert state.service_url == "minipulsar://127.0.0.1:9003"
    with pytest.raises(ClusterError, match="--cluster-name"):
        plan_cluster(1, 1, 0, "a/b", None, lambda: 1)


def recorded(pids=True) -> ClusterState:
    procs = [ClusterProcess("etcd", "etcd", 4000, peer_port=4001, pid=11 if pids else None),
             ClusterProcess("bookie-0", "bookie", 4002, pid=12 if pids else None),
             ClusterProcess("bookie-1", "bookie", 4003),
             ClusterProcess("broker-0", "broker", 4004, http_port=4006, pid=14 if pids else None),
             ClusterProcess("broker-1", "broker", 4005, http_port=4007)]
    return ClusterState("standalone", procs)


def test_plan_cluster_existing_data_reuses_recorded_ports_and_pids():
    previous = recorded()
    state = plan_cluster(None, None, None, None, previous, no_free_port)
    assert ports_of(state) == ports_of(previous)
    assert [p.pid for p in state.processes] == [11, 12, None, 14, None]
    state.processes[0].pid = 99                     # a copy: the caller may change it
    assert previous.processes[0].pid == 11
    # the same values given explicitly are fine, base 0 included
    same = plan_cluster(2, 2, 4000, "standalone", previous, no_free_port)
    assert ports_of(same) == ports_of(previous)
    assert ports_of(plan_cluster(2, 2, 0, None, previous, no_free_port)) == ports_of(previous)


@pytest.mark.parametrize("kwargs,match", [
    ({"brokers": 3}, r"2 broker\(s\), not --brokers 3"),
    ({"bookies": 1}, r"2 bookie\(s\), not --bookies 1"),
    ({"cluster_name": "west"}, "cluster name 'standalone', not --cluster-name 'west'"),
    ({"base_port": 5000}, "other ports than --base-port 5000"),
    ({"base_port": 65530}, "other ports than --base-port 65530"),
])
def test_plan_cluster_existing_data_refuses_another_layout(kwargs, match):
    args = {"brokers": None, "bookies": None, "base_port": None, "cluster_name": None, **kwargs}
    with pytest.raises(ClusterError, match=match) as info:
        plan_cluster(args["brokers"], args["bookies"], args["base_port"], args["cluster_name"], recorded(),
                     no_free_port)
    assert "cluster down --purge" in str(info.value)


# ---- state file ------------------------------------------------------------------------
def test_state_file_round_trip_and_shape():
    state = recorded()
    text = state.to_json()
    data = json.loads(text)
    assert data["format"] == 1 and data["cluster_name"] == "standalone" and data["host"] == "127.0.0.1"
    assert data["processes"][0] == {"name": "etcd", "kind": "etcd", "port": 4000, "peer_port": 4001, "pid": 11}
    assert data["processes"][1] == {"name": "bookie-0", "kind": "bookie", "port": 4002, "pid": 12}
    assert data["processes"][4] == {"name": "broker-1", "kind": "broker", "port": 4005, "http_port": 4007,
                                    "pid": None}
    assert ClusterState.from_json(text) == state
    assert state.get("broker-1").http_port == 4007
    assert state.bookie_addresses() == ["127.0.0.1:4002", "127.0.0.1:4003"]


@pytest.mark.parametrize("text,match", [
    ("{not json", "not JSON"),
    ("[]", "not a JSON object"),
    ('{"format": 2, "cluster_name": "x", "processes": []}', "format 2"),
    ('{"format": 1, "processes": []}', "cluster_name missing"),
    ('{"format": 1, "cluster_name": "x"}', "processes missing"),
    ('{"format": 1, "cluster_name": "x", "processes": [{"name": "z", "kind": "zookeeper"}]}', "kind"),
    ('{"format": 1, "cluster_name": "x", "processes": [{"name": "etcd", "kind": "etcd", "port": 70000}]}',
     "bad port or pid"),
    ('{"format": 1, "cluster_name": "x", "processes": [{"name": "etcd", "kind": "etcd", "pid": "12"}]}',
     "bad port or pid"),
    ('{"format": 1, "cluster_name": "x", "processes": [{"name": "etcd", "kind": "etcd"}]}',
     "one etcd, bookies and brokers"),
])
def test_state_file_errors_name_the_file_and_the_problem(text, match):
    with pytest.raises(ClusterError, match=match) as info:
        ClusterState.from_json(text, "/d/cluster.json")
    assert "/d/cluster.json is not a minipulsar cluster state file" in str(info.value)


def test_bookie_addresses_need_known_ports():
    state = plan_cluster(1, 2, 0, None, None, iter([1, 2]).__next__)
    with pytest.raises(ValueError, match="bookie-0, bookie-1"):
        state.bookie_addresses()


# ---- URLs, command lines, ready lines -------------------------------------------------------
def test_service_url_and_etcd_url():
    assert service_url([6600, 6601]) == "minipulsar://127.0.0.1:6600,127.0.0.1:6601"
    assert service_url([6600, 0]) == "minipulsar://127.0.0.1:6600"
    assert service_url([7], host="h") == "minipulsar://h:7"
    assert etcd_url(2379) == "etcd://127.0.0.1:2379"


def test_etcd_command_is_a_single_member_on_loopback():
    cmd = etcd_command("/usr/bin/etcd", "/d/etcd", 2379, 2380)
    assert cmd[0] == "/usr/bin/etcd"
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert flags == {"--name": "default", "--data-dir": "/d/etcd",
                     "--listen-client-urls": "http://127.0.0.1:2379", "--advertise-client-urls": "http://127.0.0.1:2379",
                     "--listen-peer-urls": "http://127.0.0.1:2380",
                     "--initial-advertise-peer-urls": "http://127.0.0.1:2380",
                     "--initial-cluster": "default=http://127.0.0.1:2380", "--log-level": "warn"}


def test_bookie_and_broker_commands():
    assert bookie_command("py", "/d/bookie-0", 0, None) == ["py", "-m", "bookie", "--port", "0",
                                                             "--data-dir", "/d/bookie-0"]
    assert bookie_command("py", "/d/bookie-0", 3181, "etcd://127.0.0.1:1")[-2:] == \
        ["--metadata-store-url", "etcd://127.0.0.1:1"]
    broker = ClusterProcess("broker-1", "broker", 6601, http_port=0)
    cmd = broker_command("py", broker, "/d/broker-1", "etcd://127.0.0.1:1", ["127.0.0.1:1", "127.0.0.1:2"],
                         "east", "/d/broker.toml")
    assert cmd[:3] == ["py", "-m", "broker"]
    assert dict(zip(cmd[3::2], cmd[4::2])) == {
        "--metadata-store-url": "etcd://127.0.0.1:1", "--bookies": "127.0.0.1:1,127.0.0.1:2",
        "--data-dir": "/d/broker-1", "--port": "6601", "--http-port": "0", "--pulsar-port": "0", "--pulsar-tls-port": "0",
        "--cluster-name": "east",
        "--config": "/d/broker.toml"}


@pytest.mark.parametrize("bookies,quorum", [(1, 1), (2, 2), (5, 2)])
def test_broker_config_quorums(bookies, quorum):
    conf = tomllib.loads(broker_config_toml(bookies))
    assert conf == {"managed_ledger_default_ensemble_size": quorum, "managed_ledger_default_write_quorum": quorum,
                    "managed_ledger_default_ack_quorum": quorum}


def test_broker_config_is_accepted_by_the_broker():
    from broker.config import BrokerConfig

    values = {**tomllib.loads(broker_config_toml(1)), "bookies": ["127.0.0.1:1"],
              "metadata_store_url": "etcd://127.0.0.1:2"}
    _, problems = BrokerConfig.parse(values, complete=True)
    assert problems == []


def test_parse_ready_line():
    assert parse_ready_line("BOOKIE_READY", "") is None
    assert parse_ready_line("BOOKIE_READY", "INFO starting\nBOOKIE_READYX port=1 pid=2\n") is None
    text = ("2026 INFO x\nBROKER_READY port=1 pid=2 http_port=3\nlater\n"
            "BROKER_READY port=6600 pid=12 http_port=-1\r\nINFO more\n")
    assert parse_ready_line("BROKER_READY", text) == {"port": 6600, "pid": 12, "http_port": -1}
    assert parse_ready_line("BOOKIE_READY", "BOOKIE_READY port=3181 pid=7") == {"port": 3181, "pid": 7}


def test_cluster_arguments_leave_unset_values_to_the_plan():
    p = argparse.ArgumentParser()
    cluster.add_arguments(p)
    up = p.parse_args(["up"])
    assert (up.brokers, up.bookies, up.base_port, up.cluster_name) == (None, None, None, None)
    assert up.data_dir == "data/cluster" and up.cluster_func is cluster.cmd_up
    down = p.parse_args(["down", "--purge", "--timeout", "3"])
    assert down.purge and down.timeout == 3.0 and down.cluster_func is cluster.cmd_down
    assert p.parse_args(["status", "--data-dir", "x"]).data_dir == "x"


def test_minipulsar_cli_has_the_cluster_subcommand():
    from deploy.cli import SUBCOMMANDS

    assert "cluster" in SUBCOMMANDS


# ---- process helpers on stand-in processes -----------------------------------------------------
def stand_in(tmp_path, name: str, code: str) -> tuple[ClusterProcess, list[str]]:
    """A python process playing ``name``: its argv names ``<tmp>/<name>`` (how
    running_pid recognizes it) and it runs ``code``."""
    return ClusterProcess(name, name.split("-")[0]), [sys.executable, "-c", code, str(tmp_path / name)]


READY = "import os, sys, time; print(f'BOOKIE_READY port=4321 pid={os.getpid()}', flush=True); "


def test_start_wait_and_stop_stand_in_processes(tmp_path):
    bookie, cmd = stand_in(tmp_path, "bookie-0", READY + "time.sleep(60)")
    state = ClusterState("standalone", [ClusterProcess("etcd", "etcd", 1, peer_port=2), bookie,
                                        ClusterProcess("broker-0", "broker")])
    cluster.start_processes(tmp_path, state, [(bookie, cmd)], timeout_s=20)
    try:
        assert bookie.port == 4321 and bookie.pid
        assert cluster.running_pid(tmp_path, bookie) == bookie.pid
        saved = cluster.load_state(tmp_path)
        assert saved.get("bookie-0").port == 4321 and saved.get("bookie-0").pid == bookie.pid
        assert "minipulsar cluster up: " in (tmp_path / "bookie-0.log").read_text()
        # a live pid that is not this process (its argv does not name the data dir) does not count
        other = ClusterProcess("bookie-1", "bookie", pid=bookie.pid)
        assert cluster.running_pid(tmp_path, other) is None
    finally:
        rows = cluster.stop_processes(tmp_path, [bookie], timeout_s=10)
    assert rows[0][0] == "bookie-0" and rows[0][2].startswith("stopped in ")
    assert bookie.pid is None
    assert cluster.stop_processes(tmp_path, [bookie]) == [("bookie-0", "-", "not running")]


def test_a_process_that_dies_during_start_shows_its_log(tmp_path):
    bookie, cmd = stand_in(tmp_path, "bookie-0", "import sys; print('cannot open the ledger db'); sys.exit(3)")
    state = ClusterState("standalone", [bookie])
    with pytest.raises(ClusterError, match=r"bookie-0 exited \(status 3\) before it was ready") as info:
        cluster.start_processes(tmp_path, state, [(bookie, cmd)], timeout_s=20)
    assert "cannot open the ledger db" in str(info.value)
    assert str(tmp_path / "bookie-0.log") in str(info.value)


def test_not_ready_in_time_says_so_and_stop_kills_what_ignores_sigterm(tmp_path, capsys):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('still booting', flush=True); time.sleep(60)"
    bookie, cmd = stand_in(tmp_path, "bookie-0", code)
    state = ClusterState("standalone", [bookie])
    try:
        with pytest.raises(ClusterError, match=r"bookie-0 not ready after 0.5s") as info:
            cluster.start_processes(tmp_path, state, [(bookie, cmd)], timeout_s=0.5)
        assert "still booting" in str(info.value)
    finally:
        t0 = time.monotonic()
        rows = cluster.stop_processes(tmp_path, [bookie], timeout_s=0.5)
    assert rows[0][2].startswith("killed") and time.monotonic() - t0 < 5
    assert bookie.pid is None


def test_find_etcd_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(cluster.shutil, "which", lambda name: None)
    monkeypatch.setattr(cluster.os, "access", lambda path, mode: False)
    with pytest.raises(ClusterError, match=r"run scripts/setup.sh or apt-get install etcd-server"):
        cluster.find_etcd()


def up_args(tmp_path, **kw):
    values = dict(brokers=1, bookies=1, base_port=0, cluster_name=None, data_dir=str(tmp_path / "c"),
                  timeout=5.0, cluster_command="up", cluster_func=cluster.cmd_up)
    values.update(kw)
    return SimpleNamespace(**values)


def test_up_with_a_port_in_use_starts_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cluster, "find_etcd", lambda: "/bin/false")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        base = s.getsockname()[1] - 2          # the port of bookie-0
        if base < 1024:
            pytest.skip("port too low for this layout")
        status = cluster.run_from_args(up_args(tmp_path, base_port=base))
    err = capsys.readouterr().err
    assert status == 1
    assert f"port {base + 2} (bookie-0)" in err and "nothing was started" in err and "ss -ltnp" in err
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_up_without_etcd_says_what_to_install(tmp_path, monkeypatch, capsys):
    def missing():
        raise ClusterError(cluster.ETCD_MISSING)
    monkeypatch.setattr(cluster, "find_etcd", missing)
    assert cluster.run_from_args(up_args(tmp_path)) == 1
    assert "cluster up: etcd is not installed" in capsys.readouterr().err


def test_status_and_down_without_a_cluster(tmp_path, capsys):
    args = SimpleNamespace(data_dir=str(tmp_path), cluster_command="status", cluster_func=cluster.cmd_status)
    assert cluster.run_from_args(args) == 1
    assert "no cluster in" in capsys.readouterr().err
    args = SimpleNamespace(data_dir=str(tmp_path), cluster_command="down", cluster_func=cluster.cmd_down,
                           timeout=1.0, purge=False)
    assert cluster.run_from_args(args) == 0
    assert "nothing to stop" in capsys.readouterr().out


def test_status_of_a_stopped_cluster_is_exit_1(tmp_path, capsys):
    cluster.save_state(tmp_path, recorded(pids=False))
    args = SimpleNamespace(data_dir=str(tmp_path), cluster_command="status", cluster_func=cluster.cmd_status)
    assert cluster.run_from_args(args) == 1
    out = capsys.readouterr().out
    assert out.count(" dead") == 5
    assert "service URL: minipulsar://127.0.0.1:4004,127.0.0.1:4005" in out
    assert "5 of 5 process(es) DOWN" in out
