"""``minipulsar-spark-sink``: the geo demo's analytics job (PySpark Structured
Streaming).

::

    minipulsar-spark-sink --service-url minipulsar://localhost:6600 \\
        --topic persistent://geo/flights/departures \\
        --output /data/analytics --checkpoint /data/checkpoints [--trigger 10s|available-now]

Reads the flights topic with the ``minipulsar`` source, parses each flight's
JSON (``client.spark.flights``) and runs two streaming queries, each with its
own checkpoint (``<checkpoint>/flights``, ``<checkpoint>/carrier_hourly``):

* ``<output>/flights``: every flight as Parquet, partitioned by ``date`` (the
  local date of the flight) and ``origin_cluster`` (the cluster where the
  message was published: ``replicated_from``, or this broker's cluster);
* ``<output>/carrier_hourly``: per carrier and hour of scheduled departure
  (a one-hour event-time window; ``date`` and ``hour`` = ``sched_dep_time //
  100`` name it in local time): ``flights``, ``mean_dep_delay``,
  ``p90_dep_delay`` (exact, linear interpolation like pandas' ``quantile``),
  ``cancellations`` (``dep_time`` null).  A watermark on event time
  (``--watermark``, default 1 day) closes windows; each window is appended
  once, when the watermark passes its end.  Flights later than the watermark
  are dropped, so publish in departure order (the geo demo does).

Both queries are exactly-once (checkpointed source offsets + Spark's Parquet
sink log).  ``--durable-subscription`` keeps unread data from retention while
the job is down (the source's ``durableSubscription``, one subscription per
query named after its checkpoint, taken over at restart).  The same topic copy in two clusters gives identical aggregates.
Each micro-batch prints one progress line (rows, rate, end offsets).  Runs on
``--master local[*]`` (default) or a Spark cluster (``spark://host:7077``;
workers need minipulsar installed).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Sequence

from client.spark.flights import FLIGHT_SCHEMA_DDL, FLIGHTS_TOPIC

__all__ = ["parse_flights", "hourly_aggregates", "parse_trigger", "durable_subscription_name", "build_parser", "run",
           "main"]


def parse_trigger(text: str) -> dict:
    """``"available-now"`` -> ``{"availableNow": True}``; ``"10s"``, ``"2 min"``,
    ``"500ms"`` -> ``{"processingTime": "10 seconds"}``.  Raises ``ValueError``."""
    value = text.strip().lower()
    if value in ("available-now", "availablenow", "available_now"):
        return {"availableNow": True}
    units = {"ms": "milliseconds", "s": "seconds", "sec": "seconds", "seconds": "seconds", "m": "minutes",
             "min": "minutes", "minutes": "minutes", "h": "hours", "hours": "hours"}
    number = value.rstrip("abcdefghijklmnopqrstuvwxyz ").strip()
    unit = value[len(number):].strip() or "s"
    try:
        amount = float(number)
    except ValueError:
        amount = -1
    if amount <= 0 or unit not in units:
        raise ValueError(f"invalid --trigger {text!r}: use 'available-now' or an interval like '10s', '2min'")
    return {"processingTime": f"{amount:g} {units[unit]}"}


def parse_flights(source_df, local_cluster: str):
    """Flights from the source's rows: the JSON columns (``FLIGHT_SCHEMA_DDL``)
    plus ``date`` (local flight date), ``origin_cluster``, ``event_time``
    (scheduled departure; from the message, else computed), ``cancelled``,
    ``sched_hour`` and the message's ``topic``, ``partition``, ``message_id``,
    ``publish_time``.  Rows whose payload is not a flight are dropped."""
    from pyspark.sql import functions as F

    parsed = source_df.select(
        F.from_json(F.col("value").cast("string"), FLIGHT_SCHEMA_DDL).alias("f"),
        "topic", "partition", "message_id", "publish_time", F.col("event_time").alias("msg_event_time"),
        "replicated_from")
    flights = parsed.where(F.col("f").isNotNull() & F.col("f.year").isNotNull() & F.col("f.carrier").isNotNull())
    computed = F.make_timestamp(F.col("f.year"), F.col("f.month"), F.col("f.day"), F.col("f.hour"),
                                F.col("f.minute"), F.lit(0), F.lit("America/New_York"))
    return flights.select(
        "f.*",
        F.make_date(F.col("f.year"), F.col("f.month"), F.col("f.day")).alias("date"),
        F.coalesce(F.col("replicated_from"), F.lit(local_cluster)).alias("origin_cluster"),
        F.coalesce(F.col("msg_event_time"), computed).alias("event_time"),
        F.col("f.dep_time").isNull().alias("cancelled"),
        (F.col("f.sched_dep_time") / 100).cast("int").alias("sched_hour"),
        "topic", "partition", "message_id", "publish_time")


def hourly_aggregates(flights_df, watermark: str = "1 day"):
    """Per carrier and one-hour event-time window (= hour of scheduled
    departure): ``window_start``, ``window_end`` (UTC timestamps), ``date``,
    ``hour`` (local), ``carrier``, ``flights``, ``mean_dep_delay``,
    ``p90_dep_delay`` (minutes), ``cancellations``; with a watermark of
    ``watermark`` (a Spark interval, e.g. ``"1 day"``) on ``event_time``."""
    from pyspark.sql import functions as F

    grouped = (flights_df.withWatermark("event_time", watermark)
               .groupBy(F.window("event_time", "1 hour").alias("w"), "carrier", "date",
                        F.col("sched_hour").alias("hour")))
    return grouped.agg(
        F.count(F.lit(1)).alias("flights"),
        F.avg("dep_delay").alias("mean_dep_delay"),
        F.percentile(F.col("dep_delay"), F.lit(0.9)).alias("p90_dep_delay"),
        F.sum(F.col("cancelled").cast("long")).alias("cancellations"),
    ).select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "date", "hour",
             "carrier", "flights", "mean_dep_delay", "p90_dep_delay", "cancellations")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``minipulsar-spark-sink``."""
    p = argparse.ArgumentParser(prog="minipulsar-spark-sink",
                                description="Flights topic -> Parquet flights + per-carrier hourly aggregates "
                                            "(Spark Structured Streaming, exactly-once).")
    p.add_argument("--service-url", required=True, help="broker, minipulsar://host:port")
    p.add_argument("--topic", default=FLIGHTS_TOPIC, help=f"flights topic (default {FLIGHTS_TOPIC})")
    p.add_argument("--output", required=True, help="output directory (flights/, carrier_hourly/)")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (one per query inside)")
    p.add_argument("--trigger", default="10s", help="'available-now' (read what is there, then exit) or an "
                                                     "interval like '10s' (default; run until Ctrl-C)")
    p.add_argument("--watermark", default="1 day", help="event-time watermark delay (default '1 day')")
    p.add_argument("--starting-offsets", default="earliest", help="startingOffsets of a new query (default earliest)")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None, help="entries per micro-batch (default: all)")
    p.add_argument("--durable-subscription", action="store_true",
                   help="hold unread data with a durable subscription per query and partition (source option "
                        "durableSubscription), named after the checkpoint so a restart takes it over")
    p.add_argument("--cluster", default=None, help="local cluster name for origin_cluster (default: ask the broker)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--shuffle-partitions", type=int, default=4, help="spark.sql.shuffle.partitions (default 4)")
    p.add_argument("--timeout", type=float, default=None, help="stop after this many seconds (default: never)")
    p.add_argument("--quiet", action="store_true", help="no per-batch progress lines")
    return p


