"""The producer's stream handling against a scripted in-process gRPC broker
(same process, real gRPC): SendError handling, resend order after a retriable
error, duplicates, frame coalescing, ProducerBusy on reconnect.  The real
broker is exercised in tests/integration/test_producer.py."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from client.client import AsyncClient
from client.entry_format import decode_entry
from client.errors import ChecksumError, ProducerBusy
from client.message_id import MessageId
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc

pytestmark = pytest.mark.timeout(60)


class ScriptedBroker(broker_pb2_grpc.PulsarBrokerServicer):
    """Answers every Send with a receipt at (1, n), except what ``rules`` say:
    ``rules[(connection_no, sequence_id)]`` = ("error", ClassName) sends a
    SendError (and aborts the stream when retriable, like the real broker) or
    ("dup",) answers -1:-1.  ``busy_on`` = connection numbers refused with
    ProducerBusy.  Records frames and sequence ids per connection."""

    def __init__(self):
        self.rules: dict = {}
        self.busy_on: set[int] = set()
        self.connections = 0
        self.frames: list[list[int]] = []  # per connection: Sends per frame
        self.seqs: list[list[int]] = []
        self.entry = 0

    async def GetPartitionedTopicMetadata(self, request, context):
        return pb.PartitionedTopicMetadata(partitions=0)

    async def Produce(self, request_iterator, context):
        conn = self.connections
        self.connections += 1
        self.frames.append([])
        self.seqs.append([])
        first = await context.read()
        if conn in self.busy_on:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, "ProducerBusy: still connected")
        await context.write(pb.ProducerResponse(success=pb.ProducerSuccess(
            producer_name=first.create.producer_name or "gen-1", last_sequence_id=-1, max_message_size=1 << 20,
            topic=first.create.topic)))
        while True:
            req = await context.read()
            if req is grpc.aio.EOF:
                return
            self.frames[conn].append(len(req.sends.sends))
            receipts, errors = [], []    # like the broker: consecutive errors in one SendErrorBatch
            for send in req.sends.sends:
                decode_entry(send.headers_and_payload)
                self.seqs[conn].append(send.sequence_id)
                rule = self.rules.get((conn, send.sequence_id))
                if rule and rule[0] == "error":
                    if receipts:
                        await context.write(pb.ProducerResponse(receipts=pb.ReceiptBatch(receipts=receipts)))
                        receipts = []
                    errors.append(pb.SendError(sequence_id=send.sequence_id, error=rule[1], message="scripted"))
                    if rule[1] == "ServiceNotReady":
                        await self._write_errors(context, errors)
                        await context.abort(grpc.StatusCode.UNAVAILABLE, "ServiceNotReady: scripted")
                    continue
                await self._write_errors(context, errors)
                if rule and rule[0] == "dup":
                    pos = pb.Position(ledger_id=-1, entry_id=-1)
                else:
                    pos = pb.Position(ledger_id=1, entry_id=self.entry)
                    self.entry += 1
                receipts.append(pb.SendReceipt(sequence_id=send.sequence_id,
                                               highest_sequence_id=send.highest_sequence_id, message_id=pos))
            await self._write_errors(context, errors)
            if receipts:
                await context.write(pb.ProducerResponse(receipts=pb.ReceiptBatch(receipts=receipts)))

    @staticmethod
    async def _write_errors(context, errors: list) -> None:
        if len(errors) == 1:
            await context.write(pb.ProducerResponse(send_error=errors[0]))
        elif errors:
            await context.write(pb.ProducerResponse(send_errors=pb.SendErrorBatch(errors=errors)))
        errors.clear()


@pytest.fixture
async def broker():
    server = grpc.aio.server()
    servicer = ScriptedBroker()
    broker_pb2_grpc.add_PulsarBrokerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    servicer.url = f"minipulsar://127.0.0.1:{port}"
    yield servicer
    await server.stop(0)


async def test_retriable_send_error_reconnects_and_resends_from_that_message(broker):
    broker.rules[(0, 3)] = ("error", "ServiceNotReady")
    async with AsyncClient(broker.url, operation_timeout_seconds=5) as client:
        p = await client.create_producer("t", batching_enabled=False)
        ids = await asyncio.gather(*(p.send(b"%d" % i) for i in range(8)))
        assert ids == sorted(ids) and all(m.ledger_id == 1 for m in ids)
        assert broker.connections == 2
        assert broker.seqs[0][:4] == [0, 1, 2, 3]
        assert broker.seqs[1][0] == 3 and sorted(set(broker.seqs[1])) == [3, 4, 5, 6, 7]
        assert p.last_sequence_id() == 7


async def test_non_retriable_send_error_fails_only_that_message(broker):
    broker.rules[(0, 1)] = ("error", "ChecksumError")
    async with AsyncClient(broker.url, operation_timeout_seconds=5) as client:
        p = await client.create_producer("t", batching_enabled=False)
        results = await asyncio.gather(*(p.send(b"%d" % i) for i in range(3)), return_exceptions=True)
        assert isinstance(results[1], ChecksumError)
        assert isinstance(results[0], MessageId) and isinstance(results[2], MessageId)
        assert broker.connections == 1


async def test_a_batch_of_send_errors_fails_each_of_its_messages_and_only_those(broker):
    for seq in (1, 2, 3):
        broker.rules[(0, seq)] = ("error", "ChecksumError" if seq != 2 else "MessageTooBig")
    async with AsyncClient(broker.url, operation_timeout_seconds=5) as client:
        p = await client.create_producer("t", batching_enabled=False)
        results = await asyncio.gather(*(p.send(b"%d" % i) for i in range(5)), return_exceptions=True)
        assert [type(r).__name__ for r in results] == ["MessageId", "ChecksumError", "MessageTooBig",
                                                       "ChecksumError", "MessageId"]
        assert broker.connections == 1
        assert await p.send(b"after") == MessageId(1, 2)


async def test_duplicate_receipt_gives_minus_one_ids(broker):
    broker.rules[(0, 0)] = ("dup",)
    async with AsyncClient(broker.url, operation_timeout_seconds=5) as client:
        p = await client.create_producer("t")
        ids = await asyncio.gather(*(p.send(b"x") for _ in range(3)))  # one batch of 3
        assert ids == [MessageId(-1, -1)] * 3


async def test_unbatched_sends_are_coalesced_into_frames(broker):
    async with AsyncClient(broker.url, operation_timeout_seconds=5) as client:
        p = await client.create_producer("t", batching_enabled=False, max_pending_messages=0)
        ids = await asyncio.gather(*(p.send(b"y" * 10) for _ in range(500)))
        assert len(ids) == 500 and ids == sorted(ids)
        assert sum(broker.frames[0]) == 500 and len(broker.frames[0]) < 100


async def test_producer_busy_fails_creation_but_is_retried_on_reconnect(broker):
    broker.busy_on = {0}
    async with AsyncClient(broker.url, operation_timeout_seconds=5) as client:
        with pytest.raises(ProducerBusy):
            await client.create_producer("t", producer_name="p")
        broker.busy_on = {2}
        broker.rules[(1, 0)] = ("error", "ServiceNotReady")
        p = await client.create_producer("t", producer_name="p")
        mid = await p.send(b"x")  # connection 1 fails, 2 busy, 3 works
        assert mid.ledger_id == 1 and broker.connections == 4
