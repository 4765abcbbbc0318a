"""The /metrics families added for the entry cache and the GC pauses (collectors
only; the HTTP endpoint is covered by tests/integration/test_entry_cache.py)."""
from __future__ import annotations

import gc
import types

from prometheus_client import CollectorRegistry, generate_latest

from broker.ledger.entry_cache import ENTRY_OVERHEAD_BYTES, EntryCacheManager
from broker.ledger.position import Position
from broker.metrics import BrokerCollector, gc_pause_collector


def test_cache_gauges_report_size_entries_hits_and_evictions():
    manager = EntryCacheManager(1 << 20, eviction_interval_ms=0)
    cache = manager.new_cache("t", lambda: Position(1, 2))
    cache.active = True
    for e in range(5):
        cache.insert(Position(1, e), b"x" * 10)
    cache.get(Position(1, 4))
    cache.get(Position(9, 9))
    manager.do_cache_eviction(now=1.0)
    service = types.SimpleNamespace(config=types.SimpleNamespace(cluster_name="c1"), topics={},
                                    ml_factory=types.SimpleNamespace(cache_manager=manager))
    registry = CollectorRegistry()
    registry.register(BrokerCollector(service))
    text = generate_latest(registry).decode()
    assert f'pulsar_ml_cache_used_size{{cluster="c1"}} {3 * (10 + ENTRY_OVERHEAD_BYTES)}.0' in text
    assert 'pulsar_ml_cache_entries{cluster="c1"} 3.0' in text
    assert 'pulsar_ml_cache_hits_total{cluster="c1"} 1.0' in text
    assert 'pulsar_ml_cache_misses_total{cluster="c1"} 1.0' in text
    assert 'pulsar_ml_cache_evicted_entries_total{cluster="c1",reason="readers"} 2.0' in text


def test_gc_pause_histogram_counts_full_collections():
    collector = gc_pause_collector()
    assert gc_pause_collector() is collector            # one hook per process
    before = collector._count[2]
    gc.collect()
    gc.collect()
    assert collector._count[2] == before + 2
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert f'python_gc_pause_seconds_count{{generation="2"}} {float(before + 2)}' in text
    assert 'python_gc_pause_seconds_bucket{generation="2",le="+Inf"}' in text
    assert 'python_gc_max_pause_seconds{generation="2"}' in text
    assert collector._last[2] > 0
