"""The Spark source on a geo-replicated topic with a replicated subscription:
two real clusters; the topic then holds replicated messages (``replicated_from``)
and snapshot *markers*, entries the broker never delivers to a Reader.

As in Pulsar since apache/pulsar#22572, the last message id a client is told
must be the last entry it can receive (not a trailing marker): otherwise
``Reader.has_message_available()`` stays True with nothing to read, and a
Spark range ending at a marker waits for a message that never comes.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from client import Client, MessageId, SyncAdminClient
from tests.geo import connect_clusters, start_clusters
from tests.procs import ProcessTracker
from tests.spark.fixtures import requires_spark, spark_session

pytestmark = [pytest.mark.timeout(240)]

TOPIC = "persistent://geo-spark/ns/markers"


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    tracker = ProcessTracker()
    try:
        a, b = start_clusters(tmp_path_factory.mktemp("geo-spark"), ["east", "west"], tracker,
                              broker_config="replicated_subscriptions_snapshot_frequency_millis = 200\n")
        asyncio.run(connect_clusters([a, b], "geo-spark", "ns", ["east", "west"]))
        with SyncAdminClient(a.url) as admin:
            admin.create_partitioned_topic(TOPIC, 2)
        clients = [Client(a.url), Client(b.url)]
        try:
            for c in clients:   # replicated subscriptions: the controllers write snapshot markers
                deadline = time.monotonic() + 30
                while True:
                    try:
                        c.subscribe(TOPIC, "board", replicate_subscription_state_enabled=True)
                        break
                    except Exception:  # noqa: BLE001 - the replicated topic may not exist there yet
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
            for c, prefix, n in ((clients[0], "e", 300), (clients[1], "w", 200)):
                producer = c.create_producer(TOPIC, block_if_queue_full=True)
                for i in range(n):
                    producer.send_async(f"{prefix}{i}".encode(), None, partition_key=str(i))
                producer.flush()
                producer.close()
            _wait_replicated(a.url, b.url, 500)
            time.sleep(1.5)   # a few more snapshot markers after the last message
            yield a, b
        finally:
            for c in clients:
                c.close()
    finally:
        tracker.kill_all()


def _wait_replicated(url_a, url_b, expected, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    for url in (url_a, url_b):
        with SyncAdminClient(url) as admin:
            while admin.get_stats(TOPIC).get("msgInCounter", 0) < expected:
                assert time.monotonic() < deadline, f"replication to {url} did not finish"
                time.sleep(0.2)


def test_reader_has_no_message_available_after_the_last_message(clusters):
    """Fails while GetLastMessageId returns a trailing marker (apache/pulsar#22571)."""
    a, _ = clusters
    client = Client(a.url)
    try:
        reader = client.create_reader(f"{TOPIC}-partition-0", MessageId.earliest)
        n = 0
        deadline = time.monotonic() + 30
        while reader.has_message_available():
            assert time.monotonic() < deadline, f"has_message_available() stays True after {n} messages " \
                                                "(the last entry is a marker the reader never receives)"
            try:
                reader.read_next(2000)
                n += 1
            except Exception:  # noqa: BLE001 - Timeout: nothing more to read
                pytest.fail(f"has_message_available() is True but read_next() times out after {n} messages "
                            "(the last entry is a snapshot marker)")
        assert n > 0
    finally:
        client.close()


@requires_spark
def test_spark_reads_the_same_topic_in_both_clusters(clusters):
    spark = spark_session()
    results = {}
    for cluster in clusters:
        # a range ending at a marker would wait for a message that never comes: fail after 15 s
        df = (spark.read.format("minipulsar").option("service_url", cluster.url).option("topics", TOPIC)
              .option("readTimeoutMs", "15000").load())
        rows = df.select("value", "replicated_from").collect()
        results[cluster.name] = (sorted(r.value for r in rows), {(r.value[:1], r.replicated_from) for r in rows})
    expected = sorted([f"e{i}".encode() for i in range(300)] + [f"w{i}".encode() for i in range(200)])
    assert results["east"][0] == expected
    assert results["west"][0] == expected
    assert results["east"][1] == {(b"e", None), (b"w", "west")}     # replicated_from: where it was published
    assert results["west"][1] == {(b"e", "east"), (b"w", None)}
