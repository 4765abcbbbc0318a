"""Unit tests of broker.service.seek.find_position_by_publish_time (Pulsar's
PersistentMessageFinder) over a fake managed ledger of several ledgers: the
first entry published at/after a timestamp, O(log n) reads, empty ledgers
skipped, corrupt entries read as time 0, past the end -> the next position."""
from __future__ import annotations

import pytest

from broker.ledger.position import Entry, Position
from broker.service.seek import find_position_by_publish_time
from proto import pulsar_api_pb2
from proto.entry_format import encode_entry

P = Position


class FakeML:
    """Ledgers with entries of the given publish times (ms; -1: a corrupt entry).
    Both the ledger walk (``ledgers`` / ``ledger_entries``) and the index view
    (``number_of_entries`` / ``position_at_index``) of ManagedLedger."""

    def __init__(self, times: dict[int, list[int]]):
        self.data: dict[Position, bytes] = {}
        for lid, ts in times.items():
            for eid, t in enumerate(ts):
                if t < 0:
                    self.data[P(lid, eid)] = b"\x00corrupt"
                    continue
                md = pulsar_api_pb2.MessageMetadata(producer_name="p", sequence_id=eid, publish_time=t)
                self.data[P(lid, eid)] = encode_entry(md, b"x")
        self.ledgers = {lid: None for lid in times}
        self.counts = {lid: len(ts) for lid, ts in times.items()}
        self.reads: list[Position] = []
        last = max(p for p in self.data)
        self.last_confirmed = last

    def ledger_entries(self, lid: int) -> int:
        return self.counts[lid]

    @property
    def number_of_entries(self) -> int:
        return sum(self.counts.values())

    def position_at_index(self, index: int) -> Position:
        for lid in sorted(self.counts):
            if index < self.counts[lid]:
                return P(lid, index)
            index -= self.counts[lid]
        raise IndexError(index)

    async def read_entries(self, pos: Position, n: int):
        self.reads.append(pos)
        return [Entry(pos, self.data[pos])]

    def next_position(self, pos: Position) -> Position:
        return P(pos.ledger_id, pos.entry_id + 1)


TIMES = {7: [500, 600, 700], 3: [100, 200, 200, 300], 5: []}


@pytest.mark.parametrize("ts,expected", [(0, P(3, 0)), (100, P(3, 0)), (101, P(3, 1)), (200, P(3, 1)),
                                         (201, P(3, 3)), (300, P(3, 3)), (301, P(7, 0)), (650, P(7, 2)),
                                         (700, P(7, 2)), (701, P(7, 3)), (10**15, P(7, 3))])
async def test_first_position_at_or_after(ts, expected):
    ml = FakeML(TIMES)
    assert await find_position_by_publish_time(ml, ts) == expected
    assert len(ml.reads) <= 3                          # ceil(log2(7)) binary-search reads


async def test_corrupt_entries_count_as_time_zero():
    ml = FakeML({1: [100, -1, 300]})                     # 1:1 unreadable metadata
    assert await find_position_by_publish_time(ml, 150) == P(1, 2)


async def test_many_entries_take_logarithmic_reads():
    ml = FakeML({1: list(range(0, 10_000, 10)), 2: list(range(10_000, 20_000, 10))})
    assert await find_position_by_publish_time(ml, 12_345) == P(2, 235)
    assert len(ml.reads) <= 11
