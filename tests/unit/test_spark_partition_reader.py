"""Where a range read stops (client.spark.partition_reader._RangeRead), with a
fake Reader and admin: end of a batch entry, entries past the end, redelivered
duplicates, trailing markers (never delivered: the subscription's mark-delete
position tells), and a read that gets nothing."""
from __future__ import annotations

import asyncio

import pytest

from client.errors import Timeout
from client.message import Message
from client.message_id import MessageId
from client.spark.offsets import EARLIEST, Position, TopicPartition
from client.spark.options import SourceError
from client.spark.partition_reader import PartitionRange, _RangeRead

TOPIC = "persistent://public/default/t"


def msg(ledger, entry, batch_index=-1, batch_size=0, value=None):
    mid = MessageId(ledger, entry, -1, batch_index, batch_size)
    return Message(value or f"{ledger}:{entry}:{batch_index}".encode(), mid, TOPIC, partition_key="k",
                   publish_time=1000, event_time=0, producer_name="p")


class FakeReader:
    def __init__(self, messages):
        self.messages = list(messages)

    async def read_next(self, timeout_millis=None):
        if self.messages:
            return self.messages.pop(0)
        await asyncio.sleep(timeout_millis / 1000)
        raise Timeout("no message")

    def subscription_name(self):
        return "reader-x"


class FakeAdmin:
    def __init__(self, mark_deletes):
        self.mark_deletes = list(mark_deletes)
        self.calls = 0

    async def get_stats(self, topic):
        self.calls += 1
        position = self.mark_deletes.pop(0) if len(self.mark_deletes) > 1 else self.mark_deletes[0]
        return {"subscriptions": {"reader-x": {"markDeletePosition": position}}}


def read_all(messages, start=EARLIEST, end=Position(1, 2), mark_deletes=("-1:-1",), read_timeout_ms=2000):
    part = PartitionRange("minipulsar://127.0.0.1:1", TopicPartition(TOPIC, -1), start, end, poll_timeout_ms=20,
                          read_timeout_ms=read_timeout_ms)
    state = _RangeRead(part)
    state.reader, state.admin = FakeReader(messages), FakeAdmin(mark_deletes)

    async def go():
        values = []
        while not state.done:
            cols = await state.next_columns(3)
            values.extend(cols.value)
        return values
    return asyncio.run(go()), state


def test_stops_after_the_last_message_of_the_end_entry():
    batch = [msg(1, 2, i, 3) for i in range(3)]
    values, state = read_all([msg(1, 0), msg(1, 1)] + batch + [msg(1, 3)])
    assert values == [b"1:0:-1", b"1:1:-1", b"1:2:0", b"1:2:1", b"1:2:2"]
    assert state.admin.calls == 0           # no idle check needed


def test_an_entry_past_the_end_stops_the_read():
    values, state = read_all([msg(1, 0), msg(1, 5)], end=Position(1, 3))
    assert values == [b"1:0:-1"] and state.done


def test_redelivered_messages_are_returned_once():
    values, _ = read_all([msg(1, 0), msg(1, 1, 0, 2), msg(1, 0), msg(1, 1, 0, 2), msg(1, 1, 1, 2), msg(1, 2)])
    assert values == [b"1:0:-1", b"1:1:0", b"1:1:1", b"1:2:-1"]


def test_trailing_markers_end_the_read_by_mark_delete_position():
    # entries 1:1 and 1:2 are markers: nothing more arrives; the broker acked them
    values, state = read_all([msg(1, 0)], mark_deletes=["1:0", "1:0", "1:2"])
    assert values == [b"1:0:-1"] and state.done
    assert state.admin.calls == 3


def test_nothing_arriving_fails_naming_the_option():
    with pytest.raises(SourceError, match="option 'readTimeoutMs'"):
        read_all([msg(1, 0)], mark_deletes=["1:0"], read_timeout_ms=100)


def test_empty_range_reads_nothing():
    values, state = read_all([msg(1, 0)], start=Position(1, 2), end=Position(1, 2))
    assert values == [] and state.done
