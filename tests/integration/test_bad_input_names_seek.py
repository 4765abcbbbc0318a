"""Subscription names with '/' and seeks beyond the end, with real processes
(issue 21 items 9 and 11).

* Item 11: cursor names are URL-encoded into their metadata path segment, as
  Pulsar does (``Codec.encode``), so ``a/b`` is one node: after an unload the
  subscriptions are exactly the ones created (before: a phantom ``a`` at 0:0
  holding the backlog), their acknowledgments survive, unsubscribe and topic
  deletion leave no node behind.
* Item 9: a seek / reset-cursor to a position beyond the end is refused with a
  clear error and changes nothing (future messages keep coming); a Reader whose
  start id lies beyond the end starts at the next message added, as Pulsar's
  NonDurableCursorImpl (next valid position, else latest) -- before it skipped
  every future message of the ledger; a seek by a publish time in the future
  lands after the last entry.
"""
from __future__ import annotations

import sqlite3
import time
import uuid
from urllib.parse import quote

import pytest

from client import AsyncClient, InitialPosition
from client.admin import AdminClient
from client.consumer import ConsumerType
from client.errors import InvalidArgument as ClientInvalidArgument
from client.errors import PulsarException, Timeout
from client.message_id import MessageId

pytestmark = pytest.mark.timeout(180)

NAMES = ["a/b", "team/app/sub", "with space+plus%25", "é/ü", "trailing/"]


def uid() -> str:
    return uuid.uuid4().hex[:8]


def metadata_paths(cluster, prefix: str) -> list[str]:
    """Metadata nodes at or under ``prefix``, read from the broker's SQLite store (read-only)."""
    db = sqlite3.connect(f"file:{cluster.data_dir / 'broker' / 'metadata.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT path FROM nodes WHERE path = ? OR path LIKE ?",
                          (prefix, prefix.replace("%", "\\%").replace("_", "\\_") + "/%")).fetchall()
    finally:
        db.close()
    return sorted(r[0] for r in rows)


async def drain(consumer, idle_ms: int = 1500, ack: bool = True) -> list[bytes]:
    out = []
    while True:
        try:
            msg = await consumer.receive(timeout_millis=idle_ms)
        except Timeout:
            return out
        out.append(msg.data())
        if ack:
            consumer.acknowledge(msg)


# ---------------------------------------------------------------------------- item 11
async def test_subscription_names_with_slashes_survive_unload_unsubscribe_and_delete(standalone_factory):
    cluster = standalone_factory()
    topic = f"persistent://public/default/names-{uid()}"
    async with AsyncClient(cluster.service_url) as client, AdminClient(cluster.service_url) as admin:
        producer = await client.create_producer(topic, batching_enabled=False)
        for i in range(10):
            await producer.send(b"m%d" % i)
        for name in NAMES:
            consumer = await client.subscribe(topic, name, consumer_type=ConsumerType.Shared,
                                              initial_position=InitialPosition.Earliest)
            for _ in range(4):
                consumer.acknowledge(await consumer.receive(timeout_millis=10000))
            await consumer.close()                                # flushes the acknowledgments
        assert sorted(await admin.get_subscriptions(topic)) == sorted(NAMES)

        for round_ in range(2):
            await admin.unload_topic(topic)
            assert sorted(await admin.get_subscriptions(topic)) == sorted(NAMES), round_
            stats = await admin.get_stats(topic)
            assert {n: stats["subscriptions"][n]["msgBacklog"] for n in NAMES} == {n: 6 for n in NAMES}

        consumer = await client.subscribe(topic, "a/b", consumer_type=ConsumerType.Shared)
        assert sorted(await drain(consumer)) == [b"m%d" % i for i in range(4, 10)]
        await consumer.close()

        await admin.unsubscribe(topic, "team/app/sub")
        await admin.unload_topic(topic)
        left = sorted(n for n in NAMES if n != "team/app/sub")
        assert sorted(await admin.get_subscriptions(topic)) == left

        ml = f"/managed-ledgers/public/default/persistent/{topic.rsplit('/', 1)[1]}"
        nodes = metadata_paths(cluster, ml)
        cursors = sorted(p[len(ml) + 1:] for p in nodes if p != ml and not p[len(ml) + 1:].startswith("pulsar."))
        # One node per subscription, its name URL-encoded into one segment (internal
        # cursors such as pulsar.dedup aside).
        assert ml in nodes and cursors == sorted(quote(n, safe="") for n in left), nodes
        assert all(p.count("/") == ml.count("/") + 1 for p in nodes if p != ml), nodes

        await producer.close()
        await admin.delete_topic(topic, force=True)
        assert metadata_paths(cluster, ml) == []
        # The same name starts afresh: no subscription came back.
        await admin.create_topic(topic)
        assert await admin.get_subscriptions(topic) == []


# ---------------------------------------------------------------------------- item 9
async def test_seek_and_reset_beyond_the_end_are_refused_and_change_nothing(standalone):
    topic = f"persistent://public/default/seek-end-{uid()}"
    async with AsyncClient(standalone.service_url) as client, AdminClient(standalone.service_url) as admin:
        producer = await client.create_producer(topic, batching_enabled=False)
        ids = [await producer.send(b"m%d" % i) for i in range(5)]
        consumer = await client.subscribe(topic, "s", consumer_type=ConsumerType.Exclusive,
                                          initial_position=InitialPosition.Earliest)
        assert await drain(consumer) == [b"m%d" % i for i in range(5)]
        last = ids[-1]
        for target in (MessageId(last.ledger_id, last.entry_id + 1000), MessageId(last.ledger_id + 100, 0)):
            with pytest.raises(ClientInvalidArgument) as info:
                await consumer.seek(target)
            assert "not an entry" in str(info.value) and "Traceback" not in str(info.value)
        with pytest.raises(PulsarException) as info:
            await admin.reset_cursor(topic, "s", f"{last.ledger_id}:{last.entry_id + 1000}")
        assert "not an entry" in str(info.value)
        # Nothing changed: the next messages come, the backlog counts them.
        for i in range(5, 8):
            await producer.send(b"m%d" % i)
        assert (await admin.get_stats(topic))["subscriptions"]["s"]["msgBacklog"] == 3
        assert await drain(consumer) == [b"m5", b"m6", b"m7"]
        # A seek to the position after the last entry (latest) and by a future publish time: both
        # land after the end, so only what comes next is delivered.
        await consumer.seek(MessageId(last.ledger_id, last.entry_id + 4))
        await consumer.seek(int(time.time() * 1000) + 10**9)
        await producer.send(b"m8")
        assert await drain(consumer) == [b"m8"]
        await consumer.close()
        await producer.close()


async def test_reader_starting_beyond_the_end_gets_the_next_messages(standalone):
    topic = f"persistent://public/default/reader-end-{uid()}"
    async with AsyncClient(standalone.service_url) as client:
        producer = await client.create_producer(topic, batching_enabled=False)
        ids = [await producer.send(b"m%d" % i) for i in range(3)]
        last = ids[-1]
        readers = [await client.create_reader(topic, MessageId(last.ledger_id, last.entry_id + 1000)),
                   await client.create_reader(topic, MessageId(last.ledger_id + 100, 0)),
                   await client.create_reader(topic, MessageId(last.ledger_id, last.entry_id + 7),
                                              start_message_id_inclusive=True)]
        for i in range(3, 6):
            await producer.send(b"m%d" % i)
        for reader in readers:
            got = [(await reader.read_next(timeout_millis=5000)).data() for _ in range(3)]
            assert got == [b"m3", b"m4", b"m5"]
            await reader.close()
        await producer.close()
