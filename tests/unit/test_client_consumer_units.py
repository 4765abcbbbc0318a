"""Consumer mechanisms without I/O: flow permits, receive queue, ack grouping
(BatchMessageAcker, PersistentAcknowledgmentsGroupingTracker), ack timeout,
negative acks, configuration, pattern matching, Message."""
import asyncio
import re

import pytest
from hypothesis import given, strategies as st

from client.ack_grouping import (AcknowledgmentsGroupingTracker, BatchMessageAcker, MAX_ACK_GROUP_SIZE,
                                 unacked_mask_from_ack_set)
from client.consumer_config import (BatchReceivePolicy, ConsumerConfig, ConsumerType, DeadLetterPolicy,
                                    InitialPosition)
from client.errors import AlreadyClosed, InvalidConfiguration, Timeout
from client.message import Message, TopicMessageId
from client.message_id import MessageId
from client.multi_topics_consumer import pattern_namespace, topics_matching
from client.receiver_queue import FlowPermits, ReceiverQueue
from client.redelivery_trackers import NegativeAcksTracker, UnAckedMessageTracker
from proto import broker_pb2 as pb


# ---------------------------------------------------------------- flow permits
def test_flow_permits_initial_then_refill_at_half():
    p = FlowPermits(10)
    assert p.initial() == 10
    assert [p.processed() for _ in range(4)] == [0, 0, 0, 0]
    assert p.processed() == 5  # half the queue consumed: grant them back in one Flow
    assert p.processed(3) == 0 and p.take_all() == 3 and p.take_all() == 0


def test_flow_permits_count_messages_and_reset_on_resubscribe():
    p = FlowPermits(1000)
    p.initial()
    assert p.processed(499) == 0
    assert p.processed(10) == 509  # a batch of 10 counts 10
    p.processed(100)
    assert p.initial() == 1000 and p.available == 0  # reconnect: broker's count restarts


def test_flow_permits_queue_of_one():
    p = FlowPermits(1)
    assert p.initial() == 1 and p.processed() == 1
    with pytest.raises(ValueError):
        FlowPermits(0)


@given(st.integers(1, 500), st.lists(st.integers(0, 50), max_size=60))
def test_flow_permits_conserve_permits(size, counts):
    p = FlowPermits(size)
    p.initial()
    granted = sum(p.processed(c) for c in counts)
    assert granted + p.available == sum(counts)
    assert p.available < p.refill_threshold


# ---------------------------------------------------------------- receive queue
async def test_receiver_queue_fifo_and_timeout():
    q = ReceiverQueue()
    q.put(1)
    q.put_many([2, 3])
    assert len(q) == 3
    assert [await q.get(), await q.get(0), q.get_nowait()] == [1, 2, 3]
    with pytest.raises(Timeout):
        await q.get(0.02)
    with pytest.raises(IndexError):
        q.get_nowait()


async def test_receiver_queue_wakes_waiters_in_order():
    q = ReceiverQueue()
    t1 = asyncio.create_task(q.get())
    t2 = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.put("a")
    q.put("b")
    assert {await t1, await t2} == {"a", "b"}


async def test_receiver_queue_cancelled_waiter_passes_item_on():
    q = ReceiverQueue()
    t1 = asyncio.create_task(q.get())
    t2 = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.put("x")
    t1.cancel()
    done, pending = await asyncio.wait([t1, t2], timeout=1)
    assert [t.result() for t in done if not t.cancelled()] == ["x"]  # delivered once, never lost
    for t in pending:
        t.cancel()


async def test_receiver_queue_remove_if_and_close():
    q = ReceiverQueue()
    q.put_many(range(6))
    assert q.remove_if(lambda i: i % 2) == [1, 3, 5]
    assert q.clear() == [0, 2, 4]
    waiter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.close()
    with pytest.raises(AlreadyClosed):
        await waiter
    q.put(1)  # ignored once closed
    with pytest.raises(AlreadyClosed):
        await q.get()


# ---------------------------------------------------------------- batch acker
def test_unacked_mask_from_java_bitset_words():
    assert unacked_mask_from_ack_set([], 5) == 0b11111  # no state: all unacked
    assert unacked_mask_from_ack_set([0b10110], 5) == 0b10110
    assert unacked_mask_from_ack_set([-1], 3) == 0b111  # int64 words may be negative
    words = [0, 1]  # index 64 unacked only; trailing words trimmed = acked
    assert unacked_mask_from_ack_set(words, 70) == 1 << 64


