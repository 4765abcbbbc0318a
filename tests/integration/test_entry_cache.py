"""The broker's entry cache on real processes (2 bookies + a broker): entries are
evicted behind a caught-up consumer, and a slow subscription or a reader still
gets every message, in order, exactly once, from the bookies once the cache let
them go. Figures come from the broker's /metrics (pulsar_ml_cache_*)."""
from __future__ import annotations

import asyncio
import re
import time
import urllib.request
import uuid

import pytest

from client import AsyncClient, InitialPosition, MessageId
from client.admin import AdminClient
from client.errors import AlreadyExists, Timeout
from tests.procs import start_bookie, start_broker

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def cluster(tmp_path, process_tracker):
    """``cluster(**broker_config) -> broker``: 2 bookie processes and a broker process."""

    def start(**broker_config):
        bookies = [start_bookie(tmp_path / f"bookie-{i}", tracker=process_tracker) for i in range(2)]
        conf = tmp_path / "broker.toml"
        conf.write_text("".join(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}\n"
                                for k, v in broker_config.items()))
        return start_broker(tmp_path / "broker", [b.address for b in bookies], config_file=conf,
                            tracker=process_tracker)

    return start


async def _namespace(broker) -> None:
    async with AdminClient(broker.service_url) as admin:
        for call, arg in ((admin.create_tenant, "public"), (admin.create_namespace, "public/default")):
            try:
                await call(arg)
            except AlreadyExists:
                pass


async def metrics(broker) -> dict[str, float]:
    """The broker's pulsar_ml_cache_* samples: ``{"pulsar_ml_cache_entries": 0.0,
    "pulsar_ml_cache_evicted_entries_total{reason=age}": 12.0, ...}``."""
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/metrics", timeout=10).read().decode())
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(pulsar_ml_cache_\w+)(?:\{([^}]*)\})? (\S+)$', line)
        if m:
            reason = re.search(r'reason="(\w+)"', m.group(2) or "")
            out[m.group(1) + (f"{{reason={reason.group(1)}}}" if reason else "")] = float(m.group(3))
    return out


async def wait_for_metric(broker, name: str, predicate, timeout_s: float = 20.0) -> dict[str, float]:
    """Poll /metrics until ``predicate(value of name)``; the last figures, or AssertionError."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = await metrics(broker)
        if predicate(m.get(name, 0.0)):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} = {m.get(name)} after {timeout_s} s; {m}")
        await asyncio.sleep(0.1)


async def _receive(consumer, n: int, ack: bool = True) -> list[bytes]:
    out = []
    for _ in range(n):
        msg = await consumer.receive(timeout_millis=30000)
        out.append(msg.data())
        if ack:
            consumer.acknowledge(msg)
    return out


@pytest.mark.parametrize("by_mark_delete", [False, True], ids=["read-position", "mark-delete"])
async def test_cache_empties_behind_a_caught_up_consumer(cluster, by_mark_delete):
    """Age eviction off (10 min): only the reader rule can evict. 600 unbatched
    messages to a consumer that keeps up: the cache served the tailing reads
    (hits), and once consumed (acknowledged, for the mark-delete rule) nothing
    stays cached: every inserted entry left by the readers rule."""
    broker = cluster(managed_ledger_cache_eviction_time_threshold_millis=600_000,
                     cache_eviction_by_mark_deleted_position=by_mark_delete)
    await _namespace(broker)
    topic = f"persistent://public/default/cache-{uuid.uuid4().hex[:8]}"
    n = 600
    sent = [b"m-%05d" % i for i in range(n)]
    async with AsyncClient(broker.service_url) as client:
        consumer = await client.subscribe(topic, "fast")
        receiving = asyncio.create_task(_receive(consumer, n))
        producer = await client.create_producer(topic, batching_enabled=False)
        for i in range(0, n, 20):
            await asyncio.gather(*(producer.send(p) for p in sent[i:i + 20]))
        assert await asyncio.wait_for(receiving, 60) == sent
        m = await wait_for_metric(broker, "pulsar_ml_cache_entries", lambda v: v == 0)
        assert m["pulsar_ml_cache_used_size"] == 0
        assert m["pulsar_ml_cache_hits_total"] >= n / 2, m            # tailing reads came from the cache
        assert m["pulsar_ml_cache_evicted_entries_total{reason=readers}"] >= n, m
        assert m["pulsar_ml_cache_evicted_entries_total{reason=age}"] == 0
        assert m["pulsar_ml_cache_evicted_entries_total{reason=size}"] == 0
        await consumer.close()
        await producer.close()


async def test_slow_subscription_and_reader_get_every_message_in_order(cluster):
    """A slow subscription (receiver queue of 5, not receiving while 1,500 messages go out)
    holds back the readers rule; age eviction (200 ms) still empties the cache. The slow
    consumer then gets all 1,500 messages in order, once, and so does a reader from the
    earliest position: the entries the cache dropped came from the bookies (misses)."""
    broker = cluster(managed_ledger_cache_eviction_time_threshold_millis=200)
    await _namespace(broker)
    topic = f"persistent://public/default/cache-slow-{uuid.uuid4().hex[:8]}"
    n = 1500
    sent = [b"s-%05d" % i for i in range(n)]
    async with AsyncClient(broker.service_url) as client:
        fast = await client.subscribe(topic, "fast", initial_position=InitialPosition.Earliest)
        slow = await client.subscribe(topic, "slow", initial_position=InitialPosition.Earliest,
                                      receiver_queue_size=5)
        receiving = asyncio.create_task(_receive(fast, n))
        producer = await client.create_producer(topic, batching_enabled=False)
        for i in range(0, n, 50):
            await asyncio.gather(*(producer.send(p) for p in sent[i:i + 50]))
        assert await asyncio.wait_for(receiving, 60) == sent
        # The slow cursor read 5 entries at most: only age eviction can have emptied the cache.
        before = await wait_for_metric(broker, "pulsar_ml_cache_entries", lambda v: v == 0)
        assert before["pulsar_ml_cache_evicted_entries_total{reason=age}"] >= n // 2, before
        got = await _receive(slow, n)
        assert got == sent                                          # nothing lost, nothing reordered
        with pytest.raises(Timeout):
            await slow.receive(timeout_millis=500)                  # and nothing twice
        reader = await client.create_reader(topic, start_message_id=MessageId.earliest)
        read = []
        while await reader.has_message_available():
            read.append((await reader.read_next(timeout_millis=10000)).data())
        assert read == sent
        after = await metrics(broker)
        assert after["pulsar_ml_cache_misses_total"] - before["pulsar_ml_cache_misses_total"] >= n, after
        await reader.close()
        await slow.close()
        await fast.close()
        await producer.close()
