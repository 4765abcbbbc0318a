"""Support of the model-based durability test (``tests/integration/test_durability_model.py``).

Three parts, none of which knows hypothesis:

* :class:`LoopThread` -- one asyncio event loop running in a background thread.
  Hypothesis' stateful tests are synchronous; every rule submits its
  coroutine to this loop and waits for it with a time bound. Producers and
  consumers keep running (reconnecting, prefetching) between rules.
* :class:`Cluster` -- three real bookie processes and one real broker process
  (``tests.procs``), with the fault injections the rules use: SIGKILL, restart
  on the same port, SIGSTOP/SIGCONT, kill -9 / SIGTERM of the broker. Every
  process is registered with a :class:`tests.procs.ProcessTracker`.
* :class:`Model` -- what the test knows about every payload (sent, acknowledged
  by the broker with which id, ack attempted, ack confirmed on which consumer
  stream, where it was seen) and the durability verdict built from it.

The model's four promises (``Model.verdict``):

1. *lost*: a payload whose send resolved with a real message id is neither in
   the topic (read from the earliest position with a Reader) nor was ever
   delivered to the subscription (the union covers ledgers that were trimmed
   after being consumed);
2. *duplicated*: a payload observed at two different message ids (dedup is on
   and each payload is sent exactly once by the application; the SDK's own
   resends after reconnects must be dropped by the broker);
3. *rolled back*: a payload delivered again to the subscription on a consumer
   stream established after its ``acknowledge_and_wait`` returned (a redelivery
   on the very stream the ack went out on may legitimately have been dispatched
   before the ack arrived, so it is not counted);
4. *undelivered*: a payload acknowledged by the broker whose acknowledgment was
   never even attempted, not delivered to a fresh consumer of the subscription
   during the final drain.

Also failing: a payload observed that was never sent (*phantom*). Reported
but not failing (``INFORMATIONAL``): a payload whose send resolved as a
duplicate (id -1:-1) that is not in the topic (*lost_dup_acked*): after a
producer is re-created while its predecessor's sends are still in flight, a
new message may reuse a sequence id the broker had pushed but not persisted
and be dropped as a duplicate, as in Pulsar; only real ids count as
acknowledged.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import os
import re
import shutil
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Optional

from tests.procs import BookieProcess, BrokerProcess, ProcessTracker, start_bookie, start_broker


class RuleTimeout(Exception):
    """A rule's coroutine did not finish within its time bound."""


# --------------------------------------------------------------------------------------------------
# event loop
# --------------------------------------------------------------------------------------------------
class LoopThread:
    """An asyncio event loop owned by a daemon thread; ``run(coro, timeout)`` from any other thread."""

    def __init__(self, name: str = "durability-model-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro, timeout: float) -> Any:
        """Run ``coro`` on the loop and return its result; cancel it and raise
        :class:`RuleTimeout` after ``timeout`` seconds."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            try:
                fut.result(5)
            except BaseException:  # noqa: BLE001 - cancelled (or failed while cancelling)
                pass
            raise RuleTimeout(f"coroutine did not finish within {timeout:g}s") from None

    def call_soon(self, fn, *args) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what still runs on the loop, stop it and close it."""
        if self.loop.is_closed():
            return

        async def cancel_all():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout / 2)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout)
        except BaseException:  # noqa: BLE001 - best effort at teardown
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


# --------------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------------
BOOKIE_UP, BOOKIE_DOWN = "up", "down"