def test_batch_message_acker():
    a = BatchMessageAcker(4)
    assert not a.ack_individual(2) and a.outstanding == 3 and a.is_acked(2)
    assert not a.ack_cumulative(1) and a.acked_indexes() == [0, 1, 2]
    assert a.ack_individual(3) and a.outstanding == 0
    b = BatchMessageAcker(3, unacked_mask=0b100)  # broker says 0 and 1 already acked
    assert b.ack_individual(2)
    with pytest.raises(ValueError):
        b.ack_individual(3)


# ---------------------------------------------------------------- grouping tracker
def positions(ack: pb.Ack):
    return [(p.ledger_id, p.entry_id, p.batch_size, list(p.batch_indexes)) for p in ack.positions]


def test_individual_acks_grouped_in_one_frame():
    t = AcknowledgmentsGroupingTracker(ack_group_time_ms=100)
    assert t.flush_due_ms() is None
    assert not t.add_individual(MessageId(1, 1), now_ms=1000)
    assert not t.add_individual(MessageId(1, 2), now_ms=1050)
    assert not t.add_individual(MessageId(1, 1), now_ms=1060)  # duplicate ack: once
    assert t.flush_due_ms() == 1100
    assert t.is_duplicate(MessageId(1, 2)) and not t.is_duplicate(MessageId(1, 3))
    frames = t.flush()
    assert len(frames) == 1 and frames[0].ack_type == pb.Individual
    assert positions(frames[0]) == [(1, 1, 0, []), (1, 2, 0, [])]
    assert t.flush() == [] and not t.has_pending()


def test_group_full_or_time_zero_asks_for_flush():
    t = AcknowledgmentsGroupingTracker(ack_group_time_ms=0)
    assert t.add_individual(MessageId(1, 1), 0)
    t = AcknowledgmentsGroupingTracker(ack_group_time_ms=100)
    flags = [t.add_individual(MessageId(1, i), 0) for i in range(MAX_ACK_GROUP_SIZE)]
    assert flags[-1] and not any(flags[:-1])


def test_batch_entry_acked_once_all_messages_are_without_batch_index_ack():
    t = AcknowledgmentsGroupingTracker()
    t.register_batch(3, 7, 3)
    ids = [MessageId(3, 7, -1, i, 3) for i in range(3)]
    t.add_individual(ids[0], 0)
    t.add_individual(ids[2], 0)
    assert t.flush() == []  # BatchMessageAcker: not yet complete
    t.add_individual(ids[1], 0)
    assert positions(t.flush()[0]) == [(3, 7, 0, [])]
    assert t.acker_of(ids[0]) is None


def test_batch_index_ack_sends_acked_indexes():
    t = AcknowledgmentsGroupingTracker(batch_index_ack_enabled=True)
    t.register_batch(3, 7, 4, unacked_mask=0b1110)  # index 0 acked earlier (broker ack set)
    t.add_individual(MessageId(3, 7, -1, 2, 4), 0)
    assert positions(t.flush()[0]) == [(3, 7, 4, [0, 2])]
    t.add_individual(MessageId(3, 7, -1, 1, 4), 0)
    t.add_individual(MessageId(3, 7, -1, 3, 4), 0)
    assert positions(t.flush()[0]) == [(3, 7, 0, [])]  # complete: the whole entry


def test_batch_id_without_acker_acks_whole_entry_unless_batch_index_ack():
    t = AcknowledgmentsGroupingTracker()
    t.add_individual(MessageId(1, 5, -1, 2, 4), 0)  # e.g. a deserialized id: as Pulsar, the entry
    assert positions(t.flush()[0]) == [(1, 5, 0, [])]
    t = AcknowledgmentsGroupingTracker(batch_index_ack_enabled=True)
    t.add_individual(MessageId(1, 5, -1, 2, 4), 0)
    assert positions(t.flush()[0]) == [(1, 5, 4, [2])]


def test_chunked_message_acks_every_chunk():
    t = AcknowledgmentsGroupingTracker()
    t.add_individual(MessageId(1, 3), 0, chunk_ids=[MessageId(1, 1), MessageId(1, 2), MessageId(1, 3)])
    assert [p[:2] for p in positions(t.flush()[0])] == [(1, 1), (1, 2), (1, 3)]


