"""Consumer delivery rules without a broker: acks in flight across reconnects
(AcknowledgmentsGroupingTracker), chunked message ids (ChunkMessageIdImpl),
the PIP-84 consumer epoch, redeliveries on Exclusive (redeliver-all), dropped
chunks (ack-timeout tracking), the Reader's restart point after a
disconnection (clearReceiverQueue) and the dead-letter count, against the
scripted fake stream of test_client_consumer_stream."""
from __future__ import annotations

import asyncio
import time

import grpc

from client.ack_grouping import AcknowledgmentsGroupingTracker
from client.batching import PendingMessage, message_metadata
from client.chunking import chunk_message
from client.consumer import ConsumerType, DeadLetterPolicy, create_consumer
from client.consumer_config import ConsumerConfig
from client.consumer_impl import ConsumerImpl
from client.entry_format import encode_entry
from client.entry_splitter import EntrySplitter
from client.message import TopicChunkMessageId
from client.message_id import ChunkMessageId, MessageId, chunk_message_ids
from proto import broker_pb2 as pb
from tests.unit.test_client_consumer_stream import TOPIC, FakeCall, FakeClient, entry, until


def ack_keys(frames):
    return [(f.ack_type, [(p.ledger_id, p.entry_id, list(p.batch_indexes)) for p in f.positions]) for f in frames]


# ---------------------------------------------------------------- tracker: acks in flight
def test_flushed_acks_stay_in_flight_until_confirmed():
    t = AcknowledgmentsGroupingTracker(100)
    t.add_individual(MessageId(1, 1), 0)
    t.add_individual(MessageId(1, 2), 0)
    token, frames = t.flush_in_flight()
    assert token and ack_keys(frames) == [(pb.Individual, [(1, 1, []), (1, 2, [])])]
    assert not t.has_pending() and t.in_flight() == 1
    assert t.is_duplicate(MessageId(1, 1)) and t.first_new_batch_index(1, 2) == 1 << 40  # still filters
    t.confirm(token)
    assert t.in_flight() == 0 and not t.is_duplicate(MessageId(1, 1))


def test_requeue_in_flight_makes_acks_pending_again():
    t = AcknowledgmentsGroupingTracker(100)
    t.add_individual(MessageId(1, 1), 0)
    t.add_cumulative(MessageId(1, 0), 0)
    _, first = t.flush_in_flight()
    t.add_individual(MessageId(1, 5), 0)
    _, second = t.flush_in_flight()
    assert t.in_flight() == 2
    assert t.requeue_in_flight(now_ms=7)
    assert t.in_flight() == 0 and t.has_pending() and t.flush_due_ms() == 107
    token, frames = t.flush_in_flight()
    assert ack_keys(frames) == [(pb.Cumulative, [(1, 0, [])]), (pb.Individual, [(1, 1, []), (1, 5, [])])]


def test_batch_index_acks_in_flight_filter_a_redelivered_batch():
    t = AcknowledgmentsGroupingTracker(100, batch_index_ack_enabled=True)
    t.register_batch(1, 3, 4)
    t.add_individual(MessageId(1, 3, -1, 0, 4), 0)
    t.add_individual(MessageId(1, 3, -1, 2, 4), 0)
    _, frames = t.flush_in_flight()
    assert ack_keys(frames) == [(pb.Individual, [(1, 3, [0, 2])])]
    # the broker redelivers the entry before it applied the acks: the new acker keeps them
    assert t.register_batch(1, 3, 4).unacked_mask == 0b1010
    t.requeue_in_flight()
    assert ack_keys(t.flush()) == [(pb.Individual, [(1, 3, [0, 2])])]


def test_clear_forgets_acks_in_flight():
    t = AcknowledgmentsGroupingTracker(100)
    t.add_individual(MessageId(1, 1), 0)
    t.flush_in_flight()
    t.clear()
    assert t.in_flight() == 0 and not t.requeue_in_flight()


# ---------------------------------------------------------------- chunked message ids
def chunked_entries(payload: bytes, first_entry: int, chunk_size: int = 100):
    md = message_metadata(PendingMessage(payload, 7), "prod", int(time.time() * 1000))
    return [pb.EntryMessage(position=pb.Position(ledger_id=1, entry_id=first_entry + i),
                            headers_and_payload=encode_entry(cmd, data))
            for i, (cmd, data) in enumerate(chunk_message(md, payload, chunk_size))]


def test_chunked_message_id_carries_every_chunk():
    s = EntrySplitter(TOPIC)
    entries = chunked_entries(b"x" * 250, 10)
    msgs = [m for e in entries for m in s.split(e, 0).messages]
    (m,) = msgs
    mid = m.message_id()
    assert isinstance(mid, ChunkMessageId)
    assert mid == MessageId(1, 12) and hash(mid) == hash(MessageId(1, 12))
    assert mid.first_chunk_message_id == MessageId(1, 10) and mid.last_chunk_message_id == MessageId(1, 12)
    assert chunk_message_ids(mid) == (MessageId(1, 10), MessageId(1, 11), MessageId(1, 12))
    assert mid.serialize() == MessageId(1, 12).serialize()
    assert chunk_message_ids(MessageId(1, 12)) == ()


