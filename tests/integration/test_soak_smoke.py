"""Smoke test of scripts/soak.py: a short run against a real standalone prints one
JSON line per run with RSS, probe (cache, GC) and latency samples, and a summary.
Figures are printed, never asserted (no timing checks)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.procs import REPO_ROOT

pytestmark = pytest.mark.timeout(180)


def test_soak_short_run_prints_samples_and_a_summary():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "soak.py"), "--runs", "1", "--duration", "6",
                           "--rate", "200", "--sample", "2", "--latency-interval", "3", "--label", "smoke"],
                          cwd=str(REPO_ROOT), env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    print(proc.stderr[-3000:])
    run, agg = lines
    assert run["label"] == "smoke" and agg["runs"] == 1
    assert run["rss_mb"] and all(s["broker"] > 0 and s["bookie-0"] > 0 and s["bookie-1"] > 0 for s in run["rss_mb"])
    assert run["probe"] and all(p["cache_entries"] is not None and "2" in p["gc"] for p in run["probe"])
    assert run["latency"] and run["perf_summary"]["not_received"] == 0
    assert {"broker_rss_mb_end", "p99_ms_first_minute", "cache_entries_end", "gc_pause_ms_per_s_last_2min"} \
        <= run["summary"].keys()


def test_soak_stall_watch_names_every_process_and_journal_sync_can_be_off():
    """``--stall-watch`` runs the standalone, its bookies and the perf client under
    scripts/stallwatch and reports per process; ``--no-journal-sync`` is recorded."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "soak.py"), "--runs", "1", "--duration", "4",
                           "--rate", "200", "--sample", "2", "--latency-interval", "2", "--stall-watch",
                           "--no-journal-sync"],
                          cwd=str(REPO_ROOT), env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(proc.stderr[-3000:])
    run = json.loads(proc.stdout.splitlines()[0])
    assert run["journal_sync"] is False
    assert set(run["stalls"]["processes"]) == {"broker", "bookie-0", "bookie-1", "perf"}
    assert "interval  1: p99" in proc.stderr


@pytest.mark.timeout(400)
def test_soak_mixed_survives_every_fault_kind_with_nothing_lost_or_duplicated():
    """``--scenario mixed``: every subscription type, nacks, a geo pair, and the four fault
    kinds (bookie kill -9, broker kill -9, bookie SIGSTOP, geo link cut) in a short run;
    nothing acknowledged is lost or stored twice, every process is sampled (RSS, fds)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "soak.py"), "--scenario", "mixed", "--runs", "1",
                           "--duration", "70", "--fault-every", "3", "--sample", "3", "--rate", "100",
                           "--no-journal-sync", "--label", "mixed-smoke"],
                          cwd=str(REPO_ROOT), env=env, capture_output=True, text=True, timeout=380)
    print(proc.stderr[-5000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    run, agg = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    s = run["summary"]
    assert (s["lost"], s["duplicated"], s["lost_in_delivery"]) == (0, 0, 0) and s["acked_msgs"] > 0
    assert {f["fault"] for f in run["faults"]} == {"kill_bookie", "kill_broker", "pause_bookie", "cut_geo_link"}
    assert s["faults_survived"] == s["faults"] >= 4
    assert {t["subscription"] for t in run["topics"].values()} >= {"Exclusive", "Shared", "Failover", "KeyShared"}
    assert run["topics"] and all(t["acked"] > 0 and t["stored"] == t["acked"] for t in run["topics"].values())
    assert {"a-broker", "a-bookie-0", "b-standalone", "b-bookie-0", "client"} <= run["processes"].keys()
    assert all(p["rss_mb_end"] > 0 and p["fds_end"] > 0 for p in run["processes"].values())
    assert run["processes"]["a-broker"]["restarts"] >= 1 and agg["runs"] == 1