def test_cumulative_keeps_only_highest():
    t = AcknowledgmentsGroupingTracker()
    t.add_cumulative(MessageId(1, 5), 0)
    t.add_cumulative(MessageId(1, 9), 0)
    t.add_cumulative(MessageId(1, 7), 0)  # lower: ignored
    frames = t.flush()
    assert len(frames) == 1 and frames[0].ack_type == pb.Cumulative
    assert positions(frames[0]) == [(1, 9, 0, [])]
    assert t.is_duplicate(MessageId(1, 9)) and t.is_duplicate(MessageId(0, 99)) and not t.is_duplicate(MessageId(1, 10))
    t.add_cumulative(MessageId(1, 8), 0)
    assert t.flush() == []  # nothing new
    t.clear()  # after a seek
    assert not t.is_duplicate(MessageId(1, 9))


def test_cumulative_inside_batch_acks_previous_entry_once():
    t = AcknowledgmentsGroupingTracker()
    t.register_batch(2, 10, 3)
    t.add_cumulative(MessageId(2, 10, -1, 0, 3), 0)
    assert positions(t.flush()[0]) == [(2, 9, 0, [])]  # Pulsar's prevBatchMessageId
    t.add_cumulative(MessageId(2, 10, -1, 1, 3), 0)
    assert t.flush() == []
    t.add_cumulative(MessageId(2, 10, -1, 2, 3), 0)
    assert positions(t.flush()[0]) == [(2, 10, 0, [])]


def test_cumulative_inside_batch_with_batch_index_ack():
    t = AcknowledgmentsGroupingTracker(batch_index_ack_enabled=True)
    t.register_batch(2, 10, 4)
    t.add_cumulative(MessageId(2, 10, -1, 1, 4), 0)
    assert positions(t.flush()[0]) == [(2, 10, 4, [0, 1])]
    assert t.is_duplicate(MessageId(2, 10, -1, 1, 4)) and not t.is_duplicate(MessageId(2, 10, -1, 2, 4))


def test_cumulative_and_individual_in_one_flush():
    t = AcknowledgmentsGroupingTracker()
    t.add_individual(MessageId(1, 20), 0)
    t.add_cumulative(MessageId(1, 10), 0)
    kinds = [f.ack_type for f in t.flush()]
    assert kinds == [pb.Cumulative, pb.Individual]


# ---------------------------------------------------------------- ack timeout / nacks
def test_unacked_tracker_expires_after_timeout():
    t = UnAckedMessageTracker(1000)
    t.add(MessageId(1, 1), 0)
    t.add(MessageId(1, 2, -1, 0, 2), 100)
    t.add(MessageId(1, 2, -1, 1, 2), 200)
    t.add(MessageId(1, 3), 300, positions=[MessageId(1, 3), MessageId(1, 4)])  # chunked
    assert t.next_deadline_ms() == 1000
    assert t.remove(MessageId(1, 1)) and not t.remove(MessageId(1, 1))
    assert t.expired(999) == []
    assert t.expired(1200) == [MessageId(1, 2)]  # one entry for both batch messages
    assert t.expired(5000) == [MessageId(1, 3), MessageId(1, 4)]
    assert t.next_deadline_ms() is None


def test_unacked_tracker_readd_restarts_and_cumulative_removes():
    t = UnAckedMessageTracker(1000)
    t.add(MessageId(1, 1), 0)
    t.add(MessageId(1, 2), 0)
    t.add(MessageId(1, 1), 500)  # redelivered and received again
    assert t.expired(1000) == [MessageId(1, 2)]
    t.add(MessageId(1, 3), 600)
    assert t.remove_up_to(MessageId(1, 2)) == 1 and len(t) == 1
    t.clear()
    assert len(t) == 0


def test_negative_acks_tracker():
    t = NegativeAcksTracker(500)
    t.add(MessageId(4, 1), 1000)
    t.add(MessageId(4, 2, -1, 1, 3), 1100)
    assert t.next_deadline_ms() == 1500 and MessageId(4, 1) in t
    assert t.expired(1499) == []
    assert t.expired(1600) == [MessageId(4, 1), MessageId(4, 2)]
    assert len(t) == 0


