"""The sink job (minipulsar-spark-sink) through SIGKILLs and trimming.

A private standalone cluster whose ledgers roll over every 20 entries and whose
namespace keeps nothing consumed (retention 0: every rollover trims the ledgers
behind the slowest durable cursor).  N flights are published in departure
order at a steady rate; the sink job (--trigger 2s --durable-subscription) is
SIGKILLed (its whole process group: Python driver, JVM, Python workers) K
times while they are published, restarted after a pause each time, and run to
completion with --trigger available-now at the end.  Then:

* rows in (sent, with their message ids) vs rows out (Parquet flights table),
  lost (sent, not written) and duplicated (written more than once);
* carrier_hourly vs the same aggregation in pandas (windows exact);
* ledgers trimmed during the run.

    .venv/bin/python scripts/spark_sink_chaos.py [--flights 15000] [--kills 3] [--rate 300]
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from client import Client, SyncAdminClient  # noqa: E402
from client.spark import flights as fl  # noqa: E402
from tests.procs import ProcessTracker, start_standalone  # noqa: E402

WATERMARK_HOURS = 2


def expected_hourly(flights):
    import pandas as pd
    df = pd.DataFrame(flights)
    df["event_ms"] = [fl.scheduled_departure_ms(r.year, r.month, r.day, r.hour, r.minute) for r in df.itertuples()]
    df["window_start"] = pd.to_datetime(df.event_ms // 3_600_000 * 3_600_000, unit="ms")
    df["cancelled"] = df.dep_time.isna()
    watermark = pd.to_datetime(df.event_ms.max() - WATERMARK_HOURS * 3_600_000, unit="ms")
    agg = (df.groupby(["window_start", "carrier"])
             .agg(flights=("carrier", "size"), cancellations=("cancelled", "sum"),
                  mean_dep_delay=("dep_delay", "mean")).reset_index())
    closed = agg[agg.window_start + pd.Timedelta(hours=1) <= watermark]
    return closed.sort_values(["window_start", "carrier"]).reset_index(drop=True)


def start_sink(url, topic, out, ck, log, trigger):
    cmd = [str(REPO / ".venv/bin/minipulsar-spark-sink"), "--service-url", url, "--topic", topic,
           "--output", str(out), "--checkpoint", str(ck), "--trigger", trigger, "--durable-subscription",
           "--master", "local[2]", "--watermark", f"{WATERMARK_HOURS} hours", "--cluster", "standalone",
           "--shuffle-partitions", "2"]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flights", type=int, default=15000)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--rate", type=float, default=300.0, help="flights/s")
    ap.add_argument("--seed", type=int, default=22)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    from client.spark.session import build_session
    spark = build_session("local[1]", "sink-chaos-check", shuffle_partitions=2)   # before any client: forks

    work = Path(tempfile.mkdtemp(prefix="sink-chaos-"))
    (work / "broker.toml").write_text("managed_ledger_max_entries_per_ledger = 20\n"
                                      "managed_ledger_min_ledger_rollover_time_minutes = 0\n"
                                      "broker_deduplication_entries_interval = 1\n")
    tracker = ProcessTracker()
    cluster = start_standalone(work / "cluster", ("--broker-config", str(work / "broker.toml")), tracker=tracker)
    url = cluster.service_url
    topic = "persistent://public/chaos/flights"
    admin = SyncAdminClient(url)
    admin.create_namespace("public/chaos")
    admin.set_retention("public/chaos", 0, 0)                 # nothing kept once every durable cursor passed it
    admin.create_partitioned_topic(topic, fl.FLIGHTS_PARTITIONS)
    flights = fl.sorted_by_departure(fl.read_flights_csv(limit=args.flights * 2))[:args.flights]
    print(f"work dir {work}; {len(flights)} flights; broker {url}", flush=True)

    sent: dict[str, str] = {}           # message id -> carrier (rows in)
    seen_ledgers: dict[int, set] = {i: set() for i in range(fl.FLIGHTS_PARTITIONS)}
    done, stop_watch = threading.Event(), threading.Event()

    def publish():
        client = Client(url)
        producer = client.create_producer(topic, block_if_queue_full=True, batching_max_messages=50)
        ids = {}
        t0 = time.monotonic()
        for i, flight in enumerate(flights):
            payload, key, event_ms = fl.flight_to_message(flight)

            def cb(exc, mid, i=i):
                ids[i] = exc if exc is not None else mid
            producer.send_async(payload, cb, partition_key=key, event_timestamp=event_ms)
            delay = t0 + (i + 1) / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        producer.flush()
        producer.close()
        client.close()
        failed = [v for v in ids.values() if isinstance(v, Exception)]
        assert not failed and len(ids) == len(flights), (len(failed), len(ids))
        for i, mid in ids.items():
            sent[str(mid)] = flights[i]["carrier"]
        done.set()

    def watch_ledgers():
        while not stop_watch.is_set():
            for p in range(fl.FLIGHTS_PARTITIONS):
                try:
                    st = admin.get_internal_stats(f"{topic}-partition-{p}")
                    seen_ledgers[p].update(li["ledgerId"] for li in st["ledgers"])
                except Exception:  # noqa: BLE001
                    pass
            stop_watch.wait(0.5)

    out, ck = work / "out", work / "checkpoint"
    log = open(work / "sink.log", "ab")
    producer_thread = threading.Thread(target=publish)
    watcher = threading.Thread(target=watch_ledgers, daemon=True)
    t_start = time.monotonic()
    watcher.start()
    kills = 0

    def batches() -> int:
        try:
            return (work / "sink.log").read_text(errors="replace").count("[flights] batch ")
        except OSError:
            return 0

    def wait_for_batch(since: int, limit: float = 300) -> None:
        deadline = time.monotonic() + limit
        while batches() <= since and time.monotonic() < deadline:
            time.sleep(0.2)
    try:
        sink = start_sink(url, topic, out, ck, log, "2s")
        while len(admin.get_subscriptions(topic)) < 2:      # the job holds the topic before anything is sent
            time.sleep(0.2)
        print(f"[{time.monotonic() - t_start:5.1f}s] the job holds {admin.get_subscriptions(topic)}", flush=True)
        producer_thread.start()
        while kills < args.kills and not done.is_set():
            wait_for_batch(batches())                        # at least one batch in this run, then a while
            time.sleep(rnd.uniform(1, 6))
            if done.is_set():
                break
            os.killpg(sink.pid, signal.SIGKILL)
            sink.wait()
            kills += 1
            subs = sorted(admin.get_subscriptions(topic))
            print(f"[{time.monotonic() - t_start:5.1f}s] SIGKILL {kills} after {batches()} flights batches logged; "
                  f"subscriptions left holding data: {subs}", flush=True)
            time.sleep(rnd.uniform(2, 5))
            sink = start_sink(url, topic, out, ck, log, "2s")
        producer_thread.join()
        print(f"[{time.monotonic() - t_start:5.1f}s] all {len(sent)} flights published", flush=True)
        wait_for_batch(batches())
        time.sleep(rnd.uniform(0, 3))
        os.killpg(sink.pid, signal.SIGKILL)   # one more, after the last publish
        sink.wait()
        kills += 1
        print(f"[{time.monotonic() - t_start:5.1f}s] SIGKILL {kills}", flush=True)
        final = start_sink(url, topic, out, ck, log, "available-now")
        rc = final.wait(900)
        print(f"[{time.monotonic() - t_start:5.1f}s] final available-now run exit status {rc}", flush=True)
    finally:
        log.close()

    import pandas as pd
    stop_watch.set()
    table = spark.read.parquet(str(out / "flights"))          # follows Spark's sink log
    written = [r.message_id for r in table.select("message_id").collect()]
    committed = set(table.inputFiles())
    on_disk = {"file://" + str(p) for p in (out / "flights").rglob("*.parquet")}
    written_set = set(written)
    lost = set(sent) - written_set
    dup = len(written) - len(written_set)
    extra = written_set - set(sent)
    print(f"rows in {len(sent)}, rows out {len(written)}, lost {len(lost)}, duplicated {dup}, unknown {len(extra)}; "
          f"Parquet files in the sink log {len(committed)}, on disk {len(on_disk)} "
          f"(left by killed batches, not in the log: {len(on_disk - committed)})", flush=True)
    hourly = (spark.read.parquet(str(out / "carrier_hourly")).toPandas()
              .sort_values(["window_start", "carrier"]).reset_index(drop=True))
    exp = expected_hourly(flights)
    same = (len(hourly) == len(exp) and list(hourly.carrier) == list(exp.carrier)
            and list(pd.to_datetime(hourly.window_start)) == list(exp.window_start)
            and list(hourly.flights) == list(exp.flights) and list(hourly.cancellations) == list(exp.cancellations))
    print(f"carrier_hourly: {len(hourly)} windows, expected {len(exp)}; flights {int(hourly.flights.sum())} vs "
          f"{int(exp.flights.sum())}; identical: {'yes' if same else 'NO'}", flush=True)
    now = {p: {li["ledgerId"] for li in admin.get_internal_stats(f"{topic}-partition-{p}")["ledgers"]}
           for p in seen_ledgers}
    trimmed = {p: len(ids - now[p]) for p, ids in seen_ledgers.items()}
    print(f"ledgers trimmed during the run, per partition: {trimmed} (total {sum(trimmed.values())}); "
          f"SIGKILLs {kills}", flush=True)
    print(f"subscriptions at the end: {admin.get_subscriptions(topic)}", flush=True)
    spark.stop()
    admin.close()
    cluster.terminate()
    tracker.kill_all()
    return 0 if not lost and not dup and not extra and same else 1


if __name__ == "__main__":
    sys.exit(main())
