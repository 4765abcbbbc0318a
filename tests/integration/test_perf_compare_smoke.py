"""Smoke test of scripts/perf_compare.py: one short interleaved run of this
checkout against itself (a real standalone per checkout) prints one JSON line
per result, a summary line and the summary table. No timing is asserted beyond
sanity (positive msg/s, p50 <= p99)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.procs import REPO_ROOT

pytestmark = pytest.mark.timeout(180)


def test_perf_compare_short_run_prints_results_and_a_summary():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "perf_compare.py"), "--base", ".",
                           "--head", ".", "--runs", "1", "--scenarios", "latency", "--duration", "2"],
                          cwd=str(REPO_ROOT), env=env, capture_output=True, text=True, timeout=150)
    print(proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    results = [x for x in lines if x["kind"] == "result"]
    summaries = [x for x in lines if x["kind"] == "summary"]
    assert len(results) == 2 and len(summaries) == 1 and lines[-1] is summaries[0]
    assert [r["checkout"] for r in results] == ["base", "head"]     # run 1: base first
    for r in results:
        f = r["figures"]
        assert r["scenario"] == "latency" and r["run"] == 1 and r["commit"]
        assert set(f) == {"msg_per_s", "p50_ms", "p99_ms", "p99.9_ms"}
        assert f["msg_per_s"] > 0 and 0 <= f["p50_ms"] <= f["p99_ms"] <= f["p99.9_ms"]
        assert r["perf"]["consumed"] > 0
    summary = summaries[0]["summary"]["latency"]
    for name in ("base", "head"):
        med = summary[name]
        assert med["msg_per_s"]["n"] == 1 and med["msg_per_s"]["median"] > 0
        assert med["p50_ms"]["median"] <= med["p99_ms"]["median"]
    assert summary["head_over_base"]["msg_per_s"] > 0
    assert "summary (median" in proc.stderr and "head/base" in proc.stderr
    assert "run 1 of 1: base" in proc.stderr and "run 1 of 1: head" in proc.stderr
