"""Model-based delivery test over REAL processes (hypothesis ``RuleBasedStateMachine``), issue 20.

The delivery counterpart of ``test_durability_model.py``, on the same cluster
(one broker with deduplication on, E=Qw=Qa=2 over three bookie processes,
ledgers rolling over every 20 entries, cursor ledgers every 10) with a small
``max_message_size`` (8 KiB) so that large messages are chunked, and infinite
retention (nothing is trimmed: the final Reader sees everything ever stored;
trimming is the durability model's business). Driven only through the SDK:

* four producers with fixed names: batching off (``plain``), default batching
  (``batch``), KeyBased batching (``keyed``), chunking on with batching off
  (``chunk``: every other message is 9-30 KB, i.e. 2-5 chunks, LZ4 or not);
  messages carry one of four keys (or none);
* one subscription of each type (Exclusive, Shared, Failover, Key_Shared), up
  to two consumers each (one on Exclusive), with drawn ack timeouts
  (``unacked_messages_timeout_ms`` 1000/2000 ms or off), negative-ack delays
  (50/300 ms) and queue sizes; rules receive and, per message, acknowledge
  with receipt (``acknowledge_and_wait``), acknowledge without waiting,
  negatively acknowledge, or leave it unacknowledged (ack timeout, or
  redelivery on reconnect); a rule just waits so timers fire;
* Readers opened at the earliest position, after a recorded message id
  (exclusive) or at one (inclusive), chunked messages' ids drawn half the time
  (the consumer's ``ChunkMessageId``), reading in steps, kept open across faults;
* faults drawn as in the durability model: SIGKILL / restart / SIGSTOP of
  bookies, kill -9 and SIGTERM of the broker (restarted on its port), admin
  topic unload, each with a burst of sends in flight.

Invariants (``tests/delivery_model_support.py``, module docstring, for the
full list), after every step and at the end with every process up (settle the
sends, read the whole topic with a Reader from the earliest position, read
every open Reader to the end, close every consumer, drain each subscription
with a fresh consumer):

1. every resolved send is stored exactly once: each payload once in the
   topic, a chunked one complete and intact; per producer, the stored order is
   the send order (per key for the KeyBased producer);
2. a Reader gets every stored message once from its start position, in order;
3. no message whose ack was confirmed is delivered again to that subscription
   (on a consumer stream established after the confirmation, or on the same
   stream in a later PIP-84 consumer epoch);
4. every stored message is eventually delivered to each subscription unless
   an acknowledgment of it was attempted there;
5. (liveness, final check only) with every process up, each producer still
   open gets a message stored within three attempts of one send timeout each.

Known limitation kept out of the model, as Pulsar documents it: chunked
messages need a non-shared subscription (all chunks go to one consumer).
When an example draws ``chunking=True``, the Shared and Key_Shared
subscriptions have one consumer at a time; with ``chunking=False`` the chunk
producer sends small messages only and they may have two.

Bugs this test found. Fixed (85145b4 for the broker's three), their replays in ``model_replays/``
now run as regression tests (``test_delivery_model_replay_*``):

* an unload did not disconnect Readers (their non-durable subscriptions were
  not in ``PersistentTopic.subscriptions``): the Reader stayed on the closed
  topic instance, got no new message, and its dispatcher spun on the closed
  managed ledger, freezing the broker (``delivery_reader_across_unload.txt``);
* a topic unloaded while clients attached to it orphaned them (the Produce
  stream registered its disconnect callback only after writing
  ProducerSuccess; ``BrokerService.get_topic`` handed out an instance closed
  while the caller waited for its load, and ``subscribe`` / ``add_producer``
  accepted a closed topic): producers whose every send timed out, and acks
  confirmed on the orphaned instance lost (delivered again)
  (``delivery_unload_while_clients_attach.txt``);
* an unload while the managed ledger waited to roll over (a ledger failed for
  want of bookies) stranded the adds that did not fit the ledger the rollover
  finally created (``_rollover`` put them back in ``_queued``, no new
  rollover started because the ledger was closing, and ``close()`` never
  failed them): their producers' streams waited on them forever
  (``delivery_unload_during_rollover.txt``);
* a Reader created at a chunked message's id with
  ``start_message_id_inclusive=True`` (the ``ChunkMessageId`` a consumer
  handed out) never returned that message: the SDK sent the id's own
  position, the last chunk, instead of its first chunk (Pulsar #16154,
  #23713), so the assembler dropped the message
  (``delivery_reader_at_chunked_id.txt``); fixed in ``client.consumer_impl``
  (``first_chunk_of``, for seeks too).
* confirmed batch-index acks on Key_Shared delivered again after double
  unloads (seen once in a long run, never in a replay of its trace, kept as
  ``delivery_keyshared_batch_ack_redelivered.txt``): ``acknowledge_and_wait``
  called while the consumer reconnected returned as soon as the new
  connection's own flush had taken its ack, without waiting for the broker's
  answer, and a refused flush was dropped; fixed with ack receipts
  (``client.ack_receipts``), test in ``test_delivery_consumer.py``.

Profiles (environment variables, read at import):

* bounded CI profile (default): ``MINIPULSAR_DELIVERY_MODEL_EXAMPLES`` (default 3)
  examples of ``MINIPULSAR_DELIVERY_MODEL_STEPS_PER_EXAMPLE`` (default 12) steps,
  about 1-2 minutes on 2 cores when green::

      .venv/bin/python -m pytest -q -s tests/integration/test_delivery_model.py

* long run: ``MINIPULSAR_DELIVERY_MODEL_STEPS=<total steps>`` (or
  ``MINIPULSAR_DELIVERY_MODEL_PROFILE=long``, 2000 steps) spreads the total over
  examples of ``MINIPULSAR_DELIVERY_MODEL_STEPS_PER_EXAMPLE`` (default 60) steps,
  without a pytest timeout.

Other knobs (same meaning as the durability model's): ``..._SHRINK=0``,
``..._DIR=/path``, ``..._KEEP=1``, ``..._SEED=<int>``, ``..._REPRODUCE=<blob>``,
all prefixed ``MINIPULSAR_DELIVERY_MODEL``.

Replaying a sequence without hypothesis: put the printed ``state.rule(...)``
lines (or an example's ``trace.log``) in a file::

    MINIPULSAR_DELIVERY_MODEL_REPLAY=steps.txt .venv/bin/python -m pytest -q -s \\
        tests/integration/test_delivery_model.py -k replay

Each example prints a summary line (use ``-s``). A failing example keeps its
data dir: ``failure.txt``, ``trace.log``, ``model.json``, ``stats.json``,
``client.log`` and the servers' ``broker/broker.stderr.log`` and
``bookie-<i>/bookie.stderr.log``.
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
from client import AsyncClient, BatchingType, InitialPosition, MessageId
from client.admin import AdminClient
from client.consumer_config import ConsumerType
from client.errors import PulsarException, Timeout
from tests.delivery_model_support import INFORMATIONAL, ConsumerHandle, ReaderRecord, Reference
from tests.durability_model_support import Cluster, LoopThread, RuleTimeout
from tests.procs import ProcessTracker

# ----------------------------------------------------------------------------------------------
# profiles
# ----------------------------------------------------------------------------------------------
_env = os.environ.get
_P = "MINIPULSAR_DELIVERY_MODEL_"
_TOTAL_STEPS = _env(_P + "STEPS") or ("2000" if _env(_P + "PROFILE") == "long" else None)
LONG = _TOTAL_STEPS is not None
if LONG:
    STEPS_PER_EXAMPLE = int(_env(_P + "STEPS_PER_EXAMPLE", "60"))
    EXAMPLES = int(_env(_P + "EXAMPLES") or max(1, math.ceil(int(_TOTAL_STEPS) / STEPS_PER_EXAMPLE)))
else:
    STEPS_PER_EXAMPLE = int(_env(_P + "STEPS_PER_EXAMPLE", "12"))
    EXAMPLES = int(_env(_P + "EXAMPLES", "3"))
SHRINK = _env(_P + "SHRINK", "1") != "0"
# Known open broker bugs (see the module docstring): the rules that provoke them run only with this set.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else [])

settings.register_profile(
    "minipulsar-delivery-ci", max_examples=EXAMPLES, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None,
    database=None, print_blob=True, phases=PHASES, suppress_health_check=list(HealthCheck))
settings.register_profile(
    "minipulsar-delivery-long", max_examples=EXAMPLES, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None,
    database=None, print_blob=True, phases=PHASES, suppress_health_check=list(HealthCheck))
PROFILE = settings.get_profile("minipulsar-delivery-long" if LONG else "minipulsar-delivery-ci")

# ----------------------------------------------------------------------------------------------
# the cluster's configuration
# ----------------------------------------------------------------------------------------------
_BROKER_FIELDS = {f.name for f in dataclasses.fields(BrokerConfig)}
BK_TIMEOUT_KEY = "bookkeeper_client_timeout_in_seconds" if "bookkeeper_client_timeout_in_seconds" in _BROKER_FIELDS \
    else None
BK_TIMEOUT_S = 3
MAX_MESSAGE_SIZE = 8192
BROKER_SETTINGS = {
    "broker_deduplication_enabled": True,
    "managed_ledger_default_ensemble_size": 2,
    "managed_ledger_default_write_quorum": 2,
    "managed_ledger_default_ack_quorum": 2,
    "managed_ledger_max_entries_per_ledger": 20,
    "managed_ledger_min_ledger_rollover_time_minutes": 0,
    "managed_ledger_cursor_max_entries_per_ledger": 10,
    "max_unacked_messages_per_consumer": 10_000_000,  # the final drain receives everything without acking
    "max_message_size": MAX_MESSAGE_SIZE,
    "default_retention_time_in_minutes": -1,           # nothing trimmed: the final Reader sees everything
    "default_retention_size_in_mb": -1,
}
if BK_TIMEOUT_KEY is not None:
    BROKER_SETTINGS[BK_TIMEOUT_KEY] = BK_TIMEOUT_S

# client-side time bounds (seconds)
OP_TIMEOUT_S = 10
SEND_TIMEOUT_S = (3 * BK_TIMEOUT_S + 4) if BK_TIMEOUT_KEY else 6
PAUSES_S = (0.3, 1.5, BK_TIMEOUT_S + 1.5) if BK_TIMEOUT_KEY else (0.3, 1.0, 2.0)
RULE_BOUND_S = 90
BURSTS = st.sampled_from([0, 8, 40, 200])  # sends fired (not awaited) just before a fault, over all producers

TOPIC = "persistent://public/default/delivery-model"
CONSUMER_ERRORS = (PulsarException, asyncio.TimeoutError)

# producers: slot -> options (names are fixed: deduplication across reconnects and re-creations)
SLOTS = ("plain", "batch", "keyed", "chunk")
PRODUCER_OPTIONS = {
    "plain": dict(batching_enabled=False),
    "batch": dict(batching_enabled=True, batching_max_messages=8),
    "keyed": dict(batching_enabled=True, batching_type=BatchingType.KeyBased, batching_max_messages=8),
    "chunk": dict(batching_enabled=False, chunking_enabled=True),
}
KEYS = ("k0", "k1", "k2", "k3", None)
BIG_SIZES = (9000, 17000, 30000)       # > MAX_MESSAGE_SIZE: 2-5 chunks
CHUNKED_MIN = MAX_MESSAGE_SIZE

# subscriptions: name -> (type, most consumers at a time)
SUBS = {"excl": ConsumerType.Exclusive, "shared": ConsumerType.Shared, "failover": ConsumerType.Failover,
        "keyshared": ConsumerType.KeyShared}
SUB_NAMES = tuple(SUBS)
PATTERNS = ("ack", "ack", "ack", "ack_nack", "ack_skip", "plain_ack", "nack", "skip")
MAX_READERS = 3


def step(fn):
    """Count and trace a rule; remember that the example failed if it raises."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        self.ref.step += 1
        self.ref.rules[fn.__name__] += 1
        self.log(f"step {self.ref.step}: {fn.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
        try:
            return fn(self, *args, **kwargs)
        except BaseException:
            self.failed = True
            raise
    return wrapper


@dataclasses.dataclass
class ProducerSlot:
    name: str
    instance: int = 0
    producer: object = None
    compression: str = "LZ4"
    sends: int = 0                       # sends of the current instance (their order)


@dataclasses.dataclass
class ReaderHandle:
    reader: object
    rec: ReaderRecord
    dead: bool = False


class DeliveryModel(RuleBasedStateMachine):
    base_dir: Path = Path("/tmp/minipulsar-delivery-model")
    keep_dirs = _env(_P + "KEEP") == "1"
    _counter = itertools.count(1)
    results: list[dict] = []

    def __init__(self) -> None:
        super().__init__()
        self.number = next(self._counter)
        self.dir = self.base_dir / f"example-{self.number:03d}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.t0 = time.monotonic()
        self.ref = Reference({name: t.name for name, t in SUBS.items()})
        self.tracker = ProcessTracker()
        self.cluster: Cluster | None = None
        self.loop: LoopThread | None = None
        self.client: AsyncClient | None = None
        self.admin: AdminClient | None = None
        self.slots = {name: ProducerSlot(name) for name in SLOTS}
        self.consumers: dict[str, list[ConsumerHandle]] = {name: [] for name in SUB_NAMES}
        self.consumers_created = 0
        self.readers: list[ReaderHandle] = []
        self.recorded_ids: list[tuple[bytes, MessageId, bool]] = []   # (pid, id, usable inclusively)
        self.stuck_producers: list[str] = []
        self.inflight: set[asyncio.Future] = set()
        self.chunking = True
        self.failed = False
        self.verdict: dict[str, list[str]] = {}
        self._trace = open(self.dir / "trace.log", "w", buffering=1)
        self._client_log = logging.FileHandler(self.dir / "client.log")
        self._client_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._client_log.setLevel(logging.INFO)
        self._client_logger = logging.getLogger("client")
        self._client_logger.addHandler(self._client_log)
        self._client_logger_level = self._client_logger.level
        self._client_logger_propagate = self._client_logger.propagate
        self._client_logger.setLevel(logging.INFO)
        self._client_logger.propagate = False
        self.trace_lines: list[str] = []

    # ------------------------------------------------------------------ helpers
    def log(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.2f}s] {text}"
        self.trace_lines.append(line)
        try:
            self._trace.write(line + "\n")
        except ValueError:
            pass

    def note(self, text: str) -> None:
        text = text if len(text) <= 400 else text[:400] + "..."
        with self.ref.lock:
            self.ref.notes.append(f"step {self.ref.step}: {text}")
        self.log(f"  note: {text}")

    def run(self, coro, timeout: float = RULE_BOUND_S):
        try:
            return self.loop.run(coro, timeout)
        except RuleTimeout as exc:
            self.ref.rules["(rule coroutine timed out)"] += 1
            self.note(f"rule coroutine timed out: {exc}")
            return None

    def fault(self, kind: str, detail: str = "") -> None:
        self.ref.faults[kind] += 1
        self.log(f"  fault {kind} {detail}".rstrip())

    def max_consumers(self, sub: str) -> int:
        if SUBS[sub] is ConsumerType.Exclusive:
            return 1
        if self.chunking and SUBS[sub] in (ConsumerType.Shared, ConsumerType.KeyShared):
            return 1  # chunked messages need all chunks on one consumer (Pulsar's documented limitation)
        return 2

    # ------------------------------------------------------------------ producers (on the loop)
    async def _ensure_producer(self, slot: ProducerSlot):
        p = slot.producer
        if p is not None and getattr(p, "_state", None) in ("failed", "closed", "closing"):
            self.note(f"{slot.name} producer is {p._state}; recreating it")
            await self._close_producer(slot)
        if slot.producer is None:
            try:
                slot.producer = await asyncio.wait_for(self.client.create_producer(
                    TOPIC, producer_name=f"delivery-model-{slot.name}", send_timeout_millis=SEND_TIMEOUT_S * 1000,
                    max_pending_messages=0, compression_type=slot.compression, **PRODUCER_OPTIONS[slot.name]),
                    OP_TIMEOUT_S + 5)
                slot.instance += 1
                slot.sends = 0
                self.log(f"  {slot.name} producer #{slot.instance} created (compression {slot.compression}, "
                         f"last sequence id {slot.producer.last_sequence_id()})")
            except CONSUMER_ERRORS as exc:
                self.note(f"create_producer {slot.name} failed: {type(exc).__name__}: {exc}")
        return slot.producer

    async def _close_producer(self, slot: ProducerSlot) -> None:
        p, slot.producer = slot.producer, None
        if p is not None:
            try:
                await asyncio.wait_for(p.close(), OP_TIMEOUT_S + 10)
            except CONSUMER_ERRORS as exc:
                self.note(f"{slot.name} producer close: {type(exc).__name__}: {exc}")
            if self.inflight:  # close() fails what is left: let the callbacks run
                await asyncio.sleep(0)
            self.ref.producer_closed(slot.name, slot.instance)

    def _send_done(self, pid: bytes, fut: asyncio.Future) -> None:
        self.inflight.discard(fut)
        if fut.cancelled():
            self.ref.on_send_result(pid, asyncio.CancelledError("cancelled"), None)
            return
        exc = fut.exception()
        mid = None if exc is not None else fut.result()
        self.ref.on_send_result(pid, exc, mid)
        if exc is None and mid.ledger_id >= 0:
            big = self.ref.sends[pid].size >= CHUNKED_MIN
            self.recorded_ids.append((pid, mid, not big))  # a receipt of a chunked message: last chunk only

    async def _send(self, slot_name: str, k: int, wait: bool) -> list[asyncio.Future]:
        slot = self.slots[slot_name]
        prod = await self._ensure_producer(slot)
        if prod is None:
            return []
        tasks = []
        for _ in range(k):
            idx = slot.sends
            slot.sends += 1
            if slot_name == "chunk" and self.chunking and idx % 2 == 0:
                size = BIG_SIZES[(idx // 2) % len(BIG_SIZES)]
            else:
                size = 16 + idx % 48
            key = KEYS[idx % (len(KEYS) - 1)] if slot_name == "keyed" else KEYS[idx % len(KEYS)]
            pid, payload = self.ref.new_send(slot_name, slot.instance, idx, key, size,
                                             key_based=slot_name == "keyed")
            task = asyncio.ensure_future(prod.send(payload, partition_key=key))
            task.add_done_callback(functools.partial(self._send_done, pid))
            self.inflight.add(task)
            tasks.append(task)
        if wait and tasks:
            await asyncio.wait(tasks, timeout=SEND_TIMEOUT_S + 5)
            states = [self.ref.sends[p].state for p in self.ref.sends if self.ref.sends[p].step == self.ref.step
                      and self.ref.sends[p].slot == slot_name]
            self.log(f"  sent {k} on {slot_name}: " + ", ".join(f"{s}={states.count(s)}" for s in sorted(set(states))))
        return tasks

    async def _round_trip_sends(self) -> None:
        tasks = [t for name in SLOTS for t in await self._send(name, 4 if name == "chunk" else 10, wait=False)]
        if tasks:
            await asyncio.wait(tasks, timeout=SEND_TIMEOUT_S + 5)
        states = [self.ref.sends[p].state for p in self.ref.sends if self.ref.sends[p].step == self.ref.step]
        self.log(f"  sent {len(tasks)}: " + ", ".join(f"{s}={states.count(s)}" for s in sorted(set(states))))

    async def _send_burst(self, k: int) -> None:
        """``k`` sends over every producer, not awaited (in flight across the fault that follows)."""
        for name in SLOTS:
            n = max(1, k // len(SLOTS))
            if name == "chunk":
                n = min(n, 10)
            await self._send(name, n, wait=False)

    # ------------------------------------------------------------------ consumers (on the loop)
    async def _subscribe(self, sub: str, options: dict, receiver_queue_size: int | None = None,
                         patience_s: float = OP_TIMEOUT_S + 10) -> ConsumerHandle | None:
        self.consumers_created += 1
        number = self.consumers_created
        opts = dict(options)
        if receiver_queue_size is not None:
            opts["receiver_queue_size"] = receiver_queue_size
        deadline = time.monotonic() + patience_s
        while True:
            try:
                c = await asyncio.wait_for(self.client.subscribe(
                    TOPIC, f"model-{sub}", consumer_type=SUBS[sub], initial_position=InitialPosition.Earliest,
                    batch_index_ack_enabled=True, consumer_name=f"c{number}-{sub}", **opts), OP_TIMEOUT_S + 5)
                handle = ConsumerHandle(c, number, sub, opts)
                self.log(f"  {handle.describe()} subscribed")
                return handle
            except CONSUMER_ERRORS as exc:
                if time.monotonic() > deadline:
                    self.note(f"subscribe to {sub} failed: {type(exc).__name__}: {exc}")
                    return None
                await asyncio.sleep(0.5)

    async def _open_consumer(self, sub: str, options: dict) -> None:
        handle = await self._subscribe(sub, options)
        if handle is not None:
            self.consumers[sub].append(handle)

    async def _close_consumer(self, handle: ConsumerHandle) -> None:
        if handle in self.consumers[handle.sub]:
            self.consumers[handle.sub].remove(handle)
        try:
            await asyncio.wait_for(handle.consumer.close(), OP_TIMEOUT_S + 10)
        except CONSUMER_ERRORS as exc:
            self.note(f"consumer #{handle.number} close: {type(exc).__name__}: {exc}")
        self.log(f"  {handle.describe()} closed")

    async def _live_consumer(self, sub: str, i: int) -> ConsumerHandle | None:
        handles = self.consumers[sub]
        if not handles:
            return None
        h = handles[i % len(handles)]
        if h.consumer._failed() is not None or h.consumer._closed:
            self.note(f"{h.describe()} failed ({h.consumer._failed()}); resubscribing")
            await self._close_consumer(h)
            await self._open_consumer(sub, h.options)
            return self.consumers[sub][-1] if self.consumers[sub] else None
        return h

    async def _consume(self, sub: str, i: int, n: int, pattern: str) -> None:
        h = await self._live_consumer(sub, i)
        if h is None:
            self.log(f"  no consumer on {sub}")
            return
        got = confirmed = nacked = skipped = 0
        for j in range(n):
            try:
                msg = await h.consumer.receive(timeout_millis=1000 if j == 0 else 300)
            except Timeout:
                break
            except CONSUMER_ERRORS as exc:
                self.note(f"receive failed on {h.describe()}: {type(exc).__name__}: {exc}")
                break
            got += 1
            pid = self.ref.on_delivery(sub, msg, h, "rule")
            self.recorded_ids.append((pid, msg.message_id(), True))
            action = {"ack": "wait", "plain_ack": "plain", "nack": "nack", "skip": "skip",
                      "ack_nack": "nack" if j % 3 == 2 else "wait",
                      "ack_skip": "skip" if j % 3 == 2 else "wait"}[pattern]
            if action == "skip":
                skipped += 1
                self.ref.on_left_unacked(sub)
                continue
            if action == "nack":
                nacked += 1
                self.ref.on_nack(sub)
                try:
                    h.consumer.negative_acknowledge(msg)
                except CONSUMER_ERRORS as exc:
                    self.note(f"nack of {pid.decode()} failed: {type(exc).__name__}: {exc}")
                continue
            self.ref.on_ack_attempt(sub, pid)
            try:
                if action == "plain":
                    h.consumer.acknowledge(msg)
                    continue
                await asyncio.wait_for(h.consumer.acknowledge_and_wait(msg), OP_TIMEOUT_S + 2)
            except CONSUMER_ERRORS as exc:
                self.ref.on_ack_error(sub, pid, exc)
                self.note(f"[{sub}] ack of {pid.decode()} failed: {type(exc).__name__}: {exc}")
                continue
            self.ref.on_ack_confirmed(sub, msg, h, self.consumers[sub])
            confirmed += 1
        self.log(f"  {h.describe()}: received {got}, confirmed {confirmed}, nacked {nacked}, left {skipped}")

    # ------------------------------------------------------------------ readers (on the loop)
    async def _open_reader(self, start: str, pick: int) -> None:
        start_id, start_pid = MessageId.earliest, None
        if start != "earliest":
            choices = [r for r in self.recorded_ids if start == "after" or r[2]]
            chunked = [r for r in choices if getattr(r[1], "chunk_message_ids", ())]
            if chunked and pick % 2 == 0:  # chunked ids are rare among the recorded ones: draw them half the time
                choices = chunked
            if choices:
                start_pid, start_id, _ = choices[pick % len(choices)]
            else:
                start = "earliest"
        rec = self.ref.new_reader(start, None if start == "earliest" else start_id, start_pid)
        try:
            reader = await asyncio.wait_for(self.client.create_reader(
                TOPIC, start_id, start_message_id_inclusive=start == "at", receiver_queue_size=50), OP_TIMEOUT_S + 5)
        except CONSUMER_ERRORS as exc:
            self.note(f"create_reader failed: {type(exc).__name__}: {exc}")
            rec.notes.append(f"could not be created: {type(exc).__name__}")
            rec.closed_step = self.ref.step
            return
        self.readers.append(ReaderHandle(reader, rec))
        self.log(f"  {rec.describe()} (id {start_id!s})")

    async def _read(self, rh: ReaderHandle, n: int, first_timeout_ms: int = 1000) -> int:
        got = 0
        for j in range(n):
            try:
                msg = await rh.reader.read_next(timeout_millis=first_timeout_ms if j == 0 else 300)
            except Timeout:
                break
            except CONSUMER_ERRORS as exc:
                self.note(f"reader #{rh.rec.number}: read_next failed: {type(exc).__name__}: {exc}")
                rh.rec.notes.append(f"read_next failed at step {self.ref.step}: {type(exc).__name__}")
                rh.dead = True
                break
            got += 1
            self.ref.on_reader_message(rh.rec, msg)
        return got

    async def _read_to_end(self, rh: ReaderHandle) -> int:
        """Read until the broker says nothing more is available (or 10 s without progress while
        connected: a Reader still in its reconnect backoff, up to 30 s after many broker
        restarts, is waited for)."""
        n = stuck = 0
        start = time.monotonic()
        while time.monotonic() - start < 120 and not rh.dead:
            got = await self._read(rh, 1000, first_timeout_ms=2000)
            n += got
            if rh.dead:
                break
            if got:
                stuck = 0
                continue
            if not rh.reader.is_connected():
                continue
            try:
                more = await asyncio.wait_for(rh.reader.has_message_available(), OP_TIMEOUT_S + 2)
            except CONSUMER_ERRORS as exc:
                self.note(f"reader #{rh.rec.number}: has_message_available failed: {type(exc).__name__}: {exc}")
                more = True
            if not more:
                return n
            stuck += 1
            if stuck >= 5:
                rh.rec.notes.append("got nothing for 10 s while the broker said more messages are available")
                self.note(f"reader #{rh.rec.number}: nothing for 10 s while more messages are available")
                return n
        return n

    async def _close_reader(self, rh: ReaderHandle) -> None:
        if rh in self.readers:
            self.readers.remove(rh)
        rh.rec.closed_step = self.ref.step
        try:
            await asyncio.wait_for(rh.reader.close(), OP_TIMEOUT_S)
        except CONSUMER_ERRORS:
            pass

    # ------------------------------------------------------------------ others (on the loop)
    async def _connect(self, ack_timeout_ms) -> None:
        self.client = AsyncClient(self.cluster.service_url, operation_timeout_seconds=OP_TIMEOUT_S,
                                  connection_timeout_ms=2000)
        self.admin = AdminClient(self.cluster.service_url, operation_timeout_seconds=OP_TIMEOUT_S)
        await self.admin.create_tenant("public")
        await self.admin.create_namespace("public/default")
        for slot in self.slots.values():
            await self._ensure_producer(slot)
        for sub in SUB_NAMES:  # every subscription exists from the start
            await self._open_consumer(sub, dict(unacked_messages_timeout_ms=ack_timeout_ms,
                                                negative_ack_redelivery_delay_ms=100, receiver_queue_size=100))

    async def _unload(self) -> None:
        try:
            await asyncio.wait_for(self.admin.unload_topic(TOPIC), OP_TIMEOUT_S + 5)
        except CONSUMER_ERRORS as exc:
            self.note(f"unload failed: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ rules
    @initialize(dedup_snapshot_interval=st.sampled_from([5, 1000]), chunking=st.booleans(),
                ack_timeout_ms=st.sampled_from([None, 1000]), initial_sends=st.sampled_from([20, 0, 100]))
    @step
    def start_cluster(self, dedup_snapshot_interval, chunking, ack_timeout_ms=None, initial_sends=0):
        self.chunking = chunking
        conf = dict(BROKER_SETTINGS, broker_deduplication_entries_interval=dedup_snapshot_interval)
        self.cluster = Cluster(self.dir, self.tracker, conf)
        self.cluster.start()
        self.log(f"  cluster: bookies {[b.address for b in self.cluster.bookies]}, broker "
                 f"{self.cluster.service_url}, dir {self.dir}")
        self.loop = LoopThread("delivery-model-loop")
        self.loop.run(self._connect(ack_timeout_ms), 90)
        if initial_sends:
            for name in SLOTS:
                self.run(self._send(name, initial_sends // (4 if name == "chunk" else 1), wait=True))

    @precondition(lambda self: self.cluster is not None)
    @rule()
    @step
    def round_trip(self):
        """Send on every producer, then receive on every subscription (patterns in turn). The
        rule without arguments: hypothesis' simplest example (its first) repeats it, so that
        one is cheap and still covers every producer and subscription."""
        self.run(self._round_trip_sends())
        for k, sub in enumerate(SUB_NAMES):
            pattern = PATTERNS[(self.ref.step + k) % len(PATTERNS)]
            self.log(f"  {sub}: {pattern}")
            self.run(self._consume(sub, self.ref.step, 40, pattern))

    @precondition(lambda self: self.cluster is not None)
    @rule(slot=st.sampled_from(SLOTS), k=st.sampled_from([1, 5, 20, 100]), wait=st.booleans())
    @step
    def send(self, slot, k, wait):
        if slot == "chunk":
            k = min(k, 20)
        self.run(self._send(slot, k, wait))

    @precondition(lambda self: self.cluster is not None)
    @rule(sub=st.sampled_from(SUB_NAMES), i=st.integers(0, 1), n=st.sampled_from([1, 10, 50, 200]),
          pattern=st.sampled_from(PATTERNS))
    @step
    def consume(self, sub, i, n, pattern):
        self.run(self._consume(sub, i, n, pattern))

    @precondition(lambda self: self.cluster is not None)
    @rule(sub_i=st.integers(0, 3), ack_timeout_ms=st.sampled_from([None, 1000, 2000]),
          nack_delay_ms=st.sampled_from([50, 300]), queue=st.sampled_from([10, 100]))
    @step
    def open_consumer(self, sub_i, ack_timeout_ms, nack_delay_ms, queue):
        for k in range(len(SUB_NAMES)):  # the first subscription from sub_i with room
            sub = SUB_NAMES[(sub_i + k) % len(SUB_NAMES)]
            if len(self.consumers[sub]) < self.max_consumers(sub):
                self.run(self._open_consumer(sub, dict(unacked_messages_timeout_ms=ack_timeout_ms,
                                                       negative_ack_redelivery_delay_ms=nack_delay_ms,
                                                       receiver_queue_size=queue)))
                return
        self.log("  every subscription has its most consumers")

    @precondition(lambda self: self.cluster is not None)
    @rule(sub=st.sampled_from(SUB_NAMES), i=st.integers(0, 1))
    @step
    def close_consumer(self, sub, i):
        handles = self.consumers[sub]
        if handles:
            self.run(self._close_consumer(handles[i % len(handles)]))

    @precondition(lambda self: self.cluster is not None)
    @rule(secs=st.sampled_from([0.5, 1.5, 3.0]))
    @step
    def wait(self, secs):
        time.sleep(secs)  # ack timeouts, negative-ack delays and batch timers fire meanwhile

    @precondition(lambda self: self.cluster is not None and len(self.readers) < MAX_READERS)
    @rule(start=st.sampled_from(["earliest", "after", "at"]), pick=st.integers(0, 10 ** 6))
    @step
    def open_reader(self, start, pick):
        self.run(self._open_reader(start, pick))

    @precondition(lambda self: self.cluster is not None and self.readers)
    @rule(i=st.integers(0, MAX_READERS - 1), n=st.sampled_from([10, 100, 1000]))
    @step
    def read(self, i, n):
        rh = self.readers[i % len(self.readers)]
        got = self.run(self._read(rh, n))
        self.log(f"  reader #{rh.rec.number}: read {got} (total {len(rh.rec.seq)})")

    @precondition(lambda self: self.cluster is not None and self.readers)
    @rule(i=st.integers(0, MAX_READERS - 1))
    @step
    def close_reader(self, i):
        self.run(self._close_reader(self.readers[i % len(self.readers)]))

    @precondition(lambda self: self.cluster is not None)
    @rule(slot=st.sampled_from(SLOTS), compression=st.sampled_from(["LZ4", "NONE"]))
    @step
    def reopen_producer(self, slot, compression):
        s = self.slots[slot]
        self.run(self._close_producer(s))
        s.compression = compression
        self.run(self._ensure_producer(s))

    @precondition(lambda self: self.cluster is not None and len(self.cluster.up_bookies()) == 3)
    @rule(i=st.integers(0, 2), sends=BURSTS, delay=st.sampled_from([0.0, 0.02, 0.2]))
    @step
    def kill_bookie(self, i, sends, delay):
        if sends:
            self.run(self._send_burst(sends))
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
                self.run(self._send_burst(sends))
            time.sleep(secs)
        finally:
            self.cluster.resume_bookie(idx)

    @precondition(lambda self: self.cluster is not None)
    @rule(sends=BURSTS, delay=st.sampled_from([0.0, 0.02, 0.2]), down_s=st.sampled_from([0.0, 1.0]))
    @step
    def kill_broker_and_restart(self, sends, delay, down_s):
        if sends:
            self.run(self._send_burst(sends))
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
            self.run(self._send_burst(sends))
        status = self.cluster.terminate_broker()
        self.fault("restart_broker_clean", f"exit status {status}")
        self.cluster.restart_broker()
        self.log(f"  broker restarted, pid {self.cluster.broker.pid}")

    @precondition(lambda self: self.cluster is not None)
    @rule(sends=BURSTS, again_s=st.sampled_from([None, None, 0.1, 0.15]))
    @step
    def unload_topic(self, sends, again_s=None):
        """Unload the topic (admin); with ``again_s``, once more as soon as the topic is loaded
        again after that many seconds, i.e. while the clients are re-creating their producers
        and consumers on it (a bundle bounced between brokers)."""
        if sends:
            self.run(self._send_burst(sends))
        self.fault("unload_topic")
        self.run(self._unload())
        if again_s is not None:
            time.sleep(again_s)
            self.run(self._unload_when_loaded())

    async def _unload_when_loaded(self, within_s: float = 3.0) -> None:
        deadline = time.monotonic() + within_s
        while True:
            try:
                await asyncio.wait_for(self.admin.unload_topic(TOPIC), OP_TIMEOUT_S + 5)
                self.fault("unload_topic", "again, as soon as it was loaded")
                return
            except CONSUMER_ERRORS as exc:
                if time.monotonic() > deadline:
                    self.note(f"second unload: {type(exc).__name__}: {exc}")
                    return
                await asyncio.sleep(0.005)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def nothing_rolled_back_stored_twice_or_corrupt(self):
        problems = self.ref.online_problems()
        if problems:
            self.failed = True
            raise AssertionError(self.failure_text({"online": problems}))

    # ------------------------------------------------------------------ final check
    async def _probe_producers(self) -> None:
        """Every process is up: each producer still open must get a message stored (a few
        attempts, each bounded by the send timeout). A producer whose sends keep timing out
        on a healthy cluster is stuck (e.g. attached to a topic instance that was closed)."""
        async def probe(slot: ProducerSlot) -> None:
            if slot.producer is None:
                return
            for attempt in range(1, 4):
                tasks = await self._send(slot.name, 1, wait=False)
                if not tasks:
                    return  # the producer failed and could not be recreated: noted
                await asyncio.wait(tasks, timeout=SEND_TIMEOUT_S + 5)
                if tasks[0].done() and not tasks[0].cancelled() and tasks[0].exception() is None:
                    self.log(f"  probe of the {slot.name} producer #{slot.instance}: stored (attempt {attempt})")
                    return
                err = "no answer" if not tasks[0].done() else repr(tasks[0].exception())[:200]
                self.note(f"probe of the {slot.name} producer #{slot.instance}, attempt {attempt}: {err}")
            self.stuck_producers.append(
                f"{slot.name} producer #{slot.instance} (delivery-model-{slot.name}): 3 sends in a row not stored "
                f"with every process up (each within its {SEND_TIMEOUT_S} s send timeout)")

        await asyncio.gather(*(probe(slot) for slot in self.slots.values()))

    async def _settle(self) -> None:
        if self.inflight:
            await asyncio.wait(list(self.inflight), timeout=SEND_TIMEOUT_S + 10)
        for slot in self.slots.values():
            if slot.producer is not None:
                try:
                    await asyncio.wait_for(slot.producer.flush(), SEND_TIMEOUT_S + 5)
                except CONSUMER_ERRORS:
                    pass
            await self._close_producer(slot)
        if self.inflight:
            await asyncio.wait(list(self.inflight), timeout=5)

    async def _read_all(self) -> None:
        """The final Reader: the whole topic from the earliest position = the stored order."""
        deadline = time.monotonic() + 60  # the topic may still be loading (ledger recovery after restarts)
        while True:
            try:
                reader = await asyncio.wait_for(self.client.create_reader(TOPIC, MessageId.earliest),
                                                OP_TIMEOUT_S + 5)
                break
            except CONSUMER_ERRORS as exc:
                if time.monotonic() > deadline:
                    self.note(f"final read: could not create a reader: {type(exc).__name__}: {exc}")
                    return
                self.log(f"  final read: create_reader failed ({type(exc).__name__}: {str(exc)[:150]}); retrying")
                await asyncio.sleep(1)
        msgs = []
        stuck = 0
        start = time.monotonic()
        while time.monotonic() - start < 90:
            try:
                msgs.append(await reader.read_next(timeout_millis=2000))
                stuck = 0
                continue
            except Timeout:
                pass
            except CONSUMER_ERRORS as exc:
                self.note(f"final read: read_next failed: {type(exc).__name__}: {exc}")
                break
            try:
                more = await asyncio.wait_for(reader.has_message_available(), OP_TIMEOUT_S + 2)
            except CONSUMER_ERRORS as exc:
                self.note(f"final read: has_message_available failed: {type(exc).__name__}: {exc}")
                more = True
            if not more:
                break
            stuck += 1
            if stuck >= 5:
                self.note("final read: nothing for 10 s while the broker says more messages are available")
                break
        self.ref.set_final_order(msgs)
        self.log(f"  final read: {len(msgs)} messages")
        try:
            await asyncio.wait_for(reader.close(), OP_TIMEOUT_S)
        except CONSUMER_ERRORS:
            pass

    async def _finish_reader(self, rh: ReaderHandle) -> None:
        if not rh.dead:
            n = await self._read_to_end(rh)
            rh.rec.finished = not rh.dead
            self.log(f"  reader #{rh.rec.number}: read {n} more to the end (total {len(rh.rec.seq)})")
        await self._close_reader(rh)

    async def _drain(self, sub: str) -> None:
        for h in list(self.consumers[sub]):
            await self._close_consumer(h)
        h = await self._subscribe(sub, {}, receiver_queue_size=1000, patience_s=60)
        if h is None:
            self.note(f"final drain of {sub}: could not subscribe")
            return
        s = self.ref.subs[sub]
        stored = {m.pid for m in self.ref.final_order or ()}
        expected = stored - set(s.ack_attempted)
        start = last = time.monotonic()
        n = 0
        while time.monotonic() - start < 90:
            try:
                msg = await h.consumer.receive(timeout_millis=1000)
            except Timeout:
                quiet = time.monotonic() - last
                if (expected <= s.drain_delivered and quiet >= 2) or quiet >= 10:
                    break
                continue
            except CONSUMER_ERRORS as exc:
                self.note(f"final drain of {sub}: receive failed: {type(exc).__name__}: {exc}")
                break
            n += 1
            last = time.monotonic()
            self.ref.on_delivery(sub, msg, h, "drain")
        s.drained = True
        self.log(f"  final drain of {sub}: {n} deliveries on consumer #{h.number}, "
                 f"{len(expected - s.drain_delivered)} expected missing")
        try:
            await asyncio.wait_for(h.consumer.close(), OP_TIMEOUT_S + 5)
        except CONSUMER_ERRORS:
            pass

    async def _finish(self) -> None:
        await asyncio.gather(*(self._finish_reader(rh) for rh in list(self.readers)),
                             *(self._drain(sub) for sub in SUB_NAMES))

    async def _dump_stats(self) -> None:
        out = {}
        for name, call in (("stats", self.admin.get_stats), ("internal_stats", self.admin.get_internal_stats)):
            try:
                out[name] = await asyncio.wait_for(call(TOPIC), OP_TIMEOUT_S + 2)
            except CONSUMER_ERRORS as exc:
                out[name] = f"{type(exc).__name__}: {exc}"
        (self.dir / "stats.json").write_text(json.dumps(out, indent=1, default=str))

    def final_check(self) -> None:
        self.log("final check: every process up, settle sends, read the topic, finish the readers, "
                 "drain the subscriptions")
        crashed = self.cluster.unexpected_exits()
        for note in self.cluster.ensure_all_up():
            self.note(note)
        for what, coro, bound in (("probing the producers", self._probe_producers(), 150),
                                  ("settling the sends", self._settle(), 150),
                                  ("reading the topic", self._read_all(), 150),
                                  ("finishing the readers and draining the subscriptions", self._finish(), 240),
                                  ("dumping the stats", self._dump_stats(), 30)):
            try:
                self.loop.run(coro, bound)
            except RuleTimeout:
                self.failed = True
                raise AssertionError(self.failure_text(
                    {"final_check_hung": [f"{what} did not finish within {bound}s"]})) from None
        self.verdict = self.ref.verdict()
        self.verdict["stuck_producer"] = list(self.stuck_producers)
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
        out = [f"delivery promises broken in example {self.number} (data dir {self.dir}):"]
        for kind, lines in problems.items():
            out.append(f"  {kind.upper()} ({len(lines)}):")
            out += [f"    {ln}" for ln in lines[:25]]
            if len(lines) > 25:
                out.append(f"    ... {len(lines) - 25} more")
        out.append("  " + self.summary_line())
        if self.ref.notes:
            out.append("  notes (last 15):")
            out += [f"    {n}" for n in self.ref.notes[-15:]]
        out.append("  trace (last 60 lines; full trace in trace.log):")
        out += [f"    {ln}" for ln in self.trace_lines[-60:]]
        if self.cluster is not None:
            out.append("  log excerpt:")
            out += [f"    {ln}" for ln in self.cluster.log_excerpt(max_lines=25).splitlines()]
        return "\n".join(out)

    def summary(self) -> dict:
        c = self.ref.counts()
        v = self.verdict
        return dict(example=self.number, steps=self.ref.step, seconds=round(time.monotonic() - self.t0, 1),
                    chunking=self.chunking, faults=dict(self.ref.faults), rules=dict(self.ref.rules), **c,
                    **{k: len(v.get(k, [])) for k in ("lost", "lost_dup_acked", "lost_dup_acked_excused",
                                                      "duplicated", "corrupt", "order", "reader", "rolled_back",
                                                      "undelivered", "stuck_producer")},
                    checked=bool(v), failed=self.failed, send_errors=self.ref.send_errors())

    def summary_line(self) -> str:
        s = self.summary()
        faults = ", ".join(f"{k}={n}" for k, n in sorted(s["faults"].items())) or "none"
        return (f"example {s['example']}: {s['steps']} steps in {s['seconds']}s (chunking={s['chunking']}); "
                f"faults: {faults}; sent {s['sent']} (chunked {s['chunked_sent']}, keyed {s['keyed_sent']}; acked "
                f"{s['acked']}, dup-acked {s['dup_acked']}, failed/unknown {s['send_failed'] + s['send_pending']}, "
                f"of which stored {s['unknown_but_stored']}"
                + (f"; errors: {', '.join(f'{k}={n}' for k, n in s['send_errors'].most_common())}"
                   if s["send_errors"] else "") + f"); stored {s['stored']}; "
                f"delivered {s['delivered']} (redelivered {s['redelivered']}, nacked {s['nacked']}, left unacked "
                f"{s['left_unacked']}), ack confirmed {s['confirmed']}/{s['ack_attempted']}; readers {s['readers']} "
                f"read {s['read']}; lost {s['lost']}, lost dup-acked {s['lost_dup_acked']} (+{s['lost_dup_acked_excused']} "
                f"excused), duplicated {s['duplicated']}, corrupt {s['corrupt']}, order {s['order']}, reader "
                f"{s['reader']}, rolled back {s['rolled_back']}, undelivered {s['undelivered']}, stuck producers "
                f"{s['stuck_producer']}"
                + ("" if s["checked"] else " (final check not run)") + (" FAILED" if s["failed"] else ""))

    def teardown(self):
        try:
            if self.cluster is not None and self.loop is not None and not self.failed:
                self.final_check()
        finally:
            try:
                if self.loop is not None and self.client is not None:
                    try:
                        self.loop.run(self._teardown_clients(), 40)
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
                    (self.dir / "model.json").write_text(json.dumps(self.ref.dump(), indent=0))
                self._trace.close()
                self._client_logger.removeHandler(self._client_log)
                self._client_logger.setLevel(self._client_logger_level)
                self._client_logger.propagate = self._client_logger_propagate
                self._client_log.close()
                if not self.failed and not self.keep_dirs:
                    for child in self.dir.iterdir():
                        if child.name not in ("trace.log", "summary.txt"):
                            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()

    async def _teardown_clients(self) -> None:
        for slot in self.slots.values():
            try:
                await self._close_producer(slot)
            except BaseException:  # noqa: BLE001
                pass
        for handles in self.consumers.values():
            for h in list(handles):
                try:
                    await self._close_consumer(h)
                except BaseException:  # noqa: BLE001
                    pass
        for rh in list(self.readers):
            try:
                await self._close_reader(rh)
            except BaseException:  # noqa: BLE001
                pass
        for c in (self.client, self.admin):
            try:
                await asyncio.wait_for(c.close(), 10)
            except BaseException:  # noqa: BLE001
                pass


def _totals(results: list[dict]) -> str:
    keys = ("steps", "sent", "chunked_sent", "keyed_sent", "acked", "dup_acked", "send_failed",
            "unknown_but_stored", "stored", "delivered", "redelivered", "nacked", "confirmed", "readers", "read",
            "lost", "lost_dup_acked", "lost_dup_acked_excused", "duplicated", "corrupt", "order", "reader",
            "rolled_back", "undelivered", "stuck_producer")
    tot = {k: sum(r[k] for r in results) for k in keys}
    faults: dict[str, int] = {}
    for r in results:
        for k, n in r["faults"].items():
            faults[k] = faults.get(k, 0) + n
    failed = sum(1 for r in results if r["failed"])
    return (f"delivery model: {len(results)} example runs ({failed} failed), {tot['steps']} steps; faults "
            f"{', '.join(f'{k}={n}' for k, n in sorted(faults.items())) or 'none'}; messages sent {tot['sent']} "
            f"(chunked {tot['chunked_sent']}, KeyBased {tot['keyed_sent']}), acked by the broker {tot['acked']} "
            f"(+{tot['dup_acked']} as duplicates), send failed/unknown {tot['send_failed']} (stored anyway "
            f"{tot['unknown_but_stored']}), stored {tot['stored']}; delivered {tot['delivered']} (redelivered "
            f"{tot['redelivered']}, nacked {tot['nacked']}), ack confirmed {tot['confirmed']}; readers "
            f"{tot['readers']} read {tot['read']}; lost {tot['lost']}, lost dup-acked {tot['lost_dup_acked']} "
            f"(+{tot['lost_dup_acked_excused']} excused), duplicated {tot['duplicated']}, corrupt {tot['corrupt']}, "
            f"order {tot['order']}, reader {tot['reader']}, redelivered after ack {tot['rolled_back']}, "
            f"undelivered {tot['undelivered']}, stuck producers {tot['stuck_producer']}")


@pytest.mark.timeout(0 if LONG else 900)
def test_delivery_model(tmp_path):
    base = Path(_env(_P + "DIR") or tmp_path)
    DeliveryModel.base_dir = base
    DeliveryModel.results = []
    print(f"\ndelivery model: {EXAMPLES} examples x {STEPS_PER_EXAMPLE} steps, shrink={SHRINK}, send timeout "
          f"{SEND_TIMEOUT_S}s, max message size {MAX_MESSAGE_SIZE}, data in {base}", flush=True)
    factory = DeliveryModel
    if _env(_P + "SEED"):
        factory = seed(int(_env(_P + "SEED")))(factory)
    if _env(_P + "REPRODUCE"):
        factory = reproduce_failure(hypothesis.__version__, _env(_P + "REPRODUCE").encode())(factory)
    try:
        run_state_machine_as_test(factory, settings=PROFILE)
    finally:
        print(_totals(DeliveryModel.results), flush=True)


def replay_steps(text: str) -> None:
    """Run the state machine on exactly the steps of a printed case (``state.rule(k=v)`` lines
    as hypothesis prints them, or an example's ``trace.log``): a fixed sequence, real timing."""
    machine = DeliveryModel()
    try:
        for line in text.splitlines():
            m = (re.match(r"\s*state\.(\w+)\((.*)\)\s*$", line)
                 or re.match(r"\[[ \d.]+s\] step \d+: (\w+)\((.*)\)\s*$", line))
            if not m or m.group(1) == "teardown":
                continue
            name, args = m.groups()
            kwargs = eval(f"dict({args})", {"__builtins__": {"dict": dict, "None": None}})  # noqa: S307
            getattr(machine, name)(**kwargs)
            machine.nothing_rolled_back_stored_twice_or_corrupt()
    finally:
        machine.teardown()


@pytest.mark.skipif(not _env(_P + "REPLAY"),
                    reason=f"set {_P}REPLAY=<file with the printed state.rule(...) lines or a trace.log>")
@pytest.mark.timeout(0)
def test_delivery_model_replay(tmp_path):
    DeliveryModel.base_dir = Path(_env(_P + "DIR") or tmp_path)
    DeliveryModel.results = []
    try:
        replay_steps(Path(_env(_P + "REPLAY")).read_text())
    finally:
        print(_totals(DeliveryModel.results), flush=True)


@pytest.mark.timeout(600)
def test_delivery_model_replay_unload_while_clients_attach(tmp_path):
    """20 unloads, each repeated as soon as the topic is loaded again (while producers and
    consumers re-attach), then one round trip. Failed before 85145b4 (167e154, aabb37d): every
    producer stuck (3 probes in a row time out on a healthy cluster), and 40-80 messages whose
    acks were confirmed delivered again to the final drain."""
    DeliveryModel.base_dir = Path(_env(_P + "DIR") or tmp_path)
    DeliveryModel.results = []
    try:
        replay_steps((Path(__file__).parent / "model_replays" / "delivery_unload_while_clients_attach.txt").read_text())
    finally:
        print(_totals(DeliveryModel.results), flush=True)


@pytest.mark.timeout(600)
def test_delivery_model_replay_reader_across_unload(tmp_path):
    """A Reader reads the topic to its end, the topic is unloaded, more messages are sent. Failed
    before 85145b4 (167e154, aabb37d): the Reader got none of them (0 of 34), and the broker
    stopped answering (round trips of 17 s, then every RPC past its deadline) while the
    Reader's dispatcher spun."""
    DeliveryModel.base_dir = Path(_env(_P + "DIR") or tmp_path)
    DeliveryModel.results = []
    try:
        replay_steps((Path(__file__).parent / "model_replays" / "delivery_reader_across_unload.txt").read_text())
    finally:
        print(_totals(DeliveryModel.results), flush=True)


@pytest.mark.timeout(600)
def test_delivery_model_replay_unload_during_rollover(tmp_path):
    """33 steps of a long run (its Reader rules left out): a bookie killed, another paused with
    sends in flight, so the current ledger fails with no spare bookie and the managed ledger waits
    to create the next one, and unloads meanwhile. Failed before 85145b4 (aabb37d, 2 of 2): every
    producer stuck (612 sends time out, 3 probes in a row on the healthy cluster too), the
    broker never disconnected them."""
    DeliveryModel.base_dir = Path(_env(_P + "DIR") or tmp_path)
    DeliveryModel.results = []
    try:
        replay_steps((Path(__file__).parent / "model_replays" / "delivery_unload_during_rollover.txt").read_text())
    finally:
        print(_totals(DeliveryModel.results), flush=True)


@pytest.mark.timeout(300)
def test_delivery_model_replay_reader_at_chunked_id(tmp_path):
    """No fault: 325 messages (13 of them chunked, 2-5 chunks each), an Exclusive consumer receives
    them (its ids of chunked messages are ChunkMessageIds), Readers open at two of those ids
    (inclusive) and after a third. Failed before first_chunk_of: both inclusive Readers missed their
    first message (the chunked one they start at), e.g. "reader #1 from at m-300 (9:6, first chunk
    9:5) ... got [m-301, ...], expected [m-300, m-301, ...]"."""
    DeliveryModel.base_dir = Path(_env(_P + "DIR") or tmp_path)
    DeliveryModel.results = []
    try:
        replay_steps((Path(__file__).parent / "model_replays" / "delivery_reader_at_chunked_id.txt").read_text())
    finally:
        print(_totals(DeliveryModel.results), flush=True)
