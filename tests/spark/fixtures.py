"""Spark test helpers: one shared local[2] session, skip reasons, producing.

The session is created once per test process (~5-7 s) and stopped at exit;
every Spark test module uses ``spark_session()``.
"""
from __future__ import annotations

import atexit
import functools
import uuid

import pytest

from client.spark.session import spark_unavailable_reason

SKIP_REASON = spark_unavailable_reason()
#: ``pytestmark`` for Spark test modules: skipped, with the reason, without pyspark or Java
requires_spark = pytest.mark.skipif(SKIP_REASON is not None,
                                    reason=f"Spark tests need the spark extra and Java 17: {SKIP_REASON}")


@functools.lru_cache(maxsize=None)
def spark_session():
    """The process's shared SparkSession (local[2], quiet, loopback, format registered)."""
    from client.spark.session import build_session
    spark = build_session(master="local[2]", app_name="minipulsar-tests", shuffle_partitions=2,
                          conf={"spark.sql.streaming.minBatchesToRetain": "5"})
    atexit.register(spark.stop)
    return spark


def unique_topic(prefix: str) -> str:
    """A fresh ``persistent://public/default/<prefix>-<random>`` name."""
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"


def produce(client, topic: str, start: int, stop: int, batching: bool = True) -> dict[bytes, dict]:
    """Publish messages ``start..stop-1`` (value ``m<i>``, key ``k<i % 17>``,
    property ``i``, event time ``1.6e12 + i`` ms) and wait; returns
    ``{value: {"key", "properties", "event_time_ms", "message_id"}}``."""
    producer = client.create_producer(topic, block_if_queue_full=True, batching_enabled=batching,
                                      max_pending_messages=2000)
    sent: dict[bytes, dict] = {}
    ids: dict[bytes, object] = {}

    def callback_for(value):
        def callback(exc, msg_id):
            ids[value] = exc if exc is not None else msg_id
        return callback

    try:
        for i in range(start, stop):
            value = f"m{i}".encode()
            sent[value] = {"key": f"k{i % 17}", "properties": {"i": str(i)}, "event_time_ms": 1_600_000_000_000 + i}
            producer.send_async(value, callback_for(value), partition_key=f"k{i % 17}", properties={"i": str(i)},
                                event_timestamp=1_600_000_000_000 + i)
        producer.flush()
    finally:
        producer.close()
    failed = [v for v, r in ids.items() if isinstance(r, Exception)]
    assert not failed and len(ids) == len(sent), f"{len(failed)} sends failed, {len(sent) - len(ids)} unsettled"
    for value, msg_id in ids.items():
        sent[value]["message_id"] = msg_id
    return sent
