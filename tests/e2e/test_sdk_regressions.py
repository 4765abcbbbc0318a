"""SDK behaviour the geo demo depends on, checked against a real cluster.

Regressions found while building the demo (issue 6), fixed since: each test
reproduces the failure that was seen and asserts the fixed behaviour.
"""
from __future__ import annotations

import asyncio
import uuid

import pytest

from client.admin import AdminClient
from client.client import AsyncClient

pytestmark = pytest.mark.timeout(120)


async def test_lazy_partition_producer_keeps_send_order(standalone):
    """A lazily started partition producer must publish messages in send order.

    ``PartitionedProducer.send_async`` queues the sends made while the partition's
    producer is being created as tasks, but sends made after it exists go straight
    to it, overtaking the queued ones: a key's messages are stored out of order,
    and with broker deduplication the overtaken messages (lower sequence ids) are
    dropped as duplicates (the geo demo lost 471 of 20,000 flights this way)."""
    topic = f"persistent://public/default/lazy-order-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(standalone.service_url)
    client = AsyncClient(standalone.service_url)
    try:
        await admin.create_partitioned_topic(topic, 4)
        # with a producer name every partition starts lazily (without one, partition 0 starts at once)
        producer = await client.create_producer(topic, producer_name=f"lazy-{uuid.uuid4().hex[:6]}",
                                                lazy_start_partitioned_producers=True, send_timeout_millis=0,
                                                max_pending_messages=0)
        ids = []
        n = 2000
        for i in range(n):
            producer.send_async(b"m-%d" % i, lambda exc, mid, i=i: ids.append((i, exc, mid)), partition_key="k")
            if i >= 1000:
                await asyncio.sleep(0)  # a burst while the partition producer is created, then a steady flow
        await producer.flush()
        for _ in range(200):
            if len(ids) == n:
                break
            await asyncio.sleep(0.05)
        assert all(exc is None for _, exc, _ in ids), [exc for _, exc, _ in ids if exc][:3]
        stored = [(mid.ledger_id, mid.entry_id, mid.batch_index) for _, _, mid in sorted(ids, key=lambda t: t[0])]
        assert stored == sorted(stored), "messages of one key stored out of send order"
    finally:
        await client.close()
        await admin.close()
