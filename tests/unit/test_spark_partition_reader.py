"""Where a range read stops (client.spark.partition_reader._RangeRead), with a
fake Reader that pushes entries to the read's RangeProgress as the real
entry splitter does: end of a batch entry, entries past the end, redelivered
duplicates, trailing markers (never pushed: the reader's own position and the
topic's last dispatchable entry tell), chunked messages across the end,
entries deleted before being read, and a read that gets nothing."""
from __future__ import annotations

import asyncio

import pytest

from client.errors import Timeout
from client.message import Message
from client.message_id import ChunkMessageId, MessageId
from client.spark.offsets import EARLIEST, LedgerInfo, Position, TopicPartition
from client.spark.options import SourceError
from client.spark.partition_reader import PartitionRange, _RangeRead
from client.spark.progress import RangeProgress

TOPIC = "persistent://public/default/t"


def msg(ledger, entry, batch_index=-1, batch_size=0, value=None):
    mid = MessageId(ledger, entry, -1, batch_index, batch_size)
    return Message(value or f"{ledger}:{entry}:{batch_index}".encode(), mid, TOPIC, partition_key="k",
                   publish_time=1000, event_time=0, producer_name="p")


def chunked(first, last, value=b"chunked"):
    """A completed chunked message whose chunks are the entries ``first``..``last`` of ledger 1."""
    ids = tuple(MessageId(1, e) for e in range(first, last + 1))
    mid = ChunkMessageId(1, last, -1, first_chunk_message_id=ids[0], chunk_message_ids=ids)
    return Message(value, mid, TOPIC, publish_time=1000, event_time=0, producer_name="c", chunk_ids=ids)


class Push:
    """One entry the broker pushes: its position, the messages it yields and
    whether it is the first chunk of a chunked message."""

    def __init__(self, entry, messages=(), first_chunk=False):
        self.position = Position(1, entry)
        self.messages = list(messages)
        self.first_chunk = first_chunk


class FakeReader:
    """Pushes one entry at a time into the progress when its queue is empty."""

    def __init__(self, pushes, progress):
        self.pushes = list(pushes)
        self.progress = progress
        self.queue = []

    def _push(self):
        push = self.pushes.pop(0)
        self.progress.on_entry(push.position, push.first_chunk)
        for m in push.messages:
            first = m._chunk_ids[0] if m._chunk_ids else m.message_id()
            if m._chunk_ids:
                self.progress.on_chunked_complete(Position(first.ledger_id, first.entry_id))
            self.progress.on_message(Position(first.ledger_id, first.entry_id))
        self.queue.extend(push.messages)

    async def read_next(self, timeout_millis=None):
        while not self.queue and self.pushes:
            self._push()
        if self.queue:
            return self.queue.pop(0)
        await asyncio.sleep(timeout_millis / 1000)
        raise Timeout("no message")


class FakeClient:
    def __init__(self, last_dispatchable):
        self.last = last_dispatchable
        self.calls = 0

    async def get_last_message_id(self, topic):
        self.calls += 1
        return MessageId(1, self.last)


class FakeAdmin:
    def __init__(self, ledgers):
        self.ledgers = ledgers

    async def get_internal_stats(self, topic):
        return {"ledgers": [{"ledgerId": lid, "entries": 100} for lid in self.ledgers]}


def read_all(pushes, start=EARLIEST, end=Position(1, 2), last_dispatchable=99, read_timeout_ms=2000,
             plan=(), ledgers=(1,), fail_on_data_loss=True):
    part = PartitionRange("minipulsar://127.0.0.1:1", TopicPartition(TOPIC, -1), start, end, poll_timeout_ms=20,
                          read_timeout_ms=read_timeout_ms, ledgers=tuple(plan), fail_on_data_loss=fail_on_data_loss)
    state = _RangeRead(part)
    state.reader = FakeReader(pushes, state.progress)
    state.client, state.admin = FakeClient(last_dispatchable), FakeAdmin(ledgers)

    async def go():
        values = []
        while not state.done:
            cols = await state.next_columns(3)
            values.extend(cols.value)
        return values
    return asyncio.run(go()), state


def test_stops_after_the_last_message_of_the_end_entry():
    batch = [msg(1, 2, i, 3) for i in range(3)]
    values, state = read_all([Push(0, [msg(1, 0)]), Push(1, [msg(1, 1)]), Push(2, batch), Push(3, [msg(1, 3)])])
    assert values == [b"1:0:-1", b"1:1:-1", b"1:2:0", b"1:2:1", b"1:2:2"]
    assert state.client.calls == 0           # no idle check needed


def test_an_entry_past_the_end_stops_the_read():
    values, state = read_all([Push(0, [msg(1, 0)]), Push(5, [msg(1, 5)])], end=Position(1, 3))
    assert values == [b"1:0:-1"] and state.done


def test_redelivered_messages_are_returned_once():
    pushes = [Push(0, [msg(1, 0)]), Push(1, [msg(1, 1, 0, 2)]), Push(0, [msg(1, 0)]),
              Push(1, [msg(1, 1, 0, 2), msg(1, 1, 1, 2)]), Push(2, [msg(1, 2)])]
    values, _ = read_all(pushes)
    assert values == [b"1:0:-1", b"1:1:0", b"1:1:1", b"1:2:-1"]


