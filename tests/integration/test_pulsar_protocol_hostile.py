"""Hostile and edge-case frames on Pulsar's binary protocol against a REAL broker, over
raw sockets: a corrupt message gets a SEND_ERROR for that message only (the next one
is stored), acknowledgments of positions that do not exist are refused by request id
(ACK_RESPONSE), an absurd flow grant and redelivery of unknown ids change nothing,
random bytes after CONNECT close only that connection; the broker keeps serving the
official client throughout."""
from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import threading
import time
import uuid

import pytest

pulsar = pytest.importorskip("pulsar", reason="pulsar-client (the `test` extra) is not installed")

from broker.protocols.pulsar.frames import FrameDecoder, encode_command, encode_payload_command  # noqa: E402
from proto.entry_format import encode_entry  # noqa: E402
from proto.pulsar_api_pb2 import MessageMetadata  # noqa: E402
from proto.pulsar_wire_pb2 import BaseCommand, ServerError  # noqa: E402
from tests.procs import ProcessTracker, ensure_namespace, start_bookie, start_broker  # noqa: E402

pytestmark = pytest.mark.timeout(180)
T = BaseCommand


class Raw:
    """A raw Pulsar-protocol connection: ``send(cmd, payload=None)``, ``expect(type)``."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = FrameDecoder(64 << 20)
        self.frames: list = []
        self.send(BaseCommand(type=T.CONNECT, connect={"client_version": "hostile", "protocol_version": 20}))
        assert self.expect(T.CONNECTED).connected.protocol_version == 20

    def send(self, cmd, payload=None) -> None:
        self.sock.sendall(encode_command(cmd) if payload is None else encode_payload_command(cmd, payload))

    def expect(self, kind: int):
        while True:
            for i, (cmd, _) in enumerate(self.frames):
                if cmd.type == kind:
                    return self.frames.pop(i)[0]
            data = self.sock.recv(1 << 16)
            assert data, f"connection closed while waiting for {T.Type.Name(kind)}"
            self.frames += self.decoder.feed(data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    base = tmp_path_factory.mktemp("pulsar-hostile")
    tracker = ProcessTracker()
    conf = base / "broker.toml"
    conf.write_text("managed_ledger_default_ensemble_size = 1\nmanaged_ledger_default_write_quorum = 1\n"
                    "managed_ledger_default_ack_quorum = 1\n")
    try:
        bookie = start_bookie(base / "bookie", journal_sync=False, tracker=tracker)
        proc = start_broker(base / "broker", [bookie.address], config_file=conf, tracker=tracker)
        asyncio.run(ensure_namespace(proc.service_url))
        proc.bookie = bookie
        yield proc
    finally:
        tracker.kill_all()


def entry(seq: int, payload: bytes) -> bytes:
    return encode_entry(MessageMetadata(producer_name="raw", sequence_id=seq, publish_time=1), payload)


def test_corrupt_message_is_refused_alone_and_acks_of_nothing_are_refused(broker):
    topic = f"persistent://public/default/hostile-{uuid.uuid4().hex[:8]}"
    raw = Raw(broker.pulsar_port)
    try:
        raw.send(BaseCommand(type=T.PRODUCER, producer={"topic": topic, "producer_id": 1, "request_id": 1,
                                                         "producer_name": "raw"}))
        assert raw.expect(T.PRODUCER_SUCCESS).producer_success.last_sequence_id == -1
        corrupt = bytearray(entry(0, b"payload"))
        corrupt[-1] ^= 0xFF                                        # CRC32C no longer matches
        raw.send(BaseCommand(type=T.SEND, send={"producer_id": 1, "sequence_id": 0}), bytes(corrupt))
        err = raw.expect(T.SEND_ERROR).send_error
        assert (err.sequence_id, err.error) == (0, ServerError.ChecksumError) and "checksum" in err.message
        raw.send(BaseCommand(type=T.SEND, send={"producer_id": 1, "sequence_id": 1}), entry(1, b"good"))
        receipt = raw.expect(T.SEND_RECEIPT).send_receipt
        assert receipt.sequence_id == 1 and receipt.message_id.entryId == 0     # the first entry stored
        raw.send(BaseCommand(type=T.SUBSCRIBE, subscribe={"topic": topic, "subscription": "s", "subType": 1,
                                                           "consumer_id": 1, "request_id": 2, "initialPosition": 1}))
        assert raw.expect(T.SUCCESS).success.request_id == 2
        raw.send(BaseCommand(type=T.FLOW, flow={"consumer_id": 1, "messagePermits": 2**32 - 1}))
        msg = raw.expect(T.MESSAGE).message
        assert msg.message_id.entryId == 0 and msg.redelivery_count == 0
        # an acknowledgment of an entry that does not exist: refused by request id, nothing moves
        raw.send(BaseCommand(type=T.ACK, ack={"consumer_id": 1, "ack_type": 0, "request_id": 3, "message_id": [
            {"ledgerId": 2**63 - 5, "entryId": 12}]}))
        refused = raw.expect(T.ACK_RESPONSE).ackResponse
        assert refused.request_id == 3 and refused.HasField("error")
        # redelivery of ids never delivered, and a real ack answered by ACK_RESPONSE without error
        raw.send(BaseCommand(type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES, redeliverUnacknowledgedMessages={
            "consumer_id": 1, "message_ids": [{"ledgerId": 99, "entryId": i} for i in range(1000)]}))
        raw.send(BaseCommand(type=T.ACK, ack={"consumer_id": 1, "ack_type": 0, "request_id": 4, "message_id": [
            {"ledgerId": msg.message_id.ledgerId, "entryId": msg.message_id.entryId}]}))
        done = raw.expect(T.ACK_RESPONSE).ackResponse
        assert done.request_id == 4 and not done.HasField("error")
    finally:
        raw.close()


def test_random_bytes_after_connect_close_only_that_connection(broker):
    rng = random.Random(35)
    client = pulsar.Client(broker.pulsar_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(f"persistent://public/default/fuzz-{uuid.uuid4().hex[:6]}")
        for _ in range(20):
            raw = Raw(broker.pulsar_port)
            raw.sock.sendall(os.urandom(rng.randint(1, 4096)))
            raw.sock.settimeout(10)
            try:
                while raw.sock.recv(65536):
                    pass                                   # until the broker closes it
            except (ConnectionResetError, socket.timeout):
                pass
            raw.close()
            producer.send(b"still serving")
    finally:
        client.close()


def test_reading_pauses_while_sends_wait_for_storage_and_receipts_stay_in_order(broker):
    """The bookie is stopped (SIGSTOP): the broker reads at most MAX_PENDING_SENDS (1,000)
    sends of the connection and stops reading, so a client pushing 32 MB blocks instead of
    filling the broker's memory; once the bookie resumes every send is receipted, in order."""
    from broker.protocols.pulsar.connection import MAX_PENDING_SENDS

    topic = f"persistent://public/default/pause-{uuid.uuid4().hex[:8]}"
    raw = Raw(broker.pulsar_port)
    n, payload = 4 * MAX_PENDING_SENDS, os.urandom(8192)
    frames = b"".join(encode_payload_command(BaseCommand(type=T.SEND, send={"producer_id": 1, "sequence_id": i}),
                                             entry(i, payload)) for i in range(1, n))
    done = threading.Event()
    try:
        raw.send(BaseCommand(type=T.PRODUCER, producer={"topic": topic, "producer_id": 1, "request_id": 1}))
        raw.expect(T.PRODUCER_SUCCESS)
        raw.send(BaseCommand(type=T.SEND, send={"producer_id": 1, "sequence_id": 0}), entry(0, b"warm"))
        raw.expect(T.SEND_RECEIPT)                                 # the ledger exists
        os.kill(broker.bookie.pid, signal.SIGSTOP)
        raw.sock.settimeout(60)
        sender = threading.Thread(target=lambda: (raw.sock.sendall(frames), done.set()), daemon=True)
        sender.start()
        time.sleep(3)
        assert not done.is_set(), "the broker kept reading while 1,000 sends waited for the bookie"
    finally:
        os.kill(broker.bookie.pid, signal.SIGCONT)
    try:
        assert done.wait(60)
        seqs = [raw.expect(T.SEND_RECEIPT).send_receipt.sequence_id for _ in range(1, n)]
        assert seqs == list(range(1, n))
    finally:
        raw.close()


