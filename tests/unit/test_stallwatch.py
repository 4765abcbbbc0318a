"""scripts/stallwatch: the sitecustomize finds a main thread held in one call, and
report.summarize names processes and counts stalls per minute. A real child
process for the first; files written by hand for the second."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WATCH = REPO / "scripts" / "stallwatch"


def _report():
    spec = importlib.util.spec_from_file_location("stallwatch_report", WATCH / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_blocking_call_on_the_main_thread_is_reported_with_its_stack(tmp_path):
    env = dict(os.environ, STALLWATCH_DIR=str(tmp_path), PYTHONPATH=str(WATCH))
    # a stall is written when the main thread moves on: give the watch a moment after it
    code = ("import subprocess, time\nsubprocess.run(['sleep', '0.4'])\n"
            "end = time.monotonic() + 0.2\nwhile time.monotonic() < end:\n    pass\n")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)
    (path,) = tmp_path.glob("stall.*")
    lines = path.read_text().splitlines()
    assert lines[0].startswith("PROC ")
    stalls = [line for line in lines if line.startswith("STALL ")]
    assert any(int(line.split()[2][3:]) >= 300 and "subprocess.py" in line for line in stalls), lines


def test_without_the_variable_nothing_is_written(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(WATCH))
    env.pop("STALLWATCH_DIR", None)
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, cwd=tmp_path, timeout=30)
    assert not list(tmp_path.iterdir())


def test_report_names_processes_and_buckets_stalls_per_minute(tmp_path):
    (tmp_path / "stall.1").write_text(
        "PROC 1 python -m bookie --port 1 --data-dir /tmp/x/data/bookie-0\n"
        "STALL 1000.0 ms=120 ledger_db.py:122:write_group <- journal.py:118:_flush\n"
        "STALL 1070.0 ms=300 ledger_db.py:122:write_group <- journal.py:118:_flush\n"
        "GC 1071.0 gen=2 ms=25.0\n")
    (tmp_path / "stall.2").write_text("PROC 2 soak.py --probe f -- -m deploy.cli standalone --port 0\n")
    (tmp_path / "stall.3").write_text("PROC 3 -c e2e persistent://public/default/t --service-url x\n"
                                      "OVERSLEEP 1001.0 ms=90\n")
    s = _report().summarize(tmp_path, start=990.0)
    assert s["processes"]["bookie-0"] == {"stalls": 2, "longest_ms": 300, "stalled_ms": 420,
                                          "top": "ledger_db.py:122:write_group", "gc_over_20ms": 1,
                                          "oversleeps": 0}
    assert s["processes"]["broker"]["stalls"] == 0 and s["processes"]["perf"]["oversleeps"] == 1
    assert s["per_minute"] == [{"bookie-0": (1, 120)}, {"bookie-0": (1, 300)}]