# ---------------------------------------------------------------- configuration
def test_consumer_type_maps_to_protocol():
    assert ConsumerType.KeyShared.value == pb.Key_Shared
    assert ConsumerType.Failover.value == pb.Failover
    assert InitialPosition.Earliest.value == pb.Earliest
    assert not ConsumerType.Shared.allows_cumulative_ack and ConsumerType.Exclusive.allows_cumulative_ack


def test_dead_letter_policy_topic_names():
    p = DeadLetterPolicy(max_redeliver_count=3)
    assert p.topic_for("persistent://public/default/orders", "sub") == "persistent://public/default/orders-sub-DLQ"
    assert p.topic_for("persistent://t/n/orders-partition-2", "sub") == "persistent://t/n/orders-sub-DLQ"
    assert DeadLetterPolicy(1, "my-dlq").topic_for("x", "s") == "persistent://public/default/my-dlq"
    with pytest.raises(InvalidConfiguration):
        DeadLetterPolicy(max_redeliver_count=0)


def test_consumer_config_validation():
    c = ConsumerConfig("s", receiver_queue_size=0).validate()
    assert c.receiver_queue_size == 1
    for bad in (dict(subscription_name=""), dict(unacked_messages_timeout_ms=500),
                dict(receiver_queue_size=-1), dict(consumer_type="Shared"), dict(ack_group_time_ms=-1)):
        kwargs = {"subscription_name": "s", **bad}
        with pytest.raises(InvalidConfiguration):
            ConsumerConfig(**kwargs).validate()
    assert ConsumerConfig("s", unacked_messages_timeout_ms=0).validate().unacked_messages_timeout_ms == 0
    assert BatchReceivePolicy().max_num_messages == 100 and BatchReceivePolicy().timeout_ms == 100


def test_pattern_namespace_and_matching():
    ns, rx = pattern_namespace(re.compile("persistent://public/default/orders-.*"))
    assert ns == "public/default"
    topics = ["persistent://public/default/orders-a", "persistent://public/default/orders-b-partition-0",
              "persistent://public/default/orders-b-partition-1", "persistent://public/default/other"]
    assert topics_matching(topics, rx) == topics[:3]
    ns, rx = pattern_namespace(re.compile("orders-.*"))
    assert ns == "public/default" and topics_matching(topics, rx) == topics[:3]
    with pytest.raises(InvalidConfiguration):
        pattern_namespace(re.compile("persistent://public/.*/x"))


# ---------------------------------------------------------------- message
def test_message_accessors():
    mid = TopicMessageId(1, 2, 0, -1, topic="persistent://public/default/t-partition-0")
    m = Message(b"hi", mid, mid.topic, properties={"a": "1"}, partition_key="k", publish_time=5,
                event_time=6, redelivery_count=2, producer_name="p", sequence_id=9)
    assert (m.data(), m.value(), m.properties(), m.partition_key(), m.ordering_key()) == (b"hi", b"hi", {"a": "1"},
                                                                                        "k", None)
    assert (m.publish_timestamp(), m.event_timestamp(), m.redelivery_count(), m.producer_name()) == (5, 6, 2, "p")
    assert m.message_id() == MessageId(1, 2, 0) and m.topic_name().endswith("t-partition-0")
    assert m.replicated_from() is None and m._entry_positions() == (MessageId(1, 2, 0),)
    m.properties()["b"] = "2"
    assert m.properties() == {"a": "1"}
    assert Message(b"", MessageId(1, 1), "t").partition_key() == ""
    assert mid.plain() == mid and type(mid.plain()) is MessageId


@given(cumulative=st.none() | st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(-1, 4)),
       individual=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=4))
def test_first_new_batch_index_agrees_with_is_duplicate(cumulative, individual):
    """The splitter's one-check-per-entry shortcut says what is_duplicate says per message."""
    tracker = AcknowledgmentsGroupingTracker(ack_group_time_ms=100_000)
    if cumulative is not None:
        tracker.add_cumulative(MessageId(cumulative[0], cumulative[1], -1, cumulative[2], 5 if cumulative[2] >= 0 else 0), 0)
    for ledger_id, entry_id in individual:
        tracker.add_individual(MessageId(ledger_id, entry_id), 0)
    for ledger_id in range(4):
        for entry_id in range(4):
            first_new = tracker.first_new_batch_index(ledger_id, entry_id)
            for i in range(5):
                dup = tracker.is_duplicate(MessageId(ledger_id, entry_id, -1, i, 5))
                assert (i < first_new) == dup, (ledger_id, entry_id, i, first_new)
