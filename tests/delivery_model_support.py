"""Support of the model-based delivery test (``tests/integration/test_delivery_model.py``).

Builds on the durability model's support (``tests/durability_model_support.py``:
``LoopThread``, ``Cluster``, ``TrackedConsumer``, the send states and id
helpers), which it imports unchanged. What is new here knows several
producers (batching off, default batching, KeyBased batching, chunking),
several subscriptions (one of each type, each with its own consumers) and
Readers:

* payloads that check themselves: ``make_payload(n, size)`` is
  ``b"m-<n>:<size>|"`` followed by ``size`` bytes derived from that header, so
  any copy read back (a chunked message reassembled, a batch split) can be
  checked to be complete and intact (:func:`parse_payload`);
* :class:`ConsumerHandle` -- a ``TrackedConsumer`` that also knows its
  subscription and peeks at the SDK's PIP-84 consumer epoch of its stream;
* :class:`Reference` -- what the test knows (every send, every delivery per
  subscription, every acknowledgment attempted / confirmed, every Reader's
  sequence) and the verdict built from it once the final Reader has read the
  whole topic (the stored order).

Verdict kinds (``Reference.verdict``), failing unless in ``INFORMATIONAL``:

* ``lost``: a send resolved with a real message id, not in the topic (retention
  is infinite in this test, so the final Reader from the earliest position
  sees everything ever stored);
* ``lost_dup_acked``: a send resolved as a duplicate (``-1:-1``: "stored by an
  earlier transmission") that is not in the topic, by a producer instance
  whose predecessor of the same name did *not* leave unresolved sends behind
  (``lost_dup_acked_excused`` otherwise, informational: a new producer may
  reuse a sequence id its predecessor had pushed but not persisted, as in
  Pulsar -- see ``tests/durability_model_support.py``);
* ``duplicated``: a payload stored at two message ids;
* ``corrupt``: a delivered or read payload whose bytes are not the ones sent
  (e.g. a chunked message reassembled wrong);
* ``phantom``: a payload never sent;
* ``unordered``: the final Reader's ids are not increasing;
* ``order``: within one producer instance, two stored messages in the
  opposite order of their sends (for a KeyBased producer: of one key);
* ``reader``: a Reader that did not get exactly the stored messages from its
  start position, once each, in order (a Reader closed early: a prefix of them);
* ``rolled_back``: a message delivered to a subscription again after its
  ``acknowledge_and_wait`` returned, on a consumer stream that did not yet exist
  then, or on the same stream in a later PIP-84 consumer epoch (a
  redeliver-all sent after the ack was confirmed);
* ``undelivered``: a stored message never acknowledged on a subscription (no
  ack even attempted) that a fresh consumer of that subscription did not get
  in the final drain.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
from typing import Any, Optional

from tests.durability_model_support import (ACKED, DUP_ACKED, FAILED, PENDING, TrackedConsumer, fmt_id,
                                            mid_key)

__all__ = ["INFORMATIONAL", "ConsumerHandle", "Reference", "ReaderRecord", "SendInfo", "StoredMsg",
           "make_payload", "parse_payload", "fmt_id", "mid_key", "ACKED", "DUP_ACKED", "FAILED", "PENDING"]

INFORMATIONAL = frozenset({"lost_dup_acked_excused"})


# --------------------------------------------------------------------------------------------------
# payloads
# --------------------------------------------------------------------------------------------------
def make_payload(n: int, size: int) -> tuple[bytes, bytes]:
    """``(pid, payload)``: ``pid`` = ``b"m-<n>"``, the payload its header plus ``size`` derived bytes."""
    head = b"m-%d:%d|" % (n, size)
    return b"m-%d" % n, head + hashlib.shake_128(head).digest(size)


def parse_payload(data: bytes) -> tuple[bytes, bool]:
    """``(pid, intact)`` of a payload read back; pid ``b"?"`` when not even the header parses."""
    head, sep, body = bytes(data).partition(b"|")
    pid, _, size = head.partition(b":")
    if not sep or not pid.startswith(b"m-"):
        return b"?" + bytes(data[:40]), False
    try:
        n = int(size)
    except ValueError:
        return pid, False
    return pid, body == hashlib.shake_128(head + b"|").digest(n)


def _num(pid: bytes) -> int:
    try:
        return int(pid.split(b"-", 1)[1])
    except (IndexError, ValueError):
        return -1


def _sorted(pids) -> list[bytes]:
    return sorted(pids, key=_num)


# --------------------------------------------------------------------------------------------------
# consumers
# --------------------------------------------------------------------------------------------------
class ConsumerHandle(TrackedConsumer):
    """A consumer of one subscription (``sub``), numbered across the whole example.

    ``epoch()`` peeks at the SDK's PIP-84 consumer epoch of the current stream
    (``ConsumerImpl._epoch``; 0 when absent). Read right after ``receive()``
    returns, on the loop, it is the epoch the message's frame was accepted in:
    a redeliver-all clears the queue when it raises the epoch."""

    def __init__(self, consumer, number: int, sub: str, options: dict[str, Any]) -> None:
        super().__init__(consumer, number)
        self.sub = sub
        self.options = dict(options)

    def _impl(self):
        try:
            impls = self.consumer._impls()
            return impls[0] if impls else None
        except (AttributeError, IndexError):
            return None

    def epoch(self) -> int:
        return int(getattr(self._impl(), "_epoch", 0) or 0)

    def connected_generation(self) -> Optional[int]:
        return None if self._current_call() is None else self.generation()

    def snapshot(self) -> tuple[int, Optional[int], int]:
        """``(streams seen, index of the connected stream or None, its epoch)``."""
        return self.streams_seen(), self.connected_generation(), self.epoch()

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.sub} consumer #{self.number} ({opts})"


# --------------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class SendInfo:
    pid: bytes
    slot: str                            # which producer ("plain", "batch", "keyed", "chunk")
    instance: int                        # producer instance of that slot (1, 2, ... after reopens)
    index: int                           # send order within the instance
    key: Optional[str]
    size: int
    step: int
    key_based: bool = False
    state: str = PENDING
    msg_id: Optional[tuple] = None
    error: Optional[str] = None
    resolved_step: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class StoredMsg:
    """One message of the final Reader's pass over the topic (the stored order)."""
    pid: bytes
    key: tuple                           # (ledger, entry, batch index) -- the last chunk's for a chunked one
    first_chunk: Optional[tuple]         # first chunk's (ledger, entry, -1) for a chunked message


