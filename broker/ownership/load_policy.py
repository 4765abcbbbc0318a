"""Placement and shedding decisions of the load manager, pure (no I/O).

Follows Pulsar's ``ModularLoadManagerImpl`` (assign an unowned bundle to the
least-loaded live broker, ``LeastLongTermMessageRate`` simplified) and
``ThresholdShedder`` (unload the hottest bundle of a broker whose load stays
above the cluster average by ``load_balancer_broker_overloaded_threshold_percentage``),
both simplified. A broker's load report is a dict (``LoadReport.to_json``).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

__all__ = ["LoadReport", "broker_score", "select_broker", "ShedDecision", "find_bundle_to_shed"]


@dataclasses.dataclass
class LoadReport:
    """What a broker publishes under ``/loadbalance/brokers/<host:port>`` (Pulsar's
    ``LocalBrokerData``): ``service_url``; ``bundles`` (``{"tenant/ns/0x.._0x..":
    {"topics": n, "msg_rate_in": msgs/s, "msg_rate_out": msgs/s, "msg_throughput_in":
    bytes/s, "msg_throughput_out": bytes/s}}``); totals ``topics``, ``msg_rate_in``,
    ``msg_rate_out`` (msgs/s), ``msg_throughput_in``/``_out`` (bytes/s); ``cpu`` (% of
    one core over the last interval); ``timestamp_ms``; ``web_service_url`` (``http(s)://host:port``
    of its REST admin, Pulsar's ``webServiceUrl``; "" without one)."""

    service_url: str
    bundles: dict = dataclasses.field(default_factory=dict)
    topics: int = 0
    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    msg_throughput_in: float = 0.0
    msg_throughput_out: float = 0.0
    cpu: float = 0.0
    timestamp_ms: int = 0
    web_service_url: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "LoadReport":
        """From ``to_json``'s dict; unknown keys ignored, missing ones default.
        Raises TypeError/ValueError for a value of the wrong type."""
        names = {f.name for f in dataclasses.fields(cls)}
        report = cls(**{k: v for k, v in data.items() if k in names})
        if not isinstance(report.service_url, str) or not isinstance(report.bundles, dict):
            raise ValueError("load report needs a service_url string and a bundles object")
        return report


def broker_score(report: LoadReport) -> float:
    """A broker's load: messages in + out per second, plus 1 per owned bundle so that an
    idle cluster still spreads bundles (Pulsar's message-rate based placement, simplified)."""
    return float(report.msg_rate_in) + float(report.msg_rate_out) + len(report.bundles)


def select_broker(reports: Iterable[LoadReport], pending: Optional[dict] = None) -> Optional[str]:
    """The service URL of the least-loaded broker of ``reports`` (ties broken by URL),
    counting ``pending`` (``{service_url: bundles assigned since its last report}``) as
    owned; None when there is no broker."""
    pending = pending or {}
    best = None
    for report in reports:
        key = (broker_score(report) + pending.get(report.service_url, 0), report.service_url)
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


@dataclasses.dataclass(frozen=True)
class ShedDecision:
    """Unload ``bundle`` (``tenant/ns/0x.._0x..``) from the broker ``service_url``."""

    service_url: str
    bundle: str


def find_bundle_to_shed(reports: list[LoadReport], threshold_percentage: float,
                        min_rate: float = 10.0) -> Optional[ShedDecision]:
    """Pulsar's ``ThresholdShedder``, simplified: the broker whose message rate (in +
    out, msgs/s) is above the cluster average by more than ``threshold_percentage`` %
    and above ``min_rate``, and owns at least two bundles, gives up its busiest
    bundle. None when no broker is overloaded or there are fewer than two brokers."""
    if len(reports) < 2:
        return None
    rates = {r.service_url: float(r.msg_rate_in) + float(r.msg_rate_out) for r in reports}
    average = sum(rates.values()) / len(rates)
    for report in sorted(reports, key=lambda r: -rates[r.service_url]):
        rate = rates[report.service_url]
        if rate < min_rate or rate <= average * (1 + threshold_percentage / 100.0):
            return None
        if len(report.bundles) < 2:
            continue

        def bundle_rate(item):
            data = item[1] if isinstance(item[1], dict) else {}
            return float(data.get("msg_rate_in", 0)) + float(data.get("msg_rate_out", 0))

        name, _ = max(report.bundles.items(), key=bundle_rate)
        return ShedDecision(report.service_url, name)
    return None
