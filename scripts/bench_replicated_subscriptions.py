"""Replicated-subscriptions benchmark (issue 5): from an acknowledgment in A to
the matching mark-delete in B.

For each broker setting (``--configs``; default: snapshot frequency 1000 ms
and 100 ms, each with minipulsar's UPDATEs between snapshots every
``replicated_subscriptions_update_interval_millis`` = 100 ms (the default) and
with that interval set to 10^9 ms, i.e. pure PIP-33 where B only moves when A's
mark-delete passes a completed snapshot), two fresh real clusters a and b are
started in a temporary directory (``python -m deploy.cli standalone``; bookies
fsync unless ``--no-sync``) with namespace ``bench/rsub`` replicated both
ways. Then:

* a producer process publishes ``--rate`` msg/s (default 500) of ``--size``
  bytes into a, one message per entry (batching off), each carrying its
  number in its first 8 bytes; it runs ``--warmup`` + ``--duration`` + a tail
  (so that snapshots taken after the last measured message exist);
* a consumer in A (SDK, ``replicate_subscription_state_enabled=True``,
  ``ack_group_time_ms`` = ``--ack-group-ms``, default 0 = each ack leaves at
  once) acknowledges every message cumulatively and records t_ack(k);
* a poller on B every ``--poll-ms`` (default 10) calls ``topics.internal_stats``
  (B's last entry) then ``topics.stats`` (admin verbs over gRPC) and records
  the subscription's ``markDeletePosition`` and ``msgBacklog`` with the time
  the answer arrived;
* a reader on B (raw, non-durable) maps B's positions to message numbers.

For every message k acknowledged in A during the measured ``--duration``, two
latencies from t_ack(k) to the first poll that shows k

* ``acked_latency_ms_*``: acknowledged in B, by counting: B's acknowledged
  messages = data entries up to B's last entry - msgBacklog (one message per
  entry, and acks in A are cumulative, so they are a prefix). This includes
  the individual acknowledgments that minipulsar's UPDATEs carry between
  snapshots: what a consumer failing over to B would not get again;
* ``mark_delete_latency_ms_*``: B's markDeletePosition at or past k's position
  in B (strict PIP-33 view).

p50/p99/p99.9/max in ms (HdrHistogram). Resolution: the poll interval plus the
poll's round trips (``poll_rtt_ms_*``; the count-based figure can only come
out late, never early). ONE JSON line per setting on stdout, progress on
stderr.

    .venv/bin/python scripts/bench_replicated_subscriptions.py [--quick] [--no-sync]
        [--configs 1000:100,100:100,1000:1000000000,100:1000000000]
        [--rate 500] [--duration 15] [--warmup 3] [--poll-ms 10] [--ack-group-ms 0]

``--quick`` (smoke test): settings 100:100 and 100:10^9 only, 0.5 s warm-up,
1 s measured. Nothing is asserted. Uses the worker and cluster helpers of
scripts/bench_replication.py.
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(SCRIPTS)
for _p in (REPO_ROOT, SCRIPTS):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import bench_replication as br  # noqa: E402

TENANT, NAMESPACE = "bench", "rsub"
SUBSCRIPTION = "bench-sub"
PURE_PIP33_UPDATE_MS = 1_000_000_000
DEFAULT_CONFIGS = f"1000:100,100:100,1000:{PURE_PIP33_UPDATE_MS},100:{PURE_PIP33_UPDATE_MS}"
QUICK_CONFIGS = f"100:100,100:{PURE_PIP33_UPDATE_MS}"


def progress(msg: str) -> None:
    br.progress(msg, "bench_replicated_subscriptions")


def parse_configs(text: str) -> list[tuple[int, int]]:
    """``"1000:100,100:1e9"`` -> [(snapshot ms, update interval ms)]."""
    out = []
    for item in text.split(","):
        snap, _, upd = item.strip().partition(":")
        out.append((int(float(snap)), int(float(upd)) if upd else 100))
    return out


class PositionMap:
    """Reads a topic on B (raw, non-durable, from the earliest entry) and keeps
    (position, message number) of every data entry, in order."""

    def __init__(self, cluster, topic: str):
        self.cluster, self.topic = cluster, topic
        self.positions: list[tuple[int, int]] = []
        self.numbers: list[int] = []
        self.arrived: dict[int, float] = {}    # message number -> epoch s it was read in B
        self.published: dict[int, float] = {}  # message number -> its publish time in A (epoch s)
        self.call = None
        self.task = None

    async def start(self) -> "PositionMap":
        from proto import broker_pb2 as pb

        self.call = self.cluster.stub().Consume()
        await self.call.write(pb.ConsumerRequest(subscribe=pb.Subscribe(
            topic=self.topic, subscription=f"bench-map-{uuid.uuid4().hex[:6]}", sub_type=pb.Exclusive,
            initial_position=pb.Earliest, durable=False)))
        first = await self.call.read()
        if not first.HasField("subscribed"):
            raise RuntimeError(f"reader on {self.cluster.name}: {first}")
        await self.call.write(pb.ConsumerRequest(flow=pb.Flow(permits=100_000)))
        self.task = asyncio.create_task(self._pump())
        return self

    async def _pump(self) -> None:
        import grpc

        from client.batching import is_batched, parse_batch
        from client.entry_format import decode_entry
        from proto import broker_pb2 as pb

        req = 0
        unflowed = unacked = 0
        last_ack = time.monotonic()
        while True:
            resp = await self.call.read()
            if resp is grpc.aio.EOF:
                return
            if not resp.HasField("messages"):
                continue
            last = None
            got = 0
            for e in resp.messages.entries:
                last = e.position
                md, payload = decode_entry(e.headers_and_payload)
                if md.HasField("marker_type"):
                    continue
                datas = [d for _, d in parse_batch(md, bytes(payload))] if is_batched(md) else [bytes(payload)]
                for data in datas:
                    self.positions.append((e.position.ledger_id, e.position.entry_id))
                    self.numbers.append(int.from_bytes(data[:8], "big"))
                    self.arrived.setdefault(self.numbers[-1], time.time())
                    self.published.setdefault(self.numbers[-1], md.publish_time / 1000.0)
                    got += 1
            if last is not None:
                # permits back at half the window, a cumulative ack at most every
                # 100 ms: the map adds few frames to b's load
                unflowed += got
                unacked += got
                if unflowed >= 50_000:
                    await self.call.write(pb.ConsumerRequest(flow=pb.Flow(permits=unflowed)))
                    unflowed = 0
                now = time.monotonic()
                if now - last_ack >= 0.1 or unacked >= 20_000:
                    req += 1
                    await self.call.write(pb.ConsumerRequest(ack=pb.Ack(
                        ack_type=pb.Cumulative, request_id=req,
                        positions=[pb.AckPosition(ledger_id=last.ledger_id, entry_id=last.entry_id)])))
                    last_ack, unacked = now, 0

    def covered(self, mark_delete: tuple[int, int]) -> int:
        """Highest message number at or before ``mark_delete`` in B (-1: none)."""
        i = bisect.bisect_right(self.positions, mark_delete)
        return self.numbers[i - 1] if i else -1

    def covered_by_count(self, last_confirmed: tuple[int, int], backlog: int) -> int:
        """Highest message number acknowledged in B when B's subscription has
        ``backlog`` unacknowledged data entries and B's last entry is
        ``last_confirmed``: acknowledged = data entries up to it - backlog (acks in
        A are cumulative, so B's acknowledged messages are a prefix)."""
        acked = bisect.bisect_right(self.positions, last_confirmed) - backlog
        return self.numbers[acked - 1] if acked > 0 else -1

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.call is not None:
            self.call.cancel()


async def scrape(cluster) -> dict[str, float]:
    """The ``pulsar_replicated_subscriptions_*`` series of ``cluster``'s /metrics
    (name -> value; {} when the broker has no such metrics, e.g. an older checkout)."""
    import urllib.request

    try:
        port = int(cluster.proc.stdout_log.read_text().split("http_port=")[-1].split()[0])
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
    except Exception:   # noqa: BLE001 - figures only
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("pulsar_replicated_subscriptions_"):
            name = line.split("{")[0].split(" ")[0]
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


def parse_position(text: str) -> tuple[int, int] | None:
    try:
        ledger, entry = text.split(":")[:2]
        return int(ledger), int(entry)
    except (ValueError, AttributeError):
        return None


async def run_setting(base: Path, snapshot_ms: int, update_ms: int, args) -> dict:
    from client import AsyncClient
    from client.consumer_config import InitialPosition
    from client.perf_stats import LatencyRecorder

    label = f"snap{snapshot_ms}-upd{update_ms}"
    config = (f"replicated_subscriptions_snapshot_frequency_millis = {snapshot_ms}\n"
              f"replicated_subscriptions_update_interval_millis = {update_ms}\n")
    cs = br.Clusters(base / label, ["a", "b"], args.sync, config)
    (base / label).mkdir(parents=True, exist_ok=True)
    tail_s = max(args.min_tail, 2.0 * snapshot_ms / 1000.0) if update_ms >= PURE_PIP33_UPDATE_MS \
        else max(args.min_tail, 1.2 * snapshot_ms / 1000.0)
    producer = client = pmap = None
    tasks: list[asyncio.Task] = []
    try:
        a, b = cs.start()
        await br.register([a, b], TENANT, NAMESPACE, {"a": ["a", "b"], "b": ["a", "b"]})
        topic = f"persistent://{TENANT}/{NAMESPACE}/t-{uuid.uuid4().hex[:8]}"
        await a.admin("topics.create", topic=topic)
        pmap = await PositionMap(b, topic).start()
        client = AsyncClient(a.url)
        consumer = await client.subscribe(topic, SUBSCRIPTION, initial_position=InitialPosition.Earliest,
                                          replicate_subscription_state_enabled=True,
                                          ack_group_time_ms=args.ack_group_ms)
        t_ack: dict[int, float] = {}
        # (sent, answered, B's mark-delete, B's msgBacklog, B's last entry read just before the stats)
        polls: list[tuple[float, float, tuple[int, int] | None, int, tuple[int, int] | None]] = []
        stop_polling = asyncio.Event()

        a_positions: list[tuple[int, int]] = []    # A's position of each message, in order
        a_numbers: list[int] = []
        a_polls: list[tuple[float, tuple[int, int] | None]] = []   # (answered, A's mark-delete)

        async def consume():
            while True:
                msg = await consumer.receive()
                k = int.from_bytes(msg.data()[:8], "big")
                mid = msg.message_id()
                a_positions.append((mid.ledger_id, mid.entry_id))
                a_numbers.append(k)
                consumer.acknowledge_cumulative(msg)
                t_ack[k] = time.time()

        async def poll_a():
            # when A's broker applied the acknowledgment (its mark-delete position)
            interval = args.poll_ms / 1000.0
            while not stop_polling.is_set():
                try:
                    stats = await a.admin("topics.stats", topic=topic)
                    sub = stats["subscriptions"].get(SUBSCRIPTION)
                    a_polls.append((time.time(), parse_position(sub["markDeletePosition"]) if sub else None))
                except Exception:   # noqa: BLE001
                    pass
                await asyncio.sleep(interval)

        async def poll():
            interval = args.poll_ms / 1000.0
            nxt = time.monotonic()
            while not stop_polling.is_set():
                sent = time.time()
                try:
                    # the last entry first: entries stored between the two calls only make
                    # the count-based figure later (conservative), never earlier
                    internal = await b.admin("topics.internal_stats", topic=topic)
                    stats = await b.admin("topics.stats", topic=topic)
                    sub = stats["subscriptions"].get(SUBSCRIPTION)
                except Exception:   # noqa: BLE001 - topic not there yet
                    sub = None
                answered = time.time()
                if sub is not None:
                    polls.append((sent, answered, parse_position(sub["markDeletePosition"]), sub["msgBacklog"],
                                  parse_position(internal["lastConfirmedEntry"])))
                nxt += interval
                await asyncio.sleep(max(0.0, nxt - time.monotonic()))

        samples: dict[str, list[dict]] = {"a": [], "b": []}

        async def sample_metrics():
            # the memory of the origin-id state (index, received acks, pending) once a second
            while not stop_polling.is_set():
                samples["a"].append(await scrape(a))
                samples["b"].append(await scrape(b))
                await asyncio.sleep(1.0)

        tasks = [asyncio.create_task(consume()), asyncio.create_task(poll()), asyncio.create_task(sample_metrics()),
                 asyncio.create_task(poll_a())]
        meter = br.CpuMeter(cs.cpu_groups()).start()
        cpu_main0 = time.process_time()
        producer = await br.Worker("producer", [
            "--url", a.url, "--topic", topic, "--rate", str(args.rate), "--warmup", str(args.warmup),
            "--seconds", str(args.duration + tail_s), "--size", str(args.size), "--unbatched", "--indexed",
        ], script=br.__file__).start()
        await producer.line(60)
        progress(f"[{label}] {args.rate} msg/s into {topic}: {args.warmup:g}s warm-up + {args.duration:g}s "
                 f"measured + {tail_s:g}s tail; polling b every {args.poll_ms} ms")
        prod = await producer.line(args.warmup + args.duration + tail_s + 120)
        measure_from = prod["measure_start_ms"] / 1000.0
        measure_to = measure_from + args.duration
        produced = prod["acked"]
        # every message acknowledged in A, every message readable in B ...
        deadline = time.monotonic() + 30
        while (len(t_ack) < produced or len(pmap.numbers) < produced) and time.monotonic() < deadline:
            if pmap.task.done():
                raise RuntimeError(f"reader on b ended: {pmap.task.exception()!r}")
            await asyncio.sleep(0.05)
        measured = sorted(k for k, t in t_ack.items() if measure_from <= t <= measure_to)
        last_k = measured[-1] if measured else -1
        # ... and B's mark-delete past the last measured one (or a timeout)
        deadline = time.monotonic() + max(10.0, 3 * snapshot_ms / 1000.0)
        while time.monotonic() < deadline:
            if polls and polls[-1][2] is not None and pmap.covered(polls[-1][2]) >= last_k:
                break
            await asyncio.sleep(0.05)
        stop_polling.set()
        final_a = await scrape(a)
        cpu = meter.stop()
        cpu.update(producer=prod["cpu_s"], bench_process=round(time.process_time() - cpu_main0, 2))
    finally:
        for t in tasks:
            t.cancel()
        if producer is not None:
            producer.kill()
            await producer.wait(5)
        if pmap is not None:
            pmap.close()
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), 5)
            except Exception:   # noqa: BLE001
                pass
        await cs.close()

    def first_cover(coverage: list[tuple[float, int]]) -> tuple[dict, int]:
        """Latency percentiles (ms) from t_ack(k) to the first poll covering k, and
        how many measured k were covered at all (coverage only grows: one sweep)."""
        lat = LatencyRecorder()
        best, j, n = -1, 0, 0
        for k in measured:
            while best < k and j < len(coverage):
                best = max(best, coverage[j][1])
                j += 1
            if best >= k:
                lat.record(max(1, int((coverage[j - 1][0] - t_ack[k]) * 1e6)))
                n += 1
        return lat.total(), n

    def first_cover_times(coverage: list[tuple[float, int]]) -> dict[int, float]:
        """k -> time of the first poll covering k, for the measured k."""
        out, best, j = {}, -1, 0
        for k in measured:
            while best < k and j < len(coverage):
                best = max(best, coverage[j][1])
                j += 1
            if best >= k:
                out[k] = coverage[j - 1][0]
        return out

    def covered_in_a(mdp) -> int:
        i = bisect.bisect_right(a_positions, mdp)
        return a_numbers[i - 1] if i else -1

    # split the path: the ack reaching A's broker (SDK stream), then A's broker -> B
    a_cov = [(t, covered_in_a(mdp) if mdp else -1) for t, mdp in a_polls]
    in_a = first_cover_times(a_cov)
    in_b = first_cover_times([(answered, pmap.covered_by_count(lac, backlog) if lac else -1)
                              for _, answered, _, backlog, lac in polls])
    applied_a, a_to_b = LatencyRecorder(), LatencyRecorder()
    for k, t in in_a.items():
        applied_a.record(max(1, int((t - t_ack[k]) * 1e6)))
        if k in in_b:
            a_to_b.record(max(1, int((in_b[k] - t) * 1e6)))
    applied_a_p, a_to_b_p = applied_a.total(), a_to_b.total()
    md_p, md_n = first_cover([(answered, pmap.covered(mdp) if mdp else -1) for _, answered, mdp, _, _ in polls])
    ack_p, ack_n = first_cover([(answered, pmap.covered_by_count(lac, backlog) if lac else -1)
                                for _, answered, _, backlog, lac in polls])
    if args.dump:
        # raw series for a closer look: acks in A and polls of B (times in epoch seconds)
        dump = Path(args.dump)
        dump.parent.mkdir(parents=True, exist_ok=True)
        with open(dump.with_name(f"{dump.stem}-{label}{dump.suffix or '.json'}"), "w") as f:
            json.dump({"t_ack": sorted(t_ack.items()), "measure_from": measure_from, "measure_to": measure_to,
                       "polls": [(sent, answered, mdp, backlog, lac, pmap.covered(mdp) if mdp else -1,
                                  pmap.covered_by_count(lac, backlog) if lac else -1)
                                 for sent, answered, mdp, backlog, lac in polls]}, f)
    # the floor of any scheme: from the ack in A to the message itself being readable in B
    # (the UPDATE follows the data in the same replication stream); 1 us when it was there first
    arrival = LatencyRecorder()
    for k in measured:
        t = pmap.arrived.get(k)
        if t is not None:
            arrival.record(max(1, int((t - t_ack[k]) * 1e6)))
    arr = arrival.total()
    # the replication lag A -> B of the measured messages (publish time in A to readable in B)
    repl = LatencyRecorder()
    for k in measured:
        if k in pmap.arrived and k in pmap.published:
            repl.record(max(1, int((pmap.arrived[k] - pmap.published[k]) * 1e6)))
    repl_p = repl.total()
    rtts = LatencyRecorder()
    for sent, answered, *_ in polls:
        rtts.record(int((answered - sent) * 1e6))
    r = rtts.total()
    result = {
        "scenario": "replicated_subscription_ack_to_mark_delete", "journal_sync": args.sync,
        "snapshot_frequency_ms": snapshot_ms, "update_interval_ms": update_ms,
        "pure_pip33": update_ms >= PURE_PIP33_UPDATE_MS, "rate": args.rate, "message_bytes": args.size,
        "warmup_s": args.warmup, "duration_s": args.duration, "tail_s": tail_s,
        "ack_group_ms": args.ack_group_ms, "poll_ms": args.poll_ms,
        "produced": produced, "acked_in_a": len(t_ack), "replicated_to_b": len(pmap.numbers),
        "measured_acks": len(measured),
        # acknowledged in B by counting (data entries up to B's last entry - msgBacklog):
        # includes the individual acks that minipulsar's UPDATEs carry between snapshots
        "acked_covered": ack_n,
        "acked_latency_ms_p50": ack_p["p50"], "acked_latency_ms_p99": ack_p["p99"],
        "acked_latency_ms_p999": ack_p["p99.9"], "acked_latency_ms_max": ack_p["max"],
        "acked_latency_ms_mean": ack_p["mean"],
        # B's markDeletePosition at or past the message
        "mark_delete_covered": md_n,
        "mark_delete_latency_ms_p50": md_p["p50"], "mark_delete_latency_ms_p99": md_p["p99"],
        "mark_delete_latency_ms_p999": md_p["p99.9"], "mark_delete_latency_ms_max": md_p["max"],
        "mark_delete_latency_ms_mean": md_p["mean"],
        "message_in_b_after_ack_ms_p50": arr["p50"], "message_in_b_after_ack_ms_p99": arr["p99"],
        "replication_lag_ms_p50": repl_p["p50"], "replication_lag_ms_p99": repl_p["p99"],
        # the same path in two halves: the ack applied by A's broker (its mark-delete position
        # polled), then from there to acknowledged in B (the part this feature is about)
        "ack_applied_in_a_ms_p50": applied_a_p["p50"], "ack_applied_in_a_ms_p99": applied_a_p["p99"],
        "applied_in_a_to_acked_in_b_ms_p50": a_to_b_p["p50"], "applied_in_a_to_acked_in_b_ms_p99": a_to_b_p["p99"],
        "polls": len(polls), "poll_rtt_ms_p50": r["p50"], "poll_rtt_ms_p99": r["p99"],
        "b_mark_delete_positions_seen": len({mdp for _, _, mdp, _, _ in polls if mdp}),
        "b_final_msg_backlog": polls[-1][3] if polls else None,
        "cpu_s": cpu, "loadavg_1m": br.loadavg(),
    }
    # issue 15: marker bytes per acknowledged message and the memory of the origin-id state
    # (None on a checkout without these metrics)
    def peak(side: str, name: str):
        vals = [m[name] for m in samples[side] if name in m]
        return max(vals) if vals else None

    upd_bytes = final_a.get("pulsar_replicated_subscriptions_update_marker_bytes_total")
    result.update({
        "a_update_markers": final_a.get("pulsar_replicated_subscriptions_update_markers_total"),
        "a_update_marker_bytes": upd_bytes,
        "marker_bytes_per_acked_message": round(upd_bytes / len(t_ack), 3) if upd_bytes and t_ack else None,
        "b_pending_acks_max": peak("b", "pulsar_replicated_subscriptions_pending_acks"),
        "b_received_acks_bytes_max": peak("b", "pulsar_replicated_subscriptions_received_acks_bytes"),
        "a_origin_index_bytes_max": peak("a", "pulsar_replicated_subscriptions_origin_index_bytes"),
        "b_origin_index_bytes_max": peak("b", "pulsar_replicated_subscriptions_origin_index_bytes"),
        "b_origin_index_runs_max": peak("b", "pulsar_replicated_subscriptions_origin_index_runs"),
    })
    progress(f"[{label}] replication lag a -> b p50 {repl_p['p50']} / p99 {repl_p['p99']} ms; "
             f"message in B after the ack in A: p50 {arr['p50']} ms, p99 {arr['p99']} ms; ack applied in "
             f"A p50 {applied_a_p['p50']} / p99 {applied_a_p['p99']} ms, from there to acknowledged in B "
             f"p50 {a_to_b_p['p50']} / p99 {a_to_b_p['p99']} ms")
    progress(f"[{label}] ack in A -> acknowledged in B (msgBacklog): p50 {ack_p['p50']} ms, p99 {ack_p['p99']} ms "
             f"({ack_n}/{len(measured)}); -> mark-delete in B: p50 {md_p['p50']} ms, p99 {md_p['p99']} ms "
             f"({md_n}/{len(measured)}); {len(polls)} polls, rtt p50 {r['p50']} ms")
    return result


