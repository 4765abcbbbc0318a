"""Measure the Spark source and sink job (the figures of issue 7).

    .venv/bin/python scripts/spark_bench.py [--service-url URL] [--messages 200000] [--flights]

Without ``--service-url`` a private standalone cluster is started in a temp
dir (and stopped).  Prints:

* batch source: rows/s reading N messages (``--size`` bytes) from a
  1-partition and a 4-partition topic (``df.agg(count, sum(length(value)))``,
  warm session, best of ``--repeat``);
* streaming: micro-batch latency (triggerExecution ms, median/p90) of a
  query reading ``--stream-rate`` msg/s produced while it runs;
* with ``--flights``: the sink job (available-now) on all 336,776 flights.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def produce(client, topic, n, size, start=0):
    producer = client.create_producer(topic, block_if_queue_full=True, max_pending_messages=5000,
                                      batching_max_messages=1000)
    pad = b"x" * max(0, size - 12)
    t0 = time.perf_counter()
    for i in range(start, start + n):
        producer.send_async(b"%010d" % i + pad, None, partition_key=str(i % 64))
    producer.flush()
    producer.close()
    return n / (time.perf_counter() - t0)


def bench_batch(spark, url, topic, n, repeat):
    from pyspark.sql import functions as F
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        row = (spark.read.format("minipulsar").option("service_url", url).option("topics", topic).load()
               .agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("bytes")).collect()[0])
        elapsed = time.perf_counter() - t0
        assert row.n == n, (row.n, n)
        best = elapsed if best is None else min(best, elapsed)
    return n / best, best


def bench_stream(spark, client, url, topic, rate, seconds, tmp):
    q = (spark.readStream.format("minipulsar").option("service_url", url).option("topics", topic)
         .option("startingOffsets", "latest").load()
         .writeStream.format("noop").option("checkpointLocation", os.path.join(tmp, "ck-" + uuid.uuid4().hex))
         .trigger(processingTime="0 seconds").start())
    stop = threading.Event()

    def producer_loop():
        producer = client.create_producer(topic, block_if_queue_full=True, batching_max_publish_delay_ms=5)
        i = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            for _ in range(max(1, rate // 10)):
                producer.send_async(b"s%010d" % i, None)
                i += 1
            producer.flush()
            time.sleep(max(0.0, 0.1 - (time.perf_counter() - t0)))
        producer.close()

    thread = threading.Thread(target=producer_loop, daemon=True)
    time.sleep(3)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    time.sleep(2)
    q.stop()
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    lat = sorted(p["durationMs"]["triggerExecution"] for p in batches)
    rows = [p["numInputRows"] for p in batches]
    return lat, rows


def bench_flights(spark, client, admin, url, tmp):
    from client.spark import flights as fl
    from client.spark.sink import build_parser, run
    topic = f"persistent://public/default/flights-{uuid.uuid4().hex[:6]}"
    admin.create_partitioned_topic(topic, fl.FLIGHTS_PARTITIONS)
    flights = fl.sorted_by_departure(fl.read_flights_csv())
    producer = client.create_producer(topic, block_if_queue_full=True, max_pending_messages=5000)
    t0 = time.perf_counter()
    for f in flights:
        payload, key, event_ms = fl.flight_to_message(f)
        producer.send_async(payload, None, partition_key=key, event_timestamp=event_ms)
    producer.flush()
    producer.close()
    produce_s = time.perf_counter() - t0
    args = build_parser().parse_args(["--service-url", url, "--topic", topic, "--output", os.path.join(tmp, "out"),
                                      "--checkpoint", os.path.join(tmp, "ck"), "--trigger", "available-now"])
    t0 = time.perf_counter()
    rc = run(args, spark=spark)
    elapsed = time.perf_counter() - t0
    n = spark.read.parquet(os.path.join(tmp, "out", "flights")).count()
    aggs = spark.read.parquet(os.path.join(tmp, "out", "carrier_hourly")).count()
    return rc, len(flights), produce_s, elapsed, n, aggs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--service-url")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=100, help="payload bytes")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--stream-rate", type=int, default=1000)
    p.add_argument("--stream-seconds", type=int, default=20)
    p.add_argument("--flights", action="store_true")
    p.add_argument("--skip-batch", action="store_true")
    args = p.parse_args(argv)

    from client import Client, SyncAdminClient
    from client.spark.session import build_session

    tmp = tempfile.mkdtemp(prefix="minipulsar-spark-bench-")
    proc = None
    url = args.service_url
    if url is None:
        from tests.procs import start_standalone
        proc = start_standalone(os.path.join(tmp, "cluster"))
        url = proc.service_url
    print(f"load average {os.getloadavg()}, cpus {os.cpu_count()}, master {args.master}", flush=True)
    client, admin = Client(url), SyncAdminClient(url)
    try:
        spark = build_session(master=args.master, app_name="minipulsar-spark-bench")
        spark.range(10).count()
        if not args.skip_batch:
            for parts in (1, 4):
                topic = f"persistent://public/default/bench{parts}-{uuid.uuid4().hex[:6]}"
                if parts > 1:
                    admin.create_partitioned_topic(topic, parts)
                rate = produce(client, topic, args.messages, args.size)
                rows_s, secs = bench_batch(spark, url, topic, args.messages, args.repeat)
                print(f"batch read, {parts} partition(s): {args.messages} x {args.size} B in {secs:.2f}s = "
                      f"{rows_s:,.0f} rows/s (produced at {rate:,.0f} msg/s)", flush=True)
        if args.stream_seconds > 0:
            topic = f"persistent://public/default/stream-{uuid.uuid4().hex[:6]}"
            admin.create_topic(topic)
            lat, rows = bench_stream(spark, client, url, topic, args.stream_rate, args.stream_seconds, tmp)
            if lat:
                print(f"streaming at ~{args.stream_rate} msg/s: {len(lat)} micro-batches, triggerExecution "
                      f"median {statistics.median(lat):.0f} ms, p90 {lat[int(0.9 * (len(lat) - 1))]:.0f} ms, "
                      f"max {lat[-1]:.0f} ms; rows/batch median {statistics.median(rows):.0f}", flush=True)
        if args.flights:
            rc, n, produce_s, elapsed, written, aggs = bench_flights(spark, client, admin, url, tmp)
            print(f"sink job (available-now) on {n:,} flights: rc {rc}, {elapsed:.1f}s = {n / elapsed:,.0f} "
                  f"flights/s ({written:,} rows written, {aggs:,} carrier-hour rows); produced in "
                  f"{produce_s:.1f}s", flush=True)
    finally:
        client.close()
        admin.close()
        if proc is not None:
            proc.terminate()
            proc.kill()


if __name__ == "__main__":
    main()
