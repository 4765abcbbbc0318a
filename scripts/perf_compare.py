"""Compare the end-to-end performance of two checkouts of minipulsar, interleaved.

Both checkouts are measured in the same session, alternating (run 1: base then
head, run 2: head then base, ...), so that a shared, noisy machine slows both
alike. For each run and checkout a fresh ``minipulsar standalone`` of that
checkout (2 bookies + broker, journal sync on) is started in a temporary
directory, every scenario is run with that checkout's own ``minipulsar-perf
e2e`` (one producer and one acknowledging consumer in one process), and the
standalone and its bookies are stopped. Every process runs with this
interpreter (``sys.executable``) and ``PYTHONPATH=<checkout>``, so an older
commit only needs a worktree::

    git worktree add /tmp/wt-base <commit>
    .venv/bin/python scripts/perf_compare.py --base /tmp/wt-base --head . --runs 3
    .venv/bin/python scripts/perf_compare.py --base /tmp/wt-base --head . --runs 5 --scenarios latency --duration 30

Scenarios (100-byte messages, 2 s warm-up left out of the figures):

* ``latency``: ``e2e -r 5000 --batch-delay-ms 1``: msg/s received and the
  end-to-end latency p50/p99/p99.9 (ms);
* ``throughput``: ``e2e -r 0 --batch-delay-ms 10`` (as fast as it goes): msg/s
  received and the end-to-end latency p50/p99 (ms).

Output: progress on stderr; on stdout one JSON line per result (``"kind":
"result"``: run, checkout, repo, commit, scenario, figures, perf's summary)
and a last line (``"kind": "summary"``) with, per scenario and checkout, the
median/min/max of every figure and head/base as a ratio of the medians; the
same summary as a table on stderr. Logs (standalone, perf stderr) are kept in
the temporary directory printed at the start.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import env_for, stop_standalone  # noqa: E402  (scripts/soak.py: no repository imports)

REPO = Path(__file__).resolve().parent.parent
READY = re.compile(r"STANDALONE_READY port=(\d+) pid=(\d+) http_port=(-?\d+)")
START_TIMEOUT_S = 90.0
PERF_CODE = "import sys; from client.perf import main; sys.exit(main())"

# scenario -> (perf e2e options, figures recorded)
SCENARIOS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "latency": (["-r", "5000", "-s", "100", "--batch-delay-ms", "1"], ("msg_per_s", "p50_ms", "p99_ms", "p99.9_ms")),
    "throughput": (["-r", "0", "-s", "100", "--batch-delay-ms", "10"], ("msg_per_s", "p50_ms", "p99_ms")),
}


class CompareError(Exception):
    """A failure with a message that says what to look at."""


def progress(msg: str) -> None:
    print(f"[perf-compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def git_commit(repo: Path) -> str:
    """Short commit of ``repo``'s HEAD, ``+dirty`` when tracked files are modified."""
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit or "unknown") + ("+dirty" if dirty else "")


