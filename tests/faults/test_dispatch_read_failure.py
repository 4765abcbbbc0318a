"""A consumer behind the producer, whose entries are no longer in the broker's cache,
while every bookie of the ledger is down: the dispatcher's reads fail. Once the bookies
are back, the consumer must get every message without reconnecting (Pulsar's
``readEntriesFailed``: read again after ``dispatcherReadFailureBackoff*``). Found by the
fault suite: the dispatch loop ended at the first failed read and the subscription got
nothing more until its consumer reconnected.

Exclusive (cursor reads) and Shared after a redelivery (replay reads: before, positions
whose read failed were dropped from the replay set and never redelivered).
"""
from __future__ import annotations

import asyncio
import time

import pytest

from client import AsyncClient, ConsumerType, InitialPosition
from client.admin import AdminClient
from client.errors import PulsarException

pytestmark = pytest.mark.timeout(120)


async def _receive_all(consumer, expected: set[bytes], timeout_s: float) -> set[bytes]:
    got: set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    while got != expected and time.monotonic() < deadline:
        try:
            msg = await consumer.receive(timeout_millis=500)
        except PulsarException:
            continue
        got.add(msg.data())
        consumer.acknowledge(msg)
    return got


@pytest.mark.parametrize("sub_type", [ConsumerType.Exclusive, ConsumerType.Shared])
async def test_dispatcher_reads_again_after_its_bookies_come_back(fault_cluster, sub_type):
    cluster = fault_cluster(2, dispatcher_read_failure_backoff_initial_time_in_ms=500,
                            dispatcher_read_failure_backoff_max_time_in_ms=1000)
    await cluster.create_namespace()
    topic = "persistent://public/default/read-failure"
    payloads = [b"m-%03d" % i for i in range(50)]
    async with AsyncClient(cluster.service_url) as client:
        await (await client.subscribe(topic, "s", consumer_type=sub_type,
                                      initial_position=InitialPosition.Earliest)).close()
        producer = await client.create_producer(topic, batching_enabled=False)
        for p in payloads:
            await producer.send(p)
        await producer.close()
    await asyncio.to_thread(cluster.kill_broker)
    await asyncio.to_thread(cluster.restart_broker)        # nothing of the topic is cached any more
    async with AsyncClient(cluster.service_url, operation_timeout_seconds=15) as client:
        consumer = await client.subscribe(topic, "s", consumer_type=sub_type, receiver_queue_size=1,
                                          negative_ack_redelivery_delay_ms=300,
                                          initial_position=InitialPosition.Earliest)
        first = await consumer.receive(timeout_millis=15000)
        if sub_type is ConsumerType.Shared:
            consumer.negative_acknowledge(first)             # replay reads for the rest of the test
        else:
            consumer.acknowledge(first)
        cluster.kill_bookie(0)
        cluster.kill_bookie(1)
        # the dispatcher's reads fail meanwhile, and its stats say it backs off
        started, states = time.monotonic(), set()
        async with AdminClient(cluster.service_url) as admin:
            while time.monotonic() - started < 10 and "read failure backoff" not in states:
                states.add((await admin.get_stats(topic))["subscriptions"]["s"]["dispatcherState"])
                await asyncio.sleep(0.05)
        assert "read failure backoff" in states, states
        await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - started)))
        await asyncio.to_thread(cluster.restart_bookie, 0)
        await asyncio.to_thread(cluster.restart_bookie, 1)
        expected = set(payloads) if sub_type is ConsumerType.Shared else set(payloads[1:])
        got = await _receive_all(consumer, expected, timeout_s=30)
    assert got == expected, f"{len(expected - got)} messages never delivered after the bookies came back"
    log = (cluster.broker.data_dir / "broker.stderr.log").read_text(errors="replace")
    assert "dispatcher failed" not in log
