"""Figures of a ``scripts/soak.py --scenario mixed`` run (:mod:`soak_mixed`): throughput,
latency percentiles, faults survived, messages lost / duplicated per topic and the RSS and
open fds of every process at the start and the end; and their report on stderr."""
from __future__ import annotations

import collections
import statistics
import sys
import time


def progress(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentile(values, q: float) -> float | None:
    """The ``q``-th percentile (nearest rank) of ``values``; None when empty."""
    if not len(values):
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100.0 * (len(s) - 1))))]


def summarize_mixed(args, stats, stored: dict, all_topics: list[str], geo_topic: str, subs: dict,
                    samples: list[dict], faults: list[dict], duration_s: float, load_s: float) -> dict:
    """The figures of a mixed run (``stats``: :class:`soak_mixed.Stats`; ``stored``: key ->
    Counter of stored sequence numbers, key ``B:<topic>`` for cluster B): throughput, p99,
    faults, lost / duplicated per topic, RSS and fds per process. Returns the result dict
    (``summary``, ``topics``, ``processes``, ``faults``, ``samples``)."""
    acked_total = sum(len(stats.acked[t]) for t in all_topics)
    lost_stored = dup_stored = lost_delivery = redelivered = unacked_stored = 0
    per_topic = {}
    keys = [*all_topics, "B:" + geo_topic]
    for key in keys:
        topic = key[2:] if key.startswith("B:") else key
        acked = stats.acked[topic]
        counts = stored.get(key, collections.Counter())
        delivered = stats.delivered[key]
        row = {"acked": len(acked), "stored": len(counts), "lost": len(acked - set(counts)),
               "duplicated": sum(c - 1 for c in counts.values() if c > 1),
               "unacknowledged_but_stored": len(set(counts) - acked),
               "never_delivered": len(acked - set(delivered)),
               "redelivered": sum(c - 1 for c in delivered.values() if c > 1),
               "subscription": "Shared (cluster B)" if key.startswith("B:") else subs[topic]}
        per_topic[key] = row
        lost_stored += row["lost"]
        dup_stored += row["duplicated"]
        lost_delivery += row["never_delivered"]
        redelivered += row["redelivered"]
        unacked_stored += row["unacknowledged_but_stored"]

    procs: dict[str, dict] = {}
    warm = next((s for s in samples if s["t"] >= min(60.0, load_s / 4)), samples[0] if samples else None)
    for s in samples:
        for label, v in s["procs"].items():
            p = procs.setdefault(label, {"pids": [], "first": None, "last": None, "last_pid_first": None})
            if v["rss_mb"] is None:
                continue
            if not p["pids"] or p["pids"][-1] != v["pid"]:
                p["pids"].append(v["pid"])
                p["last_pid_first"] = {"t": s["t"], **v}
            if p["first"] is None and (warm is None or s["t"] >= warm["t"]):
                p["first"] = {"t": s["t"], **v}
            p["last"] = {"t": s["t"], **v}
    processes = {}
    for label, p in procs.items():
        if p["first"] is None or p["last"] is None:
            continue
        steady = p["last_pid_first"] if len(p["pids"]) > 1 else p["first"]
        processes[label] = {
            "restarts": len(p["pids"]) - 1,
            "rss_mb_start": p["first"]["rss_mb"], "rss_mb_end": p["last"]["rss_mb"],
            "fds_start": p["first"]["fds"], "fds_end": p["last"]["fds"],
            # over the lifetime of the process alive at the end (since warm-up when never restarted)
            "rss_growth_mb_last_process": round(p["last"]["rss_mb"] - steady["rss_mb"], 1),
            "fd_growth_last_process": (p["last"]["fds"] - steady["fds"]) if steady["fds"] is not None
            and p["last"]["fds"] is not None else None,
            "last_process_observed_s": round(p["last"]["t"] - steady["t"], 1)}
    summary = {
        "duration_s": round(duration_s, 1), "load_s": round(load_s, 1), "rate": args.rate,
        "acked_msgs": acked_total, "throughput_msg_s": round(acked_total / load_s, 1) if load_s else None,
        "publish_p50_ms": _r(percentile(stats.publish_ms, 50)), "publish_p99_ms": _r(percentile(stats.publish_ms, 99)),
        "publish_max_ms": _r(max(stats.publish_ms) if stats.publish_ms else None),
        "e2e_p50_ms": _r(percentile(stats.e2e_ms, 50)), "e2e_p99_ms": _r(percentile(stats.e2e_ms, 99)),
        "send_errors": stats.send_errors,
        "faults": len(faults), "faults_survived": sum(1 for f in faults if f["survived"]),
        "recovery_s_median": _r(statistics.median([f["recovered_in_s"] for f in faults if f["survived"]])
                                if any(f["survived"] for f in faults) else None),
        "lost": lost_stored, "duplicated": dup_stored, "lost_in_delivery": lost_delivery,
        "redelivered_to_consumers": redelivered, "nacked": len(stats.nacked),
        "unacknowledged_but_stored": unacked_stored,
        "ok": lost_stored == 0 and dup_stored == 0 and lost_delivery == 0 and all(f["survived"] for f in faults),
    }
    return {"scenario": "mixed", "summary": summary, "topics": per_topic, "processes": processes,
            "faults": faults, "samples": samples}


def _r(x):
    return None if x is None else round(x, 1)


def print_report(result: dict) -> None:
    """The run's figures on stderr, one line each."""
    s = result["summary"]
    progress(f"mixed: {s['acked_msgs']} msgs acknowledged in {s['load_s']}s = {s['throughput_msg_s']} msg/s; "
             f"publish p50 {s['publish_p50_ms']} p99 {s['publish_p99_ms']} max {s['publish_max_ms']} ms; "
             f"end-to-end p50 {s['e2e_p50_ms']} p99 {s['e2e_p99_ms']} ms")
    progress(f"mixed: faults {s['faults_survived']}/{s['faults']} survived (median recovery "
             f"{s['recovery_s_median']} s); LOST {s['lost']} DUPLICATED {s['duplicated']} "
             f"never delivered {s['lost_in_delivery']}; redelivered {s['redelivered_to_consumers']} "
             f"(nacked {s['nacked']}); send errors {s['send_errors']}; ok={s['ok']}")
    for key, row in result["topics"].items():
        progress(f"  {key} [{row['subscription']}]: {row}")
    for label, p in sorted(result["processes"].items()):
        progress(f"  {label:14s} restarts {p['restarts']:2d}  RSS MiB {p['rss_mb_start']} -> {p['rss_mb_end']} "
                 f"(last process +{p['rss_growth_mb_last_process']} over {p['last_process_observed_s']} s)  "
                 f"fds {p['fds_start']} -> {p['fds_end']} (last process {p['fd_growth_last_process']:+d})"
                 if p['fd_growth_last_process'] is not None else f"  {label}: {p}")
