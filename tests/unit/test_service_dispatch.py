"""Unit tests of broker.service.dispatchers' choices, driven directly (the read
loop is not started): Key_Shared's auto-split hash ranges, sticky-key routing
and recently-joined holding (PersistentStickyKeyDispatcherMultipleConsumers),
Exclusive/Failover active-consumer choice (PersistentDispatcherSingleActiveConsumer),
Shared round robin (PersistentDispatcherMultipleConsumers), redelivery and
reset bookkeeping, and the metadata peek of ``_prepare`` (markers, corrupt
entries, delayed delivery, sticky keys). Tiny fakes stand in for the cursor
and subscription; consumers are real."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from broker.ledger.position import Entry, Position
from broker.service.consumer import Consumer, DispatchItem
from broker.service.dispatcher_key_shared import KeySharedDispatcher
from broker.service.dispatchers import (HASH_RANGE_SIZE, Dispatcher, MultipleConsumersDispatcher,
                                        SingleActiveConsumerDispatcher)
from proto import pulsar_api_pb2
from proto.entry_format import encode_entry
from proto.hashing import murmur3_32_hash

P = Position


class FakeCursor:
    def __init__(self):
        self.read_position = P(1, 0)
        self.mark_delete_position = P(1, -1)
        self.acked: set[Position] = set()
        self.rewinds = 0
        # one ledger: the position after p is the next entry id (ManagedLedger.next_position)
        self.ml = SimpleNamespace(next_position=lambda p: P(p.ledger_id, p.entry_id + 1))

    def is_acknowledged(self, pos: Position) -> bool:
        return pos <= self.mark_delete_position or pos in self.acked

    def rewind(self) -> None:
        self.rewinds += 1


class FakeSubscription:
    def __init__(self):
        self.cursor = FakeCursor()
        self.name = "sub"
        self.topic = SimpleNamespace(name="persistent://t/ns/x", config=SimpleNamespace(dispatcher_max_read_batch_size=100))
        self.redelivery_counts: dict[Position, int] = {}
        self.server_acked: list[Position] = []
        self.markers: list[Position] = []

    def ack_set_for(self, position):
        return None

    def acknowledge_server_side(self, positions):
        self.server_acked.extend(positions)

    def on_marker(self, entry, metadata):
        self.markers.append(entry.position)


def consumer(name: str, priority: int = 0, permits: int = 1000):
    frames: list = []
    c = Consumer(name, priority, frames.append, max_unacked_messages=0)
    c.add_permits(permits)
    c.frames = frames
    return c


def delivered(c: Consumer) -> list[Position]:
    return [P(m.position.ledger_id, m.position.entry_id) for f in c.frames if f.WhichOneof("response") == "messages"
            for m in f.messages.entries]


def active_changes(c: Consumer) -> list[bool]:
    return [f.active_change.is_active for f in c.frames if f.WhichOneof("response") == "active_change"]


def owner_of(ranges, key: bytes):
    h = murmur3_32_hash(key) % HASH_RANGE_SIZE
    owners = [o for s, e, o in ranges if s <= h <= e]
    assert len(owners) == 1
    return owners[0]


def keys_for(d: KeySharedDispatcher, c: Consumer, n: int = 3) -> list[bytes]:
    out = []
    i = 0
    while len(out) < n:
        k = f"key-{i}".encode()
        if d.consumer_for(k) is c:
            out.append(k)
        i += 1
    return out


# ---------------------------------------------------------------------------- Key_Shared ranges
def test_key_shared_auto_split_ranges_cover_the_hash_space():
    d = KeySharedDispatcher(FakeSubscription())
    a, b, c = consumer("a"), consumer("b"), consumer("c")
    d.add_consumer(a)
    assert d.ranges == [(0, 65535, a)] and a not in d.recently_joined
    d.cursor.read_position = P(1, 10)
    d.add_consumer(b)
    assert d.ranges == [(0, 32767, a), (32768, 65535, b)]
    assert d.recently_joined == {b: P(1, 10)}
    d.add_consumer(c)                     # the widest range (the first of equals) is split
    assert d.ranges == [(0, 16383, a), (16384, 32767, c), (32768, 65535, b)]
    assert d.consumers == [a, b, c]


def test_key_shared_consumer_for_follows_murmur3_modulo_65536():
    d = KeySharedDispatcher(FakeSubscription())
    assert d.consumer_for(b"k") is None   # no consumers
    cs = [consumer(n) for n in "abcd"]
    for c in cs:
        d.add_consumer(c)
    seen = set()
    for i in range(200):
        key = f"order-{i}".encode()
        got = d.consumer_for(key)
        assert got is owner_of(d.ranges, key)
        assert got is d.consumer_for(key)      # sticky
        seen.add(got)
    assert seen == set(cs)                     # 200 keys reach all four quarters


def test_key_shared_removal_merges_ranges_into_a_neighbour():
    d = KeySharedDispatcher(FakeSubscription())
    a, b, c = consumer("a"), consumer("b"), consumer("c")
    for x in (a, b, c):
        d.add_consumer(x)
    # [(0,16383,a), (16384,32767,c), (32768,65535,b)]
    d.remove_consumer(c)                       # middle: merged into the previous range
    assert d.ranges == [(0, 32767, a), (32768, 65535, b)] and c not in d.recently_joined
    d.remove_consumer(a)                       # first: merged into the next range
    assert d.ranges == [(0, 65535, b)]
    d.remove_consumer(b)
    assert d.ranges == [] and d.consumers == []


def test_key_shared_removed_consumers_pending_entries_are_redelivered():
    sub = FakeSubscription()
    d = KeySharedDispatcher(sub)
    a, b = consumer("a"), consumer("b")
    d.add_consumer(a)
    d.add_consumer(b)
    d.recently_joined.clear()
    a.send_entries([DispatchItem(P(1, 0), b"x", 1, b""), DispatchItem(P(1, 1), b"x", 1, b"")], {}, sub.ack_set_for)
    sub.cursor.acked.add(P(1, 1))              # acknowledged meanwhile: not redelivered
    d.remove_consumer(a)
    assert list(d.replay) == [P(1, 0)]
    assert sub.redelivery_counts == {P(1, 0): 1}
    assert a.pending_acks == {} and a.unacked_messages == 0


def test_key_shared_routes_by_key_and_holds_a_recently_joined_consumers_new_entries():
    sub = FakeSubscription()
    d = KeySharedDispatcher(sub)
    a, b = consumer("a"), consumer("b")
    d.add_consumer(a)
    sub.cursor.read_position = P(1, 2)         # b joins when the read position is 1:2
    d.add_consumer(b)
    ka, kb = keys_for(d, a, 1)[0], keys_for(d, b, 1)[0]
    items = [DispatchItem(P(1, 0), b"x", 1, kb),   # before b's join: delivered to b
             DispatchItem(P(1, 1), b"x", 1, ka),
             DispatchItem(P(1, 2), b"x", 1, kb),   # at/after the join: held
             DispatchItem(P(1, 3), b"x", 1, ka)]
    d._dispatch(items)
    assert delivered(a) == [P(1, 1), P(1, 3)]
    assert delivered(b) == [P(1, 0)]
    assert d._held == {P(1, 2)}
    # Nothing before b's join is acknowledged yet: b stays recently joined; held goes to replay.
    assert d.total_permits() == 2000 - 3
    assert b in d.recently_joined and list(d.replay) == [P(1, 2)] and not d._held
    # Everything before the join acknowledged (mark-delete 1:1): b is released.
    sub.cursor.mark_delete_position = P(1, 1)
    d.total_permits()
    assert b not in d.recently_joined


def test_key_shared_releases_a_consumer_that_joined_at_entry_0_of_a_new_ledger():
    """Pulsar's removeConsumersFromRecentJoinedConsumers compares the join position with the
    mark-delete position's next *valid* position: with ledger 1 fully acknowledged (1:9) and
    the read position at 3:0, a consumer joining there is released, and its key's entry at
    3:0 goes out (it used to be held for ever, and the whole subscription behind it)."""
    sub = FakeSubscription()
    sub.cursor.ml = SimpleNamespace(next_position=lambda p: P(3, 0) if p == P(1, 9) else P(p.ledger_id, p.entry_id + 1))
    sub.cursor.mark_delete_position = P(1, 9)
    d = KeySharedDispatcher(sub)
    a, b = consumer("a"), consumer("b")
    d.add_consumer(a)
    sub.cursor.read_position = P(3, 0)
    d.add_consumer(b)
    assert b in d.recently_joined
    d.total_permits()
    assert b not in d.recently_joined
    kb = keys_for(d, b, 1)[0]
    d._dispatch([DispatchItem(P(3, 0), b"x", 1, kb)])
    assert delivered(b) == [P(3, 0)] and not d._held
    # one consumer left: nothing is held for a recently joined one (Pulsar clears the map)
    c = consumer("c")
    sub.cursor.read_position = P(3, 5)
    d.add_consumer(c)
    assert c in d.recently_joined
    d.remove_consumer(a)
    d.remove_consumer(b)
    d.total_permits()
    assert not d.recently_joined


def test_key_shared_reads_past_a_stuck_replay_set_and_keeps_each_keys_order():
    """Pulsar's isDispatcherStuckOnReplays: ``a`` has no permits, its key's entry waits in
    the replay set, ``b`` has permits: the next read goes past the replay set; there ``b``'s
    key goes out, and a newer entry of ``a``'s key is held behind the older one even once
    ``a`` has permits again (order per key), then both go out in order from the replay set."""
    sub = FakeSubscription()
    d = KeySharedDispatcher(sub)
    a, b = consumer("a", permits=0), consumer("b")
    d.add_consumer(a)
    d.add_consumer(b)
    d.recently_joined.clear()
    ka, kb = keys_for(d, a, 1)[0], keys_for(d, b, 1)[0]
    d._reading_replay = False
    d._dispatch([DispatchItem(P(1, 0), b"x", 1, ka)])       # a: no permits -> held
    d.total_permits()                                        # held -> replay set
    assert list(d.replay) == [P(1, 0)]
    d._reading_replay = True
    d._dispatch([DispatchItem(P(1, 0), b"x", 1, ka)])        # replay read: still nothing goes out
    d.total_permits()
    assert d._stuck_on_replay() and d._read_past_replay() and not d._read_past_replay()
    a.add_permits(10)                                        # a could take it now, but...
    d._reading_replay = False                                # ...this round reads new entries
    d._dispatch([DispatchItem(P(1, 1), b"x", 1, kb), DispatchItem(P(1, 2), b"x", 1, ka)])
    assert delivered(b) == [P(1, 1)]
    assert delivered(a) == [] and d._held == {P(1, 2)}       # behind 1:0 of the same key
    d.total_permits()
    d._reading_replay = True
    d._dispatch([DispatchItem(P(1, 0), b"x", 1, ka), DispatchItem(P(1, 2), b"x", 1, ka)])
    assert delivered(a) == [P(1, 0), P(1, 2)]
    # no consumer with permits: waiting, not reading on
    sub2 = FakeSubscription()
    d2 = KeySharedDispatcher(sub2)
    c = consumer("c", permits=0)
    d2.add_consumer(c)
    d2._dispatch([DispatchItem(P(1, 0), b"x", 1, b"k")])
    d2.total_permits()
    assert not d2._stuck_on_replay()


def test_key_shared_keeps_key_order_when_a_consumer_runs_out_of_permits():
    sub = FakeSubscription()
    d = KeySharedDispatcher(sub)
    a = consumer("a", permits=2)
    d.add_consumer(a)
    items = [DispatchItem(P(1, i), b"x", n, b"k%d" % i) for i, n in enumerate([1, 1, 1, 1])]
    d._dispatch(items)
    assert delivered(a) == [P(1, 0), P(1, 1)]
    assert d._held == {P(1, 2), P(1, 3)}       # behind the first refused one, all held


def test_key_shared_without_ranges_holds_everything():
    d = KeySharedDispatcher(FakeSubscription())
    d._dispatch([DispatchItem(P(1, 0), b"x", 1, b"k")])
    assert d._held == {P(1, 0)}


# ---------------------------------------------------------------------------- Exclusive / Failover
def test_single_active_picks_by_priority_then_name_and_notifies():
    sub = FakeSubscription()
    d = SingleActiveConsumerDispatcher(sub)
    b, a, low = consumer("b", priority=1), consumer("a", priority=1), consumer("z", priority=0)
    d.add_consumer(b)
    assert d.active is b and active_changes(b) == [True]
    d.add_consumer(a)
    assert d.active is a and active_changes(b) == [True, False] and active_changes(a) == [True]
    d.add_consumer(low)                        # lower level wins whatever its name
    assert d.active is low
    assert sub.cursor.rewinds == 3             # each change rewinds to the mark-delete position
    assert d.accepts_redeliver_all(low) and not d.accepts_redeliver_all(a)
    d.remove_consumer(low)
    assert d.active is a and sub.cursor.rewinds == 4


def test_failover_partition_index_spreads_active_consumers():
    for index, expected in [(0, "a"), (1, "b"), (2, "c"), (3, "a"), (7, "b")]:
        d = SingleActiveConsumerDispatcher(FakeSubscription(), partition_index=index)
        for name in ("c", "a", "b"):
            d.add_consumer(consumer(name))
        d.add_consumer(consumer("lower-priority", priority=5))   # not among the top level
        assert d.active.name == expected, index


def test_single_active_redeliver_rewinds_and_counts():
    sub = FakeSubscription()
    d = SingleActiveConsumerDispatcher(sub)
    c = consumer("c")
    d.add_consumer(c)
    rewinds = sub.cursor.rewinds
    c.send_entries([DispatchItem(P(1, 0), b"x", 2, b""), DispatchItem(P(1, 1), b"x", 1, b"")], {}, sub.ack_set_for)
    sub.cursor.mark_delete_position = P(1, 0)
    d.redeliver([P(1, 0), P(1, 1)])
    assert sub.redelivery_counts == {P(1, 1): 1}      # 1:0 is acknowledged
    assert c.pending_acks == {} and sub.cursor.rewinds == rewinds + 1
    assert len(d.replay) == 0                          # order kept by re-reading, not a replay set
    d.paused = True
    assert d.total_permits() == 0


# ---------------------------------------------------------------------------- Shared
def test_shared_round_robin_splits_evenly_and_keeps_the_rest_for_replay():
    d = MultipleConsumersDispatcher(FakeSubscription())
    a, b = consumer("a", permits=10), consumer("b", permits=10)
    d.add_consumer(a)
    d.add_consumer(b)
    d._dispatch([DispatchItem(P(1, i), b"x", 1, b"") for i in range(5)])
    # Each turn's share is ceil(remaining / consumers): a 3 of 5, b 1 of 2, a the last one.
    assert delivered(a) == [P(1, 0), P(1, 1), P(1, 2), P(1, 4)] and len(a.frames) == 2
    assert delivered(b) == [P(1, 3)]
    d._dispatch([DispatchItem(P(1, 5), b"x", 1, b"")])
    assert delivered(b) == [P(1, 3), P(1, 5)]           # the next turn is b's
    starved = MultipleConsumersDispatcher(FakeSubscription())
    c = consumer("c", permits=1)
    starved.add_consumer(c)
    starved._dispatch([DispatchItem(P(2, i), b"x", 1, b"") for i in range(3)])
    assert delivered(c) == [P(2, 0)] and list(starved.replay) == [P(2, 1), P(2, 2)]


def test_shared_skips_consumers_without_permits():
    d = MultipleConsumersDispatcher(FakeSubscription())
    a, b = consumer("a", permits=0), consumer("b", permits=5)
    d.add_consumer(a)
    d.add_consumer(b)
    d._dispatch([DispatchItem(P(1, i), b"x", 1, b"") for i in range(2)])
    assert delivered(a) == [] and delivered(b) == [P(1, 0), P(1, 1)]   # a skipped in both turns
    assert len(b.frames) == 2 and list(d.replay) == []


# ---------------------------------------------------------------------------- common bookkeeping
def test_redeliver_counts_and_reset_clears():
    sub = FakeSubscription()
    d = MultipleConsumersDispatcher(sub)
    c = consumer("c", permits=3)
    d.add_consumer(c)
    sub.cursor.acked.add(P(1, 2))
    d.redeliver([P(1, 1), P(1, 2), P(1, 1)])
    assert list(d.replay) == [P(1, 1)] and sub.redelivery_counts == {P(1, 1): 2}
    d.redeliver([P(1, 3)], count=False)
    assert list(d.replay) == [P(1, 1), P(1, 3)] and P(1, 3) not in sub.redelivery_counts
    c.send_entries([DispatchItem(P(1, 4), b"x", 1, b"")], {}, sub.ack_set_for)
    epoch = d._epoch
    d.reset()
    assert len(d.replay) == 0 and c.pending_acks == {} and d._epoch == epoch + 1
    assert d.total_permits() == 2
    d.paused = True
    assert d.total_permits() == 0
    assert Dispatcher.accepts_redeliver_all(d, c) is True


def entry(pos: Position, payload: bytes = b"p", **fields) -> Entry:
    md = pulsar_api_pb2.MessageMetadata(producer_name="prod", sequence_id=1, publish_time=1, **fields)
    return Entry(pos, encode_entry(md, payload))


def test_prepare_acks_markers_and_corrupt_entries_and_reads_sticky_keys():
    sub = FakeSubscription()
    d = MultipleConsumersDispatcher(sub)
    future = int(time.time() * 1000) + 3_600_000
    entries = [entry(P(1, 0), ordering_key=b"ok", partition_key="pk"),
               entry(P(1, 1), partition_key="pk"),
               entry(P(1, 2), marker_type=1),
               Entry(P(1, 3), b"\x00not an entry"),
               entry(P(1, 4), b"0123456789", num_messages_in_batch=4),
               entry(P(1, 5), deliver_at_time=future),
               entry(P(1, 6), deliver_at_time=1)]          # due long ago: delivered now
    items = d._prepare(entries)
    assert [(i.position, i.sticky_key, i.num_messages) for i in items] == [
        (P(1, 0), b"ok", 1), (P(1, 1), b"pk", 1), (P(1, 4), b"", 4), (P(1, 6), b"", 1)]
    assert sub.server_acked == [P(1, 2), P(1, 3)] and sub.markers == [P(1, 2)]
    assert d._delayed == [(future, P(1, 5))]


def test_exclusive_does_not_delay_delivery():
    d = SingleActiveConsumerDispatcher(FakeSubscription())
    future = int(time.time() * 1000) + 3_600_000
    items = d._prepare([entry(P(1, 0), deliver_at_time=future)])
    assert [i.position for i in items] == [P(1, 0)] and d._delayed == []


def test_release_delayed_moves_due_entries_to_replay():
    d = MultipleConsumersDispatcher(FakeSubscription())
    now = int(time.time() * 1000)
    d._delayed = [(now - 10, P(1, 1)), (now + 3_600_000, P(1, 2))]
    d._release_delayed()
    assert list(d.replay) == [P(1, 1)] and d._delayed == [(now + 3_600_000, P(1, 2))]


@pytest.mark.parametrize("cls", [MultipleConsumersDispatcher, KeySharedDispatcher, SingleActiveConsumerDispatcher])
def test_read_batch_comes_from_the_config(cls):
    sub = FakeSubscription()
    sub.topic.config.dispatcher_max_read_batch_size = 7
    assert cls(sub).max_read_batch == 7