class Cluster:
    """Three bookies and one broker under ``base``, all registered with ``tracker``.

    ``bookie_state[i]`` is what the harness *did* (``up``/``down``), so that
    preconditions depend on the rule sequence only, never on timing; whether
    the processes still live is checked separately (:meth:`unexpected_exits`).
    """

    def __init__(self, base: Path, tracker: ProcessTracker, broker_settings: dict[str, Any],
                 n_bookies: int = 3, etcd_cluster: bool = False) -> None:
        # etcd_cluster: a broker cluster instead of one SQLite broker: etcd, ``broker`` (broker 0,
        # its etcd link through ``etcd_proxy``, a ThreadedTcpProxy the faults hold) and ``broker1``
        self.etcd_cluster = etcd_cluster
        self.etcd = None
        self.etcd_proxy = None
        self.broker1: Optional[BrokerProcess] = None
        self.broker_paused = False
        self.base = Path(base)
        self.tracker = tracker
        self.broker_settings = dict(broker_settings)
        self.n_bookies = n_bookies
        self.bookies: list[Optional[BookieProcess]] = [None] * n_bookies
        self.bookie_ports: list[Optional[int]] = [None] * n_bookies
        self.bookie_state: list[str] = [BOOKIE_DOWN] * n_bookies
        self.broker: Optional[BrokerProcess] = None
        self.broker_port: Optional[int] = None
        self.config_file = self.base / "broker.toml"
        self.disk_full: set[int] = set()   # bookies restarted with a full disk (fill_disk)
        self.wiped: set[int] = set()       # bookies whose data dir was wiped (wipe_bookie)

    # -- start ---------------------------------------------------------------------
    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        with concurrent.futures.ThreadPoolExecutor(self.n_bookies) as pool:
            procs = list(pool.map(lambda i: start_bookie(self.bookie_dir(i), tracker=self.tracker),
                                  range(self.n_bookies)))
        for i, proc in enumerate(procs):
            self.bookies[i], self.bookie_ports[i], self.bookie_state[i] = proc, proc.port, BOOKIE_UP
        self.config_file.write_text(_toml(self.broker_settings))
        if self.etcd_cluster:
            from tests.procs import start_etcd
            from tests.tcp_proxy import ThreadedTcpProxy

            self.etcd = start_etcd(self.base / "etcd", tracker=self.tracker)
            host, port = self.etcd.url.split("://", 1)[1].rsplit(":", 1)
            self.etcd_proxy = ThreadedTcpProxy(host, int(port))
            self.broker = start_broker(self.base / "broker", [b.address for b in procs], self.config_file,
                                       ("--metadata-store-url", f"etcd://{self.etcd_proxy.address}"),
                                       tracker=self.tracker)
            # broker 1 starts once the topic is loaded on broker 0 (start_broker1): broker 0 owns it
            from tests.procs import free_port
            self.broker1_port = free_port()
        else:
            self.broker = start_broker(self.base / "broker", [b.address for b in procs], self.config_file,
                                       tracker=self.tracker)
        self.broker_port = self.broker.port

    def bookie_dir(self, i: int) -> Path:
        return self.base / f"bookie-{i}"

    def start_broker1(self) -> None:
        """Start broker 1 of the etcd cluster on its reserved port (listed in ``service_url``)."""
        self.broker1 = _retry_start(lambda: start_broker(
            self.base / "broker1", [b.address for b in self.bookies], self.config_file,
            ("--metadata-store-url", self.etcd.url), tracker=self.tracker, port=self.broker1_port))

    @property
    def service_url(self) -> str:
        if self.etcd_cluster:
            return f"minipulsar://127.0.0.1:{self.broker_port},127.0.0.1:{self.broker1_port}"
        return f"minipulsar://127.0.0.1:{self.broker_port}"

    # -- broker cluster faults (etcd_cluster) ------------------------------------------
    def cut_etcd(self) -> None:
        """Hold broker 0's etcd link (nothing forwarded, nothing closed; its clients stay connected)."""
        self.etcd_proxy.hold()

    def restore_etcd(self) -> None:
        self.etcd_proxy.release()

    def pause_broker(self) -> None:
        """SIGSTOP of broker 0 (the caller must :meth:`resume_broker`, in a ``finally``)."""
        os.kill(self.broker.popen.pid, signal.SIGSTOP)
        self.broker_paused = True

    def resume_broker(self) -> None:
        if self.broker is not None and self.broker.is_running():
            os.kill(self.broker.popen.pid, signal.SIGCONT)
        self.broker_paused = False

    # -- bookies -------------------------------------------------------------------
    def up_bookies(self) -> list[int]:
        return [i for i, s in enumerate(self.bookie_state) if s == BOOKIE_UP]

    def down_bookies(self) -> list[int]:
        return [i for i, s in enumerate(self.bookie_state) if s == BOOKIE_DOWN]

    def kill_bookie(self, i: int) -> str:
        proc = self.bookies[i]
        self.bookie_state[i] = BOOKIE_DOWN
        proc.kill()
        return proc.address

    def restart_bookie(self, i: int) -> str:
        port = self.bookie_ports[i]
        proc = _retry_start(lambda: start_bookie(self.bookie_dir(i), extra_args=("--port", str(port)),
                                                 tracker=self.tracker))
        self.bookies[i], self.bookie_state[i] = proc, BOOKIE_UP
        return proc.address

    def pause_bookie(self, i: int) -> None:
        """SIGSTOP (the caller must :meth:`resume_bookie`, in a ``finally``)."""
        os.kill(self.bookies[i].popen.pid, signal.SIGSTOP)

    def resume_bookie(self, i: int) -> None:
        proc = self.bookies[i]
        if proc is not None and proc.is_running():
            os.kill(proc.popen.pid, signal.SIGCONT)

    # -- storage faults (issue 34): a full disk, a wiped data dir -----------------------
    # Kept apart from the rest so that other fault additions merge cleanly.
    def fill_disk(self, i: int) -> str:
        """Bookie ``i``'s disk is full: it restarts (same port) with its database capped at the
        pages it uses now (``--max-db-size-bytes``, checked every 0.2 s), so it is read-only at
        once and turns writable by itself only if deletes (trimmed ledgers) free 10 % of it.
        Returns its address."""
        proc = self.bookies[i]
        proc.terminate()
        db = sqlite3.connect(f"file:{self.bookie_dir(i) / 'ledgers.db'}?mode=ro", uri=True)
        try:
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            free = db.execute("PRAGMA freelist_count").fetchone()[0]
            page_size = db.execute("PRAGMA page_size").fetchone()[0]
        finally:
            db.close()
        cap = max(1, pages - free) * page_size
        port = self.bookie_ports[i]
        self.bookies[i] = _retry_start(lambda: start_bookie(
            self.bookie_dir(i), extra_args=("--port", str(port), "--max-db-size-bytes", str(cap),
                                            "--disk-check-interval-s", "0.2"), tracker=self.tracker))
        self.disk_full.add(i)
        return proc.address

    def free_disk(self, i: int) -> str:
        """The operator adds space to bookie ``i``: it restarts without the cap. Returns its address."""
        self.bookies[i].terminate()
        self.disk_full.discard(i)
        return self.restart_bookie(i)

    def free_all_disks(self) -> list[str]:
        """Free every full disk (before the final check); returns notes."""
        notes = []
        for i in sorted(self.disk_full):
            notes.append(f"bookie-{i}: disk freed for the final check ({self.free_disk(i)})")
        return notes

    def wipe_bookie(self, i: int) -> str:
        """kill -9 of bookie ``i``, its data (database, WAL, cookie, reserve) deleted, and the
        operator's explicit ``--format`` start: a new, empty instance under the same address
        (its logs are kept for the report). Returns its address."""
        proc = self.bookies[i]
        proc.kill()
        for path in self.bookie_dir(i).iterdir():
            if path.is_dir():           # the journal directory (bookie.journal_file)
                shutil.rmtree(path)
            elif not path.name.endswith(".log"):
                path.unlink()
        port = self.bookie_ports[i]
        self.bookies[i] = _retry_start(lambda: start_bookie(self.bookie_dir(i), extra_args=(
            "--port", str(port), "--format"), tracker=self.tracker))
        self.bookie_state[i] = BOOKIE_UP
        self.disk_full.discard(i)
        self.wiped.add(i)
        return proc.address

    # -- broker --------------------------------------------------------------------
    def kill_broker(self) -> None:
        self.broker.kill()

    def terminate_broker(self, timeout_s: float = 30.0) -> Optional[int]:
        return self.broker.terminate(timeout_s)

    def restart_broker(self) -> None:
        old = self.broker
        self.broker = _retry_start(lambda: old.restart(same_port=True))

    def broker_running(self) -> bool:
        return self.broker is not None and self.broker.is_running()

    # -- all up / down -------------------------------------------------------------
    def ensure_all_up(self) -> list[str]:
        """Resume, restart what is down (also processes that died on their own); returns notes."""
        notes = []
        for i in range(self.n_bookies):
            self.resume_bookie(i)
        notes += self.free_all_disks()
        for i in range(self.n_bookies):
            proc = self.bookies[i]
            if self.bookie_state[i] == BOOKIE_UP and (proc is None or not proc.is_running()):
                notes.append(f"bookie-{i} ({proc.address if proc else '?'}) had exited by itself "
                             f"(status {proc.returncode if proc else '?'})")
            if proc is None or not proc.is_running():
                self.restart_bookie(i)
        if self.etcd_proxy is not None:
            self.restore_etcd()
            self.resume_broker()
            if self.broker1 is not None and not self.broker1.is_running():
                notes.append(f"broker1 had exited by itself (status {self.broker1.returncode})")
                old1 = self.broker1
                self.broker1 = _retry_start(lambda: old1.restart(same_port=True))
        if not self.broker_running():
            notes.append(f"broker had exited by itself (status {self.broker.returncode})")
            self.restart_broker()
        return notes

    def unexpected_exits(self) -> list[str]:
        """Processes the harness believes running that are not (crashed by themselves)."""
        out = []
        for i, proc in enumerate(self.bookies):
            if self.bookie_state[i] == BOOKIE_UP and proc is not None and not proc.is_running():
                out.append(f"bookie-{i} {proc.address} exited with {proc.returncode}")
        return out

    def kill_all(self) -> None:
        for i in range(self.n_bookies):
            try:
                self.resume_bookie(i)
            except (ProcessLookupError, AttributeError):
                pass
        try:
            self.resume_broker()
        except (ProcessLookupError, AttributeError):
            pass
        self.tracker.kill_all()
        if self.etcd_proxy is not None:
            self.etcd_proxy.close()

    # -- logs ------------------------------------------------------------------------
    def log_files(self) -> list[Path]:
        files = [self.base / "broker" / "broker.stderr.log"]
        files += [self.bookie_dir(i) / "bookie.stderr.log" for i in range(self.n_bookies)]
        return [f for f in files if f.exists()]

    def log_excerpt(self, max_lines: int = 40,
                    pattern: str = r"WARNING|ERROR|CRITICAL|Traceback|Error:|fenc|recover|ensemble|lost|dedup"
                    ) -> str:
        """The last ``max_lines`` interesting lines of every process's stderr log."""
        rx = re.compile(pattern, re.I)
        out = []
        for f in self.log_files():
            lines = [ln.rstrip() for ln in f.read_text(errors="replace").splitlines() if rx.search(ln)]
            if lines:
                out.append(f"--- {f.relative_to(self.base)} ({len(lines)} matching lines, last {max_lines}):")
                out += [ln[:400] for ln in lines[-max_lines:]]
        return "\n".join(out)