@dataclasses.dataclass
class Confirmation:
    msg_id: tuple
    consumer_no: int
    step: int
    # consumer number -> (streams seen, connected stream index or None, its epoch), for every
    # consumer of the subscription when the ack was confirmed
    snapshot: dict[int, tuple[int, Optional[int], int]]


@dataclasses.dataclass
class SubRecord:
    name: str
    sub_type: str
    delivered: set = dataclasses.field(default_factory=set)
    drain_delivered: set = dataclasses.field(default_factory=set)
    ack_attempted: dict = dataclasses.field(default_factory=dict)   # pid -> step
    ack_errors: dict = dataclasses.field(default_factory=dict)
    confirmed: dict = dataclasses.field(default_factory=dict)       # pid -> Confirmation
    rollbacks: list = dataclasses.field(default_factory=list)
    deliveries: int = 0
    redeliveries: int = 0
    nacks: int = 0
    left_unacked: int = 0
    drained: bool = False


@dataclasses.dataclass
class ReaderRecord:
    number: int
    start: str                           # "earliest" | "after" (exclusive) | "at" (inclusive)
    start_key: Optional[tuple]
    start_first_chunk: Optional[tuple]   # "at" a chunked message: its first chunk
    start_pid: Optional[bytes]
    step: int
    seq: list = dataclasses.field(default_factory=list)  # [(pid, key)]
    finished: bool = False               # read to the end at the final check, every process up
    closed_step: Optional[int] = None
    notes: list = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        if self.start == "earliest":
            where = "earliest"
        else:
            where = (f"{'after' if self.start == 'after' else 'at'} {self.start_pid.decode()} "
                     f"({fmt_id(self.start_key)}"
                     + (f", first chunk {fmt_id(self.start_first_chunk)}" if self.start_first_chunk else "") + ")")
        return f"reader #{self.number} from {where}, opened at step {self.step}"


