"""Unit tests of broker.service.consumer's bookkeeping (Pulsar's Consumer):
permits, pending acks and unacked counts, blocking on unacked messages, the
MessageBatch frames it sends (epoch, redelivery counts, ack sets), active
changes, and the ConsumerWriter's byte accounting. No processes: the stream is
a list or a real ConsumerWriter."""
from __future__ import annotations

import pytest

from broker.ledger.position import Position
from broker.service.consumer import (OUTBOUND_HIGH_WATER_BYTES, OUTBOUND_LOW_WATER_BYTES, Consumer,
                                     ConsumerWriter, DispatchItem)
from proto import broker_pb2 as pb

P = Position


def make(max_unacked: int = 0):
    frames: list[pb.ConsumerResponse] = []
    return Consumer("c", 0, frames.append, max_unacked_messages=max_unacked), frames


def item(entry: int, n: int = 1, data: bytes = b"payload", ledger: int = 1) -> DispatchItem:
    return DispatchItem(P(ledger, entry), data, n, b"")


def push(c: Consumer, *items: DispatchItem, counts=None, ack_sets=None) -> None:
    c.send_entries(list(items), counts or {}, (ack_sets or {}).get)


def test_consumer_ids_are_unique_and_defaults():
    a, _ = make()
    b, _ = make()
    assert b.consumer_id > a.consumer_id
    assert (a.permits, a.unacked_messages, a.epoch, a.is_active, a.closed) == (0, 0, 0, False, False)
    assert a.available_permits() == 0


def test_send_entries_spends_permits_and_tracks_pending_acks():
    c, frames = make()
    c.add_permits(10)
    push(c, item(0, 1, b"abc"), item(1, 4, b"defgh"))
    assert c.permits == 5 and c.available_permits() == 5
    assert c.pending_acks == {P(1, 0): 1, P(1, 1): 4}
    assert c.unacked_messages == 5
    assert (c.msg_out_counter, c.bytes_out_counter) == (5, 8)
    assert len(frames) == 1
    batch = frames[0].messages
    assert [(m.position.ledger_id, m.position.entry_id, m.headers_and_payload) for m in batch.entries] == [
        (1, 0, b"abc"), (1, 1, b"defgh")]
    assert batch.consumer_epoch == 0            # epoch 0: not set


def test_permits_can_go_negative_and_then_none_are_available():
    c, _ = make()
    c.add_permits(2)
    push(c, item(0, 5))                        # a batch bigger than the permits left
    assert c.permits == -3 and c.available_permits() == 0
    c.add_permits(4)
    assert c.permits == 1 and c.available_permits() == 1


def test_a_position_sent_twice_is_counted_once_as_unacked():
    c, _ = make()
    push(c, item(0, 3))
    push(c, item(0, 3))                        # redelivered to the same consumer
    assert c.unacked_messages == 3 and c.pending_acks == {P(1, 0): 3}
    assert c.msg_out_counter == 6              # but delivered twice


def test_acked_and_acked_up_to():
    c, _ = make()
    push(c, item(0, 2), item(1, 1), item(2, 3), item(0, 1, ledger=2))
    assert c.unacked_messages == 7
    c.acked(P(1, 1))
    c.acked(P(1, 1))                           # again: ignored
    c.acked(P(9, 9))                           # never sent: ignored
    assert c.unacked_messages == 6 and P(1, 1) not in c.pending_acks
    c.acked_up_to(P(1, 2))                     # inclusive, across the pending positions <= it
    assert c.pending_acks == {P(2, 0): 1} and c.unacked_messages == 1
    c.acked_up_to(P(1, 99))                    # nothing pending below: nothing changes
    assert c.unacked_messages == 1


def test_take_pending_forgets_everything_in_order():
    c, _ = make()
    push(c, item(5), item(3), item(4))
    assert c.take_pending() == [P(1, 5), P(1, 3), P(1, 4)]
    assert c.pending_acks == {} and c.unacked_messages == 0
    assert c.take_pending() == []


