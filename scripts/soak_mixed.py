"""The mixed soak of ``scripts/soak.py --scenario mixed`` (issue 16 part 3): a workload with
every subscription type, acks, nacks and a geo pair, one fault every ``--fault-every`` s.

Processes (all real, on free loopback ports, tied to this process by
:mod:`proto.lifeline`): cluster ``soak-a`` = 3 bookies + 1 broker (separate
processes, E = Qw = Qa = 2, deduplication on); cluster ``soak-b`` = one
standalone (2 bookies + broker) that ``soak-a`` replicates one topic to,
through a TCP proxy (:class:`tests.tcp_proxy.TcpProxy`) that can cut the geo link.

Workload (this process, asyncio SDK): ``--mixed-topics`` local topics of ``soak-a``,
subscription types Exclusive, Shared, Failover, Key_Shared in turn (2 consumers on
Shared / Key_Shared / Failover), plus one topic replicated to ``soak-b`` (an
Exclusive subscription in A, a Shared one in B). One named producer per topic
(deduplication: per-producer sequence ids), ``--rate`` msg/s in all, ``--size``-byte
payloads carrying the topic, the sequence number and the send time. Consumers
acknowledge what they receive, but negatively acknowledge one message in 50 the
first time it arrives (redelivered after 1 s, then acknowledged).

The namespaces have infinite retention, so that the final read-back finds every stored
message (consumed ledgers are otherwise deleted). ``--broker-config FILE.toml`` adds
settings to A's broker (e.g. ``managed_ledger_max_entries_per_ledger = 100``).

Faults, in turn: kill -9 and restart a bookie (bookie-0 / bookie-1 of A), kill -9 and
restart A's broker, SIGSTOP a bookie of A for 5 s then SIGCONT, cut the geo link
for 5 s (every connection reset, new ones refused); none starts in the last 25 s of the
load. A fault is *survived* when acknowledged sends, deliveries and deliveries in B
progress again within 60 s after it ended.

At the end the producers stop, the consumers drain (up to 90 s), and every topic is
read again from the earliest position (A, and B for the replicated one): *lost* =
acknowledged by the broker to a producer but not stored (or, per subscription, never
delivered), *duplicated* = stored more than once; both must be 0. Redeliveries to
consumers (nacks, crashes) are counted apart: at-least-once delivery allows them.
Every ``--sample`` s: RSS and open file descriptors of every process (from /proc). The
data dirs (a temporary directory) are deleted after a run that passed, kept otherwise.
"""
from __future__ import annotations

import array
import asyncio
import collections
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

from soak_mixed_report import print_report, summarize_mixed  # noqa: F401 - print_report: soak.py's entry


SUB_TYPES = ("Exclusive", "Shared", "Failover", "KeyShared")
FAULTS = ("kill_bookie", "kill_broker", "pause_bookie", "cut_geo_link")
NACK_EVERY = 50
FAULT_MARGIN_S = 25.0   # no fault starts later than this before the end of the load (5 s fault + recovery)


def progress(msg: str) -> None:
    import sys

    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def proc_stats(pid: int) -> tuple[float | None, int | None]:
    """(RSS MiB, open fds) of ``pid``; None for what cannot be read."""
    rss = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024.0
                    break
    except OSError:
        return None, None
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = None
    return rss, fds


class Cluster:
    """Cluster ``soak-a``: bookies and a broker as separate processes (each killable)."""

    def __init__(self, base: Path, tracker, journal_sync: bool, broker_config: str | None = None):
        self.base, self.tracker, self.journal_sync = base, tracker, journal_sync
        self.broker_config = broker_config
        self.bookies: list = []
        self.broker = None

    def start(self) -> "Cluster":
        from tests.procs import BrokerProcess, start_bookie

        for i in range(3):
            self.bookies.append(start_bookie(self.base / f"bookie-{i}", self.journal_sync, tracker=self.tracker))
        config = self.base / "broker.toml"
        config.write_text('cluster_name = "soak-a"\nbroker_deduplication_enabled = true\n'
                          "managed_ledger_default_ensemble_size = 2\nmanaged_ledger_default_write_quorum = 2\n"
                          "managed_ledger_default_ack_quorum = 2\nbookkeeper_client_timeout_in_seconds = 5.0\n"
                          + (Path(self.broker_config).read_text() if self.broker_config else ""))
        self.broker = BrokerProcess(self.base / "broker", [b.address for b in self.bookies], config,
                                    ("--log-level", "WARNING"), self.tracker).start()
        return self

    @property
    def url(self) -> str:
        return self.broker.service_url


