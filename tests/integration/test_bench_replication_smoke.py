"""Smoke test of scripts/bench_replication.py and scripts/bench_replicated_subscriptions.py:
a --quick run of each prints one valid JSON line per scenario with the expected keys.
Figures are printed, never asserted (no timing checks)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.procs import REPO_ROOT

LAG_KEYS = {
    "scenario", "journal_sync", "rate", "message_bytes", "batch_delay_ms", "batch_max_messages", "warmup_s",
    "duration_s", "sent", "publish_errors", "received_in_b", "entries_in_b", "measured_messages", "achieved_rate",
    "messages_per_entry", "lag_ms_p50", "lag_ms_p99", "lag_ms_p999", "lag_ms_max", "lag_ms_mean",
    "publish_latency_ms_p50", "publish_latency_ms_p99", "cpu_s", "cpu_us_per_entry", "cluster_cores_busy", "loadavg_1m",
    "target_p99_ms", "target_met",
}
THROUGHPUT_KEYS = {
    "scenario", "journal_sync", "batching", "batch_max_messages", "message_bytes", "messages", "produced",
    "entries_in_a", "received_in_b", "entries_in_b", "messages_per_entry", "seconds_first_to_last",
    "seconds_enable_to_last", "seconds_enable_to_first", "msgs_per_s", "entries_per_s", "msgs_per_s_incl_startup",
    "mb_per_s", "produce_seconds", "cpu_s", "cpu_us_per_entry", "cluster_cores_busy", "loadavg_1m",
}
RSUB_KEYS = {
    "scenario", "journal_sync", "snapshot_frequency_ms", "update_interval_ms", "pure_pip33", "rate",
    "message_bytes", "warmup_s", "duration_s", "tail_s", "ack_group_ms", "poll_ms", "produced", "acked_in_a",
    "replicated_to_b", "measured_acks", "acked_covered", "acked_latency_ms_p50", "acked_latency_ms_p99",
    "acked_latency_ms_p999", "acked_latency_ms_max", "acked_latency_ms_mean", "mark_delete_covered",
    "mark_delete_latency_ms_p50", "mark_delete_latency_ms_p99", "mark_delete_latency_ms_p999",
    "mark_delete_latency_ms_max", "mark_delete_latency_ms_mean", "polls", "poll_rtt_ms_p50", "poll_rtt_ms_p99",
    "b_mark_delete_positions_seen", "b_final_msg_backlog", "cpu_s", "loadavg_1m",
}


def start_quick(script: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(REPO_ROOT / "scripts" / script), "--quick", "--no-sync"],
                            cwd=str(REPO_ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def results_of(proc: subprocess.Popen, timeout_s: float) -> list[dict]:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-4000:]
    lines = [line for line in out.splitlines() if line.strip()]
    print("\n".join(lines))  # the figures, for whoever runs pytest -s
    return [json.loads(line) for line in lines]  # every stdout line is one JSON object


def test_bench_replication_scripts_quick_print_json_lines():
    # both at once: each mostly waits (cluster start-up, fixed-rate load), and the
    # whole smoke test stays well under 40 s
    repl = start_quick("bench_replication.py")
    rsub = start_quick("bench_replicated_subscriptions.py")
    try:
        results = results_of(repl, 90)
        rsub_results = results_of(rsub, 90)
    finally:
        for proc in (repl, rsub):
            if proc.poll() is None:
                proc.terminate()   # SIGTERM: the script stops its clusters on the way out
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    lag = [r for r in results if r["scenario"] == "replication_lag"]
    tput = [r for r in results if r["scenario"] == "replication_throughput"]
    assert len(results) == 4
    assert sorted(r["rate"] for r in lag) == [1000, 10000]
    assert sorted(r["batching"] for r in tput) == [False, True]
    for r in lag:
        assert LAG_KEYS <= r.keys(), LAG_KEYS - r.keys()
    for r in tput:
        assert THROUGHPUT_KEYS <= r.keys(), THROUGHPUT_KEYS - r.keys()

    assert len(rsub_results) == 2
    assert sorted(r["pure_pip33"] for r in rsub_results) == [False, True]
    for r in rsub_results:
        assert r["scenario"] == "replicated_subscription_ack_to_mark_delete"
        assert RSUB_KEYS <= r.keys(), RSUB_KEYS - r.keys()
