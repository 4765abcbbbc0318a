"""Unit tests of the geo launcher's pure parts: the process plan of a topology
(names, start order, command lines, broker config files), the in-cluster
failover's takeover clock and victim choice (deploy/flights_failover.py)."""
from __future__ import annotations

import tomllib
from types import SimpleNamespace

import pytest

from deploy.flights_failover import TakeoverClock, choose_victim_broker
from deploy.geo_processes import plan_processes
from deploy.topology import CONFIGURATION_STORE, load_topology


def mid(ledger: int, partition: int) -> SimpleNamespace:
    return SimpleNamespace(ledger_id=ledger, partition=partition)


# ---- the process plan -------------------------------------------------------------------
def test_plan_starts_etcds_then_bookies_then_brokers(tmp_path):
    topo = load_topology()
    procs = plan_processes(topo, tmp_path)
    assert len(procs) == 1 + 3 * (1 + 3 + 2)
    kinds = [p.kind for p in procs]
    assert kinds == ["etcd"] * 4 + ["bookie"] * 9 + ["broker"] * 6
    assert procs[0].label == f"{CONFIGURATION_STORE}/etcd" and procs[0].root == tmp_path / CONFIGURATION_STORE
    assert [p.label for p in procs if p.cluster == "us-west"] == [
        "us-west/etcd", "us-west/bookie-0", "us-west/bookie-1", "us-west/bookie-2", "us-west/broker-0",
        "us-west/broker-1"]
    assert len({p.pid_file for p in procs}) == len(procs) and len({p.log_file for p in procs}) == len(procs)
    assert {p.port for p in procs} | {p.peer_port for p in procs if p.kind == "etcd"} | \
        {p.http_port for p in procs if p.kind == "broker"} | {p.pulsar_port for p in procs if p.kind == "broker"} == \
        {port for _, port in topo.ports()}


def test_plan_commands_name_the_cluster_stores(tmp_path, monkeypatch):
    import deploy.cluster as cluster

    monkeypatch.setattr(cluster, "find_etcd", lambda: "/usr/bin/etcd")
    topo = load_topology()
    procs = {p.label: p for p in plan_processes(topo, tmp_path)}
    etcd = procs["us-east/etcd"].command()
    assert etcd[0] == "/usr/bin/etcd" and str(tmp_path / "us-east" / "etcd") in etcd
    assert "http://127.0.0.1:2392" in etcd and "default=http://127.0.0.1:2393" in etcd
    bookie = procs["us-east/bookie-2"].command()
    assert bookie[bookie.index("--metadata-store-url") + 1] == "etcd://127.0.0.1:2392"
    assert bookie[bookie.index("--port") + 1] == "3183"
    (tmp_path / "eu-central").mkdir()
    broker = procs["eu-central/broker-1"]
    argv = broker.command()
    assert argv[argv.index("--config") + 1] == str(broker.config_file)
    config = tomllib.loads(broker.config_file.read_text())
    assert config["metadata_store_url"] == "etcd://127.0.0.1:2396"
    assert config["configuration_metadata_store_url"] == "etcd://127.0.0.1:2390"
    assert (config["broker_service_port"], config["web_service_port"]) == (6612, 8092)
    assert config["cluster_name"] == "eu-central" and len(config["bookies"]) == 3
    assert config["replicated_subscriptions_snapshot_frequency_millis"] == 1000


def test_geo_auth_gives_the_brokers_their_own_role_the_only_one_the_bookies_serve(tmp_path):
    """``geo up --auth``: bookies take tokens of the demo key and serve only ``geo-broker``
    (authorized_roles); the brokers present that role's token to the bookies and to other
    clusters, and it is a superuser (so its replicators replicate), distinct from the
    administrator's role."""
    import argparse
    import dataclasses

    from bookie.__main__ import add_arguments, config_from_args, config_problems
    from deploy.geo_auth import ADMIN_ROLE, BROKER_ROLE, ensure_auth_material
    from proto.auth_tokens import validate_token

    topo = dataclasses.replace(load_topology(), auth_dir=ensure_auth_material(tmp_path))
    assert BROKER_ROLE != ADMIN_ROLE
    procs = {p.label: p for p in plan_processes(topo, tmp_path)}
    argv = procs["us-east/bookie-0"].command()
    assert argv[argv.index("--authorized-roles") + 1] == BROKER_ROLE and "--authentication-enabled" in argv
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    bookie = config_from_args(parser.parse_args(argv[argv.index("bookie") + 1:]))
    assert bookie.authorized_roles == [BROKER_ROLE] and config_problems(bookie) == []
    broker = topo.broker_config("us-east", 0, str(tmp_path / "b"))
    assert BROKER_ROLE in broker.superuser_roles
    key = (tmp_path / "auth" / "secret.key").read_bytes()
    for params in (broker.bookkeeper_client_authentication_parameters, broker.broker_client_authentication_parameters):
        token = open(params.removeprefix("file://")).read().strip()
        assert validate_token(token, key, ("HS256",))["sub"] == BROKER_ROLE


def test_a_process_without_a_live_pid_is_not_running(tmp_path):
    [p] = [p for p in plan_processes(load_topology(), tmp_path) if p.label == "us-east/bookie-0"]
    assert p.running_pid() is None
    p.root.mkdir(parents=True)
    p.pid_file.write_text("1\n")            # pid 1 is alive, but is not this bookie
    assert p.running_pid() is None


# ---- the in-cluster failover ---------------------------------------------------------------
def test_victim_is_the_broker_with_the_most_partitions():
    assert choose_victim_broker({0: "b", 1: "a", 2: "b", 3: "a"}) == ("a", [1, 3])      # a tie: smallest URL
    assert choose_victim_broker({0: "a", 1: "b", 2: "b", 3: "b"}) == ("b", [1, 2, 3])
    with pytest.raises(ValueError):
        choose_victim_broker({})


def test_takeover_clock_counts_only_receipts_from_a_new_ledger_of_a_moved_partition():
    now = [100.0]
    clock = TakeoverClock(now=lambda: now[0])
    for part, ledger in ((0, 10), (1, 11), (2, 12), (0, 10)):
        clock.record(mid(ledger, part))
    assert clock.first_publish_s() is None and clock.all_published_s() is None
    clock.killed([0, 2], at=100.0)
    now[0] = 100.5
    clock.record(mid(10, 0))           # a receipt of the dead owner's ledger, read after the kill
    clock.record(mid(-1, 0))           # deduplicated: no ledger
    clock.record(mid(13, 1))           # partition 1 did not move
    clock.record(None)
    assert clock.first_publish_s() is None
    now[0] = 104.25
    clock.record(mid(20, 2))
    assert clock.first_publish_s() == 4.25 and clock.all_published_s() is None
    now[0] = 105.0
    clock.record(mid(21, 0))
    now[0] = 109.0
    clock.record(mid(22, 0))           # only the first one counts
    assert clock.first_publish_s() == 4.25 and clock.all_published_s() == 5.0
    assert clock.first_publish == {2: 104.25, 0: 105.0}