async def orchestrate(args) -> int:
    br.cancel_on_sigterm()
    base = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="bench_rsub_"))
    base.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        for snapshot_ms, update_ms in args.configs:
            br.emit(await run_setting(base, snapshot_ms, update_ms, args))
    except Exception as exc:
        failed = True
        progress(f"failed: {type(exc).__name__}: {exc}")
        raise
    finally:
        if args.keep or failed:
            progress(f"data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few seconds per setting (smoke test)")
    sync = p.add_mutually_exclusive_group()
    sync.add_argument("--sync", dest="sync", action="store_true", default=True, help="bookies fsync (default)")
    sync.add_argument("--no-sync", dest="sync", action="store_false", help="bookies do not fsync")
    p.add_argument("--configs", default=None,
                   help="comma-separated SNAPSHOT_MS:UPDATE_INTERVAL_MS broker settings, one run each (default "
                        f"{DEFAULT_CONFIGS}; with --quick {QUICK_CONFIGS})")
    p.add_argument("--rate", type=int, default=500, help="msg/s produced in A (default 500)")
    p.add_argument("--size", type=int, default=100, help="message bytes (>= 8; default 100)")
    p.add_argument("--duration", type=float, default=None, help="measured seconds (default 15)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up seconds (default 3)")
    p.add_argument("--min-tail", type=float, default=None,
                   help="seconds the load goes on after the measured window (at least; default 2)")
    p.add_argument("--poll-ms", type=int, default=10, help="topics.stats poll interval on B (default 10)")
    p.add_argument("--ack-group-ms", type=int, default=0, help="consumer ack_group_time_ms (default 0)")
    p.add_argument("--dump", default=None, metavar="FILE.json",
                   help="also write the raw acks and polls per setting (FILE-<setting>.json)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--keep", action="store_true")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.configs = parse_configs(args.configs or (QUICK_CONFIGS if args.quick else DEFAULT_CONFIGS))
    if args.size < 8:
        raise SystemExit("--size must be >= 8 (the message number is in the first 8 bytes)")
    if args.duration is None:
        args.duration = 1.0 if args.quick else 15.0
    if args.warmup is None:
        args.warmup = 0.5 if args.quick else 3.0
    if args.min_tail is None:
        args.min_tail = 0.3 if args.quick else 2.0
    try:
        return asyncio.run(orchestrate(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; clusters stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