def _retry_start(start, attempts: int = 6, delay_s: float = 0.5):
    """Start a process on a fixed port, retrying while the port is still held (e.g. TIME_WAIT)."""
    last: Optional[BaseException] = None
    for _ in range(attempts):
        try:
            return start()
        except (RuntimeError, TimeoutError) as exc:
            last = exc
            time.sleep(delay_s)
    raise RuntimeError(f"could not restart the process on its port: {last}")


def _toml(values: dict[str, Any]) -> str:
    lines = []
    for k, v in values.items():
        if isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, (int, float)):
            lines.append(f"{k} = {v}")
        else:
            lines.append(f"{k} = {str(v)!r}".replace("'", '"'))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# consumer streams
# --------------------------------------------------------------------------------------------------
class TrackedConsumer:
    """A consumer of the subscription plus the gRPC streams it was seen on.

    ``number`` orders consumer instances (a later instance subscribed after
    everything an earlier one did). ``generation()`` is the index of the
    consumer's current stream among the streams seen so far (streams are
    replaced on reconnect; the receive queue is cleared then, so a message
    dequeued now came on the current stream). This peeks at the SDK's
    ``_impls()``/``_call``; without them every message counts as generation 0
    (only consumer-instance order is used then).
    """

    def __init__(self, consumer, number: int) -> None:
        self.consumer = consumer
        self.number = number
        self._calls: list[Any] = []

    def _current_call(self):
        try:
            impls = self.consumer._impls()
            return impls[0]._call if impls else None
        except (AttributeError, IndexError):
            return None

    def generation(self) -> int:
        """Index of the current stream (registering it); the last known one when disconnected."""
        call = self._current_call()
        if call is None:
            return max(0, len(self._calls) - 1)
        for i, c in enumerate(self._calls):
            if c is call:
                return i
        self._calls.append(call)
        return len(self._calls) - 1

    def streams_seen(self) -> int:
        """Number of streams seen up to now (registering the current one)."""
        self.generation()
        return len(self._calls)


