"""The fault suite's shared harness (issue 16, part 2): one workload, one set of
checks, one figures row per scenario.

The promise under test: kill -9 of anything loses nothing and the system comes
back by itself. Every scenario runs a :class:`Workload` against real processes
while it injects faults, then calls :meth:`Workload.finish`, which checks:

1. every message acknowledged to the producer (its send callback got a message
   id) was delivered to the consumer (Pulsar's durability promise);
2. none was stored twice: in the topic as stored (read from the earliest
   position with a Reader), no payload appears at two message ids; for the
   consumer, two DIFFERENT message ids with the same payload are a duplicate
   store, while the same id delivered again is a redelivery, not a duplicate;
3. the producer's order is kept: the stored messages' sequence ids (and
   payload numbers) strictly increase in the order they are stored;
4. the system serves again after each fault: from the fault's injection to the
   moment when a send issued after it has been acknowledged AND a message sent
   after it has been received (both ends work again); the worst of the
   scenario's faults is the row's figure.

The producer has a ``producer_name`` and the broker runs with deduplication on
(``broker_deduplication_enabled``); it sends numbered messages at a modest rate
with no send timeout (``send_timeout_millis=0``), so the SDK itself keeps and
resends every pending message across reconnects: the harness resends nothing.
The consumer acknowledges every message with ``acknowledge_and_wait`` (the
broker's receipt for the ack). A second subscription that never acknowledges
keeps every ledger, so that the final Reader sees all that was stored.

Rows: ``{"scenario", "faults", "acknowledged", "lost", "duplicated",
"time_to_serve_s"}`` printed (``pytest -s``) and appended as JSON lines to the
file named by ``MINIPULSAR_FAULT_REPORT`` when set (``scripts/fault_table.py``).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from client import AsyncClient, ConsumerType, InitialPosition, MessageId
from client.admin import AdminClient
from client.errors import PulsarException, Timeout
from proto import bookie_pb2, bookie_pb2_grpc
from tests.procs import BookieProcess, BrokerProcess, ProcessTracker, ensure_namespace, start_bookie, start_broker

REPORT_ENV = "MINIPULSAR_FAULT_REPORT"

#: broker settings of every single-cluster scenario: deduplication on, a short add
#: timeout (BookKeeper's addEntryTimeout) so that a silent bookie is replaced in
#: seconds, E=Qw=Qa=2 so that a third bookie is a spare for ensemble changes.
BASE_BROKER_CONFIG = {
    "broker_deduplication_enabled": True,
    "bookkeeper_client_timeout_in_seconds": 2.0,
    "managed_ledger_default_ensemble_size": 2,
    "managed_ledger_default_write_quorum": 2,
    "managed_ledger_default_ack_quorum": 2,
}


def _toml(values: dict) -> str:
    return "".join(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}\n"
                   for k, v in values.items())


#: Lines of each server log put into a failed scenario's report (tests/faults/conftest.py).
SERVER_LOG_LINES = 80


def server_log_tails(root: Path, lines: int = SERVER_LOG_LINES) -> list[tuple[str, str]]:
    """[(relative path, its last ``lines`` lines)] of every ``*.stderr.log`` under ``root``."""
    out = []
    for path in sorted(Path(root).rglob("*.stderr.log")):
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError as exc:
            text = [f"(unreadable: {exc})"]
        out.append((str(path.relative_to(root)), "\n".join(text)))
    return out


class FaultCluster:
    """``n_bookies`` real bookies and one real broker (embedded SQLite metadata store)
    on free loopback ports; the broker keeps its port across restarts so that clients
    reconnect to it. ``bookie_args``: {index: extra ``python -m bookie`` args}.
    Every process is registered with ``tracker`` (killed at teardown)."""

    def __init__(self, root: Path, tracker: ProcessTracker, n_bookies: int = 3,
                 bookie_args: dict[int, tuple] | None = None, **broker_config) -> None:
        self.root = Path(root)
        self.tracker = tracker
        self.n_bookies = n_bookies
        self.bookie_args = bookie_args or {}
        self.config = {**BASE_BROKER_CONFIG, **broker_config}
        self.bookies: list[BookieProcess] = []
        self.broker: BrokerProcess | None = None
        self.restart_times_s: list[float] = []

    def start(self) -> "FaultCluster":
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.n_bookies) as pool:     # in parallel: ~1 s instead of ~1 s each
            self.bookies = list(pool.map(lambda i: start_bookie(self.root / f"bookie-{i}", tracker=self.tracker,
                                                                extra_args=self.bookie_args.get(i, ())),
                                         range(self.n_bookies)))
        conf = self.root / "broker.toml"
        conf.write_text(_toml(self.config))
        self.broker = start_broker(self.root / "broker", [b.address for b in self.bookies], config_file=conf,
                                   tracker=self.tracker)
        return self

    @property
    def service_url(self) -> str:
        return self.broker.service_url

    async def create_namespace(self, namespace: str = "public/default") -> None:
        await ensure_namespace(self.service_url, namespace)

    # -- faults ------------------------------------------------------------------------
    def bookie_index(self, address: str) -> int:
        return next(i for i, b in enumerate(self.bookies) if b.address == address)

    def kill_bookie(self, i: int) -> None:
        """kill -9 of bookie ``i`` (resumed first if it was paused)."""
        try:
            os.kill(self.bookies[i].pid, signal.SIGCONT)
        except (ProcessLookupError, TypeError):
            pass
        self.bookies[i].kill()

    def restart_bookie(self, i: int) -> BookieProcess:
        """Start bookie ``i`` again on its data dir and port (ledger metadata names bookies by address)."""
        old = self.bookies[i]
        self.bookies[i] = start_bookie(old.data_dir, old.journal_sync, ("--port", str(old.port), *old.extra_args),
                                       tracker=self.tracker)
        return self.bookies[i]

    def pause_bookie(self, i: int) -> None:
        os.kill(self.bookies[i].pid, signal.SIGSTOP)

    def resume_bookie(self, i: int) -> None:
        os.kill(self.bookies[i].pid, signal.SIGCONT)

    def kill_broker(self) -> None:
        self.broker.kill()

    def restart_broker(self) -> BrokerProcess:
        """A new broker process on the same data dir and gRPC port; its start-up time (s,
        until the ready line) is appended to ``restart_times_s``."""
        started = time.monotonic()
        self.broker = self.broker.restart(same_port=True)
        self.restart_times_s.append(round(time.monotonic() - started, 2))
        return self.broker

    async def open_ledger_ensemble(self, topic: str, timeout_s: float = 20.0) -> list[int]:
        """Indexes of the bookies that hold the topic's current (last) ledger: those that
        answer ReadLastAddConfirmed for it with at least one entry stored."""
        deadline = time.monotonic() + timeout_s
        while True:
            async with AdminClient(self.service_url) as admin:
                stats = await admin.get_internal_stats(topic)
            ledger_id = stats["ledgers"][-1]["ledgerId"] if stats["ledgers"] else None
            holders = []
            if ledger_id is not None:
                for i, b in enumerate(self.bookies):
                    if not b.is_running():
                        continue
                    if await bookie_last_entry(b.address, ledger_id) >= 0:
                        holders.append(i)
            if len(holders) >= self.config["managed_ledger_default_write_quorum"]:
                return holders
            if time.monotonic() > deadline:
                raise AssertionError(f"no ensemble found for the open ledger {ledger_id} of {topic}: {holders}")
            await asyncio.sleep(0.2)


async def bookie_last_entry(address: str, ledger_id: int) -> int:
    """The last entry id bookie ``address`` stores of ``ledger_id``, -1 if none or unreachable."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            resp = await bookie_pb2_grpc.BookieStub(channel).ReadLastAddConfirmed(
                bookie_pb2.LedgerRequest(ledger_id=ledger_id), timeout=3)
        except grpc.aio.AioRpcError:
            return -1
        return resp.last_entry_id