class Stats:
    """What the workload saw: per topic the acknowledged sequence numbers, per subscription
    the delivered ones (with counts), latencies, progress counters."""

    def __init__(self):
        self.acked: dict[str, set[int]] = collections.defaultdict(set)
        self.send_errors = 0
        self.delivered: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.nacked: set[tuple[str, int]] = set()
        self.publish_ms = array.array("d")     # compact: the client's RSS is measured too
        self.e2e_ms = array.array("d")
        self.acks_total = 0
        self.deliveries_total = 0


async def run_mixed(args) -> dict:
    """One mixed soak run (see the module doc); returns the result dict with ``summary``."""
    from tests.geo import Cluster as GeoCluster
    from tests.geo import connect_clusters
    from tests.procs import ProcessTracker, StandaloneProcess
    from tests.tcp_proxy import TcpProxy

    base = Path(tempfile.mkdtemp(prefix="soak-mixed-"))
    tracker = ProcessTracker()
    proxy = None
    a_admin = b_admin = None
    result = None
    try:
        t_setup = time.monotonic()
        a = await asyncio.to_thread(lambda: Cluster(base / "a", tracker, args.journal_sync, args.broker_config).start())
        extra = ["--cluster-name", "soak-b", "--deduplication"] + ([] if args.journal_sync else ["--no-journal-sync"])
        b = await asyncio.to_thread(lambda: StandaloneProcess(base / "b", extra, tracker).start())
        proxy = await TcpProxy("127.0.0.1", b.port).start()
        a_admin, b_admin = GeoCluster("soak-a", a.broker), GeoCluster("soak-b", b)
        await connect_clusters([a_admin, b_admin], "soak", "geo", ["soak-a", "soak-b"])
        # A reaches B through the proxy (the geo link the faults cut)
        await a_admin.admin("clusters.update", name="soak-b", service_url=proxy.service_url)
        await a_admin.admin("namespaces.create", namespace="soak/local")
        await a_admin.admin("namespaces.set_clusters", namespace="soak/local", clusters=["soak-a"])
        # infinite retention: the final read-back from the earliest position must find every message,
        # also in ledgers that every subscription consumed (those are deleted without retention)
        for admin, ns in ((a_admin, "soak/local"), (a_admin, "soak/geo"), (b_admin, "soak/geo")):
            await admin.admin("namespaces.set_retention", namespace=ns, retention_time_minutes=-1,
                              retention_size_mb=-1)
        progress(f"mixed: A {a.url} (bookies {[x.pid for x in a.bookies]}, broker {a.broker.pid}), "
                 f"B {b.service_url} (pid {b.pid}) via proxy {proxy.service_url}; set up in "
                 f"{time.monotonic() - t_setup:.1f}s; {args.rate:g} msg/s for {args.duration:g}s, "
                 f"a fault every {args.fault_every:g}s")
        result = await _workload(args, base, a, b, proxy)
        return result
    finally:
        for c in (a_admin, b_admin):
            if c is not None:
                await c.close()
        if proxy is not None:
            await proxy.close()
        tracker.kill_all()
        if result is not None and result["summary"]["ok"]:
            shutil.rmtree(base, ignore_errors=True)
        else:
            progress(f"mixed: data and logs kept in {base}")