# --------------------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------------------
PENDING, ACKED, DUP_ACKED, FAILED = "pending", "acked", "dup-acked", "failed"
INFORMATIONAL = frozenset({"lost_dup_acked"})   # verdict kinds that are reported, not failing


@dataclasses.dataclass
class SendRecord:
    step: int
    state: str = PENDING
    msg_id: Optional[tuple] = None       # (ledger, entry, batch_index) of the receipt
    error: Optional[str] = None
    resolved_step: Optional[int] = None


@dataclasses.dataclass
class Confirmation:
    msg_id: tuple                        # the acknowledged copy (another copy is a duplicate, not a rollback)
    consumer_no: int
    streams_seen: int                    # streams of that consumer existing when the ack was confirmed
    step: int
    at: float


@dataclasses.dataclass
class Delivery:
    payload: bytes
    msg_id: tuple
    source: str                          # "rule" / "drain" / "reader"
    consumer_no: int
    generation: int
    step: int
    redelivery_count: int


def mid_key(mid) -> tuple:
    return (mid.ledger_id, mid.entry_id, mid.batch_index)


def fmt_id(key: Optional[tuple]) -> str:
    if key is None:
        return "-"
    ledger, entry, batch = key
    return f"{ledger}:{entry}" + (f":b{batch}" if batch is not None and batch >= 0 else "")


