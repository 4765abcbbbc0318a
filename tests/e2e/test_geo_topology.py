"""The geo topology file, its checks, the generated docker-compose file and the
Dockerfile (fast: no server, or only a `geo up` that must refuse to start)."""
from __future__ import annotations

import json
import socket
import subprocess

import pytest

from deploy.compose import compose_model, render_compose
from deploy.flights_replay import DelayBoard, flight_identity, load_flights
from deploy.topology import TopologyError, load_topology, parse_topology
from tests.e2e.geo_helpers import DEFAULT_TOPOLOGY, REPO_ROOT, geo, topology_text

pytestmark = pytest.mark.timeout(120)


def test_default_topology_is_the_issue_layout():
    topo = load_topology()
    assert topo.names == ["us-east", "us-west", "eu-central"]
    for c in topo.clusters:
        assert len(c.bookie_ports) == 2 and c.write_quorum == 2 and c.ack_quorum == 2
        cfg = topo.broker_config(c.name, "/tmp/x")
        assert (cfg.managed_ledger_default_ensemble_size, cfg.managed_ledger_default_write_quorum,
                cfg.managed_ledger_default_ack_quorum) == (2, 2, 2)
        assert cfg.bookies == [f"127.0.0.1:{p}" for p in c.bookie_ports]
    [tenant] = topo.tenants
    assert tenant.name == "geo" and set(tenant.allowed_clusters) == set(topo.names)
    [ns] = topo.namespaces
    assert ns.name == "geo/flights" and set(ns.clusters) == set(topo.names) and ns.deduplication
    assert (ns.retention_time_minutes, ns.retention_size_mb) == (-1, -1)
    [topic] = topo.topics
    assert topic.name == "persistent://geo/flights/departures" and topic.partitions == 4
    assert topo.demo.origins == (("us-east", "EWR"), ("us-west", "JFK"), ("eu-central", "LGA"))
    assert topo.service_url("us-west", compose=True) == "minipulsar://broker-us-west:6601"


def test_duplicate_port_is_rejected_with_both_owners():
    text = DEFAULT_TOPOLOGY.read_text().replace("bookie_ports = [3183, 3184]", "bookie_ports = [3183, 6600]")
    with pytest.raises(TopologyError) as err:
        parse_topology(text, "dup.toml")
    assert "port 6600 is used more than once: us-east broker_port and us-west bookie_ports[1]" in str(err.value)


def test_unknown_cluster_in_namespace_is_rejected():
    text = DEFAULT_TOPOLOGY.read_text().replace('clusters = ["us-east", "us-west", "eu-central"]',
                                                'clusters = ["us-east", "us-south"]')
    with pytest.raises(TopologyError) as err:
        parse_topology(text, "ns.toml")
    assert "namespace geo/flights: unknown cluster 'us-south'" in str(err.value)