# --------------------------------------------------------------------------------------------------
# the reference
# --------------------------------------------------------------------------------------------------
class Reference:
    """Thread-safe record of what happened to every payload (see the module docstring)."""

    def __init__(self, subscriptions: dict[str, str]) -> None:
        self.lock = threading.RLock()
        self.step = 0
        self._n = 0
        self.sends: dict[bytes, SendInfo] = {}
        self.observed: dict[bytes, dict[tuple, set]] = collections.defaultdict(dict)  # pid -> key -> sources
        self.corrupt: list[str] = []
        self.phantoms: set[bytes] = set()
        self.subs = {name: SubRecord(name, t) for name, t in subscriptions.items()}
        self.readers: list[ReaderRecord] = []
        self.final_order: Optional[list[StoredMsg]] = None
        self.excused_instances: set[tuple[str, int]] = set()
        self.faults: collections.Counter = collections.Counter()
        self.rules: collections.Counter = collections.Counter()
        self.notes: list[str] = []

    # -- sends -----------------------------------------------------------------------
    def new_send(self, slot: str, instance: int, index: int, key: Optional[str], size: int,
                 key_based: bool) -> tuple[bytes, bytes]:
        with self.lock:
            pid, payload = make_payload(self._n, size)
            self._n += 1
            self.sends[pid] = SendInfo(pid, slot, instance, index, key, size, self.step, key_based)
            return pid, payload

    def on_send_result(self, pid: bytes, exc: Optional[BaseException], mid) -> None:
        with self.lock:
            rec = self.sends[pid]
            rec.resolved_step = self.step
            if exc is not None:
                rec.state, rec.error = FAILED, f"{type(exc).__name__}: {exc}"[:200]
            elif mid.ledger_id < 0 or mid.entry_id < 0:
                rec.state = DUP_ACKED
            else:
                rec.state, rec.msg_id = ACKED, mid_key(mid)

    def producer_closed(self, slot: str, instance: int) -> None:
        """An instance of ``slot`` was closed: if it left sends unresolved or failed, the next
        instance may legitimately get -1:-1 for messages never stored (see the module docstring)."""
        with self.lock:
            if any(r.slot == slot and r.instance == instance and r.state in (FAILED, PENDING)
                   for r in self.sends.values()):
                self.excused_instances.add((slot, instance + 1))

    # -- observations ---------------------------------------------------------------------
    def _observe(self, msg, source: str) -> tuple[bytes, tuple]:
        pid, intact = parse_payload(msg.data())
        key = mid_key(msg.message_id())
        if pid not in self.sends:
            self.phantoms.add(pid)
        elif not intact:
            self.corrupt.append(f"{pid.decode()} at {fmt_id(key)} ({source}, {len(msg.data())} bytes): "
                                f"content differs from what was sent ({self._story(pid)})")
        self.observed[pid].setdefault(key, set()).add(source)
        return pid, key

    def on_delivery(self, sub: str, msg, handle: ConsumerHandle, source: str) -> bytes:
        """A message received on ``sub`` by ``handle`` (``source``: "rule" / "drain")."""
        gen, epoch = handle.generation(), handle.epoch()
        with self.lock:
            pid, key = self._observe(msg, f"{sub}/{source}")
            s = self.subs[sub]
            s.deliveries += 1
            if pid in s.delivered:
                s.redeliveries += 1
            s.delivered.add(pid)
            if source == "drain":
                s.drain_delivered.add(pid)
            conf = s.confirmed.get(pid)
            if conf is not None and conf.msg_id == key:
                snap = conf.snapshot.get(handle.number)
                why = None
                if snap is None:
                    why = f"consumer #{handle.number} subscribed after the confirmation"
                elif gen >= snap[0]:
                    why = (f"stream #{gen} of consumer #{handle.number} was established after the confirmation "
                           f"({snap[0]} stream(s) seen then)")
                elif snap[1] is not None and gen == snap[1] and epoch > snap[2]:
                    why = (f"on the same stream #{gen} in consumer epoch {epoch}, raised after the confirmation "
                           f"(epoch {snap[2]} then): dispatched after a redeliver-all sent after the ack")
                if why:
                    s.rollbacks.append(
                        f"[{sub}] {pid.decode()} at {fmt_id(key)}: ack confirmed at step {conf.step} on consumer "
                        f"#{conf.consumer_no}, delivered again at step {self.step} to {handle.describe()} "
                        f"({source}, redelivery_count={msg.redelivery_count()}): {why}")
            return pid

    def on_ack_attempt(self, sub: str, pid: bytes) -> None:
        with self.lock:
            self.subs[sub].ack_attempted.setdefault(pid, self.step)

    def on_ack_error(self, sub: str, pid: bytes, exc: BaseException) -> None:
        with self.lock:
            self.subs[sub].ack_errors[pid] = f"{type(exc).__name__}: {exc}"[:200]

    def on_ack_confirmed(self, sub: str, msg, handle: ConsumerHandle, handles: list[ConsumerHandle]) -> None:
        snapshot = {h.number: h.snapshot() for h in handles}
        snapshot[handle.number] = handle.snapshot()
        pid, _ = parse_payload(msg.data())
        with self.lock:
            self.subs[sub].confirmed.setdefault(pid, Confirmation(mid_key(msg.message_id()), handle.number,
                                                                  self.step, snapshot))

    def on_nack(self, sub: str) -> None:
        with self.lock:
            self.subs[sub].nacks += 1

    def on_left_unacked(self, sub: str) -> None:
        with self.lock:
            self.subs[sub].left_unacked += 1

    def new_reader(self, start: str, start_id=None, start_pid: Optional[bytes] = None) -> ReaderRecord:
        with self.lock:
            first = getattr(start_id, "first_chunk_message_id", None)
            rec = ReaderRecord(len(self.readers) + 1, start, None if start_id is None else mid_key(start_id),
                               None if first is None or start != "at" else (first.ledger_id, first.entry_id, -1),
                               start_pid, self.step)
            self.readers.append(rec)
            return rec

    def on_reader_message(self, rec: ReaderRecord, msg) -> bytes:
        with self.lock:
            pid, key = self._observe(msg, f"reader#{rec.number}")
            rec.seq.append((pid, key))
            return pid

    def set_final_order(self, msgs: list) -> None:
        """The final Reader's messages (from the earliest position, every process up)."""
        order = []
        with self.lock:
            for msg in msgs:
                pid, key = self._observe(msg, "final-reader")
                first = getattr(msg.message_id(), "first_chunk_message_id", None)
                order.append(StoredMsg(pid, key, None if first is None else (first.ledger_id, first.entry_id, -1)))
            self.final_order = order

    # -- queries -------------------------------------------------------------------------
    def stored_twice(self) -> dict[bytes, list[tuple]]:
        with self.lock:
            return {p: sorted(ids) for p, ids in self.observed.items() if len(ids) > 1}

    def online_problems(self) -> list[str]:
        """What can be decided before the end: rollbacks, payloads stored twice, corrupt, phantoms."""
        with self.lock:
            out = [f"ROLLED BACK {r}" for s in self.subs.values() for r in s.rollbacks]
            for p, ids in self.stored_twice().items():
                out.append(f"STORED TWICE {p.decode()} at {', '.join(fmt_id(i) for i in ids)} ({self._story(p)})")
            out += [f"CORRUPT {c}" for c in self.corrupt]
            out += [f"PHANTOM payload {p!r} was never sent" for p in sorted(self.phantoms)]
            return out

    def _story(self, p: bytes) -> str:
        r = self.sends.get(p)
        if r is None:
            return "never sent"
        s = (f"{r.slot} producer #{r.instance} send {r.index} (key {r.key}, {r.size} bytes) at step {r.step}, "
             f"{r.state}")
        if r.msg_id is not None:
            s += f" as {fmt_id(r.msg_id)}"
        if r.error:
            s += f" ({r.error})"
        if r.resolved_step is not None:
            s += f" at step {r.resolved_step}"
        for sub in self.subs.values():
            bits = []
            if p in sub.ack_attempted:
                bits.append(f"ack attempted at step {sub.ack_attempted[p]}")
            if p in sub.confirmed:
                bits.append(f"confirmed at step {sub.confirmed[p].step}")
            if p in sub.ack_errors:
                bits.append(f"ack error {sub.ack_errors[p]}")
            if bits:
                s += f"; [{sub.name}] " + ", ".join(bits)
        seen = self.observed.get(p)
        if seen:
            s += "; seen at " + ", ".join(f"{fmt_id(k)} by {'/'.join(sorted(v))}" for k, v in seen.items())
        return s

    # -- the verdict --------------------------------------------------------------------
    def verdict(self) -> dict[str, list[str]]:
        with self.lock:
            order = self.final_order or []
            stored = {m.pid for m in order}
            acked = {p for p, r in self.sends.items() if r.state == ACKED}
            dup_acked = {p for p, r in self.sends.items() if r.state == DUP_ACKED}
            dup_missing = dup_acked - stored
            excused = {p for p in dup_missing if (self.sends[p].slot, self.sends[p].instance) in self.excused_instances}
            v: dict[str, list[str]] = {
                "lost": [f"{p.decode()}: {self._story(p)}" for p in _sorted(acked - stored)],
                "lost_dup_acked": [f"{p.decode()}: {self._story(p)}" for p in _sorted(dup_missing - excused)],
                "lost_dup_acked_excused": [f"{p.decode()}: {self._story(p)}" for p in _sorted(excused)],
                "duplicated": [f"{p.decode()} at {', '.join(fmt_id(i) for i in ids)}: {self._story(p)}"
                               for p, ids in sorted(self.stored_twice().items(), key=lambda x: _num(x[0]))],
                "corrupt": list(self.corrupt),
                "phantom": [repr(p) for p in sorted(self.phantoms)],
                "unordered": self._unordered(order),
                "order": self._order_problems(order),
                "reader": [line for rec in self.readers for line in self._reader_problems(rec, order)],
                "rolled_back": [r for s in self.subs.values() for r in s.rollbacks],
                "undelivered": [],
            }
            if self.final_order is None:
                v["lost"].insert(0, "the final Reader did not read the topic: nothing could be checked")
            for s in self.subs.values():
                if not s.drained:
                    v["undelivered"].append(f"[{s.name}] the subscription was not drained at the end")
                    continue
                missing = stored - set(s.ack_attempted) - s.drain_delivered
                v["undelivered"] += [f"[{s.name}] {p.decode()}: {self._story(p)}" for p in _sorted(missing)]
            return v

    @staticmethod
    def _unordered(order: list[StoredMsg]) -> list[str]:
        out = []
        for a, b in zip(order, order[1:]):
            if not a.key < b.key:
                out.append(f"the final Reader got {b.pid.decode()} at {fmt_id(b.key)} after {a.pid.decode()} "
                           f"at {fmt_id(a.key)}")
        return out

    def _order_problems(self, order: list[StoredMsg]) -> list[str]:
        """Per producer instance (and per key for KeyBased batching), stored order = send order."""
        groups: dict[tuple, list[tuple[int, int, bytes]]] = collections.defaultdict(list)
        for pos, m in enumerate(order):
            r = self.sends.get(m.pid)
            if r is None:
                continue
            groups[(r.slot, r.instance, r.key if r.key_based else "*")].append((r.index, pos, m.pid))
        out = []
        for (slot, inst, key), items in sorted(groups.items(), key=str):
            items.sort()
            for (i1, p1, a), (i2, p2, b) in zip(items, items[1:]):
                if p2 < p1:
                    out.append(f"{slot} producer #{inst}" + (f" key {key}" if key != "*" else "")
                               + f": send {i2} ({b.decode()} at {fmt_id(order[p2].key)}) is stored before send "
                               f"{i1} ({a.decode()} at {fmt_id(order[p1].key)})")
        return out

    def _reader_problems(self, rec: ReaderRecord, order: list[StoredMsg]) -> list[str]:
        if self.final_order is None:
            return []

        def after_start(m: StoredMsg) -> bool:
            if rec.start == "earliest":
                return True
            return m.key > rec.start_key if rec.start == "after" else m.key >= rec.start_key

        boundary = rec.start_first_chunk or rec.start_key

        def ambiguous(m: StoredMsg) -> bool:
            # a chunked message that began before the start position and ended after it: a
            # Reader starting in between cannot assemble it (Pulsar alike); it may or may not come
            if rec.start == "earliest" or m.first_chunk is None or m.pid == rec.start_pid:
                return False
            return after_start(m) and (m.first_chunk <= boundary if rec.start == "after"
                                       else m.first_chunk < boundary)

        amb = {m.pid for m in order if ambiguous(m)}
        expected = [m.pid for m in order if after_start(m) and m.pid not in amb]
        got = [p for p, _ in rec.seq]
        out = []
        counts = collections.Counter(got)
        twice = [p for p, n in counts.items() if n > 1]
        if twice:
            out.append(f"{rec.describe()}: got {len(twice)} message(s) more than once: "
                       + ", ".join(f"{p.decode()} x{counts[p]}" for p in _sorted(twice)[:10]))
        got_f = [p for p in got if p not in amb]
        want = expected if rec.finished else expected[:len(got_f)]
        if got_f != want:
            i = next((k for k, (a, b) in enumerate(zip(got_f, want)) if a != b), min(len(got_f), len(want)))
            ctx_got = ", ".join(p.decode() for p in got_f[max(0, i - 2):i + 4])
            ctx_want = ", ".join(p.decode() for p in want[max(0, i - 2):i + 4])
            missing = set(want) - set(got_f)
            extra = set(got_f) - set(want)
            out.append(f"{rec.describe()} ({'read to the end' if rec.finished else 'closed early: a prefix'}): "
                       f"got {len(got_f)} message(s), expected {len(want)} of the {len(expected)} stored after "
                       f"its start; first difference at #{i}: got [{ctx_got}], expected [{ctx_want}]; "
                       f"missing {len(missing)} ({', '.join(p.decode() for p in _sorted(missing)[:8])}), "
                       f"unexpected {len(extra)} ({', '.join(p.decode() for p in _sorted(extra)[:8])})"
                       + (f"; {len(amb)} straddling chunked message(s) ignored" if amb else "")
                       + (f"; notes: {'; '.join(rec.notes[-3:])}" if rec.notes else ""))
            if missing:
                out.append(f"  e.g. {_sorted(missing)[0].decode()}: {self._story(_sorted(missing)[0])}")
        return out

    # -- figures ----------------------------------------------------------------------
    def send_errors(self) -> collections.Counter:
        with self.lock:
            return collections.Counter((r.error or "").split(":", 1)[0] for r in self.sends.values()
                                       if r.state == FAILED)

    def counts(self) -> dict[str, Any]:
        with self.lock:
            states = collections.Counter(r.state for r in self.sends.values())
            chunked = [r for r in self.sends.values() if r.slot == "chunk" and r.size > 8000]
            return {
                "sent": len(self.sends), "acked": states[ACKED], "dup_acked": states[DUP_ACKED],
                "send_failed": states[FAILED], "send_pending": states[PENDING],
                "unknown_but_stored": sum(1 for p, r in self.sends.items()
                                          if r.state in (FAILED, PENDING) and p in self.observed),
                "chunked_sent": len(chunked), "chunked_acked": sum(1 for r in chunked if r.state == ACKED),
                "keyed_sent": sum(1 for r in self.sends.values() if r.key_based),
                "stored": len(self.final_order or ()),
                "delivered": sum(s.deliveries for s in self.subs.values()),
                "redelivered": sum(s.redeliveries for s in self.subs.values()),
                "nacked": sum(s.nacks for s in self.subs.values()),
                "left_unacked": sum(s.left_unacked for s in self.subs.values()),
                "ack_attempted": sum(len(s.ack_attempted) for s in self.subs.values()),
                "confirmed": sum(len(s.confirmed) for s in self.subs.values()),
                "readers": len(self.readers), "read": sum(len(r.seq) for r in self.readers),
            }

    def dump(self) -> dict:
        with self.lock:
            out = {}
            for p, r in sorted(self.sends.items(), key=lambda x: _num(x[0])):
                out[p.decode()] = {
                    "slot": r.slot, "instance": r.instance, "index": r.index, "key": r.key, "size": r.size,
                    "sent_step": r.step, "state": r.state, "receipt": fmt_id(r.msg_id), "error": r.error,
                    "resolved_step": r.resolved_step,
                    "subs": {s.name: {"ack_attempt_step": s.ack_attempted.get(p),
                                      "confirmed_step": s.confirmed[p].step if p in s.confirmed else None,
                                      "ack_error": s.ack_errors.get(p), "delivered": p in s.delivered,
                                      "drained": p in s.drain_delivered}
                             for s in self.subs.values()},
                    "seen": {fmt_id(k): sorted(v) for k, v in self.observed.get(p, {}).items()},
                }
            return {"payloads": out, "notes": self.notes,
                    "readers": [{"reader": r.describe(), "finished": r.finished, "closed_step": r.closed_step,
                                 "notes": r.notes, "seq": [f"{p.decode()}@{fmt_id(k)}" for p, k in r.seq]}
                                for r in self.readers],
                    "final_order": [f"{m.pid.decode()}@{fmt_id(m.key)}" for m in (self.final_order or [])]}