def test_multi_topic_chunked_message_id_keeps_the_topic():
    s = EntrySplitter(TOPIC, 2, topic_in_ids=True)
    (m,) = [m for e in chunked_entries(b"y" * 150, 0) for m in s.split(e, 0).messages]
    mid = m.message_id()
    assert isinstance(mid, TopicChunkMessageId) and mid.topic == TOPIC and mid.partition == 2
    assert [c.entry_id for c in mid.chunk_message_ids] == [0, 1]


async def test_ack_by_chunked_message_id_acks_every_chunk():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", consumer_type=ConsumerType.Shared, ack_group_time_ms=0)
    call = client.stub.calls[0]
    call.push(*chunked_entries(b"z" * 250, 4))
    mid = (await c.receive(1000)).message_id()
    c.acknowledge(mid)  # the id, not the message
    await until(lambda: call.of("ack"))
    assert sorted(p.entry_id for p in call.of("ack")[0].positions) == [4, 5, 6]
    await c.close()


# ---------------------------------------------------------------- consumer epoch (PIP-84)
async def test_redeliver_all_on_exclusive_starts_a_new_epoch_and_drops_stale_frames():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", negative_ack_redelivery_delay_ms=20, receiver_queue_size=4)
    call = client.stub.calls[0]
    call.push(entry(b"a", 0), entry(b"b", 1))
    c.negative_acknowledge(await c.receive(1000))
    await until(lambda: call.of("redeliver"))
    (redeliver,) = call.of("redeliver")
    assert list(redeliver.positions) == [] and redeliver.consumer_epoch == 1
    assert len(c._queue) == 0  # b dropped with the queue
    # frames the broker pushed before it saw the redeliver: dropped, their permits given back
    call.push(entry(b"c", 2), entry(b"d", 3))
    fresh = pb.ConsumerResponse(messages=pb.MessageBatch(entries=[entry(b"a", 0, redelivery=1)], consumer_epoch=1))
    call.responses.put_nowait(fresh)
    m = await c.receive(1000)
    assert (m.data(), m.redelivery_count()) == (b"a", 1)
    await until(lambda: sum(f.permits for f in call.of("flow")) >= 4 + 2)  # a, b (cleared) + c, d (stale)
    assert len(c._queue) == 0
    await c.close()


async def test_shared_redelivery_keeps_epoch_zero():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", consumer_type=ConsumerType.Shared,
                              negative_ack_redelivery_delay_ms=20)
    call = client.stub.calls[0]
    call.push(entry(b"a", 0))
    c.negative_acknowledge(await c.receive(1000))
    await until(lambda: call.of("redeliver"))
    assert [p.entry_id for p in call.of("redeliver")[0].positions] == [0]
    assert call.of("redeliver")[0].consumer_epoch == 0
    call.push(entry(b"a", 0, redelivery=1))
    assert (await c.receive(1000)).data() == b"a"
    await c.close()


async def test_a_new_stream_starts_at_epoch_zero():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", negative_ack_redelivery_delay_ms=20)
    first = client.stub.calls[0]
    first.push(entry(b"a", 0))
    c.negative_acknowledge(await c.receive(1000))
    await until(lambda: first.of("redeliver"))
    first.responses.put_nowait(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "gone"))
    await until(lambda: len(client.stub.calls) == 2 and client.stub.calls[1].of("flow"))
    client.stub.calls[1].push(entry(b"a", 0, redelivery=1))  # epoch 0 on the new stream
    assert (await c.receive(1000)).data() == b"a"
    await c.close()


# ---------------------------------------------------------------- redeliveries on Exclusive
async def test_dropped_chunks_are_tracked_for_the_ack_timeout_not_redelivered_at_once():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", unacked_messages_timeout_ms=1000)
    call = client.stub.calls[0]
    entries = chunked_entries(b"q" * 250, 0)
    call.push(*entries[1:])  # no first chunk: dropped
    call.push(entry(b"after", 3))
    assert (await c.receive(1000)).data() == b"after"
    await asyncio.sleep(0.1)
    assert call.of("redeliver") == []
    assert MessageId(1, 1) in c._impl.unacked and MessageId(1, 2) in c._impl.unacked
    await c.close()


async def test_failed_dead_letter_publish_is_redelivered_after_the_nack_delay():
    client = FakeClient()

    class FailingProducer:
        topic = "dlq"

        async def send(self, *a, **kw):
            raise RuntimeError("no DLQ")

        async def close(self):
            pass

    async def create_producer(topic, **kw):
        return FailingProducer()
    client.create_producer = create_producer
    c = await create_consumer(client, "fake", "sub", dead_letter_policy=DeadLetterPolicy(max_redeliver_count=1),
                              negative_ack_redelivery_delay_ms=300)
    call = client.stub.calls[0]
    call.push(entry(b"poison", 0, redelivery=2), entry(b"next", 1, redelivery=0))
    assert (await c.receive(1000)).data() == b"next"
    await asyncio.sleep(0.1)
    assert call.of("redeliver") == []  # not at once
    await until(lambda: call.of("redeliver"), timeout=2)
    assert call.of("redeliver")[0].consumer_epoch == 1 and list(call.of("redeliver")[0].positions) == []
    await c.close()


