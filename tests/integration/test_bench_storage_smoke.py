"""Smoke test of scripts/bench_storage.py: a --quick run prints one valid JSON line per
scenario with the expected keys. Figures are printed, never asserted (no timing checks)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.procs import REPO_ROOT

APPEND_KEYS = {
    "scenario", "journal_sync", "entries", "entry_bytes", "ensemble", "write_quorum", "ack_quorum", "window",
    "seconds", "entries_per_s", "mb_per_s", "latency_ms_p50", "latency_ms_p99", "latency_ms_max",
    "client_cpu_us_per_entry", "bookies_cpu_us_per_entry", "target_met",
}
CURSOR_KEYS = {
    "scenario", "journal_sync", "entries", "acked", "ledgers", "append_seconds", "ack_seconds", "memory_bytes",
    "persist_bytes", "persist_ms", "incremental_persist_bytes", "ml_reopen_ms", "recovery_ms",
    "state_equal_after_recovery", "is_acknowledged_mismatches", "delivered_after_recovery", "redelivered_acked",
    "missing_unacked", "read_back_seconds", "verified", "memory_target_met", "recovery_target_met",
}


def test_bench_storage_quick_prints_json_lines():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "bench_storage.py"), "--quick"],
                          cwd=str(REPO_ROOT), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    results = [json.loads(line) for line in lines]  # every stdout line is one JSON object
    print("\n".join(lines))  # the figures, for whoever runs pytest -s

    appends = [r for r in results if r["scenario"] == "ml_append"]
    cursors = [r for r in results if r["scenario"] == "cursor_holes"]
    assert len(results) == 3
    assert sorted(r["journal_sync"] for r in appends) == [False, True]
    for r in appends:
        assert APPEND_KEYS <= r.keys(), APPEND_KEYS - r.keys()
        assert r["entries"] == 5000 and r["entry_bytes"] == 1024
        assert (r["ensemble"], r["write_quorum"], r["ack_quorum"]) == (3, 2, 2)
        assert r["entries_per_s"] > 0 and r["latency_ms_p99"] >= r["latency_ms_p50"] > 0
    (c,) = cursors
    assert CURSOR_KEYS <= c.keys(), CURSOR_KEYS - c.keys()
    assert c["entries"] == 20000
    # Correctness, not speed: the recovered cursor holds exactly the acknowledged state
    # and redelivers every unacknowledged entry and no acknowledged one.
    assert c["verified"] is True
    assert c["state_equal_after_recovery"] is True
    assert c["redelivered_acked"] == 0 and c["missing_unacked"] == 0 and c["is_acknowledged_mismatches"] == 0
    assert c["delivered_after_recovery"] == c["entries"] - c["acked"]
    assert c["memory_bytes"] > 0 and c["persist_bytes"] > 0
