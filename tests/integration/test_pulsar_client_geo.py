"""Geo-replication of messages produced by the official Pulsar client: two REAL
standalone clusters replicating ``geo/ns``; ``pulsar-client`` produces in cluster a
(its ``pulsar://`` URL), and in cluster b both ``pulsar-client`` and our SDK consume
the replicated copies byte for byte, properties and keys included, each message once."""
from __future__ import annotations

import asyncio
import uuid

import pytest

pulsar = pytest.importorskip("pulsar", reason="pulsar-client (the `test` extra) is not installed")

from client import Client as SdkClient  # noqa: E402
from client import InitialPosition as SdkInitialPosition  # noqa: E402
from tests.geo import connect_clusters, start_clusters  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def test_pulsar_client_messages_replicate_to_another_cluster(tmp_path, process_tracker):
    a, b = start_clusters(tmp_path, ["a", "b"], process_tracker)

    async def setup():
        await connect_clusters([a, b], "geo", "ns", ["a", "b"])
        for c in (a, b):
            await c.close()
    asyncio.run(setup())
    topic = f"persistent://geo/ns/official-{uuid.uuid4().hex[:8]}"
    in_b = pulsar.Client(b.proc.pulsar_url, operation_timeout_seconds=30)
    in_a = pulsar.Client(a.proc.pulsar_url, operation_timeout_seconds=30)
    try:
        official_b = in_b.subscribe(topic, "official", initial_position=pulsar.InitialPosition.Earliest)
        with SdkClient(b.url) as sdk:
            ours_b = sdk.subscribe(topic, "sdk", initial_position=SdkInitialPosition.Earliest)
            producer = in_a.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5)
            sent = [(f"m{i}".encode() + bytes([i]), {"i": str(i)}, f"key-{i % 2}") for i in range(20)]
            for data, props, key in sent:
                producer.send_async(data, None, properties=props, partition_key=key)
            producer.flush()
            got_official = []
            for _ in sent:
                m = official_b.receive(30_000)
                got_official.append((m.data(), m.properties(), m.partition_key()))
                official_b.acknowledge(m)
            got_ours = []
            for _ in sent:
                m = ours_b.receive(timeout_millis=30_000)
                got_ours.append((m.data(), m.properties(), m.partition_key()))
                assert m.replicated_from() == "a"
                ours_b.acknowledge(m)
            assert got_official == sent and got_ours == sent
            with pytest.raises(pulsar.Timeout):
                official_b.receive(500)                    # each message once
            ours_b.close()
    finally:
        in_a.close()
        in_b.close()
