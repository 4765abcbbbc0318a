"""Model-based durability test over REAL processes (hypothesis ``RuleBasedStateMachine``).

One broker (dedup on, E=Qw=Qa=2, ledgers and cursor ledgers rolling over every
few entries) on three bookie processes, driven only through the SDK
(``client.AsyncClient``) while faults are injected: SIGKILL / restart /
SIGSTOP of bookies, kill -9 and SIGTERM of the broker (restarted on its port),
topic unload. The model (``tests/durability_model_support.py``) records what
the broker acknowledged and which acknowledgments it confirmed; the
invariants, checked after every step and once more at the end with every
process up (drain the subscription with a fresh consumer, read the whole
topic with a Reader from the earliest position), are the promises of
DESIGN.md "Promises, and the rules that keep them":

1. every message acknowledged by the broker is in the topic (0 lost);
2. no payload is stored twice (0 duplicated: dedup is on, the producer name is fixed);
3. no message whose ack was confirmed (``acknowledge_and_wait`` returned) is
   delivered again to the subscription after that confirmation (0 rolled back);
4. every message acknowledged by the broker and never acknowledged by the
   consumer is delivered to the subscription in the end (0 undelivered).

Profiles (environment variables, read at import):

* bounded CI profile (default): ``MINIPULSAR_MODEL_EXAMPLES`` (default 3)
  examples of ``MINIPULSAR_MODEL_STEPS_PER_EXAMPLE`` (default 16) steps, about
  1 minute on 2 cores when green (the long runs are the evidence; this keeps the
  model itself working) (shrinking a failure may add up to ~5 minutes)::

      .venv/bin/python -m pytest -q -s tests/integration/test_durability_model.py

* long run: ``MINIPULSAR_MODEL_STEPS=<total steps>`` (or
  ``MINIPULSAR_MODEL_PROFILE=long``, 5000 steps) spreads the total over examples
  of ``MINIPULSAR_MODEL_STEPS_PER_EXAMPLE`` (default 250) steps, without a pytest timeout::

      MINIPULSAR_MODEL_STEPS=5000 .venv/bin/python -m pytest -q -s tests/integration/test_durability_model.py

Other knobs: ``MINIPULSAR_MODEL_SHRINK=0`` skips shrinking a failure (faster,
longer reproduction); ``MINIPULSAR_MODEL_DIR=/path`` keeps the data dirs there
(default: pytest's tmp_path; dirs of passing examples are removed unless
``MINIPULSAR_MODEL_KEEP=1``); ``MINIPULSAR_MODEL_SEED=<int>`` fixes hypothesis' seed;
``MINIPULSAR_MODEL_REPRODUCE=<blob>`` replays a printed ``@reproduce_failure`` blob
(with the same ``MINIPULSAR_MODEL_STEPS_PER_EXAMPLE``).

Reproducing a failure without hypothesis: put the printed ``state.rule(...)``
lines in a file and run ``test_durability_model_replay`` (same rules, same
arguments, in that order; real processes, so timing still varies)::

    MINIPULSAR_MODEL_REPLAY=steps.txt .venv/bin/python -m pytest -q -s \
        tests/integration/test_durability_model.py -k replay

Each example prints a summary line (use ``-s``). A failing example keeps its
data dir: ``failure.txt`` (the verdict), ``trace.log`` (every step with
timestamps), ``model.json`` (every payload's story), ``stats.json`` (topic
stats and internal stats at the end), ``client.log`` (the SDK's log) and the
servers' ``broker/broker.stderr.log`` and ``bookie-<i>/bookie.stderr.log``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
import logging
import math
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import hypothesis
from hypothesis import HealthCheck, Phase, reproduce_failure, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from broker.config import BrokerConfig
from client import AsyncClient, InitialPosition, MessageId
from client.admin import AdminClient
from client.consumer_config import ConsumerType
from client.errors import PulsarException, Timeout
from tests.durability_model_support import (INFORMATIONAL, Cluster, LoopThread, Model, RuleTimeout,
                                            TrackedConsumer)
from tests.procs import ProcessTracker

# ----------------------------------------------------------------------------------------------
# profiles
# ----------------------------------------------------------------------------------------------
_env = os.environ.get
_TOTAL_STEPS = _env("MINIPULSAR_MODEL_STEPS") or ("5000" if _env("MINIPULSAR_MODEL_PROFILE") == "long" else None)
LONG = _TOTAL_STEPS is not None
if LONG:
    STEPS_PER_EXAMPLE = int(_env("MINIPULSAR_MODEL_STEPS_PER_EXAMPLE", "250"))
    EXAMPLES = int(_env("MINIPULSAR_MODEL_EXAMPLES") or max(1, math.ceil(int(_TOTAL_STEPS) / STEPS_PER_EXAMPLE)))
else:
    STEPS_PER_EXAMPLE = int(_env("MINIPULSAR_MODEL_STEPS_PER_EXAMPLE", "16"))
    EXAMPLES = int(_env("MINIPULSAR_MODEL_EXAMPLES", "3"))
SHRINK = _env("MINIPULSAR_MODEL_SHRINK", "1") != "0"
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else [])

settings.register_profile(
    "minipulsar-durability-ci", max_examples=EXAMPLES, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None,
    database=None, print_blob=True, phases=PHASES, suppress_health_check=list(HealthCheck))
settings.register_profile(
    "minipulsar-durability-long", max_examples=EXAMPLES, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None,
    database=None, print_blob=True, phases=PHASES, suppress_health_check=list(HealthCheck))
PROFILE = settings.get_profile("minipulsar-durability-long" if LONG else "minipulsar-durability-ci")

# ----------------------------------------------------------------------------------------------
# the cluster's configuration
# ----------------------------------------------------------------------------------------------
_BROKER_FIELDS = {f.name for f in dataclasses.fields(BrokerConfig)}


def _bookie_timeout_key() -> str | None:
    """The broker's bookie-client add timeout key, if this version of the broker has one."""
    for key in ("bookkeeper_client_timeout_in_seconds", "bookkeeper_add_entry_timeout_in_seconds",
                "bookkeeper_client_add_entry_timeout_in_seconds"):
        if key in _BROKER_FIELDS:
            return key
    return next((f for f in sorted(_BROKER_FIELDS)
                 if ("bookkeeper" in f or "bookie" in f) and "timeout" in f and "add" in f), None)