def test_trailing_markers_end_the_read_by_the_readers_own_position():
    # entries 1:1 and 1:2 are markers, never pushed; the last dispatchable entry is 1:0
    values, state = read_all([Push(0, [msg(1, 0)])], last_dispatchable=0, plan=[LedgerInfo(1, 3)])
    assert values == [b"1:0:-1"] and state.done and state.lost == 0


def test_leftover_chunks_at_the_tail_end_the_read():
    # 1:1 and 1:2 are later chunks of a message whose first chunk precedes the range: nothing is delivered
    values, state = read_all([Push(1), Push(2)], start=Position(1, 0), end=Position(1, 2), last_dispatchable=2)
    assert values == [] and state.done and state.client.calls == 0


def test_a_chunked_message_begun_at_the_end_is_read_past_it_and_others_are_not():
    # chunks at 1:1, 1:3, 1:4; another producer's message at 1:2; the range ends at the first chunk
    pushes = [Push(0, [msg(1, 0)]), Push(1, first_chunk=True), Push(2, [msg(1, 2)]), Push(3), Push(4, [chunked(1, 4)])]
    values, _ = read_all(pushes, end=Position(1, 1))
    assert values == [b"1:0:-1", b"chunked"]
    # the next range gets the other producer's message, not the chunked one
    pushes = [Push(2, [msg(1, 2)]), Push(3), Push(4)]
    values, _ = read_all(pushes, start=Position(1, 1), end=Position(1, 4), last_dispatchable=4)
    assert values == [b"1:2:-1"]


def test_entries_of_a_deleted_ledger_fail_the_read_or_are_counted():
    # planned: ledger 1 (entries 0..2) and ledger 2; 1:1-2 never come, the next entry pushed is 2:0
    plan = [LedgerInfo(1, 3), LedgerInfo(2, 5)]

    def pushes():
        return [Push(0, [msg(1, 0)]), _push_in(2, 0, [msg(2, 0)])]
    with pytest.raises(SourceError, match="option 'failOnDataLoss'.* 2 entries"):
        read_all(pushes(), end=Position(2, 0), plan=plan, ledgers=(2,))
    values, state = read_all(pushes(), end=Position(2, 0), plan=plan, ledgers=(2,), fail_on_data_loss=False)
    assert values == [b"1:0:-1", b"2:0:-1"] and state.lost == 2
    # the same gap with ledger 1 still there: markers, nothing lost
    values, state = read_all(pushes(), end=Position(2, 0), plan=plan, ledgers=(1, 2))
    assert values == [b"1:0:-1", b"2:0:-1"] and state.lost == 0


def _push_in(ledger, entry, messages):
    push = Push(entry, messages)
    push.position = Position(ledger, entry)
    return push


def test_nothing_arriving_fails_naming_the_option():
    with pytest.raises(SourceError, match="option 'readTimeoutMs'"):
        read_all([Push(0, [msg(1, 0)])], last_dispatchable=2, read_timeout_ms=100)


def test_empty_range_reads_nothing():
    values, state = read_all([Push(0, [msg(1, 0)])], start=Position(1, 2), end=Position(1, 2))
    assert values == [] and state.done


def test_range_progress_reconnection_keeps_pending_chunks_and_rewinds_to_what_was_handed_out():
    p = RangeProgress(Position(1, 0), Position(1, 5))
    p.on_entry(Position(1, 4), first_chunk=True)
    p.on_entry(Position(1, 5))
    p.on_entry(Position(1, 6))
    p.on_message(Position(1, 3))
    p.on_consumed(1, 3)
    p.on_message(Position(1, 5))          # queued, dropped by the reconnection
    assert p.highest == Position(1, 6) and p.pending == {Position(1, 4)} and p.queued == 1
    p.on_reset()
    assert p.highest == Position(1, 3) and p.pending == {Position(1, 4)} and p.queued == 0
    assert not p.complete()
    p.on_entry(Position(1, 5))
    p.on_message(Position(1, 5))          # sent again
    p.on_entry(Position(1, 6))
    p.on_chunked_complete(Position(1, 4))
    p.on_message(Position(1, 4))
    assert not p.complete()                # two of the range's messages wait in the queue
    p.on_consumed(1, 5)
    p.on_consumed(1, 6, first_entry=Position(1, 4))
    assert p.complete()


def test_messages_past_the_end_waiting_in_the_queue_do_not_hold_the_range():
    p = RangeProgress(Position(1, 0), Position(1, 2))
    p.on_entry(Position(1, 2))
    p.on_message(Position(1, 2))
    for e in range(3, 1000):            # a busy topic: the queue never empties
        p.on_entry(Position(1, e))
        p.on_message(Position(1, e))
    assert not p.complete()
    p.on_consumed(1, 2)
    assert p.complete()


def test_range_progress_counts_missing_entries_only_where_a_ledger_may_be_gone():
    plan = [LedgerInfo(5, 10), LedgerInfo(7, 10), LedgerInfo(9, 10)]
    p = RangeProgress(Position(5, 7), Position(9, 3), plan)
    p.on_entry(Position(7, 2))          # 5:8-9 missing (after the start, other ledger); 7:0-1 before a received entry
    assert p.suspects == {5: 2}
    p.suspects.clear()
    p.on_entry(Position(7, 5))          # 7:3-4: markers
    assert p.suspects == {}
    p.finish_at_tail()                  # 7:6-9 and 9:0-3 never came
    assert p.suspects == {7: 4, 9: 4} and p.pushed_to_end()
