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
    """Three broker clusters: each its etcd, three bookies (E=2 Qw=2 Qa=2) and two
    brokers; one configuration-store etcd shared by all."""
    topo = load_topology()
    assert topo.names == ["us-east", "us-west", "eu-central"]
    assert topo.configuration_store is not None
    assert topo.configuration_store_url == f"etcd://127.0.0.1:{topo.configuration_store.port}"
    for c in topo.clusters:
        assert len(c.brokers) == 2 and len(c.bookie_ports) == 3
        assert (c.ensemble_size, c.write_quorum, c.ack_quorum) == (2, 2, 2)
        assert all(b.http_port > 0 for b in c.brokers)
        for i in range(2):
            cfg = topo.broker_config(c.name, i, "/tmp/x")
            assert (cfg.managed_ledger_default_ensemble_size, cfg.managed_ledger_default_write_quorum,
                    cfg.managed_ledger_default_ack_quorum) == (2, 2, 2)
            assert cfg.bookies == [f"127.0.0.1:{p}" for p in c.bookie_ports]
            assert cfg.metadata_store_url == f"etcd://127.0.0.1:{c.etcd.port}"
            assert cfg.configuration_metadata_store_url == topo.configuration_store_url
            assert (cfg.broker_service_port, cfg.web_service_port) == (c.brokers[i].port, c.brokers[i].http_port)
            assert cfg.cluster_name == c.name and cfg.advertised_address == "127.0.0.1"
    [tenant] = topo.tenants
    assert tenant.name == "geo" and set(tenant.allowed_clusters) == set(topo.names)
    [ns] = topo.namespaces
    assert ns.name == "geo/flights" and set(ns.clusters) == set(topo.names) and ns.deduplication
    assert (ns.retention_time_minutes, ns.retention_size_mb) == (-1, -1)
    [topic] = topo.topics
    assert topic.name == "persistent://geo/flights/departures" and topic.partitions == 4
    assert topo.demo.origins == (("us-east", "EWR"), ("us-west", "JFK"), ("eu-central", "LGA"))
    assert topo.service_url("us-east") == "minipulsar://127.0.0.1:6600,127.0.0.1:6610"
    assert topo.service_url("us-west") == "minipulsar://127.0.0.1:6601,127.0.0.1:6611"
    assert topo.pulsar_url("us-east") == "pulsar://127.0.0.1:6650,127.0.0.1:6660"   # the official clients
    assert [topo.broker_config("us-west", i, "/tmp/x").broker_service_port_pulsar for i in range(2)] == [6651, 6661]
    assert len(topo.ports()) == 2 + 3 * (2 + 3 + 2 * 3)


def test_duplicate_port_is_rejected_with_both_owners():
    text = DEFAULT_TOPOLOGY.read_text().replace("bookie_ports = [3184, 3185, 3186]", "bookie_ports = [3184, 3185, 6600]")
    with pytest.raises(TopologyError) as err:
        parse_topology(text, "dup.toml")
    assert "port 6600 is used more than once: us-east broker_ports[0] and us-west bookie_ports[2]" in str(err.value)


def test_unknown_cluster_in_namespace_is_rejected():
    text = DEFAULT_TOPOLOGY.read_text().replace('clusters = ["us-east", "us-west", "eu-central"]',
                                                'clusters = ["us-east", "us-south"]')
    with pytest.raises(TopologyError) as err:
        parse_topology(text, "ns.toml")
    assert "namespace geo/flights: unknown cluster 'us-south'" in str(err.value)


def test_every_problem_is_listed_at_once():
    text = (DEFAULT_TOPOLOGY.read_text().replace("ensemble_size = 2", "ensemble_size = 4")
            .replace("partitions = 4", "partitions = -1").replace("[broker]", "[broker]\nbogus_key = 1")
            .replace("etcd_port = 2394\n", "").replace("broker_ports = [6602, 6612]", "broker_ports = [6602]"))
    with pytest.raises(TopologyError) as err:
        parse_topology(text, "many.toml")
    msg = str(err.value)
    assert "ensemble_size 4 needs at least 4 bookies, it has 3" in msg
    assert "partitions = -1 is out of range" in msg
    assert "unknown broker setting 'bogus_key'" in msg
    assert "cluster us-west: etcd_port is missing" in msg
    assert "cluster eu-central: brokers = 2 but broker_ports lists 1 port(s)" in msg
    assert "problem(s)" in msg


