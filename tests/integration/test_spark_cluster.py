"""The ``minipulsar`` Spark source on a broker cluster (issue 13): a multi-host service
URL, a partitioned topic whose partitions are served by different brokers; batch and
available-now streaming reads see exactly what was produced, also after the broker
that served some partitions was killed (-9) and they moved."""
from __future__ import annotations

import pytest

from client import Client, SyncAdminClient
from tests.cluster import BrokerCluster
from tests.spark.fixtures import produce, requires_spark, spark_session, unique_topic

pytestmark = [requires_spark, pytest.mark.timeout(300)]


def test_spark_reads_a_topic_spread_over_brokers_and_across_a_failover(tmp_path, process_tracker):
    spark = spark_session()
    cluster = BrokerCluster(tmp_path, process_tracker, brokers=2, bookies=2).start()
    url = cluster.service_url
    topic = unique_topic("spark-cluster")
    client = Client(url, operation_timeout_seconds=60)
    admin = SyncAdminClient(url)
    try:
        admin.create_partitioned_topic(topic, 4)
        sent = produce(client, topic, 0, 2000)
        owners = [admin.lookup_topic(f"{topic}-partition-{i}")["broker_url"] for i in range(4)]
        print(f"\npartition owners: {owners}")
        rows = spark.read.format("minipulsar").option("service_url", url).option("topics", topic).load().collect()
        assert sorted(r.value for r in rows) == sorted(sent)
        checkpoint = str(tmp_path / "checkpoint")
        out = str(tmp_path / "out")

        def stream_once():
            q = (spark.readStream.format("minipulsar").option("service_url", url).option("topics", topic)
                 .option("startingOffsets", "earliest").load().select("value").writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
            q.awaitTermination(240)
            assert q.exception() is None, q.exception()

        stream_once()
        first = spark.read.parquet(out).count()
        assert first == 2000, f"the first available-now run wrote {first} rows"
        # the broker serving partition 0 dies; its partitions move to the other broker
        cluster.broker_by_url(owners[0]).kill()
        more = produce(client, topic, 2000, 3000)
        stream_once()
        values = [r.value for r in spark.read.parquet(out).collect()]
        assert len(values) == 3000 and set(values) == set(sent) | set(more), "each message exactly once"
    finally:
        admin.close()
        client.close()

