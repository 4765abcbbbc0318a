"""PersistentTopic.addFailed, as pure bookkeeping: after a failed add the topic
refuses sends until every pending add completed, and only then rewinds
deduplication (pushed = persisted). A fake managed ledger whose add futures the
test completes by hand stands in for storage (no I/O in this unit)."""
from __future__ import annotations

import asyncio
import types

import pytest

from broker.ledger.managed_ledger import ManagedLedgerError
from broker.ledger.position import Position
from broker.service.errors import ServiceNotReady
from broker.service.topic import DUP_POSITION, PersistentTopic
from client.topic_name import TopicName
from proto import broker_pb2 as pb
from tests.geo import single_entry


class FakeManagedLedger:
    """add_entry_nowait hands out futures the test resolves or fails in any order."""

    def __init__(self):
        self.adds: list[asyncio.Future] = []
        self.cursors = {}

    def add_entry_nowait(self, data: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.adds.append(fut)
        return fut


def make_topic() -> tuple[PersistentTopic, FakeManagedLedger]:
    config = types.SimpleNamespace(broker_deduplication_entries_interval=1000, max_message_size=5 << 20,
                                   cluster_name="c")
    service = types.SimpleNamespace(config=config)
    ml = FakeManagedLedger()
    topic = PersistentTopic(service, TopicName.get("persistent://public/default/t"), ml, dedup_enabled=True)
    return topic, ml


def send(seq: int) -> pb.Send:
    return pb.Send(sequence_id=seq, highest_sequence_id=seq, num_messages=1,
                   headers_and_payload=single_entry("p", seq, b"m%d" % seq))


async def test_failed_add_fences_until_pending_adds_drain_then_rewinds():
    topic, ml = make_topic()
    producer = topic.add_producer("p")
    results = [topic.publish(producer, send(i)) for i in range(5)]      # seq 0..4 pending
    ml.adds[0].set_result(Position(1, 0))
    ml.adds[1].set_exception(ManagedLedgerError("bookies gone"))          # seq 1 failed
    await asyncio.sleep(0)
    assert topic.write_fenced
    with pytest.raises(ServiceNotReady):                                   # new sends refused meanwhile
        topic.publish(producer, send(1))
    ml.adds[2].set_result(Position(1, 1))                                 # seq 2..4 still land
    ml.adds[3].set_result(Position(1, 2))
    await asyncio.sleep(0)
    assert topic.write_fenced                                             # seq 4 still pending
    ml.adds[4].set_exception(ManagedLedgerError("bookies gone"))
    await asyncio.sleep(0)
    assert not topic.write_fenced                                         # drained: rewound, open again
    assert topic.dedup.highest_sequenced_pushed["p"] == 3
    assert (await results[2]) == Position(1, 1)
    with pytest.raises(ServiceNotReady):
        await results[1]
    # The client resends from the failed one on: seq 2 and 3 are duplicates (stored), 4 is new.
    dup = topic.publish(producer, send(2))
    assert (await dup) == DUP_POSITION
    again = topic.publish(producer, send(4))
    ml.adds[-1].set_result(Position(2, 0))
    assert (await again) == Position(2, 0)


async def test_rewinding_at_once_would_have_duplicated():
    """The old rule (rewind at the failure) accepted a resend of a still-pending later
    sequence id as new; the fence refuses it until the pending add is decided."""
    topic, ml = make_topic()
    producer = topic.add_producer("p")
    topic.publish(producer, send(0))
    topic.publish(producer, send(1))
    ml.adds[0].set_exception(ManagedLedgerError("ledger failed"))
    await asyncio.sleep(0)
    with pytest.raises(ServiceNotReady):
        topic.publish(producer, send(1))                 # seq 1 is still in flight: not accepted twice
    ml.adds[1].set_result(Position(1, 0))
    await asyncio.sleep(0)
    assert (await topic.publish(producer, send(1))) == DUP_POSITION
