"""The producer's reconnect/resend path against an in-process gRPC broker that
keeps the real broker's deduplication state (``broker.service.dedup``) and
reports ``last_sequence_id`` on each ProducerSuccess, as the real broker does.

A scripted connection either stores sends and then breaks without sending
their receipts (the receipts are lost), or refuses a send with a retriable
SendError and ends the stream, refusing what follows in the same frame (the
real broker's topic fence).  The tests check that after the reconnect the
producer does not send again what the broker stored (a chunk would be stored a
second time: only the last chunk is deduplicated; with deduplication off a
whole message would be), resends the rest in order, and that every chunked
message can be reassembled from what was stored."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from broker.service.dedup import DedupStatus, MessageDeduplication
from client.chunking import ChunkedMessageAssembler, is_chunk
from client.client import AsyncClient
from client.errors import ServiceNotReady
from client.entry_format import decode_entry
from client.message_id import MessageId
from client.producer import is_duplicate
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc

pytestmark = pytest.mark.timeout(60)

MAX_MESSAGE_SIZE = 4096


class DedupBroker(broker_pb2_grpc.PulsarBrokerServicer):
    """Stores sends in ``entries`` (``(sequence_id, MessageMetadata, payload)``),
    deduplicating like ``PersistentTopic.publish`` (a chunk only on its last
    chunk).  ``lose_after[conn] = n``: on connection ``conn`` store the first
    ``n`` sends of the stream (0: every send of its first frame), then end it
    without their receipts.
    ``refuse[conn] = seq``: answer that send with a retriable SendError, refuse
    the rest of the frame, end the stream.  ``refuse_only[conn] = seq``: refuse
    that one send (a retriable SendError), store the rest of the frame, then end
    the stream without their receipts (what a broker that goes on after a
    refused send does, e.g. with fault injection)."""

    def __init__(self, dedup_enabled: bool = True):
        self.dedup = MessageDeduplication(dedup_enabled)
        self.entries: list = []
        self.lose_after: dict[int, int] = {}
        self.refuse: dict[int, int] = {}
        self.refuse_only: dict[int, int] = {}
        self.connections = 0
        self.seqs: list[list[int]] = []  # sequence ids received, per connection

    async def GetPartitionedTopicMetadata(self, request, context):
        return pb.PartitionedTopicMetadata(partitions=0)

    def _publish(self, name: str, send: pb.Send) -> pb.Position:
        md, payload = decode_entry(send.headers_and_payload)
        check = not md.HasField("num_chunks_from_msg") or md.chunk_id == md.num_chunks_from_msg - 1
        highest = max(send.sequence_id, send.highest_sequence_id)
        if check:
            status = self.dedup.check(name, send.sequence_id, highest)
            assert status is not DedupStatus.UNKNOWN  # stored synchronously here
            if status is DedupStatus.DUP:
                return pb.Position(ledger_id=-1, entry_id=-1)
        self.entries.append((send.sequence_id, md, payload))
        if check:
            self.dedup.record_persisted(name, highest)
        return pb.Position(ledger_id=1, entry_id=len(self.entries) - 1)

    async def Produce(self, request_iterator, context):
        conn = self.connections
        self.connections += 1
        self.seqs.append([])
        first = await context.read()
        name = first.create.producer_name or "gen-1"
        await context.write(pb.ProducerResponse(success=pb.ProducerSuccess(
            producer_name=name, last_sequence_id=self.dedup.last_sequence_id(name),
            max_message_size=MAX_MESSAGE_SIZE, topic=first.create.topic)))
        stored_here = 0
        while True:
            req = await context.read()
            if req is grpc.aio.EOF:
                return
            receipts = []
            lose_after = self.lose_after.get(conn)
            if lose_after == 0:
                lose_after = len(req.sends.sends)
            refused_one = False
            for send in req.sends.sends:
                self.seqs[conn].append(send.sequence_id)
                if self.refuse_only.get(conn) == send.sequence_id and not refused_one:
                    refused_one = True
                    if receipts:
                        await context.write(pb.ProducerResponse(receipts=pb.ReceiptBatch(receipts=receipts)))
                        receipts = []
                    await context.write(pb.ProducerResponse(send_error=pb.SendError(
                        sequence_id=send.sequence_id, error="ServiceNotReady", message="injected")))
                    continue
                if refused_one:
                    self._publish(name, send)  # stored, its receipt never written
                    continue
                if self.refuse.get(conn) == send.sequence_id:
                    if receipts:
                        await context.write(pb.ProducerResponse(receipts=pb.ReceiptBatch(receipts=receipts)))
                    await context.write(pb.ProducerResponse(send_error=pb.SendError(
                        sequence_id=send.sequence_id, error="ServiceNotReady", message="fenced")))
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "ServiceNotReady: fenced")
                pos = self._publish(name, send)
                stored_here += 1
                receipts.append(pb.SendReceipt(sequence_id=send.sequence_id,
                                               highest_sequence_id=send.highest_sequence_id, message_id=pos))
                if lose_after == stored_here:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost")
            if refused_one:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "ServiceNotReady: injected")
            if receipts:
                await context.write(pb.ProducerResponse(receipts=pb.ReceiptBatch(receipts=receipts)))

    def assembled(self) -> list[bytes]:
        """Messages a consumer gets from the stored entries, in order."""
        asm = ChunkedMessageAssembler()
        out = []
        for i, (_, md, payload) in enumerate(self.entries):
            if is_chunk(md):
                done = asm.add(md, payload, MessageId(1, i), 0)
                if done is not None:
                    out.append(done.payload)
            else:
                out.append(payload)
        return out


@pytest.fixture
async def start_broker():
    servers = []

    async def start(**kw) -> DedupBroker:
        server = grpc.aio.server()
        servicer = DedupBroker(**kw)
        broker_pb2_grpc.add_PulsarBrokerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servicer.url = f"minipulsar://127.0.0.1:{port}"
        servers.append(server)
        return servicer

    yield start
    for server in servers:
        await server.stop(0)


BIG = bytes(range(256)) * 47  # 12,032 bytes: 3 or 4 chunks under MAX_MESSAGE_SIZE


async def send_three(broker: DedupBroker, return_exceptions: bool = False) -> list:
    """m0 plain, m1 chunked (BIG), m2 plain, written in one frame."""
    async with AsyncClient(broker.url, operation_timeout_seconds=10) as client:
        p = await client.create_producer("t", producer_name="p", batching_enabled=False, chunking_enabled=True,
                                         compression_type="NONE")
        futs = [asyncio.ensure_future(p.send(b)) for b in (b"m0", BIG, b"m2")]
        ids = await asyncio.gather(*futs, return_exceptions=return_exceptions)
        await p.close()
        return ids


@pytest.mark.parametrize("dedup", [True, False])
async def test_sends_stored_before_a_lost_connection_are_not_sent_again(start_broker, dedup):
    """The broker stored m0, all chunks of m1 and m2, then the connection
    broke before the receipts.  After the reconnect the broker's
    last_sequence_id (2) covers them: nothing is sent again and the topic
    holds each message once.  Before: everything was resent; with dedup on, the
    chunks of m1 but the last were stored a second time (only the last chunk
    is deduplicated), with dedup off every message was stored twice."""
    broker = await start_broker(dedup_enabled=dedup)
    broker.lose_after[0] = 0
    ids = await send_three(broker)
    n = broker.seqs[0].count(1)
    assert n >= 3 and broker.connections == 2
    assert broker.seqs[0] == [0] + [1] * n + [2] and broker.seqs[1] == []
    assert len(broker.entries) == n + 2, [s for s, _, _ in broker.entries]
    assert broker.assembled() == [b"m0", BIG, b"m2"]
    assert all(is_duplicate(i) for i in ids)  # stored once, by the first transmission; id unknown


async def test_chunked_message_cut_between_chunks_is_resent_and_assembles(start_broker):
    """m0 and the first 2 chunks of m1 stored, then the connection broke
    (no receipts).  The broker's last sequence id is 0 (chunks do not advance
    it): m0 is not resent, m1 goes again whole, then m2; the consumer gets
    every message once (the stale first chunks are replaced by the resend)."""
    broker = await start_broker()
    broker.lose_after[0] = 3
    ids = await send_three(broker)
    n = broker.seqs[1].count(1)
    assert n >= 3 and broker.seqs[1] == [1] * n + [2]
    assert broker.assembled() == [b"m0", BIG, b"m2"]
    assert is_duplicate(ids[0]) and not is_duplicate(ids[1]) and not is_duplicate(ids[2])


async def test_refused_chunk_is_resent_with_the_rest_of_its_message(start_broker):
    """The broker refuses m1 (its chunks share the sequence id 1: the first
    one is refused) with a retriable error and ends the stream: m1 and m2 are
    resent in order and stored; m0's receipt had arrived."""
    broker = await start_broker()
    broker.refuse[0] = 1
    ids = await send_three(broker)
    n = broker.seqs[1].count(1)
    assert broker.seqs[0][:2] == [0, 1] and n >= 3 and broker.seqs[1] == [1] * n + [2]
    assert broker.assembled() == [b"m0", BIG, b"m2"]
    assert not any(is_duplicate(i) for i in ids)


@pytest.mark.parametrize("dedup", [True, False])
async def test_refused_send_followed_by_stored_sends(start_broker, dedup):
    """The broker refuses m0 but stores m1 and m2 from the same frame (their
    receipts are lost).  m1 and m2 are not sent again (stored once).  m0 is
    resent: with dedup off it is stored; with dedup on the broker drops it as
    a duplicate of m2 although it was never stored, and the send fails with
    ServiceNotReady instead of resolving -1:-1 as if it were stored."""
    broker = await start_broker(dedup_enabled=dedup)
    broker.refuse_only[0] = 0
    ids = await send_three(broker, return_exceptions=True)
    assert broker.seqs[1] == [0]
    assert is_duplicate(ids[1]) and is_duplicate(ids[2])
    if dedup:
        assert isinstance(ids[0], ServiceNotReady) and "never stored" in str(ids[0])
        assert broker.assembled() == [BIG, b"m2"]
    else:
        assert isinstance(ids[0], MessageId) and ids[0].ledger_id >= 0
        assert broker.assembled() == [BIG, b"m2", b"m0"]