def durable_subscription_name(checkpoint: str, query: str) -> str:
    """The durable subscription of one of the job's queries
    (``--durable-subscription``): ``spark-sink-<query>-<hash of the checkpoint
    directory>``, the same at every restart of that checkpoint."""
    import hashlib
    import os
    digest = hashlib.sha1(os.path.abspath(os.path.join(checkpoint, query)).encode()).hexdigest()[:8]
    return f"spark-sink-{query}-{digest}"


def _local_cluster(service_url: str) -> str:
    from client.spark.lookup import BrokerLookup
    from client.spark.options import SourceOptions
    with BrokerLookup(SourceOptions.parse({"service_url": service_url, "topics": "unused"}, False)) as lookup:
        return lookup.local_cluster() or "local"


def _progress_line(name: str, progress: dict) -> str:
    rows = progress.get("numInputRows", 0)
    rate = progress.get("processedRowsPerSecond") or 0.0
    ends = [s.get("endOffset") for s in progress.get("sources", [])]
    end = ends[0] if len(ends) == 1 else ends
    if isinstance(end, str):
        try:
            end = json.loads(end)
        except ValueError:
            pass
    compact = {t.rsplit("/", 1)[-1]: v for t, v in end.items()} if isinstance(end, dict) else end
    ms = progress.get("durationMs", {}).get("triggerExecution", 0)
    return (f"[{name}] batch {progress.get('batchId')}: {rows} rows in {ms} ms, {rate:,.0f} rows/s, "
            f"offsets {json.dumps(compact, separators=(',', ':'))}")


