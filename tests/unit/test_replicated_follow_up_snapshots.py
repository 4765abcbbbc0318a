"""The snapshot protocol between three ReplicatedSubscriptionsControllers, with
the topics and the replication between them reduced to lists (pure logic: no
I/O, markers are delivered by hand in order)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from broker.ledger.position import Entry, Position
from broker.replication import markers
from broker.replication.controller import ReplicatedSubscriptionsController
from client.entry_format import decode_entry, encode_entry
from proto import pulsar_api_pb2 as api

CLUSTERS = ("a", "b", "c")
CONFIG = SimpleNamespace(replicated_subscriptions_update_interval_millis=100,
                         replicated_subscriptions_snapshot_frequency_millis=1000,
                         replicated_subscriptions_snapshot_timeout_seconds=30)


def now_ms() -> int:
    """The controller's clock (wall ms); 2 ms pass first so that no two steps share a ms."""
    time.sleep(0.002)
    return int(time.time() * 1000)


class Topic:
    """Just what the controller reads and writes: an entry log, the time of the
    last data entry, connected replicators and one replicated subscription."""

    def __init__(self, name: str):
        self.name = f"persistent://t/ns/topic@{name}"
        self.cluster = name
        self.entries: list[bytes] = []
        self.ml = SimpleNamespace(last_confirmed=Position(1, -1))
        self.last_data_publish_ms = 0
        self.replicators = {c: SimpleNamespace(connected=True) for c in CLUSTERS if c != name}
        self.subscriptions = {"sub": SimpleNamespace(replicated=True)}
        self.closed = False

    def _append(self, data: bytes) -> Position:
        self.entries.append(data)
        self.ml.last_confirmed = Position(1, len(self.entries) - 1)
        return self.ml.last_confirmed

    def write_marker(self, data: bytes) -> None:
        self._append(data)

    def write_data(self) -> Position:
        pos = self._append(encode_entry(api.MessageMetadata(producer_name="p", sequence_id=len(self.entries),
                                                             publish_time=now_ms()), b"flight"))
        self.last_data_publish_ms = now_ms()
        return pos


class Geo:
    """Three clusters; ``replicate()`` delivers every marker not yet delivered
    to the clusters it may go to (as the replicators would), until quiet."""

    def __init__(self):
        self.topics = {c: Topic(c) for c in CLUSTERS}
        self.controllers = {c: ReplicatedSubscriptionsController(t, c, CONFIG) for c, t in self.topics.items()}
        for ctl in self.controllers.values():   # converged: a snapshot completed after the last data
            ctl.last_completed_start_ms = now_ms()
        self.sent = {(src, dst): 0 for src in CLUSTERS for dst in CLUSTERS if src != dst}
        self.requests: list[tuple[str, bool]] = []   # (requesting cluster, follow_up) in write order
        self.completed: dict[str, list] = {c: [] for c in CLUSTERS}   # SNAPSHOT markers written per cluster

    def replicate(self) -> None:
        moved = True
        while moved:
            moved = False
            for (src, dst), n in self.sent.items():
                entries = self.topics[src].entries
                while n < len(entries):
                    data = entries[n]
                    n += 1
                    md, _ = decode_entry(data)
                    if md.HasField("marker_type") and (not md.replicate_to or dst in md.replicate_to):
                        self.controllers[dst].received_marker(src, Entry(Position(1, n - 1), data), md)
                        moved = True
                self.sent[(src, dst)] = n
        self._collect()

    def _collect(self) -> None:
        self.requests, self.completed = [], {c: [] for c in CLUSTERS}
        for c, t in self.topics.items():
            for data in t.entries:
                md, _ = decode_entry(data)
                if not md.HasField("marker_type"):
                    continue
                kind, msg = markers.parse(data)
                if kind == markers.SNAPSHOT_REQUEST and msg.source_cluster == c:
                    self.requests.append((c, msg.follow_up))
                elif kind == markers.SNAPSHOT:
                    self.completed[c].append({m.cluster: (m.message_id.ledger_id, m.message_id.entry_id)
                                              for m in msg.clusters})

    def tick(self) -> dict[str, str | None]:
        """Every controller's periodic attempt, then replication until quiet."""
        now_ms()
        started = {c: ctl.start_new_snapshot() for c, ctl in self.controllers.items()}
        self.replicate()
        return started


def test_a_remote_data_snapshot_makes_idle_clusters_take_one_flagged_follow_up():
    geo = Geo()
    geo.topics["a"].write_data()
    started = geo.tick()
    assert started["a"] and not started["b"] and not started["c"]   # only a has data
    assert len(geo.completed["a"]) == 1
    # b and c answered a's data snapshot: each takes one follow-up at its next tick.
    assert geo.controllers["b"].follow_up_due and geo.controllers["c"].follow_up_due
    started = geo.tick()
    assert not started["a"] and started["b"] and started["c"]
    assert sorted((c, f) for c, f in geo.requests if c in "bc") == [("b", True), ("b", True),
                                                                     ("c", True), ("c", True)]   # two rounds
    assert len(geo.completed["b"]) == 1 and len(geo.completed["c"]) == 1
    # The flagged follow-ups trigger nothing in turn: the idle system stays quiet.
    assert not any(ctl.follow_up_due for ctl in geo.controllers.values())
    for _ in range(8):
        assert geo.tick() == {"a": None, "b": None, "c": None}


def test_follow_up_carries_data_that_reached_a_standby_after_the_last_snapshot():
    """The failover case: b's subscription has a standby copy in c. c receives
    late data (another cluster's backlog) after b's last snapshot while b is
    idle. c's own data snapshot makes b take a follow-up, whose SNAPSHOT holds
    c's position past the late data, so b's next UPDATE moves the copy in c."""
    geo = Geo()
    geo.topics["b"].write_data()
    geo.tick()
    geo.tick()   # follow-ups of a and c
    geo.tick()
    before = geo.completed["b"][-1]["c"]
    late = [geo.topics["c"].write_data() for _ in range(5)][-1]
    geo.tick()   # c has data: its data snapshot; b answers it and owes a follow-up
    assert geo.controllers["b"].follow_up_due
    geo.tick()   # b's follow-up
    after = geo.completed["b"][-1]["c"]
    assert after > before and after >= (late.ledger_id, late.entry_id)


def test_a_cluster_with_data_of_its_own_takes_a_plain_snapshot_not_a_follow_up():
    geo = Geo()
    geo.topics["a"].write_data()
    geo.topics["b"].write_data()
    geo.tick()
    assert sorted(geo.requests) == [("a", False), ("a", False), ("b", False), ("b", False)]
    # Each answered the other's data snapshot after starting its own, and c answered
    # both: when the data stops, every cluster takes one flagged follow-up, then quiet.
    # (With data every tick, each tick's own data snapshot clears the debt instead.)
    geo.tick()
    assert sorted(geo.requests) == [("a", False)] * 2 + [("a", True)] * 2 + [("b", False)] * 2 + \
        [("b", True)] * 2 + [("c", True)] * 2
    for _ in range(4):
        assert geo.tick() == {"a": None, "b": None, "c": None}


def test_no_follow_up_while_a_replicator_is_disconnected():
    geo = Geo()
    geo.topics["a"].write_data()
    geo.tick()
    geo.topics["b"].replicators["a"].connected = False
    started = geo.tick()
    assert started["b"] is None and geo.controllers["b"].follow_up_due   # kept for later
    geo.topics["b"].replicators["a"].connected = True
    assert geo.tick()["b"] is not None
