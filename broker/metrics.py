"""Prometheus metrics with Pulsar's names, served on the broker's HTTP port at
``/metrics``. A custom collector reads the topics at scrape time (from the
HTTP server thread; it only copies numbers)."""
from __future__ import annotations

import logging
from typing import Optional

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)


class BrokerCollector:
    """Per-topic metrics labelled cluster/namespace/topic (Pulsar's topic-level
    metrics), plus per-subscription backlog and per-replicator figures."""

    def __init__(self, service):
        self.service = service

    def collect(self):
        cluster = self.service.config.cluster_name
        labels = ["cluster", "namespace", "topic"]
        in_msgs = CounterMetricFamily("pulsar_in_messages", "Messages published", labels=labels)
        in_bytes = CounterMetricFamily("pulsar_in_bytes", "Bytes published", labels=labels)
        rate_in = GaugeMetricFamily("pulsar_rate_in", "Messages/s published", labels=labels)
        rate_out = GaugeMetricFamily("pulsar_rate_out", "Messages/s dispatched", labels=labels)
        storage = GaugeMetricFamily("pulsar_storage_size", "Bytes stored", labels=labels)
        backlog = GaugeMetricFamily("pulsar_msg_backlog", "Entries in the largest subscription backlog", labels=labels)
        producers = GaugeMetricFamily("pulsar_producers_count", "Connected producers", labels=labels)
        subs = GaugeMetricFamily("pulsar_subscriptions_count", "Subscriptions", labels=labels)
        consumers = GaugeMetricFamily("pulsar_consumers_count", "Connected consumers", labels=labels)
        sub_backlog = GaugeMetricFamily("pulsar_subscription_back_log", "Subscription backlog (entries, markers excluded)",
                                        labels=labels + ["subscription"])
        sub_unacked = GaugeMetricFamily("pulsar_subscription_unacked_messages", "Unacknowledged messages",
                                        labels=labels + ["subscription"])
        repl_labels = labels + ["remote_cluster"]
        repl_backlog = GaugeMetricFamily("pulsar_replication_backlog", "Entries not yet replicated", labels=repl_labels)
        repl_rate = GaugeMetricFamily("pulsar_replication_rate_out", "Messages/s replicated", labels=repl_labels)
        repl_tput = GaugeMetricFamily("pulsar_replication_throughput_out", "Bytes/s replicated", labels=repl_labels)
        repl_delay = GaugeMetricFamily("pulsar_replication_delay_in_seconds", "Age of the oldest unreplicated entry",
                                       labels=repl_labels)
        repl_connected = GaugeMetricFamily("pulsar_replication_connected_count", "1 when the replicator is connected",
                                           labels=repl_labels)
        for topic in list(self.service.topics.values()):
            try:
                st = topic.stats()
            except Exception as exc:  # a topic closing under us
                log.debug("stats of %s: %s", topic.name, exc)
                continue
            lv = [cluster, topic.name.namespace, str(topic.name)]
            in_msgs.add_metric(lv, st["msgInCounter"])
            in_bytes.add_metric(lv, st["bytesInCounter"])
            rate_in.add_metric(lv, st["msgRateIn"])
            rate_out.add_metric(lv, st["msgRateOut"])
            storage.add_metric(lv, st["storageSize"])
            backlog.add_metric(lv, st["backlogSize"])
            producers.add_metric(lv, len(st["publishers"]))
            subs.add_metric(lv, len(st["subscriptions"]))
            consumers.add_metric(lv, sum(len(s["consumers"]) for s in st["subscriptions"].values()))
            for name, s in st["subscriptions"].items():
                sub_backlog.add_metric(lv + [name], s["msgBacklog"])
                sub_unacked.add_metric(lv + [name], s["unackedMessages"])
            for remote, r in st.get("replication", {}).items():
                rl = lv + [remote]
                repl_backlog.add_metric(rl, r.get("replicationBacklog", 0))
                repl_rate.add_metric(rl, r.get("msgRateOut", 0.0))
                repl_tput.add_metric(rl, r.get("msgThroughputOut", 0.0))
                repl_delay.add_metric(rl, r.get("replicationDelayInSeconds", 0.0))
                repl_connected.add_metric(rl, 1 if r.get("connected") else 0)
        yield from (in_msgs, in_bytes, rate_in, rate_out, storage, backlog, producers, subs, consumers,
                    sub_backlog, sub_unacked, repl_backlog, repl_rate, repl_tput, repl_delay, repl_connected)
        for extra in getattr(self.service, "extra_metrics", lambda: [])():
            yield extra


def start_metrics_server(service, host: str, port: int) -> tuple[Optional[object], int]:
    """Serve /metrics; returns (server, bound port). Port -1 disables it."""
    if port < 0:
        return None, -1
    registry = CollectorRegistry()
    registry.register(BrokerCollector(service))
    httpd, _thread = start_http_server(port, addr=host, registry=registry)
    return httpd, httpd.server_port
