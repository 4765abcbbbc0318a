"""Summarize a stall-watch directory (see ``sitecustomize.py`` here).

    python scripts/stallwatch/report.py DIR [--start UNIX_S] [--minute-s 60]

Prints, per process (named from its command line: broker, bookie-N, perf),
the number of main-thread stalls, their longest, and the top frame that held
most of the stalled time; then per minute after ``--start`` the stalls per
process. ``summarize()`` returns the same as a dict (used by
``scripts/soak.py --stall-watch``).
"""
from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path


def _name(argv: str) -> str:
    m = re.search(r"--data-dir \S*/(bookie-\d+)", argv)
    if m:
        return m.group(1)
    if " standalone" in argv:
        return "broker"
    if " e2e " in argv or "perf" in argv:
        return "perf"
    return "other"


def summarize(directory: str | Path, start: float | None = None, minute_s: float = 60.0) -> dict:
    """``{"processes": {name: {"stalls", "longest_ms", "stalled_ms", "top", "gc_over_20ms",
    "oversleeps"}}, "per_minute": [{name: [count, longest_ms]}]}`` for the stall files of
    ``directory``; minutes count from ``start`` (unix seconds; default: the first event)."""
    procs: dict[str, dict] = {}
    events = []
    for path in sorted(Path(directory).glob("stall.*")):
        lines = path.read_text(errors="replace").splitlines()
        if not lines or not lines[0].startswith("PROC "):
            continue
        name = _name(lines[0])
        if name == "other":
            continue
        p = procs.setdefault(name, {"stalls": 0, "longest_ms": 0, "stalled_ms": 0, "top": None,
                                    "gc_over_20ms": 0, "oversleeps": 0, "_where": collections.Counter()})
        for line in lines[1:]:
            parts = line.split(" ", 3)
            kind, t = parts[0], float(parts[1])
            if kind == "STALL":
                ms = int(parts[2][3:])
                p["stalls"] += 1
                p["stalled_ms"] += ms
                p["longest_ms"] = max(p["longest_ms"], ms)
                p["_where"][(parts[3] if len(parts) > 3 else "").split(" <- ")[0]] += ms
                events.append((t, name, ms))
            elif kind == "GC":
                p["gc_over_20ms"] += 1
            elif kind == "OVERSLEEP":
                p["oversleeps"] += 1
    for p in procs.values():
        where = p.pop("_where")
        p["top"] = where.most_common(1)[0][0] if where else None
    per_minute: list[dict] = []
    if events:
        t0 = start if start is not None else min(t for t, _, _ in events)
        for t, name, ms in sorted(events):
            i = int((t - t0) // minute_s)
            if i < 0:
                continue
            while len(per_minute) <= i:
                per_minute.append({})
            count, longest = per_minute[i].get(name, (0, 0))
            per_minute[i][name] = (count + 1, max(longest, ms))
    return {"processes": procs, "per_minute": per_minute}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("directory")
    ap.add_argument("--start", type=float, default=None)
    ap.add_argument("--minute-s", type=float, default=60.0)
    args = ap.parse_args()
    s = summarize(args.directory, args.start, args.minute_s)
    for name, p in sorted(s["processes"].items()):
        print(f"{name:10s} stalls {p['stalls']:4d}  longest {p['longest_ms']:5d} ms  stalled {p['stalled_ms']:6d} ms"
              f"  GC>20ms {p['gc_over_20ms']:3d}  top: {p['top']}")
    for i, minute in enumerate(s["per_minute"]):
        print(f"minute {i + 1:3d}: " + ", ".join(f"{n} {c} (max {m} ms)" for n, (c, m) in sorted(minute.items())))
    print(json.dumps(s))


if __name__ == "__main__":
    main()
