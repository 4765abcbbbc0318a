"""The summary output of ``minipulsar geo demo`` (:mod:`deploy.flights_replay`): the
tables printed after a run, and the results it returns (``--json``).

Printed, as tables (:func:`deploy.console.table`): the replay per cluster
(flights, seconds, flights/s, flights dropped by Pulsar's deduplication), the
delay board, the exactly-once check per cluster, replication lag per cluster
pair (publish -> delivery p50/p99 in ms, replicator delay p50/p99 in s), the
replicated subscriptions' backlogs (PIP-33), each board's duplicates and
losses, and the failover, if any.
"""
from __future__ import annotations

import time

from deploy.console import human_count, table

__all__ = ["DemoReport"]


class DemoReport:
    """The output half of :class:`deploy.flights_replay.Demo` (a mixin working on the
    demo's state: ``topo``, ``flights``, ``regions``, ``lag``, ``repl_delay``,
    ``failover_report``, ``victim`` and its ``sub_name``). Prints to stdout; raises nothing
    of its own."""

    def _print_checks(self, checks: dict) -> None:
        rows = []
        for name in self.topo.names:
            c = checks[name]
            rows.append((name, human_count(c["stored"]), human_count(c["distinct"]), c["duplicates"], c["missing"],
                         c["order_violations"], "OK" if c["ok"] else "FAIL"))
        print(f"\nExactly once: every cluster holds the {len(self.flights):,} replayed flights once "
              f"(counted by flight identity), in replay order per (origin, carrier)")
        print(table(["cluster", "stored", "distinct", "duplicates", "missing", "order errors", "check"], rows,
                    right=[1, 2, 3, 4, 5]))

    def _report(self, replay_s, checks, replication_ok, boards_ok, agree_ok, sub_backlogs) -> dict:
        topo = self.topo
        regions = [r for r in self.regions.values()]
        rows = []
        for r in regions:
            if not r.flights:
                continue
            took = max(1e-6, (r.finished or time.monotonic()) - r.started)
            rows.append((r.name, r.origin, human_count(len(r.flights)), f"{took:.1f}s",
                         f"{len(r.flights) / took:,.0f}", human_count(r.deduplicated), len(r.errors)))
        total = sum(len(r.flights) for r in regions)
        rows.append(("total", "", human_count(total), f"{replay_s:.1f}s", f"{total / max(replay_s, 1e-6):,.0f}",
                     human_count(sum(r.deduplicated for r in regions)), sum(len(r.errors) for r in regions)))
        print("\nReplay (flights produced per cluster; 'already stored' = dropped by deduplication)")
        print(table(["cluster", "origin", "flights", "time", "flights/s", "already stored", "errors"], rows,
                    right=[2, 3, 4, 5, 6]))

        owners = getattr(self, "owners_at_start", {})
        if owners:
            rows = []
            for cluster, parts in owners.items():
                by_broker: dict[str, list[int]] = {}
                for part, url in sorted(parts.items()):
                    by_broker.setdefault(url.split("://", 1)[-1], []).append(part)
                rows += [(cluster, broker, ", ".join(map(str, ps))) for broker, ps in sorted(by_broker.items())]
            print("\nPartitions per broker at the start of the replay (placed by each cluster's load manager; "
                  "topics lookup)")
            print(table(["cluster", "broker", "partitions"], rows))

        first = regions[0].board
        agree = all(r.board.table_rows() == first.table_rows() for r in regions)
        print(f"\nDelay board (departures and mean departure delay per carrier; the {len(regions)} regional "
              f"boards {'agree' if agree else 'DIFFER'})")
        print(table(["carrier", "departures", "cancelled", "mean delay (min)"],
                    [(c, human_count(n), human_count(k), "-" if d is None else f"{d:.1f}")
                     for c, n, k, d in first.table_rows()], right=[1, 2, 3]))

        self._print_checks(checks)

        rows, lag_json = [], {}
        for src in topo.names:
            for dst in topo.names:
                p = self.lag.percentiles(src, dst)
                samples = sorted(self.repl_delay.get((src, dst), []))
                if p is None and not samples:
                    continue
                rp50 = samples[len(samples) // 2] if samples else None
                rp99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] if samples else None
                label = f"{src} -> {dst}" if src != dst else f"{src} (local)"
                rows.append((label, "-" if p is None else human_count(p[2]), "-" if p is None else p[0],
                             "-" if p is None else p[1], "-" if rp50 is None else f"{rp50:.2f}",
                             "-" if rp99 is None else f"{rp99:.2f}"))
                lag_json[f"{src}->{dst}"] = {"messages": p[2] if p else 0, "p50_ms": p[0] if p else None,
                                             "p99_ms": p[1] if p else None, "replicator_delay_p50_s": rp50,
                                             "replicator_delay_p99_s": rp99}
        print("\nReplication lag per cluster pair: replicator delay (age of the oldest message not yet "
              "replicated, sampled every second) and publish -> delivery to the remote board (includes the "
              "board's own backlog; 'local' rows for comparison)")
        print(table(["pair", "messages", "delivery p50 ms", "delivery p99 ms", "replicator p50 s",
                     "replicator p99 s"], rows,
                    right=[1, 2, 3, 4, 5]))

        rows = []
        for r in regions:
            sub = self.sub_name(r.name)
            cells = [sub_backlogs.get((sub, c)) for c in topo.names]
            rows.append((sub, r.consuming_in, *["absent" if v is None else human_count(v) for v in cells],
                         "yes" if all(v == 0 for v in cells) else "NO"))
        print("\nReplicated subscriptions: backlog of each board's subscription in every cluster after its "
              "consumers acknowledged (0 everywhere = positions agree)")
        print(table(["subscription", "consumed in", *topo.names, "agree"], rows,
                    right=list(range(2, 2 + len(topo.names)))))

        board_rows, boards_json = [], {}
        for r in regions:
            expected = checks[r.consuming_in]["distinct"]
            losses = max(0, expected - len(r.board.seen))
            board_rows.append((r.name, r.consuming_in, human_count(r.board.deliveries), human_count(len(r.board.seen)),
                               r.board.duplicates, losses))
            missed = [f for f in self.flights if f.identity not in r.board.seen]
            boards_json[r.name] = {"consumed_in": r.consuming_in, "deliveries": r.board.deliveries,
                                   "flights": len(r.board.seen), "duplicates": r.board.duplicates, "losses": losses,
                                   "missed_sample": [(f.seq, f.origin, f.carrier) for f in missed[:20]],
                                   "missed_by_origin": {o: sum(1 for f in missed if f.origin == o)
                                                        for o in sorted({f.origin for f in missed})}}
        print("\nBoards (deliveries, distinct flights counted, duplicates = deliveries of a flight already counted, "
              "losses = flights never delivered)")
        print(table(["board", "consumed in", "deliveries", "flights", "duplicates", "losses"], board_rows,
                    right=[2, 3, 4, 5]))
        whole_cluster = self.failover_report.get("mode") == "cluster"
        if whole_cluster:
            f = self.failover_report
            b = boards_json[f["killed"]]
            print(f"\nFailover: every broker of {f['killed']} killed at flight {f['at_flight']:,} of its replay, its "
                  f"board moved to {f['moved_to']} in {f['consumers_moved_in_s']}s, brokers back after "
                  f"{f['down_s']}s: duplicates {b['duplicates']:,}, losses {b['losses']:,}")
        elif self.failover_report:
            f = self.failover_report
            before = f.pop("duplicates_before_kill")
            f.pop("deliveries_before_kill", None)
            redelivered = {r.name: r.board.duplicates - before.get(r.name, 0) for r in regions}
            f["redelivered"] = sum(redelivered.values())
            f["redelivered_by_board"] = redelivered
            f["losses"] = sum(boards_json[r.name]["losses"] for r in regions)
            moved = ", ".join(str(p) for p in f["partitions_moved"])
            new = ", ".join(sorted({u.split("://", 1)[-1] for u in f["new_owners"].values()})) or "-"

            def secs(v):
                """Seconds with two decimals, or '-' when not measured."""
                return "-" if v is None else f"{v:.2f}s"
            print(f"\nFailover inside {f['cluster']}: broker {f['broker'].split('://', 1)[-1]} (owner of partition(s) "
                  f"{moved} of {f['partitions']}) killed -9 at flight {f['at_flight']:,} of the cluster's replay, not "
                  f"restarted; new owner: {new}")
            print(table(["takeover", "seconds after the kill"],
                        [("first send acknowledged through the new owner", secs(f["first_publish_s"])),
                         ("every moved partition has a live owner (lookup)", secs(f["owners_live_s"])),
                         ("every moved partition took a send again", secs(f["all_partitions_published_s"]))],
                        right=[1]))
            print(f"redelivered messages (deliveries of a flight a board had already counted): {f['redelivered']:,} "
                  f"(" + ", ".join(f"board {k}: {v:,}" for k, v in redelivered.items()) + f"); losses {f['losses']:,}")
        losses = sum(b["losses"] for b in boards_json.values())
        # After --failover=cluster the restarted cluster receives the others' backlog late; a standby copy
        # there only catches up at its active cluster's next (follow-up) snapshot after that backlog arrived,
        # which may come after the wait above. So agreement is reported but not required then; a failover
        # inside a cluster (the cluster keeps serving) must leave every copy agreeing.
        ok = (replication_ok and boards_ok and (agree_ok or whole_cluster) and losses == 0 and agree
              and all(c["ok"] for c in checks.values()) and not any(r.errors for r in regions))
        if whole_cluster and not agree_ok:
            print("\nnote: after --failover=cluster some standby subscription copies lag (see above): they move at the "
                  "next snapshot of their active cluster after the late data reached them; not counted as a "
                  "failure of the failover run")
        errors = [e for r in regions for e in r.errors[:5]]
        if errors:
            print("\nerrors:\n  " + "\n  ".join(errors))
        import resource
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"\ngeo demo: {'all checks passed' if ok else 'SOME CHECKS FAILED'} "
              f"(this process: peak memory {peak_mb:,.0f} MiB; servers: minipulsar geo status)")
        return {"ok": ok, "flights": len(self.flights), "replay_seconds": round(replay_s, 2),
                "throughput": {r.name: round(len(r.flights) / max(1e-6, r.finished - r.started), 1)
                               for r in regions if r.flights and r.finished},
                "total_throughput": round(total / max(replay_s, 1e-6), 1),
                "deduplicated": {r.name: r.deduplicated for r in regions},
                "checks": checks, "lag": lag_json, "boards": boards_json, "boards_agree": agree,
                "board": [list(x) for x in first.table_rows()],
                "subscriptions": {f"{s}@{c}": v for (s, c), v in sub_backlogs.items()},
                "replication_ok": replication_ok, "boards_ok": boards_ok, "positions_agree": agree_ok,
                "failover": self.failover_report, "errors": errors,
                "partition_owners": {c: {str(p): u for p, u in parts.items()} for c, parts in owners.items()}, "unassigned_flights": self.unassigned,
                "demo_peak_memory_mb": round(peak_mb, 1)}
