"""Run the fault suite (``tests/faults``) and print its figures as a markdown table.

Each scenario of the suite records one row (scenario, faults injected, messages
acknowledged, lost, duplicated, time to serve again) to the JSON-lines file named by
``MINIPULSAR_FAULT_REPORT``; this script sets that variable, runs pytest and prints
the table. With ``--runs N`` it runs the suite N times and prints, per scenario, the
median and range of the time to serve again (and the sums of lost/duplicated).

    .venv/bin/python scripts/fault_table.py            # one run, ~4 min
    .venv/bin/python scripts/fault_table.py --runs 3   # three runs
    .venv/bin/python scripts/fault_table.py --from-jsonl rows.jsonl   # table of saved rows

Exit status: pytest's (non-zero if a scenario failed), 0 for ``--from-jsonl``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_suite(report: Path, pytest_args: list[str]) -> int:
    """Run ``pytest tests/faults`` once with rows going to ``report``; returns its exit status."""
    env = dict(os.environ, MINIPULSAR_FAULT_REPORT=str(report))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults", *pytest_args]
    return subprocess.call(cmd, cwd=REPO, env=env)


def load_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fmt_s(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def table(runs: list[list[dict]]) -> str:
    """Markdown table of the rows of one or more runs (grouped by scenario, first-seen order)."""
    by_scenario: "OrderedDict[str, list[dict]]" = OrderedDict()
    for rows in runs:
        for row in rows:
            by_scenario.setdefault(row["scenario"], []).append(row)
    many = len(runs) > 1
    head = ("| scenario | faults injected | acknowledged | lost | duplicated | time to serve again (s"
            + (", median (range) of %d runs" % len(runs) if many else "") + ") |")
    lines = [head, "|---|---|---:|---:|---:|---:|"]
    for scenario, rows in by_scenario.items():
        acked = [r["acknowledged"] for r in rows]
        acked_text = str(acked[0]) if not many else f"{statistics.median(acked):.0f} ({min(acked)}-{max(acked)})"
        lines.append(f"| {scenario} | {rows[-1]['faults']} | {acked_text} | {sum(r['lost'] for r in rows)} | "
                     f"{sum(r['duplicated'] for r in rows)} | {_fmt_s([r['time_to_serve_s'] for r in rows])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="how many times to run the suite (default 1)")
    parser.add_argument("--from-jsonl", type=Path, nargs="*", help="print the table of saved row files instead")
    parser.add_argument("--keep", type=Path, help="directory to keep each run's rows in (run-<n>.jsonl)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.from_jsonl:
        print(table([load_rows(p) for p in args.from_jsonl]))
        return 0
    status = 0
    runs = []
    keep = args.keep or Path(tempfile.mkdtemp(prefix="fault-table-"))
    keep.mkdir(parents=True, exist_ok=True)
    for n in range(args.runs):
        report = keep / f"run-{n + 1}.jsonl"
        report.unlink(missing_ok=True)
        started = time.monotonic()
        status = run_suite(report, args.pytest_args) or status
        rows = load_rows(report)
        runs.append(rows)
        print(f"run {n + 1}: {len(rows)} rows in {time.monotonic() - started:.0f} s ({report})", file=sys.stderr)
    print(table(runs))
    return status


if __name__ == "__main__":
    sys.exit(main())