async def bookie_read(address: str, ledger_id: int, first: int, last: int) -> list[bytes]:
    """Entries ``first..last`` of ``ledger_id`` as bookie ``address`` stores them (raises AioRpcError)."""
    async with grpc.aio.insecure_channel(address) as channel:
        out = []
        async for resp in bookie_pb2_grpc.BookieStub(channel).ReadEntries(
                bookie_pb2.ReadEntriesRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last), timeout=10):
            out.extend(e.payload for e in resp.entries)
        return out


async def bookie_info(address: str) -> bookie_pb2.BookieInfo:
    async with grpc.aio.insecure_channel(address) as channel:
        return await bookie_pb2_grpc.BookieStub(channel).GetBookieInfo(bookie_pb2.BookieInfoRequest(), timeout=5)


def _task_state(task: asyncio.Task | None) -> str:
    """'running', 'cancelled', 'returned' or the exception that ended ``task`` (None: 'none')."""
    if task is None:
        return "none"
    if not task.done():
        return "running"
    if task.cancelled():
        return "cancelled"
    return "returned" if task.exception() is None else repr(task.exception())


def _task_where(task: asyncio.Task) -> dict:
    """Where a pending task waits: its state, its stack (innermost frame last, as
    'file:line function') and the future it awaits."""
    frames, coro = [], task.get_coro()
    while coro is not None and len(frames) < 30:          # the await chain, outermost first
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            frames.append(repr(coro)[:120])
            break
        frames.append(f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return {"state": _task_state(task), "stack": frames, "awaiting": repr(getattr(task, "_fut_waiter", None))[:300]}


def _payload_number(data: bytes) -> int:
    return int(data.split(b"-")[-1])


def _mid_key(mid: MessageId) -> tuple:
    return (mid.ledger_id, mid.entry_id, mid.batch_index)


@dataclass
class Row:
    """One line of the fault table."""
    scenario: str
    faults: str
    acknowledged: int
    lost: int
    duplicated: int
    time_to_serve_s: float | None
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"scenario": self.scenario, "faults": self.faults, "acknowledged": self.acknowledged,
                "lost": self.lost, "duplicated": self.duplicated,
                "time_to_serve_s": None if self.time_to_serve_s is None else round(self.time_to_serve_s, 2),
                **self.details}