def test_every_problem_is_listed_at_once():
    text = (DEFAULT_TOPOLOGY.read_text().replace("write_quorum = 2", "write_quorum = 3")
            .replace("partitions = 4", "partitions = -1").replace("[broker]", "[broker]\nbogus_key = 1"))
    with pytest.raises(TopologyError) as err:
        parse_topology(text, "many.toml")
    msg = str(err.value)
    assert "write_quorum 3 needs at least 3 bookies" in msg
    assert "partitions = -1 is out of range" in msg
    assert "unknown broker setting 'bogus_key'" in msg
    assert "problem(s)" in msg


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.replace("bookie_ports = [3185, 3186]", "bookie_ports = [3185, 3181]"),
     "is used more than once: us-east bookie_ports[0] and eu-central bookie_ports[1]"),
    (lambda t: t.replace('clusters = ["us-east", "us-west", "eu-central"]', 'clusters = ["mars"]'),
     "unknown cluster 'mars'"),
    (lambda t: t.replace("[[clusters]]", "[[clusterz]]", 1), "unknown key(s) clusterz"),
])
def test_geo_up_refuses_a_bad_topology_before_starting_anything(tmp_path, edit, expected):
    topo = tmp_path / "bad.toml"
    topo.write_text(topology_text(text=edit(DEFAULT_TOPOLOGY.read_text()))[0])
    data = tmp_path / "data"
    proc = geo("up", "--topology", str(topo), "--data-dir", str(data), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert not data.exists(), "nothing may be created for a bad topology"


def test_geo_up_refuses_a_port_in_use_before_starting_anything(tmp_path):
    topo = tmp_path / "geo.toml"
    text, ports = topology_text()
    topo.write_text(text)
    busy = ports[3184]               # us-west's second bookie
    holder = socket.socket()
    holder.bind(("127.0.0.1", busy))
    holder.listen()
    data = tmp_path / "data"
    try:
        proc = geo("up", "--topology", str(topo), "--data-dir", str(data), timeout=60)
    finally:
        holder.close()
    assert proc.returncode == 1, proc.stderr
    assert f"port {busy} (us-west/bookie-1)" in proc.stderr and "nothing was started" in proc.stderr
    assert not list(data.glob("*/*.pid")) and not list(data.glob("*/bookie-*"))


def test_geo_up_refuses_other_ports_over_existing_data(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "topology.toml").write_text(topology_text()[0])
    other = tmp_path / "other.toml"
    other.write_text(topology_text()[0])
    proc = geo("up", "--topology", str(other), "--data-dir", str(data), timeout=60)
    assert proc.returncode == 1
    assert "ports cannot change over existing data" in proc.stderr


def test_status_and_down_on_a_stopped_data_dir(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "topology.toml").write_text(topology_text()[0])
    st = geo("status", "--data-dir", str(data), timeout=60)
    assert st.returncode == 1 and "SOME PROCESSES ARE DOWN" in st.stdout
    down = geo("down", "--data-dir", str(data), "--purge", timeout=60)
    assert down.returncode == 0 and "not running" in down.stdout
    assert not data.exists()


def test_down_purge_refuses_a_directory_that_is_not_a_geo_data_dir(tmp_path):
    (tmp_path / "keep.txt").write_text("precious")
    proc = geo("down", "--data-dir", str(tmp_path), "--purge", timeout=60)
    assert proc.returncode == 1 and "does not look like a geo data dir" in proc.stderr
    assert (tmp_path / "keep.txt").exists()


# ---- docker-compose ------------------------------------------------------------------
def test_committed_compose_file_is_the_generated_one():
    committed = (REPO_ROOT / "docker-compose.yml").read_text()
    generated = render_compose(load_topology())
    assert committed == generated, ("docker-compose.yml is stale: regenerate it with "
                                    "`minipulsar geo compose > docker-compose.yml`")
    cli = geo("compose", timeout=60)
    assert cli.returncode == 0 and cli.stdout == generated


def test_compose_has_one_service_per_process_with_health_checks():
    topo = load_topology()
    model = compose_model(topo)
    services = model["services"]
    expected = [f"bookie-{c.name}-{i}" for c in topo.clusters for i in range(2)] + \
               [f"broker-{c.name}" for c in topo.clusters] + ["geo-setup"]
    assert sorted(services) == sorted(expected)
    assert sum("build" in s for s in services.values()) == 1
    assert {s["image"] for s in services.values()} == {"minipulsar:latest"}
    for name, svc in services.items():
        if name == "geo-setup":
            assert svc["restart"] == "no"
            assert svc["command"][:3] == ["minipulsar", "geo", "setup"] and "--compose" in svc["command"]
            assert set(svc["depends_on"]) == {f"broker-{c.name}" for c in topo.clusters}
        else:
            test = svc["healthcheck"]["test"]
            assert test[0] == "CMD" and all(" " not in arg for arg in test), test   # podman limit
            assert svc["volumes"] and svc["volumes"][0].endswith(":/data")
            assert svc["volumes"][0].split(":")[0] in model["volumes"]
        for dep in svc.get("depends_on", {}).values():
            assert dep == {"condition": "service_healthy"}
    for c in topo.clusters:
        broker = services[f"broker-{c.name}"]
        assert broker["ports"] == [f"127.0.0.1:${{MINIPULSAR_PORT_{c.name.upper().replace('-', '_')}:-"
                                   f"{c.broker_port}}}:{c.broker_port}"]
        assert set(broker["depends_on"]) == {f"bookie-{c.name}-0", f"bookie-{c.name}-1"}
        assert "/app/deploy/geo.toml" in broker["command"]


def test_compose_refuses_a_topology_outside_the_project(tmp_path):
    topo = tmp_path / "geo.toml"
    topo.write_text(DEFAULT_TOPOLOGY.read_text())
    proc = geo("compose", "--topology", str(topo), timeout=60)
    assert proc.returncode == 1 and "must be inside the project" in proc.stderr


def test_dockerfile_installs_the_package_without_spark():
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert text.splitlines()[[i for i, l in enumerate(text.splitlines()) if l.startswith("FROM")][0]] == \
        "FROM python:3.11-slim"
    assert "pip install" in text and "spark" not in text.replace("Spark extra", "")
    ignore = (REPO_ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignore and "data" in ignore


def test_probe_reports_a_dead_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert geo("probe", "bookie", f"127.0.0.1:{port}", "--timeout", "1", timeout=30).returncode == 1
    assert geo("probe", "broker", f"127.0.0.1:{port}", "--timeout", "1", timeout=30).returncode == 1


# ---- the flights --------------------------------------------------------------------------
def test_replay_messages_match_the_shared_flight_format():
    from client.spark.flights import flight_to_message, read_flights_csv

    flights = load_flights(limit=2000)
    assert [f.seq for f in flights] == list(range(2000))
    by_identity = {f.identity: f for f in flights}
    checked = 0
    for row in read_flights_csv():
        ident = flight_identity(row)
        if ident in by_identity:
            payload, key, event_ms = flight_to_message(row)
            f = by_identity[ident]
            assert (f.payload, f.carrier, f.event_ms, f.origin) == (payload, key, event_ms, row["origin"])
            checked += 1
    assert checked == 2000
    events = [f.event_ms for f in flights]
    assert events == sorted(events), "replay order is scheduled-departure order"


def test_delay_board_counts_each_flight_once():
    board = DelayBoard("x")
    a = {"year": 2013, "month": 1, "day": 1, "carrier": "UA", "flight": 1, "origin": "EWR",
         "sched_dep_time": 515, "dep_time": 517, "dep_delay": 2.0}
    b = dict(a, flight=2, dep_time=None, dep_delay=None)
    assert board.add(a) and board.add(b) and not board.add(dict(a))
    assert board.duplicates == 1 and board.deliveries == 3
    assert board.table_rows() == [("UA", 2, 1, 2.0)]
    assert json.dumps(board.table_rows())


def test_geo_help_lists_every_action():
    out = subprocess.run([*geo_cmd(), "--help"], capture_output=True, text=True, cwd=str(REPO_ROOT)).stdout
    for action in ("up", "status", "demo", "down", "compose", "setup", "broker", "probe"):
        assert action in out


def geo_cmd() -> list[str]:
    import sys
    return [sys.executable, "-m", "deploy.cli", "geo"]
