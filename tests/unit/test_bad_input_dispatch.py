"""Issue 21 items 6 and 7, the pure parts: the ordered replay set, the consumer
stream's water marks (Pulsar's channel writability), permit clamping, the
consumer's ordered background work, the real batch size of an entry."""
from __future__ import annotations

import asyncio
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.ledger.batch_index import MAX_BATCH_SIZE
from broker.ledger.position import Position
from broker.service.consumer import MAX_PERMITS, Consumer, ConsumerWriter
from broker.service.dispatchers import ReplaySet, batch_size_of
from proto import broker_pb2 as pb
from proto import pulsar_api_pb2


# ---------------------------------------------------------------------------- replay set
POSITIONS = st.tuples(st.integers(0, 5), st.integers(0, 50)).map(lambda t: Position(*t))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("add"), POSITIONS), st.tuples(st.just("discard"), POSITIONS),
                          st.tuples(st.just("take"), st.integers(0, 8)), st.tuples(st.just("clear"))),
                max_size=80))
def test_replay_set_matches_a_sorted_set(ops):
    r, model = ReplaySet(), set()
    for op in ops:
        if op[0] == "add":
            r.add(op[1])
            model.add(op[1])
        elif op[0] == "discard":
            r.discard(op[1])
            model.discard(op[1])
        elif op[0] == "take":
            expected = sorted(model)[:op[1]]
            assert r.take(op[1]) == expected
            model.difference_update(expected)
        else:
            r.clear()
            model.clear()
        assert len(r) == len(model) and bool(r) == bool(model)
        assert list(r) == sorted(model)
        assert all(p in r for p in model)


def test_replay_set_takes_in_order_without_sorting_everything():
    """100,000 positions taken 100 at a time: O(n log n) in all (before: a full sort
    per read of 100, the 49 s wedge of issue 21)."""
    positions = [Position(random.randrange(1, 50), random.randrange(0, 1_000_000)) for _ in range(100_000)]
    started = time.perf_counter()
    r = ReplaySet(positions)
    out = []
    while r:
        out.extend(r.take(100))
    elapsed = time.perf_counter() - started
    assert out == sorted(set(positions))
    print(f"100k replay positions added and taken 100 at a time in {elapsed:.2f} s")
    assert elapsed < 10, elapsed


def test_replay_set_discard_compacts_the_heap():
    r = ReplaySet(Position(1, i) for i in range(1000))
    for i in range(990):
        r.discard(Position(1, i))
    assert len(r._heap) <= 2 * len(r) + 64
    assert r.take(100) == [Position(1, i) for i in range(990, 1000)]


# ---------------------------------------------------------------------------- writability
def _frame(nbytes: int) -> pb.ConsumerResponse:
    batch = pb.MessageBatch()
    batch.entries.add(position=pb.Position(ledger_id=1, entry_id=1), headers_and_payload=b"x" * nbytes)
    return pb.ConsumerResponse(messages=batch)


async def test_writer_water_marks_and_wakeup():
    w = ConsumerWriter(high_water=1000, low_water=300)
    woken = []
    consumer = Consumer("c", 0, w.send, writer=w)
    consumer.on_writable = lambda: woken.append(True)
    consumer.add_permits(10)
    assert consumer.writer is w and consumer.writable and consumer.available_permits() == 10
    w.send(_frame(600))
    assert w.writable and w.room() < 400
    w.send(_frame(600))                                 # over the high-water mark
    assert not w.writable and consumer.available_permits() == 0 and w.room() == 0
    w.send(pb.ConsumerResponse(success=pb.CommandSuccess(request_id=1)))   # answers still queue
    assert (await w.queue.get()).WhichOneof("response") == "messages"
    assert not w.writable and not woken                 # ~600 bytes left: above the low-water mark
    await w.queue.get()
    assert w.writable and woken == [True] and consumer.available_permits() == 10
    assert (await w.queue.get()).WhichOneof("response") == "success"
    assert w.buffered_bytes == 0


async def test_writer_discard_frees_frames_but_keeps_the_end_of_stream():
    w = ConsumerWriter(high_water=1000, low_water=300)
    for _ in range(5):
        w.send(_frame(500))
    w.close()
    assert not w.writable and w.queue.qsize() == 6
    assert w.discard() > 2500
    assert w.writable and w.buffered_bytes == 0
    assert await asyncio.wait_for(w.queue.get(), 1) is None


def test_writer_rejects_inverted_water_marks():
    with pytest.raises(ValueError):
        ConsumerWriter(high_water=100, low_water=200)


def test_permits_are_clamped():
    c = Consumer("c", 0, lambda r: None)
    c.add_permits(2**32 - 1)
    assert c.permits == MAX_PERMITS
    c.add_permits(2**32 - 1)
    assert c.permits == MAX_PERMITS
    c.add_permits(0)
    c.add_permits(-5)
    assert c.permits == MAX_PERMITS and c.writer is None and c.writable


async def test_ordered_work_runs_in_order_and_is_bounded():
    c = Consumer("c", 0, lambda r: None)
    ran = []

    def job(i):
        async def run():
            await asyncio.sleep(0)
            ran.append(i)
            if i == 2:
                raise RuntimeError("one bad command")
        return run

    accepted = [c.run_ordered(job(i)) for i in range(40)]
    assert c.ordered_busy()
    assert accepted.count(True) >= 16 and not accepted[-1]     # the queue is bounded
    await c.drain_ordered()
    assert ran == sorted(ran) and ran[:3] == [0, 1, 2] and len(ran) == accepted.count(True)
    assert not c.ordered_busy()


# ---------------------------------------------------------------------------- real batch size
def test_batch_size_of_is_bounded_by_the_entry():
    md = pulsar_api_pb2.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    assert batch_size_of(md, b"x" * 100) == 1
    md.num_messages_in_batch = 10
    assert batch_size_of(md, b"x" * 100) == 10
    md.num_messages_in_batch = 2**31 - 1                 # a producer's claim
    assert batch_size_of(md, b"x" * 100) == 100
    assert batch_size_of(md, b"x" * (MAX_BATCH_SIZE + 10)) == MAX_BATCH_SIZE
    md.num_messages_in_batch = 0
    assert batch_size_of(md, b"x") == 1