def test_a_batch_ack_for_an_entry_the_broker_never_delivered_reads_its_size_first(broker):
    """An ACK with an ack set (set bit = not acknowledged) for a batch entry that no consumer
    of this connection was sent: the broker reads the entry's batch size before applying it,
    in the consumer's order; the delivery that follows carries the partial ack state."""
    topic = f"persistent://public/default/unknown-size-{uuid.uuid4().hex[:8]}"
    raw = Raw(broker.pulsar_port)
    try:
        raw.send(BaseCommand(type=T.PRODUCER, producer={"topic": topic, "producer_id": 1, "request_id": 1}))
        raw.expect(T.PRODUCER_SUCCESS)
        batch = encode_entry(MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1,
                                             num_messages_in_batch=5), b"\0" * 64)
        raw.send(BaseCommand(type=T.SEND, send={"producer_id": 1, "sequence_id": 0, "num_messages": 5}), batch)
        mid = raw.expect(T.SEND_RECEIPT).send_receipt.message_id
        raw.send(BaseCommand(type=T.SUBSCRIBE, subscribe={"topic": topic, "subscription": "s", "subType": 1,
                                                           "consumer_id": 1, "request_id": 2, "initialPosition": 1}))
        raw.expect(T.SUCCESS)
        # indexes 1 and 3 acknowledged: bits 0, 2, 4 stay set (no batch_size given)
        raw.send(BaseCommand(type=T.ACK, ack={"consumer_id": 1, "ack_type": 0, "request_id": 3, "message_id": [
            {"ledgerId": mid.ledgerId, "entryId": mid.entryId, "ack_set": [0b10101]}]}))
        answer = raw.expect(T.ACK_RESPONSE).ackResponse
        assert answer.request_id == 3 and not answer.HasField("error"), answer
        raw.send(BaseCommand(type=T.FLOW, flow={"consumer_id": 1, "messagePermits": 10}))
        msg = raw.expect(T.MESSAGE).message
        assert msg.message_id.entryId == mid.entryId and list(msg.ack_set) == [0b10101]
    finally:
        raw.close()
