"""The broker's gRPC protocol spoken raw (no SDK): produce, consume, acks,
dedup, errors. Real standalone process."""
from __future__ import annotations

import asyncio
import json
import uuid

import grpc
import pytest

from client.batching import BatchMessageContainer, PendingMessage
from client.entry_format import decode_entry, encode_entry
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc


def entry(producer: str, seq: int, payload: bytes, n: int = 1) -> bytes:
    c = BatchMessageContainer()
    for i in range(n):
        c.add(PendingMessage(payload=payload + b"-%d" % i, sequence_id=seq + i))
    md, data, _ = c.build(producer, publish_time_ms=1)
    return encode_entry(md, data)


@pytest.fixture
async def stub(standalone):
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{standalone.port}")
    yield broker_pb2_grpc.PulsarBrokerStub(channel)
    await channel.close()


def topic_name() -> str:
    return f"persistent://public/default/raw-{uuid.uuid4().hex[:8]}"


async def produce(stub, topic, sends, name="p1"):
    call = stub.Produce()
    await call.write(pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name=name)))
    success = (await call.read()).success
    await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=sends)))
    out = []
    while len(out) < len(sends):
        resp = await call.read()
        if resp.HasField("receipts"):
            out.extend(resp.receipts.receipts)
        elif resp.HasField("send_errors"):     # consecutive refused sends, in order
            out.extend(resp.send_errors.errors)
        else:
            out.append(resp.send_error)
    await call.done_writing()
    return success, out


async def test_produce_consume_ack_roundtrip(stub):
    topic = topic_name()
    sends = [pb.Send(sequence_id=i * 10, highest_sequence_id=i * 10 + 9, num_messages=10,
                     headers_and_payload=entry("p1", i * 10, b"m%d" % i, 10)) for i in range(5)]
    success, receipts = await produce(stub, topic, [])
    assert success.last_sequence_id == -1
    consumer = stub.Consume()
    await consumer.write(pb.ConsumerRequest(subscribe=pb.Subscribe(
        topic=topic, subscription="s", sub_type=pb.Exclusive, initial_position=pb.Earliest, durable=True)))
    assert (await consumer.read()).HasField("subscribed")
    _, receipts = await produce(stub, topic, sends, name="p2")
    assert [r.sequence_id for r in receipts] == [0, 10, 20, 30, 40]
    await consumer.write(pb.ConsumerRequest(flow=pb.Flow(permits=1000)))
    got = []
    while len(got) < 5:
        resp = await consumer.read()
        if resp.HasField("messages"):
            got.extend(resp.messages.entries)
    md, _ = decode_entry(got[0].headers_and_payload)
    assert md.num_messages_in_batch == 10
    await consumer.write(pb.ConsumerRequest(ack=pb.Ack(
        ack_type=pb.Cumulative, request_id=7,
        positions=[pb.AckPosition(ledger_id=got[-1].position.ledger_id, entry_id=got[-1].position.entry_id)])))
    while True:
        resp = await consumer.read()
        if resp.HasField("success"):
            assert resp.success.request_id == 7
            break
    admin = json.loads((await stub.Admin(pb.AdminRequest(method="topics.stats",
                                                         body_json=json.dumps({"topic": topic})))).body_json)
    assert admin["subscriptions"]["s"]["msgBacklog"] == 0
    assert admin["msgInCounter"] == 50
    consumer.cancel()


async def test_message_too_big_and_corrupt_entry_keep_producer_usable(stub):
    topic = topic_name()
    big = entry("p", 0, b"x" * (5 * 1024 * 1024 + 10))
    corrupt = bytearray(entry("p", 1, b"ok"))
    corrupt[-1] ^= 0xFF
    good = entry("p", 2, b"fine")
    _, out = await produce(stub, topic, [
        pb.Send(sequence_id=0, headers_and_payload=big, num_messages=1),
        pb.Send(sequence_id=1, headers_and_payload=bytes(corrupt), num_messages=1),
        pb.Send(sequence_id=2, headers_and_payload=good, num_messages=1)])
    assert out[0].error == "MessageTooBig"
    assert out[1].error in ("ChecksumError", "CorruptedMessage")
    assert out[2].message_id.entry_id >= 0


