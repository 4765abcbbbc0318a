"""The ``minipulsar`` Spark data source against a real standalone cluster and a
real local Spark session (local[2]).

Batch reads equal what was produced; a streaming query with
Trigger.AvailableNow writes everything once, and after more messages its
restart adds exactly those; bad options fail with an error naming the option.
"""
from __future__ import annotations

import json

import pytest

from client import Client, MessageId, SyncAdminClient
from client.spark.offsets import EARLIEST, Position, TopicPartition
from tests.spark.fixtures import produce, requires_spark, spark_session, unique_topic

pytestmark = [requires_spark, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def spark():
    return spark_session()


@pytest.fixture(scope="module")
def url(standalone):
    return standalone.service_url


@pytest.fixture(scope="module")
def client(url):
    c = Client(url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def admin(url):
    a = SyncAdminClient(url)
    yield a
    a.close()


def _read(spark, url, topic, **options):
    reader = spark.read.format("minipulsar").option("service_url", url).option("topics", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_equals_produced(spark, url, client, admin):
    topic = unique_topic("spark-batch")
    admin.create_partitioned_topic(topic, 4)
    sent = produce(client, topic, 0, 5000)

    rows = _read(spark, url, topic).collect()

    assert len(rows) == 5000
    got = {r.value: r for r in rows}
    assert set(got) == set(sent)
    for value, expected in sent.items():
        row = got[value]
        mid = expected["message_id"]
        assert row.topic == topic
        assert row.partition == mid.partition
        assert row.message_id == str(mid)
        assert row.key == expected["key"]
        assert row.properties == expected["properties"]
        assert int(row.event_time.timestamp() * 1000) == expected["event_time_ms"]
        assert row.publish_time is not None and row.producer_name
        assert row.replicated_from is None and row.redelivery_count == 0
    assert {r.partition for r in rows} == {0, 1, 2, 3}


def test_batch_offsets_json_reads_exactly_the_range(spark, url, client):
    topic = unique_topic("spark-range")
    sent = produce(client, topic, 0, 40, batching=False)   # one entry per message
    ids = sorted((v["message_id"], v) for v in sent.values())
    # (after entry 9, up to entry 29]: messages 10..29
    start, end = ids[9][0], ids[29][0]
    offsets = lambda pos: json.dumps({topic: {"-1": f"{pos.ledger_id}:{pos.entry_id}"}})  # noqa: E731
    df = _read(spark, url, topic, startingOffsets=offsets(start), endingOffsets=offsets(end))

    values = sorted(r.value for r in df.collect())

    assert values == sorted(f"m{i}".encode() for i in range(10, 30))
    # the end of one range is the start of the next: nothing lost, nothing twice
    rest = _read(spark, url, topic, startingOffsets=offsets(end)).collect()
    assert sorted(r.value for r in rest) == sorted(f"m{i}".encode() for i in range(30, 40))


def test_read_partition_stops_at_entry_boundaries(url, client):
    """Without Spark: a range covers whole batch entries, start exclusive, end inclusive."""
    from client.spark.partition_reader import PartitionRange, read_partition
    from client.spark.input_partitions import arrow_schema as _arrow_schema
    from client.spark.source import SCHEMA

    topic = unique_topic("spark-entries")
    sent = {}
    for start in (0, 100, 200):                             # batched: 100 messages per entry, 3 entries
        sent.update(produce(client, topic, start, start + 100))
    entries = sorted({(m["message_id"].ledger_id, m["message_id"].entry_id) for m in sent.values()})
    assert len(entries) == 3
    first, last = Position(*entries[0]), Position(*entries[-1])
    tp = TopicPartition(topic, -1)

    def values(start, end):
        part = PartitionRange(url, tp, start, end, poll_timeout_ms=100, read_timeout_ms=10_000)
        return [v.as_py() for batch in read_partition(part, _arrow_schema(SCHEMA), rows_per_batch=64)
                for v in batch.column("value")]

    in_first = sorted(v for v, m in sent.items() if (m["message_id"].ledger_id, m["message_id"].entry_id) == entries[0])
    assert sorted(values(EARLIEST, first)) == in_first
    rest = values(first, last)
    assert sorted(rest) == sorted(set(sent) - set(in_first))
    assert len(rest) == len(set(rest))
    assert values(last, last) == []


def _stream_to_parquet(spark, url, topic, out, checkpoint, **options):
    reader = (spark.readStream.format("minipulsar").option("service_url", url).option("topics", topic)
              .option("startingOffsets", "earliest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().selectExpr("CAST(value AS STRING) AS v", "message_id", "partition")
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120), "the AvailableNow query did not finish"
    assert query.exception() is None
    return query


def test_stream_available_now_then_restart_adds_exactly_the_new(spark, url, client, admin, tmp_path):
    topic = unique_topic("spark-stream")
    admin.create_partitioned_topic(topic, 4)
    produce(client, topic, 0, 5000)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    _stream_to_parquet(spark, url, topic, out, checkpoint)
    first = spark.read.parquet(str(out)).collect()
    assert sorted(r.v for r in first) == sorted(f"m{i}" for i in range(5000))

    for start in range(5000, 6000, 100):                    # >= 40 entries (10 flushes x 4 partitions)
        produce(client, topic, start, start + 100)
    # the restart resumes from the checkpoint, in several micro-batches
    query = _stream_to_parquet(spark, url, topic, out, checkpoint, maxOffsetsPerTrigger="15")
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 2, [p["numInputRows"] for p in query.recentProgress]
    assert sum(p["numInputRows"] for p in batches) == 1000

    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 6000
    assert sorted(r.v for r in rows) == sorted(f"m{i}" for i in range(6000))
    assert len({r.message_id for r in rows}) == 6000

    # nothing new: another restart reads nothing
    query = _stream_to_parquet(spark, url, topic, out, checkpoint)
    assert sum(p["numInputRows"] for p in query.recentProgress) == 0
    assert spark.read.parquet(str(out)).count() == 6000


def _error_text(excinfo) -> str:
    return str(excinfo.value)


def test_unknown_topic_names_the_option(spark, url):
    topic = unique_topic("spark-missing")
    with pytest.raises(Exception) as excinfo:
        _read(spark, url, topic).collect()
    text = _error_text(excinfo)
    assert "option 'topics'" in text and topic in text and "does not exist" in text


def test_unreachable_broker_names_the_option(spark):
    with pytest.raises(Exception) as excinfo:
        (spark.read.format("minipulsar").option("service_url", "minipulsar://127.0.0.1:9")
         .option("topics", "t").option("operationTimeoutMs", "1500").load().collect())
    text = _error_text(excinfo)
    assert "option 'service_url'" in text and "cannot reach the broker" in text


def test_offsets_for_a_missing_partition_name_the_option(spark, url, admin):
    topic = unique_topic("spark-parts")
    admin.create_partitioned_topic(topic, 2)
    with pytest.raises(Exception) as excinfo:
        _read(spark, url, topic, startingOffsets=json.dumps({topic: {"5": "earliest"}})).collect()
    text = _error_text(excinfo)
    assert "option 'startingOffsets'" in text and "partition 5" in text and "does not exist" in text


def test_bad_options_name_the_option(spark, url):
    cases = [({"topics": "a", "topicsPattern": "persistent://public/default/a.*"}, "exactly one of"),
             ({"topics": "a", "startingOffsets": "yesterday"}, "option 'startingOffsets'"),
             ({"topics": "a", "maxOffsetsPerTrigger": "5"}, "option 'maxOffsetsPerTrigger'"),
             ({"topics": "a", "startingOfsets": "earliest"}, "unknown option")]
    for options, expected in cases:
        reader = spark.read.format("minipulsar").option("service_url", url)
        for key, value in options.items():
            reader = reader.option(key, value)
        with pytest.raises(Exception) as excinfo:
            reader.load().collect()
        assert expected in _error_text(excinfo), (options, _error_text(excinfo)[:500])


def test_topics_pattern_reads_matching_topics(spark, url, client, admin):
    prefix = unique_topic("spark-pat")
    a, b, other = f"{prefix}-a", f"{prefix}-b", unique_topic("spark-other")
    admin.create_partitioned_topic(b, 2)
    produce(client, a, 0, 10)
    produce(client, b, 10, 30)
    produce(client, other, 30, 35)
    df = (spark.read.format("minipulsar").option("service_url", url)
          .option("topicsPattern", prefix + "-.*").load())
    rows = df.select("topic", "value").collect()
    assert sorted(r.value for r in rows) == sorted(f"m{i}".encode() for i in range(30))
    assert {r.topic for r in rows} == {a, b}


def test_message_id_column_round_trips(spark, url, client):
    topic = unique_topic("spark-ids")
    sent = produce(client, topic, 0, 20)
    rows = _read(spark, url, topic).collect()
    for row in rows:
        assert MessageId.parse(row.message_id) == sent[row.value]["message_id"]


def test_recreated_topic_fails_on_data_loss_unless_told(spark, url, client, admin, tmp_path):
    topic = unique_topic("spark-recreated")
    produce(client, topic, 0, 50)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _stream_to_parquet(spark, url, topic, out, checkpoint)
    admin.delete_topic(topic, force=True)
    produce(client, topic, 100, 120)                        # a new topic of that name: new ledgers

    with pytest.raises(Exception) as excinfo:
        _stream_to_parquet(spark, url, topic, out, checkpoint)
    text = _error_text(excinfo)
    assert "option 'failOnDataLoss'" in text and "may have been deleted" in text

    _stream_to_parquet(spark, url, topic, out, checkpoint, failOnDataLoss="false")
    values = sorted(r.v for r in spark.read.parquet(str(out)).collect())
    assert values == sorted([f"m{i}" for i in range(50)] + [f"m{i}" for i in range(100, 120)])


def _checkpoint_as_older_incarnation(checkpoint, topic: str) -> None:
    """Rewrite the newest checkpointed offsets of ``topic`` to positions of an
    earlier incarnation with higher ledger ids (what a purge of the metadata
    store leaves behind: the new topic's ledger ids start over)."""
    offsets_dir = checkpoint / "offsets"
    newest = max((p for p in offsets_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    lines = newest.read_text().splitlines()
    source = json.loads(lines[2])
    source[topic] = {partition: "1000000:5" for partition in source[topic]}
    lines[2] = json.dumps(source)
    newest.write_text("\n".join(lines))
    crc = offsets_dir / f".{newest.name}.crc"
    if crc.exists():
        crc.unlink()


def test_checkpoint_of_a_recreated_topic_with_restarted_ledger_ids_is_not_silently_skipped(
        spark, url, client, tmp_path):
    topic = unique_topic("spark-incarnation")
    produce(client, topic, 0, 30)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _stream_to_parquet(spark, url, topic, out, checkpoint)
    _checkpoint_as_older_incarnation(checkpoint, topic)
    produce(client, topic, 30, 40)

    with pytest.raises(Exception) as excinfo:
        _stream_to_parquet(spark, url, topic, out, checkpoint)
    text = _error_text(excinfo)
    assert "option 'failOnDataLoss'" in text and "deleted and recreated" in text, text[:800]

    _stream_to_parquet(spark, url, topic, out, checkpoint, failOnDataLoss="false")
    values = sorted(r.v for r in spark.read.parquet(str(out)).collect())
    # the first run's 30, then the whole "new" topic (all 40) read from its first entry
    assert values == sorted([f"m{i}" for i in range(30)] + [f"m{i}" for i in range(40)])
