"""The stats tell where a subscription's dispatch waits (real standalone): the
subscription's ``dispatcherState`` (ours) and the cursor's ``waitingReadOp`` /
``pendingReadOps`` in the internal stats (Pulsar's names). A consumer that has every
message waits for entries; one whose permits are used up waits for permits; one whose
flow comes back reads again and then waits for entries."""
from __future__ import annotations

import asyncio
import time
import uuid

from client import AsyncClient, ConsumerType, InitialPosition
from client.admin import AdminClient


async def _state_becomes(admin, topic: str, sub: str, wanted: str, timeout_s: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = (await admin.get_stats(topic))["subscriptions"][sub]
        if stats["dispatcherState"] == wanted:
            return stats
        assert time.monotonic() < deadline, f"dispatcherState {stats['dispatcherState']!r}, not {wanted!r}"
        await asyncio.sleep(0.05)


async def test_stats_tell_where_a_subscription_waits(standalone):
    topic = f"persistent://public/default/dispatcher-state-{uuid.uuid4().hex[:6]}"
    async with AsyncClient(standalone.service_url) as client, AdminClient(standalone.service_url) as admin:
        consumer = await client.subscribe(topic, "s", consumer_type=ConsumerType.Exclusive, receiver_queue_size=4,
                                          initial_position=InitialPosition.Earliest)
        producer = await client.create_producer(topic, batching_enabled=False)
        await _state_becomes(admin, topic, "s", "waiting for entries")
        cursor = (await admin.get_internal_stats(topic))["cursors"]["s"]
        assert cursor["waitingReadOp"] is True and cursor["pendingReadOps"] == 0, cursor

        for i in range(10):                        # more than the 4 permits: dispatch stops
            await producer.send(b"m%d" % i)
        stats = await _state_becomes(admin, topic, "s", "waiting for permits")
        assert stats["consumers"][0]["msgOutCounter"] == 4, stats
        assert (await admin.get_internal_stats(topic))["cursors"]["s"]["waitingReadOp"] is False

        got = []
        while len(got) < 10:                       # taking them sends flows: it reads again
            msg = await consumer.receive(timeout_millis=10000)
            got.append(msg.data())
            await consumer.acknowledge_and_wait(msg)
        assert got == [b"m%d" % i for i in range(10)]
        stats = await _state_becomes(admin, topic, "s", "waiting for entries")
        assert stats["consumers"][0]["msgOutCounter"] == 10, stats

        await consumer.close()
        await _state_becomes(admin, topic, "s", "waiting for consumers")
        await producer.close()
