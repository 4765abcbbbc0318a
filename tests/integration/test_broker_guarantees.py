"""Broker guarantees through the SDK against real processes: acknowledgment
holes and deduplication survive kill -9, stats and Prometheus metrics, and bad
input gets clear errors while the server keeps serving."""
from __future__ import annotations

import asyncio
import urllib.request
import uuid

import pytest

from client import AsyncClient, InitialPosition
from client.consumer_config import ConsumerType
from client.errors import AlreadyClosed, InvalidArgument, InvalidTopicName, PulsarException, TopicNotFound
from client.admin import AdminClient


def topic(ns: str = "public/default") -> str:
    return f"persistent://{ns}/g-{uuid.uuid4().hex[:8]}"


async def test_holes_survive_kill9_and_acked_messages_never_come_back(standalone_factory):
    cluster = standalone_factory()
    t = topic()
    async with AsyncClient(cluster.service_url) as client:
        producer = await client.create_producer(t, batching_enabled=False)
        for i in range(100):
            await producer.send(b"m-%d" % i)
        consumer = await client.subscribe(t, "sub", consumer_type=ConsumerType.Shared,
                                          initial_position=InitialPosition.Earliest)
        acked = set()
        for _ in range(100):
            msg = await consumer.receive(timeout_millis=5000)
            if int(msg.data().split(b"-")[1]) % 2 == 0:
                await consumer.acknowledge_and_wait(msg)
                acked.add(msg.data())
    cluster.kill()                                  # kill -9: broker and bookies
    cluster = cluster.restart()
    async with AsyncClient(cluster.service_url) as client:
        consumer = await client.subscribe(t, "sub", consumer_type=ConsumerType.Shared)
        got = set()
        while True:
            try:
                msg = await consumer.receive(timeout_millis=1500)
            except PulsarException:
                break
            got.add(msg.data())
            consumer.acknowledge(msg)
    assert got == {b"m-%d" % i for i in range(1, 100, 2)}
    assert not got & acked


async def test_dedup_survives_kill9_and_same_name_continues(standalone_factory):
    cluster = standalone_factory()
    t = topic("public/dedup")
    async with AdminClient(cluster.service_url) as admin:
        await admin.create_namespace("public/dedup")
        await admin.set_deduplication("public/dedup", True)
    async with AsyncClient(cluster.service_url) as client:
        producer = await client.create_producer(t, producer_name="dp", batching_enabled=False)
        for i in range(100):
            await producer.send(b"m-%d" % i, sequence_id=i)
    cluster.kill()
    cluster = cluster.restart()
    async with AsyncClient(cluster.service_url) as client:
        producer = await client.create_producer(t, producer_name="dp", batching_enabled=False)
        assert producer.last_sequence_id() == 99
        ids = [await producer.send(b"m-%d" % i, sequence_id=i) for i in range(50, 150)]
        assert all(m.ledger_id == -1 for m in ids[:50])     # the resent half is dropped as duplicates
        reader = await client.create_reader(t, start_message_id=__import__("client").MessageId.earliest)
        seen = []
        while await reader.has_message_available():
            seen.append((await reader.read_next(timeout_millis=3000)).data())
    assert seen == [b"m-%d" % i for i in range(150)]


async def test_stats_and_prometheus_metrics(standalone):
    t = topic()
    async with AsyncClient(standalone.service_url) as client:
        consumer = await client.subscribe(t, "s1", initial_position=InitialPosition.Earliest)
        producer = await client.create_producer(t, batching_enabled=False)  # one entry per message
        for i in range(30):
            producer.send_async(__import__("os").urandom(100), lambda res, mid: None)
        await producer.flush()
        for _ in range(10):
            consumer.acknowledge(await consumer.receive(timeout_millis=5000))
        async with AdminClient(standalone.service_url) as admin:
            deadline = asyncio.get_running_loop().time() + 15
            while True:  # the grouped acks reach the broker within ack_group_time_ms (100 ms)
                stats = await admin.get_stats(t)
                if stats["subscriptions"]["s1"]["msgBacklog"] == 20 or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.1)
        assert stats["msgInCounter"] == 30
        assert stats["storageSize"] > 3000
        assert len(stats["publishers"]) == 1
        sub = stats["subscriptions"]["s1"]
        # 30 dispatched (receiver queue 1000), 10 acknowledged: 20 in the backlog, 20 unacknowledged
        assert (sub["msgBacklog"], sub["unackedMessages"], len(sub["consumers"])) == (20, 20, 1)
        for key in ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "backlogSize"):
            assert key in stats
        http_port = int(standalone.stdout_log.read_text().split("http_port=")[-1].split()[0])
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics").read().decode())
        line = next(ln for ln in text.splitlines() if ln.startswith("pulsar_in_messages_total") and t in ln)
        assert float(line.rsplit(" ", 1)[1]) == 30
        assert any(ln.startswith("pulsar_subscription_back_log") and t in ln for ln in text.splitlines())


async def test_bad_input_gets_clear_errors_and_server_keeps_serving(standalone):
    t, other = topic(), topic()
    async with AsyncClient(standalone.service_url) as client:
        with pytest.raises(InvalidTopicName):
            await client.create_producer("persistent://bad name/x/y")
        with pytest.raises(TopicNotFound, match="namespace"):
            await client.create_producer("persistent://no-such-tenant/ns/t")
        producer = await client.create_producer(t, batching_enabled=False)
        await producer.send(b"mine")
        consumer = await client.subscribe(t, "s", initial_position=InitialPosition.Earliest)
        msg = await consumer.receive(timeout_millis=5000)
        p_other = await client.create_producer(other, batching_enabled=False)
        foreign_id = None
        for _ in range(5):
            foreign_id = await p_other.send(b"other")
        await producer.send(b"mine again")   # this topic's last entry is now above the foreign id
        # an id from another topic: refused, nothing acknowledged here
        with pytest.raises(InvalidArgument, match="cannot acknowledge"):
            await consumer.acknowledge_and_wait(foreign_id)
        await consumer.acknowledge_and_wait(msg)
        # cumulative ack on Shared: refused locally with NotAllowed
        shared = await client.subscribe(t, "sh", consumer_type=ConsumerType.Shared)
        with pytest.raises(PulsarException, match="umulative"):
            shared.acknowledge_cumulative(msg)
        await producer.close()
        with pytest.raises(AlreadyClosed):
            await producer.send(b"after close")
        await consumer.close()
        with pytest.raises(AlreadyClosed):
            await consumer.receive(timeout_millis=100)
    with pytest.raises(AlreadyClosed):
        await client.create_producer(t)
    async with AsyncClient(standalone.service_url) as client:   # still serving
        p = await client.create_producer(t)
        assert (await p.send(b"still fine")).entry_id >= 0
