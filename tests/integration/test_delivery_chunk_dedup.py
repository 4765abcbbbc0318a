"""Deduplication of chunked messages advances on the last chunk only, on the live
path and when the broker rebuilds its state after a crash (Pulsar #20948), and a
replicator's chunks are deduplicated per entry. Real standalone processes; the
sends are written on the raw Produce stream to control the chunk boundaries."""
from __future__ import annotations

import time

import grpc

from client.admin import AdminClient
from client.entry_format import encode_entry
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.pulsar_api_pb2 import MessageMetadata


def chunk_entry(producer: str, seq: int, uuid: str, chunk_id: int, num_chunks: int, payload: bytes) -> bytes:
    md = MessageMetadata(producer_name=producer, sequence_id=seq, publish_time=int(time.time() * 1000),
                         uuid=uuid, chunk_id=chunk_id, num_chunks_from_msg=num_chunks,
                         total_chunk_msg_size=len(payload) * num_chunks)
    return encode_entry(md, payload)


async def _produce(port: int, topic: str, producer: str, sends: list[tuple[int, bytes]]) -> list[pb.SendReceipt]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = broker_pb2_grpc.PulsarBrokerStub(channel).Produce()
        await call.write(pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name=producer)))
        first = await call.read()
        assert first.HasField("success"), first
        await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=[
            pb.Send(sequence_id=seq, highest_sequence_id=seq, num_messages=1, headers_and_payload=data)
            for seq, data in sends])))
        receipts = []
        while len(receipts) < len(sends):
            resp = await call.read()
            assert resp.HasField("receipts"), resp
            receipts.extend(resp.receipts.receipts)
        call.cancel()
        return receipts


async def test_chunked_message_resent_after_a_crash_between_chunks_is_stored(standalone_factory):
    """Chunks 0 and 1 of message 5 stored, kill -9, restart; the client resends the whole
    message: its last chunk must be stored (before: the replay counted every chunk, so the
    last chunk was dropped as a duplicate and send() resolved with -1:-1:-1:-1)."""
    cluster = standalone_factory()
    topic = "persistent://public/dedup-chunks/t"
    async with AdminClient(cluster.service_url) as admin:
        await admin.create_namespace("public/dedup-chunks")
        await admin.set_deduplication("public/dedup-chunks", True)
    whole = [(5, chunk_entry("p", 5, "p-5", i, 3, b"part-%d" % i)) for i in range(3)]
    receipts = await _produce(cluster.port, topic, "p", [(4, chunk_entry("p", 4, "p-4", 0, 1, b"single"))]
                              + whole[:2])
    assert all(r.message_id.ledger_id >= 0 for r in receipts)
    cluster.kill()
    cluster = cluster.restart()
    receipts = await _produce(cluster.port, topic, "p", whole)
    last = receipts[-1]
    assert last.message_id.ledger_id >= 0, "the last chunk was dropped as a duplicate: the message is lost"
    # And the same message again is a duplicate now (its last chunk was stored).
    again = await _produce(cluster.port, topic, "p", whole)
    assert again[-1].message_id.ledger_id == -1


async def test_replicator_chunks_are_deduplicated_per_entry(standalone_factory):
    """A replicator resends entries after a reconnect; chunks are entries like any other and
    must be dropped when already stored (before: only the last chunk was checked, so the
    remote stored 3,180 entries instead of 3,000 after two crashes)."""
    cluster = standalone_factory()
    topic = "persistent://public/default/repl-chunks"
    sends = []
    for i in range(4):
        md = MessageMetadata(producer_name="pulsar.repl.other", sequence_id=i, publish_time=int(time.time() * 1000),
                             uuid="o-1", chunk_id=i, num_chunks_from_msg=4, total_chunk_msg_size=40,
                             replicated_from="other", replicated_source_ledger_id=7, replicated_source_entry_id=i)
        sends.append(((7 << 32) | i, encode_entry(md, b"chunk-%d" % i)))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cluster.port}") as channel:
        stub = broker_pb2_grpc.PulsarBrokerStub(channel)
        for attempt in range(2):
            call = stub.Produce()
            await call.write(pb.ProducerRequest(create=pb.CreateProducer(
                topic=topic, producer_name="pulsar.repl.other", is_replicator=True)))
            assert (await call.read()).HasField("success")
            await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=[
                pb.Send(sequence_id=seq, highest_sequence_id=seq, num_messages=1, headers_and_payload=d)
                for seq, d in sends[:2 + attempt * 2]])))
            receipts = []
            while len(receipts) < 2 + attempt * 2:
                resp = await call.read()
                receipts.extend(resp.receipts.receipts)
            call.cancel()
        # second attempt resent chunks 0 and 1: duplicates; 2 and 3 new
        assert [r.message_id.ledger_id == -1 for r in receipts] == [True, True, False, False]