def test_brokers_and_bookies_default_to_two_and_three_from_first_ports():
    topo = parse_topology("""
[[clusters]]
name = "solo"
broker_port = 7600
http_port = 7680
bookie_port = 7181
etcd_port = 7379
""")
    [c] = topo.clusters
    assert [(b.port, b.http_port) for b in c.brokers] == [(7600, 7680), (7610, 7690)]
    assert c.bookie_ports == (7181, 7182, 7183) and (c.etcd.port, c.etcd.peer_port) == (7379, 7380)
    assert topo.configuration_store is None and topo.configuration_store_url == ""
    assert topo.broker_config("solo", 1, "/tmp/x").configuration_metadata_store_url == ""
    more = parse_topology("""
[[clusters]]
name = "solo"
brokers = 3
broker_port = 7600
bookies = 4
bookie_port = 7181
etcd_port = 7379
""")
    assert more.clusters[0].broker_ports == [7600, 7610, 7620] and len(more.clusters[0].bookie_ports) == 4
    assert all(b.http_port == -1 for b in more.clusters[0].brokers), "no http_port: metrics off"


def test_reserved_broker_keys_are_refused():
    text = DEFAULT_TOPOLOGY.read_text().replace("[broker]", '[broker]\nmetadata_store_url = "etcd://x:1"')
    with pytest.raises(TopologyError, match="metadata_store_url is set by the topology itself"):
        parse_topology(text)


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.replace("bookie_ports = [3187, 3188, 3189]", "bookie_ports = [3187, 3188, 3181]"),
     "is used more than once: us-east bookie_ports[0] and eu-central bookie_ports[2]"),
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
    busy = ports[3185]               # us-west's second bookie
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
    assert st.returncode == 1 and "19 PROCESS(ES) DOWN" in st.stdout and "not running" in st.stdout
    down = geo("down", "--data-dir", str(data), "--purge", timeout=60)
    assert down.returncode == 0 and "not running" in down.stdout
    assert not data.exists()


def test_a_data_dir_of_the_one_broker_layout_is_explained_and_can_be_purged(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "topology.toml").write_text(
        '[[clusters]]\nname = "us-east"\nbroker_port = 6600\nhttp_port = 8080\nbookie_ports = [3181, 3182]\n')
    up = geo("up", "--data-dir", str(data), timeout=60)
    assert up.returncode == 1 and "older version" in up.stderr and "--purge" in up.stderr, up.stderr
    down = geo("down", "--data-dir", str(data), "--purge", timeout=60)
    assert down.returncode == 0 and not data.exists(), down.stderr


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


