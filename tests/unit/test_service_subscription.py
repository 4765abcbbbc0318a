"""Unit tests of broker.service.subscription (Pulsar's PersistentSubscription)
with a tiny fake cursor and topic: subscription-type rules, the dispatcher of
each type, batch sizes known without a read, ack routing, redelivery of only
what is pending for the consumer, the replicated flag, backlog and unsubscribe."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from broker.ledger.position import Position
from broker.service.consumer import Consumer, DispatchItem
from broker.service.dispatcher_key_shared import KeySharedDispatcher
from broker.service.dispatchers import MultipleConsumersDispatcher, SingleActiveConsumerDispatcher
from broker.service.errors import InvalidArgument, PreconditionFailed
from broker.service.subscription import CHUNK, REPLICATED_PROPERTY, Subscription
from proto import broker_pb2 as pb
from proto.errors import ConsumerBusy, NotAllowed

P = Position


def done(value=None) -> asyncio.Future:
    f = asyncio.get_running_loop().create_future()
    f.set_result(value)
    return f


class FakeCursor:
    def __init__(self):
        self.mark_delete_position = P(1, -1)
        self.read_position = P(1, 0)
        self.deleted: list[list[Position]] = []
        self.cursor_properties: dict[str, str] = {}
        self.batch_sizes: dict[Position, int] = {}
        self.batch_deleted = SimpleNamespace(batch_size=self.batch_sizes.get, ack_set_words=lambda p: None)
        self.ml = SimpleNamespace(is_entry=lambda p: True, last_confirmed=P(1, 100))
        self.backlog = 0

    def is_acknowledged(self, pos):
        return pos <= self.mark_delete_position

    def rewind(self):
        pass

    def delete_nowait(self, positions):
        self.deleted.append(list(positions))
        return done()

    async def set_cursor_properties(self, props):
        self.cursor_properties = dict(props)

    def number_of_entries_in_backlog(self):
        return self.backlog


class FakeTopicName:
    partition_index = -1

    def __str__(self):
        return "persistent://t/ns/x"


class FakeTopic:
    def __init__(self):
        self.name = FakeTopicName()
        self.config = SimpleNamespace(dispatcher_max_read_batch_size=10,
                                      replicated_subscriptions_snapshot_max_cached_per_subscription=5)
        self.controller = None
        self.removed: list[str] = []
        self.markers = 0

    async def remove_subscription(self, name):
        self.removed.append(name)

    def markers_in_backlog(self, cursor):
        return self.markers


@pytest.fixture
async def sub():
    s = Subscription(FakeTopic(), "s", FakeCursor())
    yield s
    await s.close()


def consumer(name="c") -> Consumer:
    return Consumer(name, 0, lambda r: None, max_unacked_messages=0)   # no permits: the dispatcher idles


def push(s: Subscription, c: Consumer, *entries: tuple[int, int]) -> None:
    c.send_entries([DispatchItem(P(1, e), b"x" * 8, n, b"") for e, n in entries], {}, s.ack_set_for)


# ---------------------------------------------------------------------------- types
@pytest.mark.parametrize("sub_type,cls", [(pb.Exclusive, SingleActiveConsumerDispatcher),
                                          (pb.Failover, SingleActiveConsumerDispatcher),
                                          (pb.Shared, MultipleConsumersDispatcher),
                                          (pb.Key_Shared, KeySharedDispatcher)])
async def test_dispatcher_of_each_type(sub, sub_type, cls):
    c = consumer()
    sub.add_consumer(c, sub_type)
    assert type(sub.dispatcher) is cls and sub.sub_type == sub_type
    assert sub.consumers == [c] and sub.dispatcher.consumers == [c]


async def test_subscription_type_rules(sub):
    a = consumer("a")
    sub.add_consumer(a, pb.Exclusive)
    with pytest.raises(ConsumerBusy):
        sub.add_consumer(consumer("b"), pb.Exclusive)
    with pytest.raises(NotAllowed, match="is of type Exclusive, not Shared"):
        sub.add_consumer(consumer("b"), pb.Shared)
    assert sub.consumers == [a]
    sub.remove_consumer(a)
    assert a.closed and sub.consumers == []
    sub.add_consumer(consumer("b"), pb.Shared)            # no consumers left: the type may change
    assert isinstance(sub.dispatcher, MultipleConsumersDispatcher)
    sub.add_consumer(consumer("c"), pb.Shared)
    assert len(sub.consumers) == 2


async def test_unknown_subscription_type(sub):
    with pytest.raises(InvalidArgument, match="unknown subscription type 99"):
        sub.add_consumer(consumer(), 99)
    assert sub.consumers == []


# ---------------------------------------------------------------------------- batch sizes and acks
async def test_known_batch_size_sources(sub):
    a, b = consumer("a"), consumer("b")
    sub.add_consumer(a, pb.Shared)
    sub.add_consumer(b, pb.Shared)
    push(sub, a, (0, 5))
    push(sub, b, (1, 3))
    sub.cursor.batch_sizes[P(1, 2)] = 7                   # from an earlier batch-index ack
    assert sub.known_batch_size(P(1, 0), a) == 5
    assert sub.known_batch_size(P(1, 1), a) == 3          # pending on another consumer
    assert sub.known_batch_size(P(1, 1)) == 3
    assert sub.known_batch_size(P(1, 2), a) == 7
    assert sub.known_batch_size(P(1, 9), a) is None


async def test_needs_async_ack(sub):
    c = consumer()
    sub.add_consumer(c, pb.Shared)
    push(sub, c, (0, 4))
    whole = pb.Ack(positions=[pb.AckPosition(ledger_id=1, entry_id=i) for i in range(CHUNK)])
    assert not sub.needs_async_ack(c, whole)
    whole.positions.add(ledger_id=1, entry_id=CHUNK)
    assert sub.needs_async_ack(c, whole)                  # more than CHUNK positions
    known = pb.Ack(positions=[pb.AckPosition(ledger_id=1, entry_id=0, batch_indexes=[1])])
    assert not sub.needs_async_ack(c, known)
    unknown = pb.Ack(positions=[pb.AckPosition(ledger_id=1, entry_id=5, batch_indexes=[1])])
    assert sub.needs_async_ack(c, unknown)                # size only known by reading the entry
    sub.cursor.mark_delete_position = P(1, 5)
    assert not sub.needs_async_ack(c, unknown)            # already acknowledged: nothing to read


async def test_individual_ack_of_whole_entries(sub):
    c = consumer()
    sub.add_consumer(c, pb.Shared)
    push(sub, c, (0, 2), (1, 1), (2, 1))
    sub.redelivery_counts[P(1, 1)] = 3
    ack = pb.Ack(ack_type=pb.Individual, positions=[pb.AckPosition(ledger_id=1, entry_id=0),
                                                     pb.AckPosition(ledger_id=1, entry_id=1)])
    await sub.acknowledge(c, ack)
    assert sub.cursor.deleted == [[P(1, 0), P(1, 1)]]
    assert c.pending_acks == {P(1, 2): 1} and c.unacked_messages == 1
    assert sub.redelivery_counts == {} and sub.msg_acked_counter == 2
    assert sub.unacked_messages() == 1


async def test_cumulative_ack_is_refused_on_shared_and_key_shared(sub):
    c = consumer()
    sub.add_consumer(c, pb.Key_Shared)
    push(sub, c, (0, 1))
    ack = pb.Ack(ack_type=pb.Cumulative, positions=[pb.AckPosition(ledger_id=1, entry_id=0)])
    with pytest.raises(NotAllowed, match="cumulative acknowledgment is not allowed on Key_Shared"):
        sub.acknowledge(c, ack)
    assert sub.cursor.deleted == [] and c.unacked_messages == 1 and sub.msg_acked_counter == 0
    with pytest.raises(InvalidArgument, match="exactly one position"):
        await sub.acknowledge_async(c, pb.Ack(ack_type=pb.Cumulative))


async def test_batch_index_ack_beyond_the_real_batch_size_is_refused(sub):
    c = consumer()
    sub.add_consumer(c, pb.Shared)
    push(sub, c, (0, 2))                                  # the entry holds 2 messages
    ack = pb.Ack(positions=[pb.AckPosition(ledger_id=1, entry_id=0, batch_indexes=[0, 1, 2])])
    with pytest.raises(InvalidArgument, match="3 batch indexes for entry 1:0, which holds 2 message"):
        sub.acknowledge(c, ack)
    unknown = pb.Ack(positions=[pb.AckPosition(ledger_id=1, entry_id=7, batch_indexes=[0])])
    with pytest.raises(InvalidArgument, match="batch size of 1:7 is not known yet"):
        sub.acknowledge(c, unknown)


# ---------------------------------------------------------------------------- redelivery
async def test_redeliver_only_what_is_pending_for_that_consumer(sub):
    a, b = consumer("a"), consumer("b")
    sub.add_consumer(a, pb.Shared)
    sub.add_consumer(b, pb.Shared)
    push(sub, a, (0, 1), (1, 1), (2, 1))
    push(sub, b, (3, 1))
    sub.redeliver_unacknowledged(a, [(1, 1), SimpleNamespace(ledger_id=1, entry_id=2), (1, 3), (9, 9), (1, 1)])
    assert list(sub.dispatcher.replay) == [P(1, 1), P(1, 2)]   # b's 1:3 and unknown 9:9 ignored
    assert a.pending_acks == {P(1, 0): 1} and b.pending_acks == {P(1, 3): 1}
    assert a.msg_redeliver_counter == 2
    sub.redeliver_unacknowledged(a, [])                       # empty: everything pending of a
    assert list(sub.dispatcher.replay) == [P(1, 0), P(1, 1), P(1, 2)]
    assert a.pending_acks == {} and a.msg_redeliver_counter == 3


async def test_redeliver_async_walks_long_lists(sub):
    c = consumer()
    sub.add_consumer(c, pb.Shared)
    push(sub, c, *((i, 1) for i in range(0, 2 * CHUNK + 10, 2)))     # even entries pending
    await sub.redeliver_unacknowledged_async(c, [(1, i) for i in range(2 * CHUNK + 10)])
    assert len(sub.dispatcher.replay) == CHUNK + 5 and c.pending_acks == {}
    assert c.msg_redeliver_counter == CHUNK + 5


# ---------------------------------------------------------------------------- flags, figures, unsubscribe
async def test_replicated_flag_is_a_cursor_property(sub):
    assert not sub.replicated
    await sub.set_replicated(True)
    assert sub.cursor.cursor_properties == {REPLICATED_PROPERTY: "true"} and sub.replicated
    await sub.set_replicated(False)
    assert sub.cursor.cursor_properties == {REPLICATED_PROPERTY: "false"} and not sub.replicated


async def test_backlog_excludes_markers(sub):
    sub.cursor.backlog = 10
    sub.topic.markers = 3
    assert sub.backlog() == 7
    sub.topic.markers = 12
    assert sub.backlog() == 0


async def test_unsubscribe_needs_no_other_consumers(sub):
    a, b = consumer("a"), consumer("b")
    sub.add_consumer(a, pb.Shared)
    sub.add_consumer(b, pb.Shared)
    with pytest.raises(PreconditionFailed, match="1 other connected consumer"):
        await sub.unsubscribe(a)
    with pytest.raises(PreconditionFailed, match="2 other connected consumer"):
        await sub.unsubscribe()
    assert sub.topic.removed == []
    sub.remove_consumer(b)
    await sub.unsubscribe(a)
    assert sub.topic.removed == ["s"]


async def test_flow_adds_permits_and_close_disconnects(sub):
    c = consumer()
    ended = []
    c.on_disconnect = lambda: ended.append(c.name)
    sub.add_consumer(c, pb.Exclusive)
    sub.flow(c, 0)
    sub.flow(c, -3)
    assert c.permits == 0
    await sub.close()
    assert ended == ["c"] and sub.consumers == [] and c.closed