async def test_producer_busy_and_invalid_topic(stub):
    topic = topic_name()
    call = stub.Produce()
    await call.write(pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name="same")))
    await call.read()
    other = stub.Produce()
    await other.write(pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name="same")))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await other.read()
    assert "ProducerBusy" in err.value.details()
    bad = stub.Produce()
    await bad.write(pb.ProducerRequest(create=pb.CreateProducer(topic="persistent://a b/c/d")))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await bad.read()
    assert "InvalidTopicName" in err.value.details()
    unknown_ns = stub.Produce()
    await unknown_ns.write(pb.ProducerRequest(create=pb.CreateProducer(topic="persistent://nope/nope/t")))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await unknown_ns.read()
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    call.cancel()


async def test_garbage_bytes_get_an_error_and_server_keeps_serving(standalone, stub):
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{standalone.port}")
    raw = channel.unary_unary("/minipulsar.broker.PulsarBroker/Admin")
    with pytest.raises(grpc.aio.AioRpcError):
        await raw(b"\xff\xfe garbage \x00\x01")
    await channel.close()
    resp = await stub.Admin(pb.AdminRequest(method="brokers.health", body_json="{}"))
    assert json.loads(resp.body_json)["ok"] is True


async def test_dedup_drops_resent_sequence_ids(stub):
    topic = topic_name()
    await stub.Admin(pb.AdminRequest(method="namespaces.create", body_json=json.dumps({"namespace": "public/dedup"})))
    topic = topic.replace("public/default", "public/dedup")
    await stub.Admin(pb.AdminRequest(method="namespaces.set_deduplication",
                                     body_json=json.dumps({"namespace": "public/dedup", "enabled": True})))
    sends = [pb.Send(sequence_id=i, highest_sequence_id=i, num_messages=1, headers_and_payload=entry("d", i, b"x"))
             for i in range(3)]
    _, first = await produce(stub, topic, sends, name="d")
    success, again = await produce(stub, topic, sends, name="d")
    assert success.last_sequence_id == 2
    assert all(r.message_id.ledger_id == -1 and r.message_id.entry_id == -1 for r in again)
    assert all(r.message_id.entry_id >= 0 for r in first)


async def test_idle_streams_survive_client_keepalive_pings(standalone):
    """Clients ping idle connections (keep_alive_interval_seconds); the broker must not answer
    with GOAWAY "too_many_pings" (gRPC's default policy), which would drop every stream."""
    from client.connection import channel_options

    options = channel_options(keepalive_interval_seconds=2) + [("grpc.http2.max_pings_without_data", 0)]
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{standalone.port}", options=options)
    stub = broker_pb2_grpc.PulsarBrokerStub(channel)
    topic = topic_name()
    try:
        consumer = stub.Consume()
        await consumer.write(pb.ConsumerRequest(subscribe=pb.Subscribe(
            topic=topic, subscription="idle", sub_type=pb.Exclusive, initial_position=pb.Earliest, durable=True)))
        assert (await consumer.read()).HasField("subscribed")
        await consumer.write(pb.ConsumerRequest(flow=pb.Flow(permits=10)))
        await asyncio.sleep(9)  # ~4 pings; gRPC's default server policy GOAWAYs at the 3rd
        assert not consumer.done()
        _, receipts = await produce(stub, topic, [pb.Send(sequence_id=0, highest_sequence_id=0, num_messages=1,
                                                          headers_and_payload=entry("p-idle", 0, b"late"))])
        assert receipts[0].message_id.entry_id >= 0
        resp = await asyncio.wait_for(consumer.read(), 10)
        while resp.HasField("active_change"):
            resp = await asyncio.wait_for(consumer.read(), 10)
        assert resp.HasField("messages"), resp  # the same stream still delivers
        consumer.cancel()
    finally:
        await channel.close()