BK_TIMEOUT_KEY = _bookie_timeout_key()
BK_TIMEOUT_S = 3
BROKER_SETTINGS = {
    "broker_deduplication_enabled": True,
    "managed_ledger_default_ensemble_size": 2,
    "managed_ledger_default_write_quorum": 2,
    "managed_ledger_default_ack_quorum": 2,
    "managed_ledger_max_entries_per_ledger": 20,
    "managed_ledger_min_ledger_rollover_time_minutes": 0,
    "managed_ledger_cursor_max_entries_per_ledger": 10,
    "max_unacked_messages_per_consumer": 10_000_000,  # the final drain receives everything without acking
}
# After a wiped bookie (wipe_bookie) its entries have one replica left until that ledger is gone:
# a restart of the other bookie makes them unreadable for a moment, and the dispatcher's read
# retry (15 s doubling to 60 s by default) would outlast the final drain's 10 s quiet period.
BROKER_SETTINGS.update(dispatcher_read_failure_backoff_initial_time_in_ms=500,
                       dispatcher_read_failure_backoff_max_time_in_ms=2000)
if BK_TIMEOUT_KEY is not None:
    BROKER_SETTINGS[BK_TIMEOUT_KEY] = BK_TIMEOUT_S * (1000 if BK_TIMEOUT_KEY.endswith(("_ms", "_millis")) else 1)

# the broker cluster of ClusterDurabilityModel (etcd, 2 brokers): a short session so that the
# faults "etcd link cut to one broker" and "broker paused past the session" take seconds
CLUSTER_SESSION_S = 2
CLUSTER_SETTINGS = {
    "metadata_store_session_timeout_millis": CLUSTER_SESSION_S * 1000,
    "load_balancer_report_update_min_interval_millis": 500,
}

# client-side time bounds (seconds)
OP_TIMEOUT_S = 10
SEND_TIMEOUT_S = (3 * BK_TIMEOUT_S + 4) if BK_TIMEOUT_KEY else 6
PAUSES_S = (0.3, 1.5, BK_TIMEOUT_S + 1.5) if BK_TIMEOUT_KEY else (0.3, 1.0, 2.0)
RULE_BOUND_S = 90
BURSTS = st.sampled_from([0, 5, 100, 300])  # sends fired (not awaited) just before a fault

TOPIC = "persistent://public/default/durability-model"
SUBSCRIPTION = "model-sub"
PRODUCER_NAME = "model-producer"
CONSUMER_ERRORS = (PulsarException, asyncio.TimeoutError)


