"""What the live dashboard shows, as plain data (pure functions, no I/O): a topic's
summary from its stats (Pulsar's TopicStats names), a cluster's brokers from their
load reports (Pulsar's ``LocalBrokerData``) with the ones seen before and gone now
marked ``down``, and one cluster's snapshot. The broker's dashboard resource and
``minipulsar geo dashboard`` build the same snapshots from these.

A snapshot (JSON)::

    {"name": cluster, "time_ms": ms, "leader": broker id or None,
     "brokers": [{"id": "host:port" (gRPC), "service_url", "web_service_url", "status": "up" | "down",
                  "leader": bool, "cpu": % of one core, "msg_rate_in" / "msg_rate_out": msgs/s,
                  "bundles": {"tenant/ns/0x.._0x..": topics}, "topics": n}],
     "topics": [topic summaries, see :func:`topic_summary`]}
"""
from __future__ import annotations

from typing import Iterable, Optional

__all__ = ["topic_summary", "broker_row", "BrokerMemory", "cluster_snapshot"]


def topic_summary(name: str, stats: dict, owner: str) -> dict:
    """``{"name", "owner", "msg_rate_in", "msg_rate_out" (msgs/s), "msg_in" (count),
    "storage" (bytes), "subscriptions": {sub: {"backlog" (entries), "rate_out" (msgs/s),
    "mark_delete" ("ledger:entry"), "replicated", "consumers"}}, "replication": {remote:
    {"backlog" (entries), "delay_s" (s), "rate_out" (msgs/s), "connected"}}}`` of one topic."""
    subs = {}
    for sub, s in (stats.get("subscriptions") or {}).items():
        if not s.get("isDurable", True):
            continue
        subs[sub] = {"backlog": s.get("msgBacklog", 0), "rate_out": round(s.get("msgRateOut", 0.0), 2),
                     "mark_delete": s.get("markDeletePosition", ""), "replicated": bool(s.get("isReplicated")),
                     "consumers": len(s.get("consumers") or [])}
    repl = {remote: {"backlog": r.get("replicationBacklog", 0),
                     "delay_s": round(float(r.get("replicationDelayInSeconds", 0.0)), 3),
                     "rate_out": round(r.get("msgRateOut", 0.0), 2), "connected": bool(r.get("connected"))}
            for remote, r in (stats.get("replication") or {}).items()}
    return {"name": name, "owner": owner, "msg_rate_in": round(stats.get("msgRateIn", 0.0), 2),
            "msg_rate_out": round(stats.get("msgRateOut", 0.0), 2), "msg_in": stats.get("msgInCounter", 0),
            "storage": stats.get("storageSize", 0), "subscriptions": subs, "replication": repl}


def broker_row(report: dict, leader: Optional[str], status: str = "up") -> dict:
    """One broker's row from its load report dict (``LoadReport.to_json``)."""
    url = report.get("service_url", "")
    return {"id": url.split("://", 1)[-1], "service_url": url, "web_service_url": report.get("web_service_url", ""),
            "status": status, "leader": url == leader, "cpu": report.get("cpu", 0.0),
            "msg_rate_in": round(report.get("msg_rate_in", 0.0), 2),
            "msg_rate_out": round(report.get("msg_rate_out", 0.0), 2),
            "bundles": {b: v.get("topics", 0) if isinstance(v, dict) else 0
                        for b, v in (report.get("bundles") or {}).items()},
            "topics": report.get("topics", 0)}


class BrokerMemory:
    """The brokers of one cluster seen so far: :meth:`merge` returns the live rows plus
    a ``down`` row (no bundles, no load) for each broker seen before that is gone now
    (its session expired: Pulsar's broker znode removed) or that did not answer."""

    def __init__(self) -> None:
        self.seen: dict[str, dict] = {}

    def merge(self, live: Iterable[dict], unreachable: Iterable[str] = ()) -> list[dict]:
        """``live``: broker rows; ``unreachable``: ids that did not answer (shown down
        at once, before their session expires). Rows sorted by id."""
        unreachable = set(unreachable)
        rows = {}
        for row in live:
            row = dict(row)
            if row["id"] in unreachable:
                row.update(status="down", leader=False, cpu=0.0, msg_rate_in=0.0, msg_rate_out=0.0)
            rows[row["id"]] = row
            self.seen[row["id"]] = row
        for bid, row in self.seen.items():
            if bid not in rows:
                rows[bid] = {**row, "status": "down", "leader": False, "cpu": 0.0, "msg_rate_in": 0.0,
                             "msg_rate_out": 0.0, "bundles": {}, "topics": 0}
        return [rows[k] for k in sorted(rows)]


def cluster_snapshot(name: str, time_ms: int, brokers: list[dict], topics: list[dict]) -> dict:
    """A cluster's snapshot (see the module doc); topics sorted by name."""
    leader = next((b["id"] for b in brokers if b.get("leader") and b["status"] == "up"), None)
    return {"name": name, "time_ms": time_ms, "leader": leader, "brokers": brokers,
            "topics": sorted(topics, key=lambda t: t["name"])}