def test_blocked_on_unacked_messages():
    c, _ = make(max_unacked=3)
    c.add_permits(100)
    push(c, item(0, 2))
    assert not c.blocked and c.available_permits() == 98
    push(c, item(1, 1))
    assert c.blocked and c.available_permits() == 0      # 3 unacked >= 3
    c.acked(P(1, 0))
    assert not c.blocked and c.available_permits() == 97
    unlimited, _ = make(max_unacked=0)
    push(unlimited, *(item(i, 1000) for i in range(10)))
    assert not unlimited.blocked


def test_closed_consumer_has_no_permits_and_disconnect_calls_back():
    c, _ = make()
    c.add_permits(5)
    ended = []
    c.on_disconnect = lambda: ended.append(True)
    c.disconnect()
    assert c.closed and ended == [True] and c.available_permits() == 0 and c.permits == 5


def test_epoch_only_rises_and_is_carried_by_later_frames():
    c, frames = make()
    c.set_epoch(3)
    c.set_epoch(2)
    assert c.epoch == 3
    push(c, item(0))
    assert frames[-1].messages.consumer_epoch == 3


def test_frames_carry_redelivery_counts_and_ack_sets():
    c, frames = make()
    push(c, item(0), item(1), counts={P(1, 1): 2}, ack_sets={P(1, 0): [5]})
    first, second = frames[0].messages.entries
    assert (first.redelivery_count, list(first.ack_set)) == (0, [5])
    assert (second.redelivery_count, list(second.ack_set)) == (2, [])


def test_notify_active_sends_only_changes():
    c, frames = make()
    c.notify_active(False)                     # already inactive: nothing sent
    c.notify_active(True)
    c.notify_active(True)
    c.notify_active(False)
    assert [f.active_change.is_active for f in frames] == [True, False]
    assert not c.is_active


def test_on_writable_is_not_called_for_a_closed_consumer():
    w = ConsumerWriter(high_water=10, low_water=0)
    c = Consumer("c", 0, w.send, writer=w)
    woken = []
    c.on_writable = lambda: woken.append(True)
    w.send(pb.ConsumerResponse(success=pb.CommandSuccess(request_id=1)))   # ~4 bytes: still writable
    assert w.writable
    w.writable = False                          # as if it went over the mark
    c.closed = True
    w._taken(w.buffered_bytes)
    assert w.writable and woken == []


# ---------------------------------------------------------------------------- ConsumerWriter
def test_writer_defaults_and_byte_accounting():
    w = ConsumerWriter()
    assert (w.high_water, w.low_water) == (OUTBOUND_HIGH_WATER_BYTES, OUTBOUND_LOW_WATER_BYTES)
    assert OUTBOUND_LOW_WATER_BYTES <= OUTBOUND_HIGH_WATER_BYTES
    frame = pb.ConsumerResponse(success=pb.CommandSuccess(request_id=123456))
    size = frame.ByteSize()
    w.send(frame)
    w.send(frame)
    assert w.buffered_bytes == 2 * size and w.queue.qsize() == 2 and not w.queue.empty()
    assert w.room() == OUTBOUND_HIGH_WATER_BYTES - 2 * size


async def test_writer_exactly_at_the_high_water_mark_is_still_writable():
    frame = pb.ConsumerResponse(success=pb.CommandSuccess(request_id=1))
    size = frame.ByteSize()
    w = ConsumerWriter(high_water=2 * size, low_water=size)
    w.send(frame)
    w.send(frame)
    assert w.writable and w.room() == 0          # at the mark: over means >
    w.send(frame)
    assert not w.writable
    await w.queue.get()                          # 2 * size left: above low water
    assert not w.writable
    await w.queue.get()                          # size left: at low water, writable again
    assert w.writable and w.buffered_bytes == size


async def test_close_queues_end_of_stream_after_the_frames():
    w = ConsumerWriter()
    frame = pb.ConsumerResponse(success=pb.CommandSuccess(request_id=1))
    w.send(frame)
    w.close()
    assert await w.queue.get() == frame
    assert await w.queue.get() is None
    assert w.queue.empty() and w.buffered_bytes == 0


@pytest.mark.parametrize("high,low", [(10, -1), (5, 6)])
def test_writer_water_mark_order(high, low):
    with pytest.raises(ValueError, match="water marks"):
        ConsumerWriter(high_water=high, low_water=low)
