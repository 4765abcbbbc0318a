"""The ``minipulsar`` Spark source when retention deletes data, when a query
restarts, and what holds data for it (issue 22, cases 2, 3, 5 and 7), against
a real standalone cluster whose ledgers roll over every 5 entries and local[2]
Spark:

* entries deleted between planning a batch and reading it fail the read
  (``failOnDataLoss``) or are skipped and counted, with and without a crash
  of the driver in between;
* ``startingOffsets=latest`` is resolved once: a re-run of a planned batch
  reads what the first run would have read;
* a checkpoint at the end of a ledger that was read to its end and then
  deleted is not a data loss;
* ``durableSubscription`` holds unread data against retention, and goes away
  with the query (a leftover is listed and removed with ``minipulsar-admin``);
  ``topics update-partitioned-topic`` adds partitions the stream then reads.

Retention is switched per namespace: kept (-1) while producing and planning,
then 0 and a trim triggered (a durable subscription created and deleted) to
delete every closed ledger.
"""
from __future__ import annotations

import json
import time
import uuid

import pytest

from client import Client, SyncAdminClient
from client.spark.options import SourceError, SourceOptions
from client.spark.source import SCHEMA, MinipulsarBatchReader, MinipulsarDataSource
from tests.procs import ProcessTracker, start_standalone
from tests.spark.fixtures import produce, requires_spark, spark_session

pytestmark = [requires_spark, pytest.mark.timeout(300)]

ENTRIES_PER_LEDGER = 5