def run(args: argparse.Namespace, spark=None, out=sys.stdout) -> int:
    """Run the job with parsed ``args`` on ``spark`` (default: the active
    session, else a new one from ``client.spark.session.build_session``, stopped
    at the end).  Returns 0 when every query ended
    well (available-now) or was stopped (Ctrl-C/SIGTERM/``--timeout``), 1 when
    a query failed (the error is printed)."""
    trigger = parse_trigger(args.trigger)
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):   # stop gracefully, even while Spark starts
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        return _run(args, spark, out, trigger, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(args, spark, out, trigger, stop) -> int:
    import os

    own_session = False
    if spark is None:
        from pyspark.sql import SparkSession

        from client.spark.session import build_session
        own_session = SparkSession.getActiveSession() is None
        spark = build_session(master=args.master, app_name="minipulsar-spark-sink",
                              shuffle_partitions=args.shuffle_partitions)
    else:
        from client.spark import register
        register(spark)
    cluster = args.cluster or _local_cluster(args.service_url)

    def flights_of(query: str):
        reader = (spark.readStream.format("minipulsar").option("service_url", args.service_url)
                  .option("topics", args.topic).option("startingOffsets", args.starting_offsets))
        if args.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
        if getattr(args, "durable_subscription", False):
            reader = (reader.option("durableSubscription", "true")
                      .option("subscriptionPrefix", durable_subscription_name(args.checkpoint, query)))
        return parse_flights(reader.load(), cluster)

    queries = []
    try:
        if stop.is_set():
            return 0
        queries.append(flights_of("flights").writeStream.queryName("flights").format("parquet")
                       .partitionBy("date", "origin_cluster")
                       .option("path", os.path.join(args.output, "flights"))
                       .option("checkpointLocation", os.path.join(args.checkpoint, "flights"))
                       .trigger(**trigger).start())
        queries.append(hourly_aggregates(flights_of("carrier_hourly"), args.watermark).writeStream
                       .queryName("carrier_hourly")
                       .format("parquet").outputMode("append")
                       .option("path", os.path.join(args.output, "carrier_hourly"))
                       .option("checkpointLocation", os.path.join(args.checkpoint, "carrier_hourly"))
                       .trigger(**trigger).start())
        print(f"minipulsar-spark-sink: {args.topic} at {args.service_url} (cluster {cluster}) -> {args.output}; "
              f"trigger {args.trigger}", file=out, flush=True)
        return _wait(queries, args, out, stop)
    finally:
        for q in queries:
            if q.isActive:
                q.stop()
        if own_session:
            spark.stop()


def _graceful_stop(queries, wait_s: float = 30.0) -> None:
    """Stop each query between micro-batches when possible (waits up to
    ``wait_s`` seconds for a running batch; the checkpoint makes a batch cut
    short safe anyway, it is replayed on restart)."""
    deadline = time.monotonic() + wait_s
    for q in queries:
        while q.isActive and q.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.1)
        q.stop()


def _wait(queries, args, out, stop: threading.Event) -> int:
    printed = {q.name: "" for q in queries}   # timestamp of the last progress printed
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        done = all(not q.isActive for q in queries)
        for q in queries:
            for progress in q.recentProgress:
                stamp = progress.get("timestamp", "")
                if stamp <= printed[q.name]:
                    continue
                printed[q.name] = stamp
                # idle triggers (no batch ran) report only latestOffset/triggerExecution
                if "addBatch" in progress.get("durationMs", {}) and not args.quiet:
                    print(_progress_line(q.name, progress), file=out, flush=True)
        failed = [q for q in queries if not q.isActive and q.exception() is not None]
        if failed:
            for q in failed:
                print(f"[{q.name}] failed: {q.exception()}", file=out, flush=True)
            return 1
        if done:
            return 0
        if stop.is_set() or (deadline is not None and time.monotonic() > deadline):
            print("minipulsar-spark-sink: stopping", file=out, flush=True)
            _graceful_stop(queries)
            return 0
        stop.wait(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``minipulsar-spark-sink``); returns the exit status
    (2 for a bad command line, 1 when a query failed)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        parse_trigger(args.trigger)
    except ValueError as exc:
        parser.error(str(exc))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