class Model:
    """Thread-safe record of what happened to every payload (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.step = 0
        self._n = 0
        self.sends: dict[bytes, SendRecord] = {}
        self.ack_attempted: dict[bytes, int] = {}          # payload -> step of the (first) attempt
        self.ack_errors: dict[bytes, str] = {}
        self.confirmed: dict[bytes, Confirmation] = {}
        self.observed: dict[bytes, dict[tuple, list[str]]] = collections.defaultdict(dict)  # payload -> id -> sources
        self.delivered_sub: set[bytes] = set()
        self.drain_delivered: set[bytes] = set()
        self.reader_seen: set[bytes] = set()
        self.rollbacks: list[str] = []
        self.rolled_back_payloads: set[bytes] = set()
        self.phantoms: set[bytes] = set()
        self.deliveries = 0
        self.redeliveries = 0
        self.faults: collections.Counter = collections.Counter()
        self.rules: collections.Counter = collections.Counter()
        self.notes: list[str] = []

    # -- sends -----------------------------------------------------------------------
    def new_payload(self) -> bytes:
        with self.lock:
            p = b"m-%d" % self._n
            self._n += 1
            self.sends[p] = SendRecord(step=self.step)
            return p

    def on_send_result(self, payload: bytes, exc: Optional[BaseException], mid) -> None:
        with self.lock:
            rec = self.sends[payload]
            rec.resolved_step = self.step
            if exc is not None:
                rec.state, rec.error = FAILED, f"{type(exc).__name__}: {exc}"[:200]
            elif mid.ledger_id < 0 or mid.entry_id < 0:
                rec.state = DUP_ACKED
            else:
                rec.state, rec.msg_id = ACKED, mid_key(mid)

    # -- subscription ----------------------------------------------------------------
    def on_delivery(self, msg, source: str, consumer: Optional[TrackedConsumer]) -> Delivery:
        payload = msg.data()
        key = mid_key(msg.message_id())
        gen = consumer.generation() if consumer is not None else 0
        d = Delivery(payload, key, source, consumer.number if consumer else -1, gen, self.step,
                     msg.redelivery_count())
        with self.lock:
            if payload not in self.sends:
                self.phantoms.add(payload)
            self.observed[payload].setdefault(key, []).append(source)
            if source == "reader":
                self.reader_seen.add(payload)
                return d
            self.deliveries += 1
            if payload in self.delivered_sub:
                self.redeliveries += 1
            self.delivered_sub.add(payload)
            if source == "drain":
                self.drain_delivered.add(payload)
            conf = self.confirmed.get(payload)
            if conf is not None and conf.msg_id == key and (d.consumer_no > conf.consumer_no
                                     or (d.consumer_no == conf.consumer_no and d.generation >= conf.streams_seen)):
                self.rolled_back_payloads.add(payload)
                self.rollbacks.append(
                    f"{payload.decode()} at {fmt_id(key)}: ack confirmed at step {conf.step} on consumer "
                    f"#{conf.consumer_no} (streams seen then: {conf.streams_seen}), delivered again at step "
                    f"{d.step} on consumer #{d.consumer_no} stream #{d.generation} ({source}, "
                    f"redelivery_count={d.redelivery_count})")
        return d

    def on_ack_attempt(self, payload: bytes) -> None:
        with self.lock:
            self.ack_attempted.setdefault(payload, self.step)

    def on_ack_error(self, payload: bytes, exc: BaseException) -> None:
        with self.lock:
            self.ack_errors[payload] = f"{type(exc).__name__}: {exc}"[:200]

    def on_ack_confirmed(self, msg, consumer: TrackedConsumer) -> None:
        streams = consumer.streams_seen()
        with self.lock:
            self.confirmed.setdefault(msg.data(), Confirmation(mid_key(msg.message_id()), consumer.number, streams,
                                                               self.step, time.monotonic()))

    # -- queries ----------------------------------------------------------------------
    def payloads_in(self, *states: str) -> set[bytes]:
        with self.lock:
            return {p for p, r in self.sends.items() if r.state in states}

    def stored_twice(self) -> dict[bytes, list[tuple]]:
        with self.lock:
            return {p: sorted(ids) for p, ids in self.observed.items() if len(ids) > 1}

    def online_problems(self) -> list[str]:
        """What can be decided before the end: rollbacks, payloads stored twice, phantoms."""
        with self.lock:
            out = [f"ROLLED BACK {r}" for r in self.rollbacks]
            for p, ids in self.stored_twice().items():
                out.append(f"STORED TWICE {p.decode()} at {', '.join(fmt_id(i) for i in ids)} "
                           f"({self._send_story(p)})")
            out += [f"PHANTOM payload {p!r} was never sent" for p in sorted(self.phantoms)]
            return out

    def expected_in_drain(self) -> set[bytes]:
        with self.lock:
            return {p for p, r in self.sends.items() if r.state == ACKED} - set(self.ack_attempted)

    def _send_story(self, p: bytes) -> str:
        r = self.sends.get(p)
        if r is None:
            return "never sent"
        s = f"sent at step {r.step}, {r.state}"
        if r.msg_id is not None:
            s += f" as {fmt_id(r.msg_id)}"
        if r.error:
            s += f" ({r.error})"
        if r.resolved_step is not None:
            s += f" at step {r.resolved_step}"
        if p in self.ack_attempted:
            s += f"; ack attempted at step {self.ack_attempted[p]}"
        if p in self.confirmed:
            s += f", confirmed at step {self.confirmed[p].step}"
        if p in self.ack_errors:
            s += f" (ack error: {self.ack_errors[p]})"
        seen = self.observed.get(p)
        if seen:
            s += "; seen at " + ", ".join(f"{fmt_id(k)} by {'/'.join(sorted(set(v)))}" for k, v in seen.items())
        return s

    def verdict(self) -> dict[str, list[str]]:
        """The final verdict: problem kind -> one line per payload (empty lists = all promises kept).
        ``lost_dup_acked`` is informational (see ``INFORMATIONAL``)."""
        with self.lock:
            present = set(self.observed)
            acked = self.payloads_in(ACKED)
            dup_acked = self.payloads_in(DUP_ACKED)
            expected = self.expected_in_drain()
            v = {
                "lost": [f"{p.decode()}: {self._send_story(p)}" for p in _sorted(acked - present)],
                "duplicated": [f"{p.decode()} at {', '.join(fmt_id(i) for i in ids)}: {self._send_story(p)}"
                               for p, ids in sorted(self.stored_twice().items(), key=lambda x: _num(x[0]))],
                "rolled_back": list(self.rollbacks),
                "undelivered": [f"{p.decode()}: {self._send_story(p)}"
                                for p in _sorted(expected - self.drain_delivered - (acked - present))],
                "lost_dup_acked": [f"{p.decode()}: {self._send_story(p)}" for p in _sorted(dup_acked - present)],
                "phantom": [repr(p) for p in sorted(self.phantoms)],
            }
            return v

    def send_errors(self) -> collections.Counter:
        """Failed sends by error class (what made their outcome unknown)."""
        with self.lock:
            return collections.Counter((r.error or "").split(":", 1)[0] for r in self.sends.values()
                                       if r.state == FAILED)

    def counts(self) -> dict[str, int]:
        with self.lock:
            states = collections.Counter(r.state for r in self.sends.values())
            failed_but_stored = sum(1 for p, r in self.sends.items() if r.state in (FAILED, PENDING)
                                    and p in self.observed)
            return {
                "sent": len(self.sends), "acked": states[ACKED], "dup_acked": states[DUP_ACKED],
                "send_failed": states[FAILED], "send_pending": states[PENDING],
                "unknown_but_stored": failed_but_stored,
                "delivered": self.deliveries, "redelivered": self.redeliveries,
                "ack_attempted": len(self.ack_attempted), "confirmed": len(self.confirmed),
                "ack_errors": len(self.ack_errors), "read_by_reader": len(self.reader_seen),
            }


    def dump(self) -> dict:
        """Everything recorded, per payload (for model.json after a failure)."""
        with self.lock:
            out = {}
            for p, r in sorted(self.sends.items(), key=lambda x: _num(x[0])):
                conf = self.confirmed.get(p)
                out[p.decode()] = {
                    "sent_step": r.step, "state": r.state, "receipt": fmt_id(r.msg_id), "error": r.error,
                    "resolved_step": r.resolved_step, "ack_attempt_step": self.ack_attempted.get(p),
                    "ack_error": self.ack_errors.get(p), "confirmed_step": conf.step if conf else None,
                    "seen": {fmt_id(k): v for k, v in self.observed.get(p, {}).items()},
                }
            return {"payloads": out, "rollbacks": self.rollbacks, "notes": self.notes,
                    "phantoms": [repr(p) for p in self.phantoms]}


def _num(p: bytes) -> int:
    try:
        return int(p.split(b"-", 1)[1])
    except (IndexError, ValueError):
        return -1


def _sorted(payloads) -> list[bytes]:
    return sorted(payloads, key=_num)