def test_compose_has_one_service_per_process_started_in_order():
    """Per cluster an etcd, three bookies, two brokers; the configuration-store etcd;
    geo-net holding the one network namespace and publishing the brokers' ports;
    health checks and depends_on (service_healthy) for the start order."""
    topo = load_topology()
    model = compose_model(topo)
    services = model["services"]
    expected = ["geo-net", "etcd-configuration", "geo-setup", "geo-dashboard"]
    for c in topo.clusters:
        expected += [f"etcd-{c.name}"] + [f"bookie-{c.name}-{i}" for i in range(3)] + \
            [f"broker-{c.name}-{i}" for i in range(2)]
    assert sorted(services) == sorted(expected)
    assert list(services)[0] == "geo-net" and "build" in services["geo-net"]
    assert sum("build" in s for s in services.values()) == 1
    assert {s["image"] for s in services.values()} == {"minipulsar:latest"}
    net = services.pop("geo-net")
    assert net["command"] == ["sleep", "infinity"] and net["init"] is True
    published = []
    for c in topo.clusters:
        for i, b in enumerate(c.brokers):
            var = f"MINIPULSAR_PORT_{c.name.upper().replace('-', '_')}_{i}"
            published.append(f"127.0.0.1:${{{var}:-{b.port}}}:${{{var}:-{b.port}}}")
    published += [f"127.0.0.1:{b.pulsar_port}:{b.pulsar_port}" for c in topo.clusters for b in c.brokers]
    # then each broker's web port (REST admin, metrics, its cluster's dashboard) and the geo dashboard's
    published += [f"127.0.0.1:{b.http_port}:{b.http_port}" for c in topo.clusters for b in c.brokers]
    published.append("127.0.0.1:8070:8070")
    assert net["ports"] == published, "each broker's ports (gRPC, Pulsar protocol, web) on the host's 127.0.0.1, under the same number"
    for name, svc in services.items():
        assert svc["network_mode"] == "service:geo-net"
        assert svc["depends_on"].pop("geo-net") == {"condition": "service_started"}
        for dep in svc["depends_on"].values():
            assert dep == {"condition": "service_healthy"}
        if name == "geo-setup":
            assert svc["restart"] == "no"
            assert svc["command"][:3] == ["minipulsar", "geo", "setup"] and "--compose" in svc["command"]
            assert set(svc["depends_on"]) == {f"broker-{c.name}-{i}" for c in topo.clusters for i in range(2)}
            assert len(svc["environment"]) == 6
            continue
        if name == "geo-dashboard":
            assert svc["command"][:3] == ["minipulsar", "geo", "dashboard"] and svc["command"][-1] == "8070"
            assert set(svc["depends_on"]) == {f"broker-{c.name}-{i}" for c in topo.clusters for i in range(2)}
            continue
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD" and all(" " not in arg for arg in test), test   # podman limit
        assert svc["restart"] == "unless-stopped"
        if not name.startswith("broker-"):
            assert svc["volumes"] and svc["volumes"][0].endswith(":/data")
            assert svc["volumes"][0].split(":")[0] in model["volumes"]
    assert services["etcd-configuration"]["command"][0] == "etcd"
    assert "--listen-client-urls" in services["etcd-configuration"]["command"]
    for c in topo.clusters:
        assert set(services[f"etcd-{c.name}"]["depends_on"]) == set()
        for i in range(3):
            bookie = services[f"bookie-{c.name}-{i}"]
            assert set(bookie["depends_on"]) == {f"etcd-{c.name}"}
            assert f"etcd://127.0.0.1:{c.etcd.port}" in bookie["command"]
        for i in range(2):
            broker = services[f"broker-{c.name}-{i}"]
            assert set(broker["depends_on"]) == {"etcd-configuration", f"etcd-{c.name}",
                                                 *(f"bookie-{c.name}-{k}" for k in range(3))}
            assert "/app/deploy/geo.toml" in broker["command"] and "--compose" in broker["command"]
            assert broker["command"][broker["command"].index("--index") + 1] == str(i)
            assert list(broker["environment"]) == [f"MINIPULSAR_PORT_{c.name.upper().replace('-', '_')}_{i}"]


def test_compose_brokers_take_their_port_from_the_environment():
    topo = load_topology().with_broker_ports({"MINIPULSAR_PORT_US_WEST_1": "16611"})
    assert topo.service_url("us-west") == "minipulsar://127.0.0.1:6601,127.0.0.1:16611"
    assert topo.broker_config("us-west", 1, "/data", bind_address="0.0.0.0").broker_service_port == 16611
    with pytest.raises(TopologyError, match="not a TCP port"):
        load_topology().with_broker_ports({"MINIPULSAR_PORT_US_EAST_0": "http"})


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
    assert "apt-get install" in text and "etcd-server" in text, "the etcd services run the same image"
    ignore = (REPO_ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignore and "data" in ignore


def test_probe_reports_a_dead_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert geo("probe", "bookie", f"127.0.0.1:{port}", "--timeout", "1", timeout=30).returncode == 1
    assert geo("probe", "etcd", f"127.0.0.1:{port}", "--timeout", "1", timeout=30).returncode == 1
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
