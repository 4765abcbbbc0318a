"""A Send whose sequence id does not fit Pulsar's signed 64-bit sequence ids is
refused with a clear error, and the producer name stays usable (found by the
long run of the bad-input suite: such a send was stored, after which every
CreateProducer of that name failed with UNKNOWN "Value out of range")."""
from __future__ import annotations

import uuid

import grpc

from client.entry_format import encode_entry
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.pulsar_api_pb2 import MessageMetadata


def _send(seq: int, name: str) -> pb.Send:
    md = MessageMetadata(producer_name=name, sequence_id=seq, publish_time=1)
    return pb.Send(sequence_id=seq, highest_sequence_id=seq, num_messages=1,
                   headers_and_payload=encode_entry(md, b"payload-%d" % (seq % 1000)))


async def _produce(stub, topic: str, name: str, sends: list[pb.Send]) -> tuple[pb.ProducerSuccess, list]:
    call = stub.Produce()
    await call.write(pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name=name)))
    first = await call.read()
    assert first.WhichOneof("response") == "success", first
    answers = []
    if sends:
        await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=sends)))
        while len(answers) < len(sends):
            resp = await call.read()
            kind = resp.WhichOneof("response")
            answers += (list(resp.receipts.receipts) if kind == "receipts" else
                        list(resp.send_errors.errors) if kind == "send_errors" else [resp.send_error])
    await call.done_writing()
    while await call.read() is not grpc.aio.EOF:
        pass
    return first.success, answers


async def test_sequence_id_beyond_a_java_long_is_refused_and_the_name_stays_usable(standalone):
    topic = f"persistent://public/default/seq-{uuid.uuid4().hex[:8]}"
    name = "seq-producer"
    async with grpc.aio.insecure_channel(standalone.service_url.split("://")[1]) as channel:
        stub = broker_pb2_grpc.PulsarBrokerStub(channel)
        _, answers = await _produce(stub, topic, name, [_send(5, name)])
        assert answers[0].message_id.ledger_id >= 0
        _, answers = await _produce(stub, topic, name, [_send(2**63, name)])
        assert isinstance(answers[0], pb.SendError) and answers[0].error == "InvalidArgument", answers
        assert "signed 64-bit" in answers[0].message
        success, answers = await _produce(stub, topic, name, [_send(6, name)])  # the name still works
        assert success.last_sequence_id == 5
        assert answers[0].message_id.ledger_id >= 0