def record(row: Row) -> None:
    """Print the row and append it to ``$MINIPULSAR_FAULT_REPORT`` (JSON lines) when set."""
    line = json.dumps(row.as_dict())
    print(f"\nFAULT_ROW {line}")
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


class Workload:
    """One SDK producer (``producer_name``, dedup on the broker, no send timeout) sending
    numbered messages at ``rate`` msg/s, and one SDK consumer (``sub_type``) acknowledging
    each message with ``acknowledge_and_wait``. ``publish_url`` and ``consume_url`` differ
    for geo scenarios (produce in A, consume the replicated copies in B); ``admin_url`` (default
    ``consume_url``): where the consume side's stats are asked (a test whose consumer goes
    through a proxy asks the broker itself).

    Use: ``await w.start()``; ``t = w.fault("what")`` at each injection (returns the
    monotonic time); ``await w.wait_serving(t)``; ``row = await w.finish(...)``.
    """

    def __init__(self, publish_url: str, topic: str | None = None, rate: float = 150.0,
                 consume_url: str | None = None, sub_type: ConsumerType = ConsumerType.Exclusive,
                 operation_timeout_s: float = 30.0, admin_url: str | None = None) -> None:
        self.publish_url = publish_url
        self.consume_url = consume_url or publish_url
        self.admin_url = admin_url or self.consume_url    # where the consume side's stats are asked
        self.topic = topic or f"persistent://public/default/faults-{uuid.uuid4().hex[:8]}"
        self.rate = rate
        self.sub_type = sub_type
        self.operation_timeout_s = operation_timeout_s
        self.producer_name = f"fault-producer-{uuid.uuid4().hex[:6]}"
        self.sent_at: list[float] = []                 # index -> monotonic time of the send call
        self.acked_at: dict[int, float] = {}           # index -> time its send was acknowledged
        self.acked_ids: dict[int, MessageId] = {}
        self.send_errors: list[str] = []
        self.received_at: dict[int, float] = {}        # index -> first delivery time
        self.delivered: dict[int, set] = {}            # index -> distinct message ids delivered
        self.deliveries = 0
        self.ack_failures = 0
        self.consumer_errors = 0                       # receive errors other than a timeout (count)
        self.faults: list[tuple[str, float]] = []
        self.details: dict = {}                        # extra figures a scenario adds to its row
        self.probe_wait_s = 10.0                      # how long the stall probe waits (s)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._ack_tasks: set[asyncio.Task] = set()

    async def start(self) -> "Workload":
        self.pub_client = AsyncClient(self.publish_url, operation_timeout_seconds=self.operation_timeout_s)
        self.sub_client = (self.pub_client if self.consume_url == self.publish_url else
                           AsyncClient(self.consume_url, operation_timeout_seconds=self.operation_timeout_s))
        # a subscription that never acknowledges keeps every ledger for the final Reader
        await (await self.sub_client.subscribe(self.topic, "keep", initial_position=InitialPosition.Earliest)).close()
        self.consumer = await self.sub_client.subscribe(self.topic, "work", consumer_type=self.sub_type,
                                                        initial_position=InitialPosition.Earliest)
        self.producer = await self.pub_client.create_producer(self.topic, producer_name=self.producer_name,
                                                              batching_enabled=False, send_timeout_millis=0,
                                                              max_pending_messages=0)
        self._tasks = [asyncio.create_task(self._produce()), asyncio.create_task(self._consume())]
        return self

    # -- the two ends -------------------------------------------------------------------
    async def _produce(self) -> None:
        loop = asyncio.get_running_loop()
        interval = 1.0 / self.rate
        next_at = loop.time()
        while not self._stop.is_set():
            i = len(self.sent_at)
            self.sent_at.append(time.monotonic())
            self.producer.send_async(b"fault-%08d" % i, self._on_receipt(i))
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def _on_receipt(self, i: int):
        def done(exc, mid) -> None:
            if exc is not None:
                self.send_errors.append(f"{i}: {exc!r}")
            else:
                self.acked_at[i] = time.monotonic()
                self.acked_ids[i] = mid
        return done

    async def _consume(self) -> None:
        """Receive and acknowledge until ``finish`` cancels this task. It never ends by
        itself: after the stop, every message acknowledged SO FAR may be delivered while
        the last sends are still unanswered (slow adds at the end of a fault), and the
        messages acknowledged after that must be received too (an early return here once
        left them in the SDK's queue, reported as never delivered)."""
        while True:
            try:
                msg = await self.consumer.receive(timeout_millis=500)
            except PulsarException as exc:
                if not isinstance(exc, Timeout):
                    # closed or failed: raised at once, so yield (else this loop spins and
                    # freezes the event loop) and look at self.consumer again (a stall check
                    # may subscribe a new one)
                    self.consumer_errors += 1
                    await asyncio.sleep(0.05)
                continue
            i = _payload_number(msg.data())
            self.deliveries += 1
            self.received_at.setdefault(i, time.monotonic())
            self.delivered.setdefault(i, set()).add(_mid_key(msg.message_id()))
            task = asyncio.create_task(self._ack(msg))
            self._ack_tasks.add(task)
            task.add_done_callback(self._ack_tasks.discard)

    async def _ack(self, msg) -> None:
        try:
            await asyncio.wait_for(self.consumer.acknowledge_and_wait(msg), 15)
        except (PulsarException, asyncio.TimeoutError):
            self.ack_failures += 1     # not acknowledged: the broker redelivers it (same id)

    def _all_delivered(self) -> bool:
        return all(i in self.delivered for i in self.acked_at)

    # -- faults and the time to serve again ---------------------------------------------------
    def fault(self, what: str) -> float:
        """Note a fault injected now; returns its monotonic time."""
        t = time.monotonic()
        self.faults.append((what, t))
        return t

    def serving_since(self, t: float) -> float | None:
        """Seconds from ``t`` until a send issued after ``t`` was acknowledged and a message
        sent after ``t`` was received; None while not both yet."""
        after = [i for i in range(len(self.sent_at)) if self.sent_at[i] >= t] if self.sent_at else []
        acks = [self.acked_at[i] for i in after if i in self.acked_at]
        recvs = [self.received_at[i] for i in after if i in self.received_at]
        if not acks or not recvs:
            return None
        return max(min(acks), min(recvs)) - t

    async def wait_serving(self, t: float, timeout_s: float = 60.0) -> float:
        """Wait until the system serves again after the fault at ``t`` (see :meth:`serving_since`);
        AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            took = self.serving_since(t)
            if took is not None:
                return took
            if time.monotonic() > deadline:
                raise AssertionError(f"not serving again {timeout_s:.0f} s after the fault "
                                     f"({len(self.acked_at)} acknowledged of {len(self.sent_at)} sent, "
                                     f"{len(self.received_at)} received)")
            await asyncio.sleep(0.05)

    async def run_for(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    # -- the end: drain and check ------------------------------------------------------------
    async def finish(self, scenario: str, faults: str, serve_bound_s: float = 60.0,
                     drain_timeout_s: float = 90.0) -> Row:
        """Stop sending, wait for every pending send and for the consumer to get every
        acknowledged message, read the topic as stored, check the four properties
        (AssertionError naming what failed) and record the row."""
        serve_times = []
        for what, t in self.faults:
            took = await self.wait_serving(t, serve_bound_s)
            serve_times.append(took)
        self._stop.set()
        deadline = time.monotonic() + drain_timeout_s
        while len(self.acked_at) + len(self.send_errors) < len(self.sent_at):
            assert time.monotonic() < deadline, (f"{len(self.sent_at) - len(self.acked_at) - len(self.send_errors)} "
                                                 f"sends still pending after {drain_timeout_s:.0f} s")
            await asyncio.sleep(0.1)
        while not self._all_delivered() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        # Undelivered when the drain ended: lost, whatever the probe below brings afterwards.
        missing_at_deadline = {i for i in self.acked_at if i not in self.delivered}
        if missing_at_deadline:
            # Where they stopped, seen from both ends BEFORE anything else moves (a new message
            # or subscription may wake what was stuck), then the probe.
            self.details["before_probe"] = {"client_consumer": self._client_view(),
                                            "consume_task": _task_where(self._tasks[1]),
                                            "work_subscription": await self._broker_view()}
            probe = self.details["stall_probe"] = await self._probe_stall(self.probe_wait_s)
            if probe["missing_after"]:
                # still missing: are they kept by the subscription (a new consumer gets them)?
                probe["after_probe"] = {"client_consumer": self._client_view(),
                                        "work_subscription": await self._broker_view()}
                probe["missing_after_resubscribe"] = await self._resubscribe(missing_at_deadline,
                                                                             self.probe_wait_s)
        for name, task in zip(("producer", "consumer"), self._tasks):
            if task.done() and task.cancelled():      # nothing here cancels them before the end
                self.details[f"{name}_task_error"] = "cancelled before the end"
            elif task.done() and task.exception() is not None:
                self.details[f"{name}_task_error"] = repr(task.exception())   # the harness's own loop died
            elif task.done() and name == "consumer":  # it receives until cancelled below
                self.details["consumer_task_error"] = "returned before the end"
        self._tasks[1].cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._ack_tasks:
            await asyncio.wait(list(self._ack_tasks), timeout=20)
        self.details["client_consumer"] = self._client_view()
        stored = await self._read_stored()
        lost_now = missing_at_deadline | {i for i in self.acked_at if i not in self.delivered}
        if lost_now:     # what the broker says of the subscription, to tell where they are stuck
            self.details["work_subscription"] = await self._broker_view()
            self.details["undelivered_ids"] = {i: str(self.acked_ids[i]) for i in sorted(lost_now)[:10]}
        await self.close()

        acked = set(self.acked_at)
        lost = sorted(lost_now)
        stored_numbers = [n for n, _, _ in stored]
        stored_twice = {n for n, c in Counter(stored_numbers).items() if c > 1}
        delivered_twice = {i for i, ids in self.delivered.items() if len(ids) > 1}
        duplicated = sorted(stored_twice | delivered_twice)
        seqs = [s for _, s, _ in stored]
        order_ok = all(a < b for a, b in zip(seqs, seqs[1:])) and all(
            a < b for a, b in zip(stored_numbers, stored_numbers[1:]))
        missing_in_store = sorted(acked - set(stored_numbers))
        row = Row(scenario, faults, len(acked), len(lost), len(duplicated),
                  max(serve_times) if serve_times else None,
                  {"sent": len(self.sent_at), "send_errors": len(self.send_errors), "stored": len(stored),
                   "deliveries": self.deliveries, "ack_failures": self.ack_failures,
                   "consumer_errors": self.consumer_errors,
                   "serve_times_s": [round(x, 2) for x in serve_times], **self.details})
        record(row)
        assert not any(k.endswith("_task_error") for k in self.details), self.details
        assert not lost, f"{len(lost)} acknowledged messages never delivered, e.g. {lost[:10]}: {self.details}"
        assert not missing_in_store, f"{len(missing_in_store)} acknowledged messages not stored: {missing_in_store[:10]}"
        assert not duplicated, f"{len(duplicated)} messages stored twice, e.g. {duplicated[:10]}"
        assert order_ok, "the producer's order is not kept in the stored topic"
        assert not self.send_errors, f"{len(self.send_errors)} sends failed: {self.send_errors[:5]}"
        assert len(acked) > 0
        return row

    async def _broker_view(self) -> dict:
        """The broker's stats of the ``work`` subscription with its cursor (msgOutCounter,
        outbound frames queued and written, read and mark-delete positions); an error's
        repr if they cannot be had."""
        try:
            async with AdminClient(self.admin_url) as admin:
                sub = (await admin.get_stats(self.topic))["subscriptions"]["work"]
                internal = await admin.get_internal_stats(self.topic)
            return {**sub, "cursor": internal["cursors"].get("work"), "last_confirmed": internal["lastConfirmedEntry"]}
        except Exception as exc:   # diagnostics only
            return {"error": repr(exc)}

    async def _probe_stall(self, wait_s: float = 10.0) -> dict:
        """Acknowledged messages are still undelivered at the end: send one more message
        (numbered as the others, so every check still holds) and tell whether it got through
        on the consumer's stream. Delivered while the others are not: the stream works and
        the missing frames were lost on the way; not delivered either: the stream is stuck."""
        before = {i for i in self.acked_at if i not in self.delivered}
        i = len(self.sent_at)
        self.sent_at.append(time.monotonic())
        self.producer.send_async(b"fault-%08d" % i, self._on_receipt(i))
        deadline = time.monotonic() + wait_s
        while i not in self.delivered and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return {"probe_acknowledged": i in self.acked_at, "probe_delivered": i in self.delivered,
                "missing_before": len(before), "missing_after": sum(1 for j in before if j not in self.delivered)}

    async def _resubscribe(self, missing: set[int], wait_s: float) -> int | str:
        """Close the consumer and subscribe again (the consume loop takes the new one): the
        subscription redelivers what it did not get acknowledged. Returns how many of
        ``missing`` are still undelivered ``wait_s`` seconds later, or the error's repr."""
        old = self.consumer
        try:
            await asyncio.wait_for(old.close(), 15)
        except Exception:   # a stuck consumer may not close cleanly: its stream is cancelled anyway
            pass
        try:
            self.consumer = await self.sub_client.subscribe(self.topic, "work", consumer_type=self.sub_type,
                                                            initial_position=InitialPosition.Earliest)
        except Exception as exc:
            return repr(exc)
        deadline = time.monotonic() + wait_s
        while any(i not in self.delivered for i in missing) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return sum(1 for i in missing if i not in self.delivered)

    def _client_view(self) -> list[dict]:
        """The SDK consumer's own view, to tell where undelivered messages stopped: frames and
        entries its streams brought, entries dropped as stale (older consumer epoch),
        reconnections, messages still queued, whether a stream is open, permits not yet sent."""
        return [{"frames_received": impl.frames_received, "entries_received": impl.entries_received,
                 "stale_entries_dropped": impl.stale_entries_dropped, "reconnections": impl.reconnections,
                 "queued": len(impl.queue), "queue_waiters": len(impl.queue._waiters),
                 "connected": impl._call is not None, "epoch": impl._epoch,
                 "permits_not_sent": impl.permits.available, "failed": repr(impl.failed),
                 "run_task": _task_state(impl._run_task), "maintenance_task": _task_state(impl._maintenance_task)}
                for impl in self.consumer._impls()]

    async def _read_stored(self, timeout_s: float = 60.0) -> list[tuple[int, int, tuple]]:
        """[(payload number, sequence id, message id key)] of every stored message, in stored order."""
        reader = await self.sub_client.create_reader(self.topic, start_message_id=MessageId.earliest)
        out = []
        deadline = time.monotonic() + timeout_s
        try:
            while await reader.has_message_available():
                assert time.monotonic() < deadline, "reading the stored topic took too long"
                msg = await reader.read_next(timeout_millis=10000)
                out.append((_payload_number(msg.data()), msg.sequence_id(), _mid_key(msg.message_id())))
        finally:
            await reader.close()
        return out

    async def close(self) -> None:
        self._stop.set()
        for task in self._tasks:
            if not task.done():
                task.cancel()
        for client in {id(self.pub_client): self.pub_client, id(self.sub_client): self.sub_client}.values():
            try:
                await asyncio.wait_for(client.close(), 10)
            except Exception:   # closing after the run: errors here change nothing measured
                pass