async def _workload(args, base: Path, a: Cluster, b, proxy) -> dict:
    from client import AsyncClient, InitialPosition
    from client.consumer_config import ConsumerType
    from client.errors import PulsarException

    run_id = uuid.uuid4().hex[:6]
    topics = [f"persistent://soak/local/t{i}-{run_id}" for i in range(args.mixed_topics)]
    geo_topic = f"persistent://soak/geo/g-{run_id}"
    subs = {t: SUB_TYPES[i % len(SUB_TYPES)] for i, t in enumerate(topics)}
    subs[geo_topic] = "Exclusive"
    all_topics = [*topics, geo_topic]
    stats = Stats()
    stop_producing = asyncio.Event()
    stop_consuming = asyncio.Event()
    pad = max(0, args.size - 40)

    client_a = AsyncClient(a.url, operation_timeout_seconds=60)
    client_b = AsyncClient(b.service_url, operation_timeout_seconds=60)
    await client_a.__aenter__()
    await client_b.__aenter__()

    async def produce(index: int, topic: str, rate: float):
        producer = await client_a.create_producer(topic, producer_name=f"soak-{run_id}-{index}",
                                                  send_timeout_millis=0, batching_max_publish_delay_ms=5,
                                                  block_if_queue_full=True)
        seq = 0
        inflight = asyncio.Semaphore(1000)
        t0 = time.monotonic()

        async def one(n: int, t_send: float):
            try:
                payload = f"{index}:{n}:{time.time():.6f}:".encode() + b"x" * pad
                await producer.send(payload, partition_key=f"k{n % 16}")
                stats.acked[topic].add(n)
                stats.acks_total += 1
                stats.publish_ms.append((time.monotonic() - t_send) * 1000)
            except PulsarException as exc:
                stats.send_errors += 1
                progress(f"send {topic} #{n} failed: {exc!r}")
            finally:
                inflight.release()

        tasks = set()
        while not stop_producing.is_set():
            due = t0 + seq / rate
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
                continue
            await inflight.acquire()
            task = asyncio.ensure_future(one(seq, time.monotonic()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            seq += 1
        if tasks:
            await asyncio.wait(tasks, timeout=120)
        await producer.close()

    async def consume(client, topic: str, sub: str, sub_type: str, key: str):
        consumer = await client.subscribe(topic, sub, consumer_type=getattr(ConsumerType, sub_type),
                                          initial_position=InitialPosition.Earliest,
                                          negative_ack_redelivery_delay_ms=1000)
        try:
            while not stop_consuming.is_set():
                try:
                    msg = await consumer.receive(timeout_millis=500)
                except PulsarException:
                    continue
                parts = msg.data().split(b":", 3)
                n = int(parts[1])
                if (key, n) not in stats.nacked and n % NACK_EVERY == 7:
                    stats.nacked.add((key, n))
                    consumer.negative_acknowledge(msg)
                    continue
                stats.delivered[key][n] += 1
                stats.deliveries_total += 1
                if stats.delivered[key][n] == 1:
                    stats.e2e_ms.append((time.time() - float(parts[2])) * 1000)
                consumer.acknowledge(msg)
        finally:
            try:
                await consumer.close()
            except PulsarException:
                pass

    consumers = []
    for topic in all_topics:
        n = 1 if subs[topic] == "Exclusive" else 2
        for _ in range(n):
            consumers.append(asyncio.ensure_future(consume(client_a, topic, "soak", subs[topic], topic)))
    consumers.append(asyncio.ensure_future(consume(client_b, geo_topic, "soak-b", "Shared", "B:" + geo_topic)))
    await asyncio.sleep(1.0)
    rate_each = args.rate / len(all_topics)
    producers = [asyncio.ensure_future(produce(i, t, rate_each)) for i, t in enumerate(all_topics)]

    samples: list[dict] = []
    faults: list[dict] = []

    def processes() -> dict[str, int]:
        from proto.data_dir_lock import lock_holder

        out = {f"a-bookie-{i}": x.pid for i, x in enumerate(a.bookies)}
        out["a-broker"] = a.broker.pid
        out["b-standalone"] = b.pid
        for i in range(2):
            pid = lock_holder(Path(b.data_dir) / f"bookie-{i}", "LOCK")
            if pid:
                out[f"b-bookie-{i}"] = pid
        out["client"] = os.getpid()
        return out

    t0 = time.monotonic()

    async def sampler():
        n = 0
        while not stop_producing.is_set():
            sample = {"t": round(time.monotonic() - t0, 1), "acks": stats.acks_total,
                      "deliveries": stats.deliveries_total, "procs": {}}
            for label, pid in processes().items():
                rss, fds = proc_stats(pid)
                sample["procs"][label] = {"pid": pid, "rss_mb": None if rss is None else round(rss, 1), "fds": fds}
            samples.append(sample)
            if n % max(1, int(60 / args.sample)) == 0:
                progress(f"t={sample['t']:.0f}s acked {stats.acks_total} delivered {stats.deliveries_total} "
                         f"errors {stats.send_errors} | " + " ".join(
                             f"{k} {v['rss_mb']}M/{v['fds']}fd" for k, v in sample["procs"].items()))
            n += 1
            try:
                await asyncio.wait_for(stop_producing.wait(), args.sample)
            except asyncio.TimeoutError:
                pass

    async def progressed(timeout_s: float = 60.0) -> bool:
        acks, dels = stats.acks_total, stats.deliveries_total
        geo = sum(stats.delivered["B:" + geo_topic].values())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if stats.acks_total > acks + 10 and stats.deliveries_total > dels + 10 \
                    and sum(stats.delivered["B:" + geo_topic].values()) > geo:
                return True
            await asyncio.sleep(0.5)
        return False

    async def inject(kind: int) -> dict:
        name = FAULTS[kind % len(FAULTS)]
        t_start = time.monotonic()
        detail = ""
        if name == "kill_bookie":
            from tests.procs import restart_bookie_same_port

            i = (kind // len(FAULTS)) % 2
            old = a.bookies[i]
            old.kill()
            await asyncio.sleep(2.0)
            a.bookies[i] = await asyncio.to_thread(restart_bookie_same_port, old)
            detail = f"bookie-{i} pid {old.pid} -> {a.bookies[i].pid}"
        elif name == "kill_broker":
            old = a.broker
            old.kill()
            await asyncio.sleep(1.0)
            a.broker = await asyncio.to_thread(old.restart)
            detail = f"broker pid {old.pid} -> {a.broker.pid}"
        elif name == "pause_bookie":
            i = (kind // len(FAULTS)) % 3
            os.kill(a.bookies[i].pid, signal.SIGSTOP)
            await asyncio.sleep(5.0)
            os.kill(a.bookies[i].pid, signal.SIGCONT)
            detail = f"bookie-{i} pid {a.bookies[i].pid} stopped 5 s"
        else:
            proxy.refuse(True)
            cut = proxy.cut()
            await asyncio.sleep(5.0)
            proxy.refuse(False)
            detail = f"{cut} connection(s) reset, refused 5 s"
        t_end = time.monotonic()
        ok = await progressed()
        fault = {"fault": name, "at_s": round(t_start - t0, 1), "lasted_s": round(t_end - t_start, 1),
                 "recovered_in_s": round(time.monotonic() - t_end, 1) if ok else None, "survived": ok,
                 "detail": detail}
        progress(f"fault {len(faults) + 1}: {name} ({detail}): "
                 + (f"progress again {fault['recovered_in_s']}s after" if ok else "NO PROGRESS within 60 s"))
        return fault

    async def faulter():
        k = 0
        while True:
            try:
                await asyncio.wait_for(stop_producing.wait(), args.fault_every)
                return
            except asyncio.TimeoutError:
                pass
            if time.monotonic() + FAULT_MARGIN_S > t0 + args.duration:
                return     # it could not be judged: the producers stop before it and its recovery end
            faults.append(await inject(k))
            k += 1

    sampler_task = asyncio.ensure_future(sampler())
    faulter_task = asyncio.ensure_future(faulter())
    await asyncio.sleep(args.duration)
    t_load_end = time.monotonic()
    stop_producing.set()
    await faulter_task           # a fault in progress finishes (and its recovery is checked)
    await asyncio.gather(*producers, return_exceptions=True)
    await sampler_task
    duration = time.monotonic() - t0

    # drain: every subscription has everything acknowledged, or 90 s
    def missing() -> int:
        out = 0
        for topic in all_topics:
            out += len(stats.acked[topic] - set(stats.delivered[topic]))
        out += len(stats.acked[geo_topic] - set(stats.delivered["B:" + geo_topic]))
        return out

    deadline = time.monotonic() + 90
    while missing() and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    stop_consuming.set()
    await asyncio.gather(*consumers, return_exceptions=True)

    stored = {}
    for topic in all_topics:
        stored[topic] = await read_back(client_a, topic)
    stored["B:" + geo_topic] = await read_back(client_b, geo_topic)
    await client_a.__aexit__(None, None, None)
    await client_b.__aexit__(None, None, None)
    return summarize_mixed(args, stats, stored, all_topics, geo_topic, subs, samples, faults, duration,
                           t_load_end - t0)


async def read_back(client, topic: str) -> collections.Counter:
    """Every stored message of ``topic`` (sequence number -> times stored), by a reader from
    the earliest position."""
    from client import MessageId
    from client.errors import PulsarException

    counts: collections.Counter = collections.Counter()
    reader = await client.create_reader(topic, MessageId.earliest)
    try:
        misses = 0
        while misses < 3:
            if not await reader.has_message_available():
                break
            try:
                msg = await reader.read_next(timeout_millis=5000)
            except PulsarException:
                misses += 1
                continue
            counts[int(msg.data().split(b":", 3)[1])] += 1
    finally:
        await reader.close()
    return counts