class Standalone:
    """A standalone of checkout ``repo`` with its data and log under ``work``."""

    def __init__(self, repo: Path, work: Path):
        self.repo, self.work = repo, work
        self.data = work / "data"
        self.log = work / "standalone.log"
        cmd = [sys.executable, "-m", "deploy.cli", "standalone", "--port", "0", "--http-port", "0", "--pulsar-port", "0",
               "--data-dir", str(self.data)]
        self._log_f = open(self.log, "ab")
        self.popen = subprocess.Popen(cmd, cwd=str(repo), env=env_for(repo), stdout=subprocess.PIPE,
                                      stderr=self._log_f, stdin=subprocess.DEVNULL, start_new_session=True)
        lines: list[str] = []
        ready = threading.Event()

        def read_stdout():     # finds the ready line, then keeps the pipe drained (into the log)
            for raw in self.popen.stdout:
                line = raw.decode(errors="replace")
                if not ready.is_set():
                    lines.append(line)
                    if READY.match(line):
                        ready.set()
                        continue
                try:
                    self._log_f.write(raw)
                    self._log_f.flush()
                except ValueError:      # closed by stop()
                    return

        reader = threading.Thread(target=read_stdout, daemon=True)
        reader.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.wait(0.2):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with status {self.popen.returncode}" if self.popen.poll() is not None
                       else f"not ready after {START_TIMEOUT_S:g} s")
                self.stop()
                raise CompareError(f"standalone of {repo} did not start ({why}); see {self.log} "
                                   f"(and the bookie logs in {self.data})")
        m = READY.match(lines[-1])
        self.port, self.pid = int(m.group(1)), int(m.group(2))
        self.service_url = f"minipulsar://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """SIGTERM the standalone (SIGKILL its group after 30 s), then SIGKILL any bookie left."""
        stop_standalone(self.popen, self.data)
        self._log_f.close()


def run_scenario(sa: Standalone, scenario: str, args, tag: str) -> dict:
    """Run one scenario with ``sa``'s checkout's perf tool; its figures and perf's summary."""
    options, figures = SCENARIOS[scenario]
    topic = f"persistent://public/default/perf-compare-{tag}-{scenario}-{os.getpid()}"
    log = sa.work / f"perf-{scenario}.log"
    cmd = [sys.executable, "-c", PERF_CODE, "e2e", topic, "--service-url", sa.service_url, *options,
           "-d", f"{args.duration:g}", "--warmup", f"{args.warmup:g}", "--json"]
    # duration + warm-up + perf's own drain wait (30 s) + connecting and closing
    timeout = args.duration + args.warmup + 90
    with open(log, "wb") as err:
        try:
            proc = subprocess.run(cmd, cwd=str(sa.repo), env=env_for(sa.repo), stdout=subprocess.PIPE,
                                  stderr=err, stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CompareError(f"perf e2e ({scenario}) of {sa.repo} did not finish in {timeout:g} s; "
                               f"see {log} and {sa.log}") from None
    out = proc.stdout.decode(errors="replace").strip().splitlines()
    try:
        doc = json.loads(out[-1])
    except (IndexError, ValueError):
        doc = None
    if proc.returncode != 0 or not isinstance(doc, dict) or "consume" not in doc:
        raise CompareError(f"perf e2e ({scenario}) of {sa.repo} failed (exit status {proc.returncode}, "
                           f"{'no' if doc is None else 'an unexpected'} JSON summary); see {log} and {sa.log}")
    consume = doc["consume"]
    lat = consume.get("latency_ms", {})
    values = {"msg_per_s": consume.get("msg_per_s"), "p50_ms": lat.get("p50"), "p99_ms": lat.get("p99"),
              "p99.9_ms": lat.get("p99.9")}
    return {"figures": {k: values[k] for k in figures},
            "perf": {"publish_msg_per_s": doc.get("publish", {}).get("msg_per_s"),
                     "publish_errors": doc.get("publish", {}).get("errors"),
                     "consumed": consume.get("messages"), "not_received": doc.get("not_received"),
                     "latency_source": doc.get("latency_source"), "latency_ms": lat}}


def summarize(results: list[dict], checkouts: dict[str, dict]) -> dict:
    """Per scenario, checkout and figure: median, min, max, n; and head/base of the medians."""
    out: dict = {}
    for scenario in dict.fromkeys(r["scenario"] for r in results):
        figures = SCENARIOS[scenario][1]
        sec = out[scenario] = {}
        for name in checkouts:
            rows = [r for r in results if r["scenario"] == scenario and r["checkout"] == name]
            sec[name] = {}
            for f in figures:
                vals = [r["figures"][f] for r in rows if isinstance(r["figures"].get(f), (int, float))]
                if vals:
                    sec[name][f] = {"median": round(statistics.median(vals), 3), "min": min(vals),
                                    "max": max(vals), "n": len(vals)}
        ratio = {}
        for f in figures:
            b, h = sec.get("base", {}).get(f), sec.get("head", {}).get(f)
            if b and h and b["median"]:
                ratio[f] = round(h["median"] / b["median"], 3)
        sec["head_over_base"] = ratio
    return out


def print_table(summary: dict, checkouts: dict[str, dict]) -> None:
    def num(v: float) -> str:
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"

    lines = ["", "summary (median [min - max] over the runs; head/base = ratio of the medians; "
                 "msg/s: higher is better, latency: lower is better)"]
    for name, c in checkouts.items():
        lines.append(f"  {name}: {c['repo']} @ {c['commit']}")
    for scenario, sec in summary.items():
        figures = SCENARIOS[scenario][1]
        head = f"  {scenario:<10} {'checkout':<8}" + "".join(f"{f:>24}" for f in figures)
        lines += ["", head, "  " + "-" * (len(head) - 2)]
        for name in checkouts:
            n = max((v["n"] for v in sec.get(name, {}).values()), default=0)
            cells = []
            for f in figures:
                v = sec.get(name, {}).get(f)
                cells.append(f"{num(v['median'])} [{num(v['min'])}-{num(v['max'])}]" if v else "-")
            lines.append(f"  {'':<10} {name:<8}" + "".join(f"{c:>24}" for c in cells) + f"   n={n}")
        ratio = sec.get("head_over_base", {})
        lines.append(f"  {'':<10} {'head/base':<8}" + "".join(
            f"{(f'{ratio[f]:.3f}' if f in ratio else '-'):>24}" for f in figures))
    print("\n".join(lines) + "\n", file=sys.stderr, flush=True)


def check_checkout(path: str, flag: str) -> Path:
    repo = Path(path).resolve()
    missing = [p for p in ("deploy/cli.py", "client/perf.py") if not (repo / p).is_file()]
    if missing:
        raise CompareError(f"{flag} {path}: not a minipulsar checkout (no {', '.join(missing)}); "
                           f"make one with: git worktree add {path} <commit>")
    return repo


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--base", required=True, help="the baseline checkout (e.g. a git worktree of an older commit)")
    p.add_argument("--head", default=str(REPO), help="the checkout being measured (default: this one)")
    p.add_argument("--runs", type=int, default=3, help="runs per checkout (default 3)")
    p.add_argument("--scenarios", default="latency,throughput",
                   help=f"comma-separated, of {', '.join(SCENARIOS)} (default: both)")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per scenario (default 20)")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds before measuring (default 2)")
    p.add_argument("--keep", action="store_true", help="keep the standalones' data directories (default: "
                                                       "deleted after each run; logs are always kept)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        print(f"error: unknown scenario(s) {unknown or args.scenarios!r}; choose from {', '.join(SCENARIOS)}",
              file=sys.stderr)
        return 2
    if args.runs < 1 or args.duration <= 0:
        print("error: --runs must be >= 1 and --duration > 0", file=sys.stderr)
        return 2
    try:
        checkouts = {name: {"repo": str(repo), "commit": git_commit(repo)}
                     for name, repo in (("base", check_checkout(args.base, "--base")),
                                        ("head", check_checkout(args.head, "--head")))}
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="perf-compare-"))
    progress(f"base {checkouts['base']['repo']} @ {checkouts['base']['commit']}; "
             f"head {checkouts['head']['repo']} @ {checkouts['head']['commit']}; {args.runs} run(s) of "
             f"{', '.join(scenarios)}, {args.duration:g} s each (+{args.warmup:g} s warm-up); logs in {work}")
    results: list[dict] = []
    status = 0
    try:
        for run in range(1, args.runs + 1):
            order = ("base", "head") if run % 2 else ("head", "base")
            for name in order:
                c = checkouts[name]
                tag = f"{run}-{name}"
                sa_dir = work / tag
                sa_dir.mkdir()
                progress(f"run {run} of {args.runs}: {name} ({c['repo']} @ {c['commit']}): starting a standalone")
                sa = Standalone(Path(c["repo"]), sa_dir)
                try:
                    for scenario in scenarios:
                        progress(f"run {run} of {args.runs}: {name} @ {c['commit']}: {scenario} "
                                 f"({args.duration:g} s)")
                        res = run_scenario(sa, scenario, args, tag)
                        row = {"kind": "result", "run": run, "checkout": name, "repo": c["repo"],
                               "commit": c["commit"], "scenario": scenario, "duration_s": args.duration,
                               **res}
                        results.append(row)
                        print(json.dumps(row, sort_keys=True), flush=True)
                        figs = "  ".join(f"{k} {v}" for k, v in res["figures"].items())
                        warn = ""
                        if res["perf"]["not_received"] or res["perf"]["publish_errors"]:
                            warn = (f"  (!) not received {res['perf']['not_received']}, "
                                    f"send errors {res['perf']['publish_errors']}")
                        progress(f"run {run} of {args.runs}: {name} {scenario}: {figs}{warn}")
                finally:
                    sa.stop()
                if not args.keep:
                    shutil.rmtree(sa.data, ignore_errors=True)
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        status = 1
    except KeyboardInterrupt:
        print("interrupted; the summary covers the runs done so far", file=sys.stderr, flush=True)
        status = 130
    if results:
        summary = summarize(results, checkouts)
        print(json.dumps({"kind": "summary", "runs": args.runs, "scenarios": scenarios, "checkouts": checkouts,
                          "duration_s": args.duration, "summary": summary}, sort_keys=True), flush=True)
        print_table(summary, checkouts)
    return status


if __name__ == "__main__":
    sys.exit(main())