@pytest.fixture(scope="module", autouse=True)
def spark():
    # first, before this module opens any client: starting the JVM forks this process
    return spark_session()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone cluster whose ledgers hold 5 entries (rollover at once), keeping data by
    default; the deduplication cursor follows every entry (its default, every 1000 entries,
    would hold back trimming)."""
    data = tmp_path_factory.mktemp("spark-loss")
    config = data / "broker.toml"
    config.write_text(f"managed_ledger_max_entries_per_ledger = {ENTRIES_PER_LEDGER}\n"
                      "managed_ledger_min_ledger_rollover_time_minutes = 0\n"
                      "default_retention_time_in_minutes = -1\n"
                      "default_retention_size_in_mb = -1\n"
                      "broker_deduplication_entries_interval = 1\n")   # the dedup cursor holds nothing back
    tracker = ProcessTracker()
    proc = start_standalone(data / "cluster", ("--broker-config", str(config)), tracker=tracker)
    try:
        yield proc
    finally:
        proc.terminate()
        tracker.kill_all()


@pytest.fixture(scope="module")
def url(cluster):
    return cluster.service_url


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


def new_topic(admin, prefix: str, retention_minutes: int = -1) -> tuple[str, str]:
    """A topic in a fresh namespace with the given retention (-1: keep, 0: none)."""
    ns = f"public/{prefix}-{uuid.uuid4().hex[:6]}"
    admin.create_namespace(ns)
    admin.set_retention(ns, retention_minutes, retention_minutes)
    return ns, f"persistent://{ns}/t"


def ledgers(admin, topic) -> list[tuple[int, int]]:
    return [(li["ledgerId"], li["entries"]) for li in admin.get_internal_stats(topic)["ledgers"]]


def trim(client, admin, ns: str, topic: str) -> None:
    """Retention 0 on ``ns``, and a trim of ``topic``: every closed ledger goes."""
    admin.set_retention(ns, 0, 0)
    consumer = client.subscribe(topic, f"trim-{uuid.uuid4().hex[:6]}")
    consumer.unsubscribe()                     # deleting a cursor schedules the trim
    deadline = time.monotonic() + 30
    while len(ledgers(admin, topic)) > 1:
        assert time.monotonic() < deadline, f"the closed ledgers of {topic} were not trimmed: {ledgers(admin, topic)}"
        time.sleep(0.1)


def values(sent: dict) -> list[str]:
    return sorted(v.decode() for v in sent)


class Collect:
    """A foreachBatch function keeping each batch's values; ``fail_first``: the
    first batch it gets raises instead (the driver dies after planning it)."""

    def __init__(self, fail_first: bool = False):
        self.batches: dict[int, list[str]] = {}
        self.fail_first = fail_first

    def __call__(self, df, batch_id):
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError(f"the driver dies with batch {batch_id} planned")
        self.batches[batch_id] = [r.v for r in df.selectExpr("CAST(value AS STRING) AS v").collect()]

    @property
    def rows(self) -> list[str]:
        return sorted(v for b in self.batches.values() for v in b)


def run_stream(spark, url, topic, checkpoint, sink: Collect, available_now=True, **options):
    reader = (spark.readStream.format("minipulsar").option("service_url", url).option("topics", topic)
              .option("readTimeoutMs", "60000"))
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    if not available_now:
        return writer.start()
    query = writer.trigger(availableNow=True).start()
    try:
        query.awaitTermination(180)
    except Exception:  # noqa: BLE001 - the caller looks at query.exception()
        pass
    assert not query.isActive, "the AvailableNow query did not finish"
    return query


# ---- case 2: data deleted between planning and reading ---------------------------------------
def test_a_batch_rerun_after_a_crash_fails_when_its_entries_were_deleted(spark, url, client, admin, tmp_path):
    ns, topic = new_topic(admin, "spark-crash")
    first = produce(client, topic, 0, 10, batching=False)              # ledgers 1, 2 full
    checkpoint = tmp_path / "checkpoint"
    sink = Collect()
    assert run_stream(spark, url, topic, checkpoint, sink, startingOffsets="earliest").exception() is None
    assert sink.rows == values(first)

    second = produce(client, topic, 10, 28, batching=False)            # 3 more full ledgers, 3 entries in the last
    crashed = run_stream(spark, url, topic, checkpoint, Collect(fail_first=True))
    assert crashed.exception() is not None                              # batch 1 planned, never committed
    trim(client, admin, ns, topic)                                      # its first 15 entries are gone
    assert sum(n for _, n in ledgers(admin, topic)) == 3

    rerun = Collect()                                                   # the re-run of batch 1 must not skip them
    error = run_stream(spark, url, topic, checkpoint, rerun).exception()
    assert error is not None, f"the re-run of the batch went on and read {rerun.rows}"
    text = str(error)
    assert "option 'failOnDataLoss'" in text and "may have been deleted" in text, text[:800]

    rerun = Collect()                                                   # failOnDataLoss=false: what is left
    assert run_stream(spark, url, topic, checkpoint, rerun, failOnDataLoss="false").exception() is None
    assert rerun.rows == values(second)[-3:]


def test_entries_deleted_between_planning_and_reading_fail_the_read(url, client, admin):
    """The same race without a crash: the worker checks the ledgers the driver planned."""
    ns, topic = new_topic(admin, "spark-race")
    sent = produce(client, topic, 0, 13, batching=False)              # ledgers of 5, 5 and 3 entries

    def planned(**options):
        reader = MinipulsarBatchReader(SourceOptions.parse({"service_url": url, "topics": topic, **options}, False),
                                       SCHEMA)
        return reader, reader.partitions()

    strict, strict_parts = planned()
    lenient, lenient_parts = planned(failOnDataLoss="false")
    trim(client, admin, ns, topic)

    with pytest.raises(SourceError) as excinfo:
        [batch for batch in strict.read(strict_parts[0])]
    text = str(excinfo.value)
    assert "option 'failOnDataLoss'" in text and "10 entries" in text and "deleted" in text, text
    got = sorted(v.decode() for batch in lenient.read(lenient_parts[0]) for v in batch.column("value").to_pylist())
    assert len(sent) == 13 and got == ["m10", "m11", "m12"]


# ---- case 3: startingOffsets=latest --------------------------------------------------------
def _rows(reader, start, end) -> list[str]:
    return sorted(v.decode() for part in reader.partitions(start, end) for batch in reader.read(part)
                  for v in batch.column("value").to_pylist())


def test_latest_is_resolved_once_and_a_rerun_of_the_first_batch_reads_the_same(url, client, admin):
    """Spark's calls, as MicroBatchExecution makes them: initialOffset, latestOffset(start),
    partitions(start, end); after a crash before the batch commits, a new reader re-runs it with
    a new initialOffset() and the checkpointed end."""
    _, topic = new_topic(admin, "spark-latest")
    produce(client, topic, 0, 5, batching=False)
    source = MinipulsarDataSource({"service_url": url, "topics": topic})
    first = source.streamReader(SCHEMA)
    try:
        start = first.initialOffset()
        produce(client, topic, 5, 24, batching=False)              # 19 arrive while the first batch is planned
        end0 = first.latestOffset(start, first.getDefaultReadLimit())
        batch0 = _rows(first, start, end0)
    finally:
        first.stop()
    restarted = source.streamReader(SCHEMA)
    try:
        assert _rows(restarted, restarted.initialOffset(), end0) == batch0
        later = produce(client, topic, 24, 31, batching=False)
        end1 = restarted.latestOffset(end0, restarted.getDefaultReadLimit())
        assert sorted(batch0 + _rows(restarted, end0, end1)) == values(later)
    finally:
        restarted.stop()


def test_stream_from_latest_restarted_before_its_first_batch_committed(spark, url, client, admin, tmp_path):
    _, topic = new_topic(admin, "spark-latest-run")
    produce(client, topic, 0, 5, batching=False)
    checkpoint = tmp_path / "checkpoint"
    assert run_stream(spark, url, topic, checkpoint, Collect(fail_first=True)).exception() is not None
    after = produce(client, topic, 5, 17, batching=False)
    sink = Collect()
    assert run_stream(spark, url, topic, checkpoint, sink).exception() is None
    assert sink.rows == values(after)


# ---- case 5: a ledger read to its end, then deleted -----------------------------------------
def test_restart_after_a_fully_read_ledger_was_deleted_is_not_data_loss(spark, url, client, admin, tmp_path):
    ns, topic = new_topic(admin, "spark-ledger-end")
    first = produce(client, topic, 0, ENTRIES_PER_LEDGER, batching=False)   # exactly one full ledger
    checkpoint = tmp_path / "checkpoint"
    sink = Collect()
    assert run_stream(spark, url, topic, checkpoint, sink, startingOffsets="earliest").exception() is None
    assert sink.rows == values(first)
    admin.unload_topic(topic)                                            # reloaded: that ledger closed, a new one
    assert [n for _, n in ledgers(admin, topic)] == [ENTRIES_PER_LEDGER, 0]
    sink = Collect()                                                     # the query sees it closed, read to its end
    assert run_stream(spark, url, topic, checkpoint, sink).exception() is None
    assert sink.rows == []
    trim(client, admin, ns, topic)                                       # the ledger read to its end goes
    later = produce(client, topic, 100, 103, batching=False)

    sink = Collect()
    query = run_stream(spark, url, topic, checkpoint, sink)
    assert query.exception() is None, str(query.exception())[:800]
    assert sink.rows == values(later)


def test_a_caught_up_query_at_the_last_entry_of_a_full_ledger_survives_its_trim(spark, url, client, admin,
                                                                                  tmp_path):
    """Issue 34, case 3: the add that fills a ledger closes it and creates the next one at once
    (Pulsar's ManagedLedgerImpl), so a query that read everything sees the full ledger closed
    and its successor; after that ledger is trimmed the restarted query is not in data loss.
    Before, the full ledger stayed open until the next add: the query recorded it open and
    no successor, and its restart after the trim failed with a false failOnDataLoss error."""
    ns, topic = new_topic(admin, "spark-full-ledger")
    first = produce(client, topic, 0, ENTRIES_PER_LEDGER, batching=False)   # fills exactly one ledger
    deadline = time.monotonic() + 10
    while [n for _, n in ledgers(admin, topic)] != [ENTRIES_PER_LEDGER, 0]:   # closed without another add
        assert time.monotonic() < deadline, f"the full ledger was not closed: {ledgers(admin, topic)}"
        time.sleep(0.05)
    checkpoint = tmp_path / "checkpoint"
    sink = Collect()
    assert run_stream(spark, url, topic, checkpoint, sink, startingOffsets="earliest").exception() is None
    assert sink.rows == values(first)                                    # caught up: checkpoint at entry 4
    later = produce(client, topic, 100, 103, batching=False)
    trim(client, admin, ns, topic)                                       # the full ledger goes
    sink = Collect()
    query = run_stream(spark, url, topic, checkpoint, sink)
    assert query.exception() is None, str(query.exception())[:800]
    print(f"\nrows written {len(first)} + {len(later)}, read {len(values(first))} + {len(sink.rows)} "
          f"across the trim of the full ledger")
    assert sink.rows == values(later)


# ---- case 7: durable subscription, more partitions ------------------------------------------
def test_durable_subscription_holds_unread_entries_until_the_query_stops(spark, url, client, admin, tmp_path):
    ns, topic = new_topic(admin, "spark-durable", retention_minutes=0)     # no retention: only cursors hold data
    sent = produce(client, topic, 0, 1, batching=False)
    sink = Collect()
    query = run_stream(spark, url, topic, tmp_path / "checkpoint", sink, available_now=False,
                       startingOffsets="earliest", maxOffsetsPerTrigger="2", durableSubscription="true",
                       subscriptionPrefix="spark-keep")
    try:
        deadline = time.monotonic() + 60
        while "spark-keep" not in admin.get_subscriptions(topic):
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.1)
        sent.update(produce(client, topic, 1, 21, batching=False))       # 4 rollovers while the query lags
        while len(sink.rows) < len(sent):
            assert query.isActive and time.monotonic() < deadline + 120, (query.exception(), len(sink.rows))
            time.sleep(0.2)
        assert sink.rows == values(sent)
    finally:
        query.stop()
    deadline = time.monotonic() + 30
    while "spark-keep" in admin.get_subscriptions(topic):
        assert time.monotonic() < deadline, "the durable subscription outlived the query"
        time.sleep(0.1)


def test_a_leftover_durable_subscription_is_listed_and_removed_with_the_admin_cli(url, client, admin, capsys):
    from client.admin_cli import main as admin_main
    _, topic = new_topic(admin, "spark-leftover")
    admin.create_partitioned_topic(topic, 2)
    produce(client, topic, 0, 10)
    source = MinipulsarDataSource({"service_url": url, "topics": topic, "durableSubscription": "true",
                                   "subscriptionPrefix": "spark-left"})
    reader = source.streamReader(SCHEMA)
    reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
    reader._lookup.close()                                               # the driver dies: no stop()
    capsys.readouterr()
    assert admin_main(["--service-url", url, "--json", "topics", "subscriptions", topic]) == 0
    assert "spark-left" in json.loads(capsys.readouterr().out)
    assert admin_main(["--service-url", url, "topics", "unsubscribe", topic, "-s", "spark-left"]) == 0
    assert admin.get_subscriptions(topic) == []
    for partition in range(2):
        assert admin.get_subscriptions(f"{topic}-partition-{partition}") == []


def test_update_partitioned_topic_adds_partitions_the_stream_reads(spark, url, client, admin, tmp_path, capsys):
    from client.admin_cli import main as admin_main
    _, topic = new_topic(admin, "spark-grow")
    admin.create_partitioned_topic(topic, 2)
    sent = produce(client, topic, 0, 20)
    checkpoint, sink = tmp_path / "checkpoint", Collect()
    assert run_stream(spark, url, topic, checkpoint, sink, startingOffsets="earliest").exception() is None

    capsys.readouterr()
    assert admin_main(["--service-url", url, "topics", "update-partitioned-topic", topic, "-p", "3"]) == 0
    assert "now has 3 partitions (was 2)" in capsys.readouterr().out
    assert admin_main(["--service-url", url, "topics", "update-partitioned-topic", topic, "-p", "2"]) == 1
    assert "can only grow" in capsys.readouterr().err
    assert admin.get_partitioned_topic_metadata(topic) == 3

    more = produce(client, topic, 20, 50)                               # spread over the 3 partitions
    assert {m["message_id"].partition for m in more.values()} == {0, 1, 2}
    assert run_stream(spark, url, topic, checkpoint, sink).exception() is None
    assert sink.rows == values({**sent, **more})
