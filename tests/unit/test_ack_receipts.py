"""AckReceipts (client/ack_receipts.py): an ``acknowledge_and_wait`` completes when
the flush that carried its ack is confirmed, whichever flush that was; it fails
on a non-retriable refusal and waits again after a retriable one or a broken
stream. Pure logic with asyncio futures, no I/O."""
from __future__ import annotations

import asyncio

import pytest

from client.ack_grouping import AcknowledgmentsGroupingTracker
from client.ack_receipts import CONFIRMED, PENDING, REFUSED, REQUEUE, AckReceipts
from client.errors import InvalidArgument, ServiceNotReady
from client.message_id import MessageId


@pytest.fixture
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def test_waiter_of_an_ack_taken_by_another_flush_waits_for_that_flush(loop):
    r = AckReceipts()
    w = loop.create_future()
    r.add_waiter(w)          # the call waits for the connection ...
    r.sent(1, [10])          # ... while the reconnection flushes its ack
    r.attach()
    r.attach()               # the call's own take finds nothing pending: still waits for flush 1
    assert not w.done()
    assert r.answered(10, None) == (1, CONFIRMED)
    assert w.done() and w.result() is None


def test_waiter_with_nothing_in_flight_is_done_at_once(loop):
    r = AckReceipts()
    w = loop.create_future()
    r.add_waiter(w)
    r.attach()
    assert w.done() and r.waiting() == 0


def test_waiter_waits_for_every_flush_in_flight_and_every_frame(loop):
    r = AckReceipts()
    r.sent(1, [10])
    w = loop.create_future()
    r.add_waiter(w)
    r.sent(2, [11, 12])
    r.attach()
    assert r.answered(11, None) == (2, PENDING)
    assert r.answered(12, None) == (2, CONFIRMED)
    assert not w.done()       # flush 1 (which may hold its ack) is still unanswered
    assert r.answered(10, None) == (1, CONFIRMED)
    assert w.done()


def test_non_retriable_refusal_fails_the_waiter(loop):
    r = AckReceipts()
    w = loop.create_future()
    r.add_waiter(w)
    r.sent(1, [10, 11])
    r.attach()
    assert r.answered(10, InvalidArgument("no such entry")) == (1, PENDING)
    assert r.answered(11, None) == (1, REFUSED)
    with pytest.raises(InvalidArgument):
        w.result()


def test_retriable_refusal_and_broken_stream_make_the_waiter_wait_for_the_next_flush(loop):
    r = AckReceipts()
    w = loop.create_future()
    r.add_waiter(w)
    r.sent(1, [10])
    r.attach()
    assert r.answered(10, ServiceNotReady("topic is being unloaded")) == (1, REQUEUE)
    assert not w.done()
    r.sent(2, [11])
    r.attach()
    r.connection_lost()
    assert r.answered(11, None) == (None, PENDING)   # an answer of the old stream is not an ack in flight
    assert not w.done()
    r.sent(3, [12])
    r.attach()
    assert r.answered(12, None) == (3, CONFIRMED)
    assert w.done() and w.result() is None


def test_close_fails_the_waiters(loop):
    r = AckReceipts()
    w = loop.create_future()
    r.add_waiter(w)
    r.sent(1, [10])
    r.attach()
    r.close(RuntimeError("closed"))
    with pytest.raises(RuntimeError):
        w.result()
    assert r.in_flight() == 0 and r.waiting() == 0


def test_cancelled_waiter_is_forgotten(loop):
    r = AckReceipts()
    w = loop.create_future()
    r.add_waiter(w)
    r.sent(1, [10])
    r.attach()
    w.cancel()
    assert r.answered(10, None) == (1, CONFIRMED)
    assert r.waiting() == 0


def test_tracker_requeue_makes_one_refused_flush_pending_again():
    t = AcknowledgmentsGroupingTracker(ack_group_time_ms=100, batch_index_ack_enabled=True)
    t.register_batch(1, 5, 4)
    t.add_individual(MessageId(1, 5, batch_index=1, batch_size=4), 0)
    t.add_individual(MessageId(1, 6), 0)
    token1, frames1 = t.flush_in_flight()
    t.add_individual(MessageId(1, 7), 0)
    token2, _ = t.flush_in_flight()
    assert not t.has_pending()
    assert t.requeue(token1, now_ms=1000)
    assert not t.requeue(token1, now_ms=1000)        # no longer in flight
    assert t.in_flight() == 1 and t.flush_due_ms() == 1100
    _, frames = t.flush_in_flight()
    assert [(p.ledger_id, p.entry_id, list(p.batch_indexes)) for p in frames[0].positions] == \
        [(p.ledger_id, p.entry_id, list(p.batch_indexes)) for p in frames1[0].positions]
    t.confirm(token2)
    assert t.is_duplicate(MessageId(1, 6))           # the requeued flush is in flight again
