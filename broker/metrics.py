"""Prometheus metrics with Pulsar's names, served on the broker's HTTP port at
``/metrics`` (``broker.http.metrics_resource``). A custom collector reads the
topics at scrape time (on the event loop; it only copies numbers)."""
from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Optional

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

log = logging.getLogger(__name__)


class BrokerCollector:
    """Per-topic metrics labelled cluster/namespace/topic (Pulsar's topic-level
    metrics), plus per-subscription backlog and per-replicator figures."""

    def __init__(self, service):
        self.service = service

    def collect(self):
        """Called per scrape (HTTP server thread): yields the per-topic families (counts,
        bytes, msgs/s; backlog in entries), the per-subscription and per-replicator ones,
        the entry cache's and the service's ``extra_metrics()``. A topic whose ``stats()``
        fails (closing) is left out of this scrape."""
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
        yield from self._cache_metrics(cluster)
        for extra in getattr(self.service, "extra_metrics", lambda: [])():
            yield extra


    def _cache_metrics(self, cluster: str):
        """Broker-wide entry cache figures (Pulsar's pulsar_ml_cache_* metrics)."""
        factory = getattr(self.service, "ml_factory", None)
        manager = getattr(factory, "cache_manager", None)
        if manager is None:
            return
        caches = manager.caches()
        lv = [cluster]
        used = GaugeMetricFamily("pulsar_ml_cache_used_size", "Bytes held by the entry caches, per-entry overhead "
                                 "included (managed_ledger_cache_size_mb bounds it)", labels=["cluster"])
        used.add_metric(lv, manager.total)
        entries = GaugeMetricFamily("pulsar_ml_cache_entries", "Entries held by the entry caches", labels=["cluster"])
        entries.add_metric(lv, sum(c.count for c in caches))
        hits = CounterMetricFamily("pulsar_ml_cache_hits", "Entry cache lookups that found the entry",
                                   labels=["cluster"])
        hits.add_metric(lv, sum(c.hits for c in caches))
        misses = CounterMetricFamily("pulsar_ml_cache_misses", "Entry cache lookups that did not (read from bookies)",
                                     labels=["cluster"])
        misses.add_metric(lv, sum(c.misses for c in caches))
        evicted = CounterMetricFamily("pulsar_ml_cache_evicted_entries", "Entries evicted from the entry caches, by "
                                      "rule (readers, age, size, trim, inactive)", labels=["cluster", "reason"])
        for reason, n in sorted(manager.evicted_entries.items()):
            evicted.add_metric(lv + [reason], n)
        yield from (used, entries, hits, misses, evicted)


# Upper bounds (seconds) of the GC pause histogram buckets.
GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)


class GcPauseCollector:
    """Histogram of the cyclic garbage collector's pauses per generation
    (``python_gc_pause_seconds{generation}``; the JVM's ``jvm_gc_collection_seconds``
    in Pulsar), plus the last and longest pause (``python_gc_last_pause_seconds``,
    ``python_gc_max_pause_seconds``). A collection stops every thread of the
    process, the broker's event loop included. Timed with ``gc.callbacks``
    (one ``perf_counter`` call at the start and the end of each collection);
    install once per process with :func:`gc_pause_collector`."""

    def __init__(self) -> None:
        self._start = 0.0
        self._buckets = [[0] * (len(GC_PAUSE_BUCKETS) + 1) for _ in range(3)]  # last bucket: +Inf
        self._count = [0, 0, 0]
        self._sum = [0.0, 0.0, 0.0]
        self._last = [0.0, 0.0, 0.0]
        self._max = [0.0, 0.0, 0.0]

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        pause = time.perf_counter() - self._start
        gen = min(int(info.get("generation", 2)), 2)
        i = 0
        while i < len(GC_PAUSE_BUCKETS) and pause > GC_PAUSE_BUCKETS[i]:
            i += 1
        self._buckets[gen][i] += 1
        self._count[gen] += 1
        self._sum[gen] += pause
        self._last[gen] = pause
        if pause > self._max[gen]:
            self._max[gen] = pause

    def collect(self):
        """Yields, per generation 0..2, the pause histogram (seconds, cumulative buckets
        GC_PAUSE_BUCKETS + +Inf) and the last / longest pause gauges (seconds)."""
        hist = HistogramMetricFamily("python_gc_pause_seconds", "Pauses of the cyclic garbage collector "
                                     "(every thread stops), by generation", labels=["generation"])
        last = GaugeMetricFamily("python_gc_last_pause_seconds", "The latest collection's pause, by generation",
                                 labels=["generation"])
        longest = GaugeMetricFamily("python_gc_max_pause_seconds", "The longest pause since start, by generation",
                                    labels=["generation"])
        for gen in range(3):
            counts = list(self._buckets[gen])
            cumulative, buckets = 0, []
            for bound, n in zip([*map(str, GC_PAUSE_BUCKETS), "+Inf"], counts):
                cumulative += n
                buckets.append((bound, cumulative))
            hist.add_metric([str(gen)], buckets, self._sum[gen])
            last.add_metric([str(gen)], self._last[gen])
            longest.add_metric([str(gen)], self._max[gen])
        yield from (hist, last, longest)


_gc_collector: Optional[GcPauseCollector] = None
_gc_lock = threading.Lock()


def gc_pause_collector() -> GcPauseCollector:
    """The process's GcPauseCollector, hooked into ``gc.callbacks`` on first use."""
    global _gc_collector
    with _gc_lock:
        if _gc_collector is None:
            _gc_collector = GcPauseCollector()
            gc.callbacks.append(_gc_collector._callback)
        return _gc_collector


def metrics_registry(service) -> CollectorRegistry:
    """The registry ``/metrics`` serves for ``service``: BrokerCollector + the GC pauses."""
    registry = CollectorRegistry()
    registry.register(BrokerCollector(service))
    registry.register(gc_pause_collector())
    return registry


def start_metrics_server(service, host: str, port: int, certfile: Optional[str] = None,
                         keyfile: Optional[str] = None) -> tuple[Optional[object], int]:
    """Serve /metrics; returns (server, bound port). Port -1 disables it.
    ``certfile`` / ``keyfile`` (PEM): serve HTTPS only (the broker's
    ``tls_enabled``, Pulsar's webServicePortTls)."""
    if port < 0:
        return None, -1
    registry = metrics_registry(service)
    httpd, _thread = start_http_server(port, addr=host, registry=registry, certfile=certfile, keyfile=keyfile)
    return httpd, httpd.server_port