async def test_dead_letter_count_as_pulsar():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", consumer_type=ConsumerType.Shared,
                              dead_letter_policy=DeadLetterPolicy(max_redeliver_count=2), ack_group_time_ms=0)
    call = client.stub.calls[0]
    call.push(entry(b"at-max", 0, redelivery=2), entry(b"above", 1, redelivery=3))
    assert (await c.receive(1000)).data() == b"at-max"
    await until(lambda: client.producers.get(f"{TOPIC}-sub-DLQ") and client.producers[f"{TOPIC}-sub-DLQ"].sent)
    assert [content for content, _ in client.producers[f"{TOPIC}-sub-DLQ"].sent] == [b"above"]
    await c.close()


# ---------------------------------------------------------------- acks across reconnects
class SilentCall(FakeCall):
    """Answers the subscribe, never an ack (the stream broke before they arrived)."""

    async def write(self, req):
        if req.WhichOneof("request") == "ack":
            self.sent.append(req)
            return
        await super().write(req)


async def test_unanswered_acks_are_sent_again_before_the_first_flow_after_a_reconnect():
    client = FakeClient()
    calls = iter([SilentCall(), FakeCall()])

    def consume():
        call = next(calls)
        client.stub.calls.append(call)
        return call
    client.stub.Consume = consume
    c = await create_consumer(client, "fake", "sub", consumer_type=ConsumerType.Shared, ack_group_time_ms=20)
    first = client.stub.calls[0]
    first.push(entry(b"a", 0), entry(b"b", 1))
    for _ in range(2):
        c.acknowledge(await c.receive(1000))
    await until(lambda: first.of("ack"))
    assert c._impl.tracker.in_flight() == 1
    first.responses.put_nowait(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "cut"))
    await until(lambda: len(client.stub.calls) == 2 and client.stub.calls[1].of("flow"))
    second = client.stub.calls[1]
    kinds = [r.WhichOneof("request") for r in second.sent]
    assert kinds[:3] == ["subscribe", "ack", "flow"]
    assert [p.entry_id for p in second.of("ack")[0].positions] == [0, 1]
    await until(lambda: c._impl.tracker.in_flight() == 0)  # confirmed on the new stream
    # the broker's redelivery of what it had not seen acknowledged is filtered meanwhile
    second.push(entry(b"c", 2))
    assert (await c.receive(1000)).data() == b"c"
    await c.close()


async def test_acks_written_but_unanswered_still_filter_redeliveries():
    client = FakeClient()

    def consume():
        client.stub.calls.append(SilentCall())
        return client.stub.calls[-1]
    client.stub.Consume = consume
    c = await create_consumer(client, "fake", "sub", consumer_type=ConsumerType.Shared, ack_group_time_ms=0)
    call = client.stub.calls[0]
    call.push(entry(b"a", 0))
    c.acknowledge(await c.receive(1000))
    await until(lambda: call.of("ack"))
    call.push(entry(b"a", 0, redelivery=1), entry(b"b", 1))
    assert (await c.receive(1000)).data() == b"b"  # the duplicate of a was dropped
    assert c._impl.tracker.in_flight() == 1
    await c.close()


# ---------------------------------------------------------------- Reader restart point
async def test_reader_restarts_from_the_first_dropped_message():
    client = FakeClient()
    conf = ConsumerConfig(subscription_name="reader-x", receiver_queue_size=10).validate()
    impl = ConsumerImpl(client, TOPIC, conf, durable=False, start_message_id=MessageId.latest)
    await impl.start()
    first = client.stub.calls[0]
    assert first.of("subscribe")[0].start_message_id.entry_id == MessageId.latest.entry_id
    first.push(entry(b"a", 5), entry(b"b", 6), entry(b"c", 7))
    await until(lambda: len(impl.queue) == 3)
    msg = await impl.queue.get(1)
    impl.on_dequeued(msg)  # a handed out; b, c still queued
    first.responses.put_nowait(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "cut"))
    await until(lambda: len(client.stub.calls) == 2 and client.stub.calls[1].of("subscribe"))
    sub = client.stub.calls[1].of("subscribe")[0]
    assert (sub.start_message_id.entry_id, sub.start_message_id_inclusive) == (6, True)
    # nothing queued the next time: right after the last message handed out
    await until(lambda: client.stub.calls[1].of("flow"))
    client.stub.calls[1].push(entry(b"b", 6))
    msg = await impl.queue.get(1)
    impl.on_dequeued(msg)
    client.stub.calls[1].responses.put_nowait(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "x"))
    await until(lambda: len(client.stub.calls) == 3 and client.stub.calls[2].of("subscribe"))
    sub = client.stub.calls[2].of("subscribe")[0]
    assert (sub.start_message_id.entry_id, sub.start_message_id_inclusive) == (6, False)
    await impl.close(flush=False)
