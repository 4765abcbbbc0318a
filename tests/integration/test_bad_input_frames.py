"""Frames that are not the method's request message (issue 21, "bad input gets
a clear error"): every broker and bookie method answers INVALID_ARGUMENT naming
the message type (``proto.frame_errors``), where grpc's own deserializer
answered UNKNOWN "Unexpected <class 'DecodeError'>"; on a stream, what was sent
before the bad frame is still answered; the servers keep serving.  A real
standalone cluster (2 bookies + broker) answers.
"""
from __future__ import annotations

import json

import grpc
import pytest

from client.entry_format import encode_entry
from client.errors import InvalidArgument, error_from_status
from proto import bookie_pb2, broker_pb2 as pb
from proto.pulsar_api_pb2 import MessageMetadata

GARBAGE = b"\xff\xfe garbage \x00\x01"


@pytest.fixture
async def channels(standalone):
    ports = json.loads((standalone.data_dir / "standalone.json").read_text())["bookie_ports"]
    broker = grpc.aio.insecure_channel(f"127.0.0.1:{standalone.port}")
    bookie = grpc.aio.insecure_channel(f"127.0.0.1:{ports[0]}")
    yield broker, bookie
    await broker.close()
    await bookie.close()


def assert_invalid_frame(err: grpc.aio.AioRpcError, type_name: str) -> None:
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert f"is not a valid {type_name}" in err.details(), err.details()
    assert "Unexpected <class" not in err.details()
    assert isinstance(error_from_status(*err.details().split(": ", 1)), InvalidArgument)


@pytest.mark.parametrize("method, type_name", [
    ("Admin", "minipulsar.broker.AdminRequest"),
    ("GetLastMessageId", "minipulsar.broker.TopicRequest"),
    ("GetPartitionedTopicMetadata", "minipulsar.broker.TopicRequest"),
    ("GetTopicsOfNamespace", "minipulsar.broker.NamespaceRequest"),
])
async def test_a_unary_broker_call_with_an_undecodable_frame_gets_invalid_argument(channels, method, type_name):
    broker, _ = channels
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker.unary_unary(f"/minipulsar.broker.PulsarBroker/{method}")(GARBAGE, timeout=10)
    assert_invalid_frame(err.value, type_name)
    health = await broker.unary_unary("/minipulsar.broker.PulsarBroker/Admin")(
        pb.AdminRequest(method="brokers.health", body_json="{}").SerializeToString(), timeout=10)
    assert json.loads(pb.AdminResponse.FromString(health).body_json)["ok"] is True


@pytest.mark.parametrize("method", ["Produce", "Consume"])
async def test_a_stream_opened_with_an_undecodable_frame_gets_invalid_argument(channels, method):
    broker, _ = channels
    call = broker.stream_stream(f"/minipulsar.broker.PulsarBroker/{method}")(timeout=10)
    await call.write(GARBAGE)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    kind = "ProducerRequest" if method == "Produce" else "ConsumerRequest"
    assert_invalid_frame(err.value, f"minipulsar.broker.{kind}")


async def test_a_bad_frame_after_a_send_still_gets_that_send_its_receipt(channels, standalone):
    broker, _ = channels
    topic = "persistent://public/default/bad-frame-after-send"
    call = broker.stream_stream("/minipulsar.broker.PulsarBroker/Produce",
                                request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
                                response_deserializer=pb.ProducerResponse.FromString)(timeout=30)
    await call.write(pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name="before-garbage")))
    assert (await call.read()).WhichOneof("response") == "success"
    md = MessageMetadata(producer_name="before-garbage", sequence_id=0, publish_time=1)
    await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=[pb.Send(
        sequence_id=0, highest_sequence_id=0, num_messages=1, headers_and_payload=encode_entry(md, b"kept"))])))
    first = await call.read()
    await call.write(GARBAGE)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        while True:
            await call.read()
    assert first.WhichOneof("response") == "receipts" and first.receipts.receipts[0].message_id.entry_id >= 0
    assert_invalid_frame(err.value, "minipulsar.broker.ProducerRequest")
    stats = await broker.unary_unary("/minipulsar.broker.PulsarBroker/Admin")(
        pb.AdminRequest(method="topics.stats", body_json=json.dumps({"topic": topic})).SerializeToString())
    assert json.loads(pb.AdminResponse.FromString(stats).body_json)["msgInCounter"] == 1


@pytest.mark.parametrize("method, type_name", [
    ("ReadEntries", "minipulsar.bookie.ReadEntriesRequest"),
    ("Fence", "minipulsar.bookie.LedgerRequest"),
    ("DeleteLedger", "minipulsar.bookie.LedgerRequest"),
    ("ReadLastAddConfirmed", "minipulsar.bookie.LedgerRequest"),
])
async def test_a_bookie_call_with_an_undecodable_frame_gets_invalid_argument(channels, method, type_name):
    _, bookie = channels
    if method == "ReadEntries":
        call = bookie.unary_stream(f"/minipulsar.bookie.Bookie/{method}")(GARBAGE, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
    else:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bookie.unary_unary(f"/minipulsar.bookie.Bookie/{method}")(GARBAGE, timeout=10)
    assert_invalid_frame(err.value, type_name)
    info = await bookie.unary_unary("/minipulsar.bookie.Bookie/GetBookieInfo")(
        bookie_pb2.BookieInfoRequest().SerializeToString(), timeout=10)
    assert bookie_pb2.BookieInfo.FromString(info).ByteSize() > 0


async def test_the_bookie_add_stream_keeps_its_own_answer_to_a_bad_frame(channels):
    _, bookie = channels
    call = bookie.stream_stream("/minipulsar.bookie.Bookie/AddEntry")(timeout=10)
    await call.write(GARBAGE)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid AddEntriesRequest" in err.value.details()