def step(fn):
    """Count and trace a rule; remember that the example failed if it raises."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        self.model.step += 1
        self.model.rules[fn.__name__] += 1
        self.log(f"step {self.model.step}: {fn.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
        try:
            return fn(self, *args, **kwargs)
        except BaseException:
            self.failed = True
            raise
    return wrapper


class DurabilityModel(RuleBasedStateMachine):
    base_dir: Path = Path("/tmp/minipulsar-durability-model")
    # True (ClusterDurabilityModel): two brokers on etcd, broker 0's etcd link through a proxy;
    # the rules cut_broker_etcd and pause_broker_past_session then apply
    etcd_cluster = False
    keep_dirs = _env("MINIPULSAR_MODEL_KEEP") == "1"
    _counter = itertools.count(1)
    results: list[dict] = []

    def __init__(self) -> None:
        super().__init__()
        self.number = next(self._counter)
        self.dir = self.base_dir / f"example-{self.number:03d}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.t0 = time.monotonic()
        self.model = Model()
        self.tracker = ProcessTracker()
        self.cluster: Cluster | None = None
        self.loop: LoopThread | None = None
        self.client: AsyncClient | None = None
        self.admin: AdminClient | None = None
        self.producer = None
        self.consumer: TrackedConsumer | None = None
        self.consumers_created = 0
        self.inflight: set[asyncio.Future] = set()
        self.batching = True
        self.failed = False
        self.verdict: dict[str, list[str]] = {}
        self._trace = open(self.dir / "trace.log", "w", buffering=1)
        # the SDK's own log (reconnects, send errors) next to the servers' logs
        self._client_log = logging.FileHandler(self.dir / "client.log")
        self._client_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._client_log.setLevel(logging.INFO)
        self._client_logger = logging.getLogger("client")
        self._client_logger.addHandler(self._client_log)
        self._client_logger_level = self._client_logger.level
        self._client_logger_propagate = self._client_logger.propagate
        self._client_logger.setLevel(logging.INFO)
        self._client_logger.propagate = False  # into client.log only, not pytest's captured output
        self.trace_lines: list[str] = []

    # ------------------------------------------------------------------ helpers
    def log(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.2f}s] {text}"
        self.trace_lines.append(line)
        try:
            self._trace.write(line + "\n")
        except ValueError:  # closed at teardown
            pass

    def note(self, text: str) -> None:
        with self.model.lock:
            self.model.notes.append(f"step {self.model.step}: {text}")
        self.log(f"  note: {text}")

    def run(self, coro, timeout: float = RULE_BOUND_S):
        try:
            return self.loop.run(coro, timeout)
        except RuleTimeout as exc:
            self.model.rules["(rule coroutine timed out)"] += 1
            self.note(f"rule coroutine timed out: {exc}")
            return None

    def fault(self, kind: str, detail: str = "") -> None:
        self.model.faults[kind] += 1
        self.log(f"  fault {kind} {detail}".rstrip())

    # ------------------------------------------------------------------ SDK side (on the loop)
    async def _connect(self) -> None:
        self.client = AsyncClient(self.cluster.service_url, operation_timeout_seconds=OP_TIMEOUT_S,
                                  connection_timeout_ms=2000,
                                  **({"keep_alive_interval_seconds": 1} if self.etcd_cluster else {}))
        self.admin = AdminClient(self.cluster.service_url, operation_timeout_seconds=OP_TIMEOUT_S)
        if self.etcd_cluster:   # the brokers of a cluster create public/default themselves
            from client.errors import AlreadyExists
            for create, name in ((self.admin.create_tenant, "public"), (self.admin.create_namespace, "public/default")):
                try:
                    await create(name)
                except AlreadyExists:
                    pass
        else:
            await self.admin.create_tenant("public")
            await self.admin.create_namespace("public/default")
        await self._ensure_producer()
        await self._ensure_consumer()

    async def _ensure_producer(self):
        p = self.producer
        if p is not None and getattr(p, "_state", None) in ("failed", "closed", "closing"):
            self.note(f"producer is {p._state}; recreating it")
            await self._close_producer()
        if self.producer is None:
            try:
                self.producer = await asyncio.wait_for(self.client.create_producer(
                    TOPIC, producer_name=PRODUCER_NAME, batching_enabled=self.batching, batching_max_messages=8,
                    send_timeout_millis=SEND_TIMEOUT_S * 1000, max_pending_messages=0), OP_TIMEOUT_S + 5)
                self.log(f"  producer created (batching={self.batching}, "
                         f"last sequence id {self.producer.last_sequence_id()})")
            except CONSUMER_ERRORS as exc:
                self.note(f"create_producer failed: {type(exc).__name__}: {exc}")
        return self.producer

    async def _close_producer(self) -> None:
        p, self.producer = self.producer, None
        if p is not None:
            try:
                await asyncio.wait_for(p.close(), OP_TIMEOUT_S + 10)
            except CONSUMER_ERRORS as exc:
                self.note(f"producer close: {type(exc).__name__}: {exc}")

    async def _subscribe(self, receiver_queue_size: int = 100) -> TrackedConsumer | None:
        self.consumers_created += 1
        number = self.consumers_created
        deadline = time.monotonic() + OP_TIMEOUT_S + 10
        while True:
            try:
                c = await asyncio.wait_for(self.client.subscribe(
                    TOPIC, SUBSCRIPTION, consumer_type=ConsumerType.Exclusive,
                    initial_position=InitialPosition.Earliest, batch_index_ack_enabled=True,
                    receiver_queue_size=receiver_queue_size), OP_TIMEOUT_S + 5)
                self.log(f"  consumer #{number} subscribed")
                return TrackedConsumer(c, number)
            except CONSUMER_ERRORS as exc:
                if time.monotonic() > deadline:
                    self.note(f"subscribe failed: {type(exc).__name__}: {exc}")
                    return None
                await asyncio.sleep(0.5)

    async def _ensure_consumer(self) -> TrackedConsumer | None:
        tc = self.consumer
        if tc is not None and (tc.consumer._failed() is not None or tc.consumer._closed):
            self.note(f"consumer #{tc.number} failed ({tc.consumer._failed()}); resubscribing")
            await self._close_consumer()
        if self.consumer is None:
            self.consumer = await self._subscribe()
        return self.consumer

    async def _close_consumer(self) -> None:
        tc, self.consumer = self.consumer, None
        if tc is not None:
            try:
                await asyncio.wait_for(tc.consumer.close(), OP_TIMEOUT_S + 10)
            except CONSUMER_ERRORS as exc:
                self.note(f"consumer close: {type(exc).__name__}: {exc}")

    def _send_done(self, payload: bytes, fut: asyncio.Future) -> None:
        self.inflight.discard(fut)
        if fut.cancelled():
            self.model.on_send_result(payload, asyncio.CancelledError("cancelled"), None)
            return
        exc = fut.exception()
        self.model.on_send_result(payload, exc, None if exc is not None else fut.result())

    async def _send(self, k: int, wait: bool) -> None:
        prod = await self._ensure_producer()
        if prod is None:
            return
        tasks = []
        for _ in range(k):
            payload = self.model.new_payload()
            task = asyncio.ensure_future(prod.send(payload))
            task.add_done_callback(functools.partial(self._send_done, payload))
            self.inflight.add(task)
            tasks.append(task)
        if wait:
            await asyncio.wait(tasks, timeout=SEND_TIMEOUT_S + 5)
            states = [self.model.sends[p].state for p in self.model.sends if self.model.sends[p].step ==
                      self.model.step]
            self.log(f"  sent {k}: " + ", ".join(f"{s}={states.count(s)}" for s in sorted(set(states))))

    async def _receive_and_ack(self, n: int, skip_every: int) -> None:
        tc = await self._ensure_consumer()
        if tc is None:
            return
        got = acked = 0
        for i in range(n):
            try:
                msg = await tc.consumer.receive(timeout_millis=1000 if i == 0 else 300)
            except Timeout:
                break
            except CONSUMER_ERRORS as exc:
                self.note(f"receive failed on consumer #{tc.number}: {type(exc).__name__}: {exc}")
                await self._close_consumer()
                break
            got += 1
            self.model.on_delivery(msg, "rule", tc)
            if skip_every and i % skip_every == skip_every - 1:
                continue  # leave a hole: received, never acknowledged by this consumer
            self.model.on_ack_attempt(msg.data())
            try:
                await asyncio.wait_for(tc.consumer.acknowledge_and_wait(msg), OP_TIMEOUT_S + 2)
            except CONSUMER_ERRORS as exc:
                self.model.on_ack_error(msg.data(), exc)
                self.note(f"ack of {msg.data().decode()} failed: {type(exc).__name__}: {exc}")
                continue
            self.model.on_ack_confirmed(msg, tc)
            acked += 1
        self.log(f"  consumer #{tc.number}: received {got}, confirmed {acked}")

    async def _unload(self) -> None:
        try:
            await asyncio.wait_for(self.admin.unload_topic(TOPIC), OP_TIMEOUT_S + 5)
        except CONSUMER_ERRORS as exc:
            self.note(f"unload failed: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ rules
    @initialize(trim=st.booleans(), dedup_snapshot_interval=st.sampled_from([5, 1000]),
                batching=st.booleans(), initial_sends=st.sampled_from([100, 0, 300]))
    @step
    def start_cluster(self, trim, dedup_snapshot_interval, batching, initial_sends=0):
        conf = dict(BROKER_SETTINGS, broker_deduplication_entries_interval=dedup_snapshot_interval)
        if not trim:  # keep consumed ledgers: the Reader then sees every stored message
            conf.update(default_retention_time_in_minutes=-1, default_retention_size_in_mb=-1)
        self.batching = batching
        if self.etcd_cluster:
            conf.update(CLUSTER_SETTINGS)
        self.cluster = Cluster(self.dir, self.tracker, conf, etcd_cluster=self.etcd_cluster)
        self.cluster.start()
        self.log(f"  cluster: bookies {[b.address for b in self.cluster.bookies]}, broker "
                 f"{self.cluster.service_url}, dir {self.dir}")
        self.loop = LoopThread()
        self.loop.run(self._connect(), 60)
        if self.etcd_cluster:   # the topic is loaded on broker 0 (the only one up): it owns it
            self.cluster.start_broker1()
            self.log(f"  broker1 started: {self.cluster.service_url}")
        if initial_sends:  # even hypothesis' simplest examples then have something to check
            self.run(self._send(initial_sends, wait=True))

    @precondition(lambda self: self.cluster is not None)
    @rule(k=st.sampled_from([1, 5, 20, 100, 300]), wait=st.booleans())
    @step
    def send(self, k, wait):
        self.run(self._send(k, wait))

    @precondition(lambda self: self.cluster is not None)
    @rule(n=st.sampled_from([1, 10, 50, 200]), skip_every=st.sampled_from([0, 0, 0, 4]))
    @step
    def receive_and_ack(self, n, skip_every):
        self.run(self._receive_and_ack(n, skip_every))

    @precondition(lambda self: self.cluster is not None)
    @rule()
    @step
    def reopen_consumer(self):
        self.run(self._close_consumer())
        self.run(self._ensure_consumer())

    @precondition(lambda self: self.cluster is not None)
    @rule(batching=st.booleans())
    @step
    def reopen_producer(self, batching):
        self.run(self._close_producer())
        self.batching = batching
        self.run(self._ensure_producer())

    @precondition(lambda self: self.cluster is not None and len(self.cluster.up_bookies()) == 3)
    @rule(i=st.integers(0, 2), sends=BURSTS, delay=st.sampled_from([0.0, 0.02, 0.2]))
    @step
    def kill_bookie(self, i, sends, delay):
        if sends:
            self.run(self._send(sends, wait=False))
            time.sleep(delay)
        addr = self.cluster.kill_bookie(i)
        self.fault("kill_bookie", f"bookie-{i} {addr}")

    @precondition(lambda self: self.cluster is not None and len(self.cluster.up_bookies()) < 3)
    @rule()
    @step
    def restart_bookie(self):
        i = self.cluster.down_bookies()[0]
        addr = self.cluster.restart_bookie(i)
        self.fault("restart_bookie", f"bookie-{i} {addr}")

    @precondition(lambda self: self.cluster is not None)
    @rule(i=st.integers(0, 2), secs=st.sampled_from(PAUSES_S), sends=BURSTS)
    @step
    def pause_bookie(self, i, secs, sends):
        up = self.cluster.up_bookies()
        idx = up[i % len(up)]
        self.cluster.pause_bookie(idx)
        self.fault("pause_bookie", f"bookie-{idx} for {secs}s")
        try:
            if sends:
                self.run(self._send(sends, wait=False))
            time.sleep(secs)
        finally:
            self.cluster.resume_bookie(idx)

    @precondition(lambda self: self.cluster is not None)
    @rule(sends=BURSTS, delay=st.sampled_from([0.0, 0.02, 0.2]),
          down_s=st.sampled_from([0.0, 1.0]))
    @step
    def kill_broker_and_restart(self, sends, delay, down_s):
        if sends:
            self.run(self._send(sends, wait=False))
            time.sleep(delay)
        self.cluster.kill_broker()
        self.fault("kill_broker")
        time.sleep(down_s)
        self.cluster.restart_broker()
        self.log(f"  broker restarted, pid {self.cluster.broker.pid}")

    @precondition(lambda self: self.cluster is not None)
    @rule(sends=BURSTS)
    @step
    def restart_broker_clean(self, sends):
        if sends:
            self.run(self._send(sends, wait=False))
        status = self.cluster.terminate_broker()
        self.fault("restart_broker_clean", f"exit status {status}")
        self.cluster.restart_broker()
        self.log(f"  broker restarted, pid {self.cluster.broker.pid}")

    @precondition(lambda self: self.cluster is not None)
    @rule(sends=BURSTS)
    @step
    def unload_topic(self, sends):
        if sends:
            self.run(self._send(sends, wait=False))
        self.fault("unload_topic")
        self.run(self._unload())

    @precondition(lambda self: self.cluster is not None and self.cluster.etcd_proxy is not None)
    @rule(sends=BURSTS, extra_s=st.sampled_from([1.0, 3.0]))
    @step
    def cut_broker_etcd(self, sends, extra_s):
        """Broker 0's etcd link held (its clients stay connected) past its session: it must write
        no metadata for the bundles it loses, and its clients must move to broker 1 (issue 33)."""
        self.cluster.cut_etcd()
        self.fault("cut_broker_etcd", f"for session + {extra_s}s")
        try:
            if sends:
                self.run(self._send(sends, wait=False))
            time.sleep(CLUSTER_SESSION_S + extra_s)
        finally:
            self.cluster.restore_etcd()

    @precondition(lambda self: self.cluster is not None and self.cluster.etcd_proxy is not None)
    @rule(sends=BURSTS, extra_s=st.sampled_from([1.0, 3.0]))
    @step
    def pause_broker_past_session(self, sends, extra_s):
        """SIGSTOP of broker 0 past its session: its bundles move; woken, it is fenced (issue 33)."""
        self.cluster.pause_broker()
        self.fault("pause_broker_past_session", f"for session + {extra_s}s")
        try:
            if sends:
                self.run(self._send(sends, wait=False))
            time.sleep(CLUSTER_SESSION_S + extra_s)
        finally:
            self.cluster.resume_broker()

    # ------------------------------------------------------------------ storage faults (issue 34)
    @precondition(lambda self: self.cluster is not None and len(self.cluster.up_bookies()) == 3
                  and not self.cluster.disk_full)
    @rule(i=st.integers(0, 2), sends=BURSTS)
    @step
    def disk_full(self, i, sends):
        """Bookie i's disk fills up (restarted capped at the pages it uses: read-only, registered
        so; placement avoids it, writes go to the two others)."""
        if sends:
            self.run(self._send(sends, wait=False))
        addr = self.cluster.fill_disk(i)
        self.fault("disk_full", f"bookie-{i} {addr}")

    @precondition(lambda self: self.cluster is not None and bool(self.cluster.disk_full))
    @rule(sends=BURSTS)
    @step
    def free_disk(self, sends):
        """The operator adds space to the full bookie (restarted without the cap)."""
        i = min(self.cluster.disk_full)
        if sends:
            self.run(self._send(sends, wait=False))
        addr = self.cluster.free_disk(i)
        self.fault("free_disk", f"bookie-{i} {addr}")

    @precondition(lambda self: self.cluster is not None and len(self.cluster.up_bookies()) == 3
                  and not self.cluster.wiped and not self.cluster.disk_full)
    @rule(i=st.integers(0, 2), sends=BURSTS)
    @step
    def wipe_bookie(self, i, sends):
        """kill -9 of bookie i, its data dir wiped, restarted with --format (a new instance under
        the same address): once per example (a second wipe could take both replicas of an
        entry: E=Qw=Qa=2 and nothing re-replicates). Recovery must not count its answers."""
        if sends:
            self.run(self._send(sends, wait=False))
        addr = self.cluster.wipe_bookie(i)
        self.fault("wipe_bookie", f"bookie-{i} {addr}")

    @precondition(lambda self: self.cluster is not None and len(self.cluster.up_bookies()) == 3
                  and not self.cluster.wiped and not self.cluster.disk_full)
    @rule(i=st.integers(0, 2), sends=BURSTS, down_s=st.sampled_from([1.0, 3.0]))
    @step
    def wiped_bookie_while_broker_down(self, i, sends, down_s):
        """Issue 34's scenario: broker kill -9 (its ledgers stay OPEN), bookie i wiped and
        restarted with --format, the two other bookies killed, the broker restarted: for
        ``down_s`` seconds the wiped bookie is the only one answering, and recovery must wait
        (not close a ledger short on its "no such entry"); then the others come back."""
        if sends:
            self.run(self._send(sends, wait=False))
        self.cluster.kill_broker()
        self.fault("kill_broker")
        addr = self.cluster.wipe_bookie(i)
        self.fault("wipe_bookie", f"bookie-{i} {addr}")
        others = [j for j in range(3) if j != i]
        for j in others:
            self.cluster.kill_bookie(j)
            self.fault("kill_bookie", f"bookie-{j}")
        self.cluster.restart_broker()
        self.log(f"  broker restarted, pid {self.cluster.broker.pid}; only the wiped bookie-{i} is up")
        time.sleep(down_s)
        for j in others:
            self.fault("restart_bookie", f"bookie-{j} {self.cluster.restart_bookie(j)}")

    # ------------------------------------------------------------------ invariants
    @invariant()
    def nothing_rolled_back_or_stored_twice(self):
        problems = self.model.online_problems()
        if problems:
            self.failed = True
            raise AssertionError(self.failure_text({"online": problems}))

    # ------------------------------------------------------------------ final check
    async def _settle(self) -> None:
        if self.inflight:
            await asyncio.wait(list(self.inflight), timeout=SEND_TIMEOUT_S + 10)
        if self.producer is not None:
            try:
                await asyncio.wait_for(self.producer.flush(), SEND_TIMEOUT_S + 5)
            except CONSUMER_ERRORS:
                pass
        await self._close_producer()
        if self.inflight:
            await asyncio.wait(list(self.inflight), timeout=5)
        await self._close_consumer()

    async def _drain(self) -> None:
        tc = await self._subscribe(receiver_queue_size=1000)
        if tc is None:
            self.note("final drain: could not subscribe")
            return
        expected = self.model.expected_in_drain()
        start = last = time.monotonic()
        n = 0
        while time.monotonic() - start < 90:
            try:
                msg = await tc.consumer.receive(timeout_millis=1000)
            except Timeout:
                quiet = time.monotonic() - last
                if (expected <= self.model.drain_delivered and quiet >= 2) or quiet >= 10:
                    break
                continue
            except CONSUMER_ERRORS as exc:
                self.note(f"final drain: receive failed: {type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5)
                tc = await self._subscribe(receiver_queue_size=1000) if tc.consumer._closed else tc
                if tc is None:
                    return
                continue
            n += 1
            last = time.monotonic()
            self.model.on_delivery(msg, "drain", tc)
        self.log(f"  final drain: {n} deliveries on consumer #{tc.number}")
        try:
            await asyncio.wait_for(tc.consumer.close(), OP_TIMEOUT_S + 5)
        except CONSUMER_ERRORS:
            pass

    async def _read_all(self) -> None:
        try:
            reader = await asyncio.wait_for(self.client.create_reader(TOPIC, MessageId.earliest), OP_TIMEOUT_S + 5)
        except CONSUMER_ERRORS as exc:
            self.note(f"final read: could not create a reader: {type(exc).__name__}: {exc}")
            return
        n = stuck = 0
        start = time.monotonic()
        while time.monotonic() - start < 90:
            try:
                msg = await reader.read_next(timeout_millis=2000)
            except Timeout:
                try:
                    more = await asyncio.wait_for(reader.has_message_available(), OP_TIMEOUT_S + 2)
                except CONSUMER_ERRORS as exc:
                    self.note(f"final read: has_message_available failed: {type(exc).__name__}: {exc}")
                    more = True
                if not more:
                    break
                stuck += 1
                if stuck >= 5:
                    self.note("final read: the reader got nothing for 10 s while the broker says more "
                              "messages are available")
                    break
                continue
            except CONSUMER_ERRORS as exc:
                self.note(f"final read: read_next failed: {type(exc).__name__}: {exc}")
                break
            n += 1
            self.model.on_delivery(msg, "reader", None)
        self.log(f"  final read: {n} messages")
        try:
            await asyncio.wait_for(reader.close(), OP_TIMEOUT_S)
        except CONSUMER_ERRORS:
            pass

    async def _dump_stats(self) -> None:
        """Topic stats and internal stats (ledgers, cursors) into stats.json, for the post-mortem."""
        out = {}
        for name, call in (("stats", self.admin.get_stats), ("internal_stats", self.admin.get_internal_stats)):
            try:
                out[name] = await asyncio.wait_for(call(TOPIC), OP_TIMEOUT_S + 2)
            except CONSUMER_ERRORS as exc:
                out[name] = f"{type(exc).__name__}: {exc}"
        (self.dir / "stats.json").write_text(json.dumps(out, indent=1, default=str))

    def final_check(self) -> None:
        self.log("final check: every process up, settle sends, drain the subscription, read the topic")
        crashed = self.cluster.unexpected_exits()
        for note in self.cluster.ensure_all_up():
            self.note(note)
        for what, coro, bound in (("settling the sends", self._settle(), 120),
                                  ("draining the subscription", self._drain(), 150),
                                  ("reading the topic", self._read_all(), 150),
                                  ("dumping the stats", self._dump_stats(), 30)):
            try:
                self.loop.run(coro, bound)
            except RuleTimeout:
                self.failed = True
                raise AssertionError(self.failure_text(
                    {"final_check_hung": [f"{what} did not finish within {bound}s"]})) from None
        self.verdict = self.model.verdict()
        if crashed:
            self.verdict["crashed"] = crashed
        problems = {k: v for k, v in self.verdict.items() if v and k not in INFORMATIONAL}
        if problems:
            self.failed = True
            raise AssertionError(self.failure_text(problems))

    def failure_text(self, problems: dict[str, list[str]]) -> str:
        text = self._failure_text(problems)
        try:
            (self.dir / "failure.txt").write_text(text + "\n")
        except OSError:
            pass
        return text

    def _failure_text(self, problems: dict[str, list[str]]) -> str:
        out = [f"durability promises broken in example {self.number} (data dir {self.dir}):"]
        for kind, lines in problems.items():
            out.append(f"  {kind.upper()} ({len(lines)}):")
            out += [f"    {ln}" for ln in lines[:25]]
            if len(lines) > 25:
                out.append(f"    ... {len(lines) - 25} more")
        out.append("  " + self.summary_line())
        if self.model.notes:
            out.append("  notes (last 15):")
            out += [f"    {n}" for n in self.model.notes[-15:]]
        out.append("  trace (last 60 lines; full trace in trace.log):")
        out += [f"    {ln}" for ln in self.trace_lines[-60:]]
        if self.cluster is not None:
            out.append("  log excerpt:")
            out += [f"    {ln}" for ln in self.cluster.log_excerpt(max_lines=25).splitlines()]
        return "\n".join(out)

    def summary(self) -> dict:
        c = self.model.counts()
        v = self.verdict
        return dict(example=self.number, steps=self.model.step, seconds=round(time.monotonic() - self.t0, 1),
                    faults=dict(self.model.faults), rules=dict(self.model.rules), **c,
                    lost=len(v.get("lost", [])), duplicated=len(v.get("duplicated", self.model.stored_twice())),
                    rolled_back=len(self.model.rollbacks), undelivered=len(v.get("undelivered", [])),
                    lost_dup_acked=len(v.get("lost_dup_acked", [])), checked=bool(v), failed=self.failed,
                    send_errors=self.model.send_errors())

    def summary_line(self) -> str:
        s = self.summary()
        faults = ", ".join(f"{k}={n}" for k, n in sorted(s["faults"].items())) or "none"
        return (f"example {s['example']}: {s['steps']} steps in {s['seconds']}s; faults: {faults}; "
                f"sent {s['sent']} (acked {s['acked']}, dup-acked {s['dup_acked']}, failed/unknown "
                f"{s['send_failed'] + s['send_pending']}, of which stored {s['unknown_but_stored']}"
                + (f"; errors: {', '.join(f'{k}={n}' for k, n in s['send_errors'].most_common())}"
                   if s["send_errors"] else "") + "); "
                f"delivered {s['delivered']} (redelivered {s['redelivered']}), ack confirmed {s['confirmed']}/"
                f"{s['ack_attempted']}, read {s['read_by_reader']}; "
                f"lost {s['lost']}, duplicated {s['duplicated']}, rolled back {s['rolled_back']}, "
                f"undelivered {s['undelivered']}, lost dup-acked {s['lost_dup_acked']}"
                + ("" if s["checked"] else " (final check not run)") + (" FAILED" if s["failed"] else ""))

    def teardown(self):
        try:
            if self.cluster is not None and self.loop is not None and not self.failed:
                self.final_check()
        finally:
            try:
                if self.loop is not None and self.client is not None:
                    try:
                        self.loop.run(self._teardown_clients(), 30)
                    except BaseException as exc:  # noqa: BLE001
                        self.log(f"closing clients: {exc!r}")
                    self.loop.stop()
            finally:
                if self.cluster is not None:
                    self.cluster.kill_all()
                self.tracker.kill_all()
                line = self.summary_line()
                print(line, flush=True)
                self.log(line)
                (self.dir / "summary.txt").write_text(line + "\n")
                self.results.append(self.summary())
                if self.failed:
                    (self.dir / "model.json").write_text(json.dumps(self.model.dump(), indent=0))
                self._trace.close()
                self._client_logger.removeHandler(self._client_log)
                self._client_logger.setLevel(self._client_logger_level)
                self._client_logger.propagate = self._client_logger_propagate
                self._client_log.close()
                if not self.failed and not self.keep_dirs:  # keep trace.log and summary.txt only
                    for child in self.dir.iterdir():
                        if child.name not in ("trace.log", "summary.txt"):
                            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()

    async def _teardown_clients(self) -> None:
        for closer in (self._close_producer, self._close_consumer):
            try:
                await closer()
            except BaseException:  # noqa: BLE001
                pass
        for c in (self.client, self.admin):
            try:
                await asyncio.wait_for(c.close(), 10)
            except BaseException:  # noqa: BLE001
                pass


def _totals(results: list[dict]) -> str:
    keys = ("steps", "sent", "acked", "dup_acked", "send_failed", "unknown_but_stored", "delivered",
            "confirmed", "lost", "duplicated", "rolled_back", "undelivered", "lost_dup_acked")
    tot = {k: sum(r[k] for r in results) for k in keys}
    faults: dict[str, int] = {}
    for r in results:
        for k, n in r["faults"].items():
            faults[k] = faults.get(k, 0) + n
    failed = sum(1 for r in results if r["failed"])
    return (f"durability model: {len(results)} example runs ({failed} failed), {tot['steps']} steps; faults "
            f"{', '.join(f'{k}={n}' for k, n in sorted(faults.items())) or 'none'}; messages sent {tot['sent']}, "
            f"acked by the broker {tot['acked']} (+{tot['dup_acked']} as duplicates), send failed/unknown "
            f"{tot['send_failed']} (stored anyway {tot['unknown_but_stored']}), delivered {tot['delivered']}, "
            f"ack confirmed {tot['confirmed']}; lost {tot['lost']}, duplicated {tot['duplicated']}, rolled back "
            f"{tot['rolled_back']}, undelivered {tot['undelivered']}, lost dup-acked {tot['lost_dup_acked']}")


@pytest.mark.timeout(0 if LONG else 900)
def test_durability_model(tmp_path):
    base = Path(_env("MINIPULSAR_MODEL_DIR") or tmp_path)
    DurabilityModel.base_dir = base
    DurabilityModel.results = []
    print(f"\ndurability model: {EXAMPLES} examples x {STEPS_PER_EXAMPLE} steps, shrink={SHRINK}, "
          f"bookie add timeout key: {BK_TIMEOUT_KEY or 'none (pauses kept short)'}, send timeout "
          f"{SEND_TIMEOUT_S}s, data in {base}", flush=True)
    factory = ClusterDurabilityModel if _env("MINIPULSAR_MODEL_CLUSTER") == "1" else DurabilityModel
    if _env("MINIPULSAR_MODEL_SEED"):
        factory = seed(int(_env("MINIPULSAR_MODEL_SEED")))(factory)
    if _env("MINIPULSAR_MODEL_REPRODUCE"):  # the blob of a printed @reproduce_failure(...)
        factory = reproduce_failure(hypothesis.__version__, _env("MINIPULSAR_MODEL_REPRODUCE").encode())(factory)
    try:
        run_state_machine_as_test(factory, settings=PROFILE)
    finally:
        print(_totals(DurabilityModel.results), flush=True)


class ClusterDurabilityModel(DurabilityModel):
    """The same model over a broker cluster on etcd (two brokers, broker 0's etcd link through
    a proxy), with the faults of issue 33: etcd link cut to one broker, broker paused past the
    session. Long runs: ``MINIPULSAR_MODEL_CLUSTER=1`` runs it instead of the single broker."""

    etcd_cluster = True


def replay_steps(text: str, factory=None) -> None:
    """Run the state machine on exactly the steps of a printed failing case (``state.rule(k=v)``
    lines, as hypothesis prints them, or an example's ``trace.log``), without hypothesis: a
    fixed sequence, real timing. ``factory``: the machine class (default ``DurabilityModel``;
    ``MINIPULSAR_MODEL_CLUSTER=1``: ``ClusterDurabilityModel``)."""
    if factory is None:
        factory = ClusterDurabilityModel if _env("MINIPULSAR_MODEL_CLUSTER") == "1" else DurabilityModel
    machine = factory()
    try:
        for line in text.splitlines():
            m = (re.match(r"\s*state\.(\w+)\((.*)\)\s*$", line)
                 or re.match(r"\[[ \d.]+s\] step \d+: (\w+)\((.*)\)\s*$", line))  # or a trace.log
            if not m or m.group(1) == "teardown":
                continue
            name, args = m.groups()
            kwargs = eval(f"dict({args})", {"__builtins__": {"dict": dict}})  # noqa: S307 - test input
            getattr(machine, name)(**kwargs)
    finally:
        machine.teardown()


@pytest.mark.skipif(not _env("MINIPULSAR_MODEL_REPLAY"),
                    reason="set MINIPULSAR_MODEL_REPLAY=<file with the printed state.rule(...) lines>")
@pytest.mark.timeout(0)
def test_durability_model_replay(tmp_path):
    DurabilityModel.base_dir = Path(_env("MINIPULSAR_MODEL_DIR") or tmp_path)
    DurabilityModel.results = []
    try:
        replay_steps(Path(_env("MINIPULSAR_MODEL_REPLAY")).read_text())
    finally:
        print(_totals(DurabilityModel.results), flush=True)


@pytest.mark.timeout(300)
def test_durability_model_replay_full_disk_and_wiped_bookie(tmp_path):
    """Issue 34's storage faults in a fixed sequence: a bookie's disk fills up while sends go on
    and the broker is killed, the disk is freed; then the broker is killed, a bookie wiped and
    restarted with --format, the two others killed and the broker restarted (its recovery must
    not count the wiped bookie's "no such entry"), a second disk fills up. Nothing acknowledged
    is lost or duplicated. Before the fix: 5 acknowledged messages lost (a ledger closed short)."""
    DurabilityModel.base_dir = tmp_path
    DurabilityModel.results = []
    try:
        replay_steps((Path(__file__).parent / "model_replays" / "full_disk_and_wiped_bookie.txt").read_text())
    finally:
        print(_totals(DurabilityModel.results), flush=True)


@pytest.mark.timeout(300)
def test_durability_model_replay_wiped_bookie_cursor_ledger(tmp_path):
    """A sequence the model found: bookie 0 wiped (--format), bookie 1 killed, the topic
    unloaded: the subscription's cursor ledger was on bookies 0 and 1, and the wiped bookie's
    "no such ledger" made the cursor recovery fall back to the metadata store's older
    mark-delete position (2 acknowledged messages delivered again). A "no such entry" from a
    bookie that is not the instance recorded in the ledger metadata no longer counts."""
    DurabilityModel.base_dir = tmp_path
    DurabilityModel.results = []
    try:
        replay_steps((Path(__file__).parent / "model_replays" / "wiped_bookie_cursor_ledger.txt").read_text())
    finally:
        print(_totals(DurabilityModel.results), flush=True)


@pytest.mark.timeout(300)
def test_durability_model_replay_consumer_changes_during_bookie_pauses(tmp_path):
    """A sequence the long run found (40 steps: clean broker restarts, bookie pauses, consumers
    reopened while a read from a paused bookie was in flight). Before the fixes a consumer whose
    client left before the subscribe answer kept the Exclusive subscription busy (ConsumerBusy for
    every later subscribe), a consumer closed as its reconnection's subscribe answer arrived kept
    that stream open (Python 3.11's asyncio.wait_for swallowed the cancellation: the same
    ConsumerBusy), and a cursor read that finished after a rewind moved the read position past 100
    unacknowledged messages, which were then never delivered."""
    DurabilityModel.base_dir = tmp_path
    DurabilityModel.results = []
    try:
        replay_steps((Path(__file__).parent / "model_replays" / "consumer_changes_during_bookie_pauses.txt").read_text())
    finally:
        print(_totals(DurabilityModel.results), flush=True)


@pytest.mark.timeout(300)
def test_durability_model_replay_broker_cluster_partial_failures(tmp_path):
    """Issue 33's faults in the model, as a fixed sequence (CI: one example, both faults
    guaranteed; hypothesis explores them with MINIPULSAR_MODEL_CLUSTER=1): a broker cluster
    on etcd whose broker 0 first loses its etcd link past the session with sends in flight,
    then is paused past the session; acknowledgments go on in between. The four promises
    hold (0 lost, 0 duplicated, 0 rolled back, 0 undelivered)."""
    DurabilityModel.base_dir = tmp_path
    DurabilityModel.results = []
    try:
        replay_steps((Path(__file__).parent / "model_replays" / "broker_cluster_partial_failures.txt").read_text(),
                     ClusterDurabilityModel)
    finally:
        print(_totals(DurabilityModel.results), flush=True)
    assert DurabilityModel.results and not DurabilityModel.results[-1]["failed"]
    assert DurabilityModel.results[-1]["faults"].get("cut_broker_etcd") and \
        DurabilityModel.results[-1]["faults"].get("pause_broker_past_session")
