"""The official Pulsar client against a REAL broker cluster (etcd, bookies, two
brokers): LOOKUP answers the owner's ``pulsar://`` URL (each broker registers its
Pulsar listener next to its ownership data), so a client that knows one broker
produces and consumes on topics the other one owns; after an unload the client
looks the topic up again and nothing is lost."""
from __future__ import annotations

import asyncio
import uuid

import pytest

pulsar = pytest.importorskip("pulsar", reason="pulsar-client (the `test` extra) is not installed")

from client import SyncAdminClient  # noqa: E402
from tests.cluster import BrokerCluster  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def test_lookup_names_the_owner_and_unload_moves_nothing_lost(tmp_path, process_tracker):
    c = BrokerCluster(tmp_path, process_tracker, brokers=2).start()
    entry = c.brokers[0]
    topics = [f"persistent://public/default/owned-{i}-{uuid.uuid4().hex[:6]}" for i in range(8)]
    with SyncAdminClient(c.service_url) as admin:
        owners = {t: admin.lookup_topic(t)["broker_url"] for t in topics}
    elsewhere = [t for t in topics if c.broker_by_url(owners[t]) is not entry]
    assert elsewhere, f"every topic landed on the entry broker: {owners}"
    client = pulsar.Client(entry.pulsar_url, operation_timeout_seconds=30)
    try:
        topic = elsewhere[0]
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False, producer_name="mover")
        for i in range(10):
            producer.send(f"before-{i}".encode())
        with SyncAdminClient(c.service_url) as admin:
            admin.unload_topic(topic)
        for i in range(10):
            producer.send(f"after-{i}".encode())
        got = [consumer.receive(20_000).data() for _ in range(20)]
        assert got == [f"before-{i}".encode() for i in range(10)] + [f"after-{i}".encode() for i in range(10)]
        for t in topics:                                  # every owner reachable through one URL
            client.create_producer(t, batching_enabled=False).send(t.encode())
    finally:
        client.close()
