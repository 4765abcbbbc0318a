"""Hostile acknowledgments and redeliveries against a REAL broker (issue 21 items 5, 6, 8).

* Item 5: a batch-index ack at a position that is not an entry is refused and
  stores nothing (it used to store a 2**31-bit ack set and wedge the broker for
  minutes); a batch-index ack is bounded by the entry's *real* batch size (the
  message count the broker read from the entry), never the client's
  ``batch_size`` (2**22 stalled every later ack and every topic load 3-4 s).
* Item 6: RedeliverUnacknowledged redelivers only positions pending for that
  consumer (Pulsar's Consumer.redeliverUnacknowledgedMessages); 100k positions
  never delivered used to take 49 s (the replay set was sorted per read).
* Item 8: while each hostile input is handled, a second client's round trip
  (a GetLastMessageId on another channel, from another process so that this
  process's own protobuf work does not count) stays short. On this shared
  2-core machine the figure is printed and asserted below ROUND_TRIP_BOUND_S
  (the old code took 2.7 s to minutes on the same inputs); ~100 ms is typical.

Each test runs on its own private standalone cluster (a wedge must not spread).
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import pytest

from client import AsyncClient, InitialPosition
from client.admin import AdminClient
from client.consumer import ConsumerType
from client.errors import Timeout
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from tests.procs import REPO_ROOT

pytestmark = pytest.mark.timeout(240)

#: Upper bound asserted on a second client's round trip while hostile input is handled.
ROUND_TRIP_BOUND_S = 1.0

_PROBER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[4])
import grpc
from proto import broker_pb2 as pb, broker_pb2_grpc
address, topic, stop_file = sys.argv[1:4]
channel = grpc.insecure_channel(address)
grpc.channel_ready_future(channel).result(timeout=30)
stub = broker_pb2_grpc.PulsarBrokerStub(channel)
stub.GetLastMessageId(pb.TopicRequest(topic=topic), timeout=60)
print("READY", flush=True)
worst, n = 0.0, 0
while not os.path.exists(stop_file):
    t = time.monotonic()
    stub.GetLastMessageId(pb.TopicRequest(topic=topic), timeout=600)
    worst = max(worst, time.monotonic() - t)
    n += 1
    time.sleep(0.005)
print(json.dumps({"max_s": worst, "calls": n}), flush=True)
"""


class Prober:
    """A second client in another process: GetLastMessageId round trips in a loop
    until ``stop()``, which returns ``{"max_s": worst round trip, "calls": n}``."""

    def __init__(self, port: int, topic: str):
        self._stop = Path(tempfile.mkdtemp()) / "stop"
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.proc = subprocess.Popen([sys.executable, "-c", _PROBER, f"127.0.0.1:{port}", topic, str(self._stop),
                                      str(REPO_ROOT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                     text=True)
        line = self.proc.stdout.readline()
        assert line.strip() == "READY", (line, self.proc.stderr.read() if self.proc.poll() is not None else "")

    def stop(self) -> dict:
        self._stop.touch()
        out, err = self.proc.communicate(timeout=700)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def cluster(standalone_factory):
    return standalone_factory()


@pytest.fixture
async def stub(cluster):
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{cluster.port}",
                                        options=[("grpc.max_send_message_length", 64 << 20)])
    yield broker_pb2_grpc.PulsarBrokerStub(channel)
    await channel.close()


def uid() -> str:
    return uuid.uuid4().hex[:8]


async def produce_batches(url: str, topic: str, batches: int, size: int) -> list:
    """``batches`` entries of ``size`` messages each; returns the first message id of each."""
    async with AsyncClient(url) as client:
        producer = await client.create_producer(topic, batching_enabled=size > 1, batching_max_messages=size,
                                                batching_max_publish_delay_ms=1000)
        firsts = []
        for b in range(batches):
            futs = [asyncio.ensure_future(producer.send(b"b%d-m%d" % (b, i))) for i in range(size)]
            await producer.flush()
            ids = await asyncio.gather(*futs)
            assert len({(m.ledger_id, m.entry_id) for m in ids}) == 1, ids
            firsts.append(ids[0])
        await producer.close()
        return firsts


async def open_stream(stub, topic: str, sub: str, sub_type=pb.Shared, permits: int = 0):
    call = stub.Consume()
    await call.write(pb.ConsumerRequest(subscribe=pb.Subscribe(topic=topic, subscription=sub, sub_type=sub_type,
                                                               durable=True, initial_position=pb.Earliest)))
    first = await asyncio.wait_for(call.read(), 30)
    assert first.WhichOneof("response") == "subscribed", first
    if permits:
        await call.write(pb.ConsumerRequest(flow=pb.Flow(permits=permits)))
    return call


async def answer(call, request_id: int, timeout: float = 120.0, seen: list | None = None) -> pb.ConsumerResponse:
    """Read the stream until the CommandSuccess/CommandError of ``request_id``
    (MessageBatch frames met on the way go to ``seen``)."""
    deadline = time.monotonic() + timeout
    while True:
        resp = await asyncio.wait_for(call.read(), max(0.1, deadline - time.monotonic()))
        assert resp is not grpc.aio.EOF, "stream ended"
        kind = resp.WhichOneof("response")
        if kind in ("success", "error") and getattr(resp, kind).request_id == request_id:
            return resp
        if kind == "messages" and seen is not None:
            seen.extend(resp.messages.entries)


async def request(call, req: pb.ConsumerRequest, request_id: int, **kw) -> pb.ConsumerResponse:
    await call.write(req)
    return await answer(call, request_id, **kw)


def batch_ack(ledger_id, entry_id, batch_size, indexes, request_id, ack_type=pb.Individual) -> pb.ConsumerRequest:
    return pb.ConsumerRequest(ack=pb.Ack(ack_type=ack_type, request_id=request_id, positions=[
        pb.AckPosition(ledger_id=ledger_id, entry_id=entry_id, batch_size=batch_size, batch_indexes=indexes)]))


def assert_refused(resp: pb.ConsumerResponse, needle: str) -> None:
    assert resp.WhichOneof("response") == "error", resp
    assert resp.error.error == "InvalidArgument", resp.error
    assert needle in resp.error.message, resp.error.message
    assert "Traceback" not in resp.error.message


async def backlog(url: str, topic: str, sub: str) -> int:
    async with AdminClient(url) as admin:
        return (await admin.get_stats(topic))["subscriptions"][sub]["msgBacklog"]


async def no_consumers(url: str, topic: str, sub: str, timeout: float = 30.0) -> None:
    """Wait until the broker detached every consumer of ``sub`` (after a stream was cancelled)."""
    deadline = time.monotonic() + timeout
    async with AdminClient(url) as admin:
        while (await admin.get_stats(topic))["subscriptions"][sub]["consumers"]:
            assert time.monotonic() < deadline, "consumers still attached"
            await asyncio.sleep(0.1)


async def receive_all(url: str, topic: str, sub: str, idle_ms: int = 1500) -> list[bytes]:
    """Payloads a fresh SDK consumer of ``sub`` receives (and acknowledges)."""
    async with AsyncClient(url) as client:
        consumer = await client.subscribe(topic, sub, consumer_type=ConsumerType.Shared,
                                          initial_position=InitialPosition.Earliest)
        got = []
        while True:
            try:
                msg = await consumer.receive(timeout_millis=idle_ms)
            except Timeout:
                break
            got.append(msg.data())
            consumer.acknowledge(msg)
        await consumer.close()
        return got


# ---------------------------------------------------------------------------- item 5
async def test_batch_index_ack_of_a_position_that_is_not_an_entry_is_refused(cluster, stub):
    """batch_size=2**31-1 at a position that does not exist: refused at once, nothing
    stored (before: unresponsive for 3+ minutes, SIGKILL needed); the topic reloads
    as before and every message is still delivered."""
    topic = f"persistent://public/default/ack-nowhere-{uid()}"
    firsts = await produce_batches(cluster.service_url, topic, batches=3, size=5)
    ledger, last = firsts[-1].ledger_id, firsts[-1].entry_id
    call = await open_stream(stub, topic, "s")
    prober = Prober(cluster.port, topic)
    try:
        for rid, (lid, eid) in enumerate([(ledger, last + 1), (ledger, last + 10**9), (ledger + 1000, 0)],
                                         start=1):
            resp = await request(call, batch_ack(lid, eid, 2**31 - 1, [1], rid), rid)
            assert_refused(resp, "not an entry")
        resp = await request(call, batch_ack(ledger, last + 1, 2**31 - 1, [2**31 - 2], 9, pb.Cumulative), 9)
        assert resp.WhichOneof("response") == "error", resp
        figures = prober.stop()
    finally:
        prober.kill()
    print(f"batch-index acks beyond the end: second client's worst round trip {figures['max_s'] * 1000:.0f} ms "
          f"over {figures['calls']} calls")
    assert figures["max_s"] < ROUND_TRIP_BOUND_S, figures
    call.cancel()
    await no_consumers(cluster.service_url, topic, "s")
    async with AdminClient(cluster.service_url) as admin:
        started = time.monotonic()
        await admin.unload_topic(topic)
        assert await backlog(cluster.service_url, topic, "s") == 3
        print(f"unload + reload after the refused acks: {time.monotonic() - started:.2f} s")
    assert sorted(await receive_all(cluster.service_url, topic, "s")) == sorted(
        b"b%d-m%d" % (b, i) for b in range(3) for i in range(5))


async def test_batch_index_ack_is_bounded_by_the_real_batch_size(cluster, stub):
    """A client's batch_size is not trusted: 2**22 on a 10-message entry acks within
    the 10 real messages (before: a 2**22-bit set, 3-4 s per later ack and topic
    load, and the later honest ack with batch_size=10 was refused as contradicting
    it); indexes beyond the real size are refused; the partial state survives an
    unload and only the unacknowledged messages are delivered again."""
    topic = f"persistent://public/default/ack-bounded-{uid()}"
    firsts = await produce_batches(cluster.service_url, topic, batches=2, size=10)
    e0, e1 = firsts
    # A stream that got entry 0 (its batch size known from dispatch: 10 permits = one
    # entry) and one without permits acking entry 1, pending for nobody (the broker
    # reads the entry to learn its size).
    got = []
    receiver = await open_stream(stub, topic, "s", permits=10)
    while len(got) < 1:
        resp = await asyncio.wait_for(receiver.read(), 30)
        if resp.WhichOneof("response") == "messages":
            got.extend(resp.messages.entries)
    assert [(m.position.ledger_id, m.position.entry_id) for m in got] == [(e0.ledger_id, e0.entry_id)]
    blind = await open_stream(stub, topic, "s")
    prober = Prober(cluster.port, topic)
    try:
        resp = await request(receiver, batch_ack(e0.ledger_id, e0.entry_id, 2**22, [1, 3], 1), 1)
        assert resp.WhichOneof("response") == "success", resp
        resp = await request(blind, batch_ack(e1.ledger_id, e1.entry_id, 2**22, [0, 9], 2), 2)
        assert resp.WhichOneof("response") == "success", resp
        for call, entry, rid in ((receiver, e0, 3), (blind, e1, 4)):
            resp = await request(call, batch_ack(entry.ledger_id, entry.entry_id, 2**22, [2**22 - 1], rid), rid)
            assert_refused(resp, "out of range [0, 10)")
        resp = await request(blind, batch_ack(e1.ledger_id, e1.entry_id, 10, list(range(11)) * 3, 5), 5)
        assert_refused(resp, "holds 10 message(s)")
        # The honest follow-up acks with the real size work (they were refused before).
        resp = await request(receiver, batch_ack(e0.ledger_id, e0.entry_id, 10, [0, 2], 6), 6)
        assert resp.WhichOneof("response") == "success", resp
        figures = prober.stop()
    finally:
        prober.kill()
    print(f"batch-index acks with batch_size 2**22: second client's worst round trip "
          f"{figures['max_s'] * 1000:.0f} ms over {figures['calls']} calls")
    assert figures["max_s"] < ROUND_TRIP_BOUND_S, figures
    receiver.cancel()
    blind.cancel()
    await no_consumers(cluster.service_url, topic, "s")
    assert await backlog(cluster.service_url, topic, "s") == 2            # both entries partly acknowledged
    async with AdminClient(cluster.service_url) as admin:
        await admin.unload_topic(topic)
    left = await receive_all(cluster.service_url, topic, "s")
    assert sorted(left) == sorted([b"b0-m%d" % i for i in range(4, 10)] +
                                  [b"b1-m%d" % i for i in range(1, 9)]), left


async def test_cumulative_batch_ack_with_a_huge_index_is_refused(cluster, stub):
    """A cumulative ack up to batch index 2**31-2 of a 5-message entry: refused at
    once (before: range(2**31) walked bit by bit, the broker wedged)."""
    topic = f"persistent://public/default/ack-cumulative-{uid()}"
    firsts = await produce_batches(cluster.service_url, topic, batches=2, size=5)
    call = await open_stream(stub, topic, "x", sub_type=pb.Exclusive)
    prober = Prober(cluster.port, topic)
    try:
        e = firsts[1]
        resp = await request(call, batch_ack(e.ledger_id, e.entry_id, 2**31 - 1, [2**31 - 2], 1, pb.Cumulative), 1)
        assert_refused(resp, "out of range [0, 5)")
        resp = await request(call, batch_ack(e.ledger_id, e.entry_id, 5, [2], 2, pb.Cumulative), 2)
        assert resp.WhichOneof("response") == "success", resp
        figures = prober.stop()
    finally:
        prober.kill()
    print(f"cumulative batch ack up to index 2**31-2: worst round trip {figures['max_s'] * 1000:.0f} ms")
    assert figures["max_s"] < ROUND_TRIP_BOUND_S, figures
    call.cancel()
    await no_consumers(cluster.service_url, topic, "x")
    assert await backlog(cluster.service_url, topic, "x") == 1   # entry 0 acknowledged, entry 1 partly
    assert sorted(await receive_all(cluster.service_url, topic, "x")) == [b"b1-m3", b"b1-m4"]


# ---------------------------------------------------------------------------- item 6
async def test_redeliver_only_positions_pending_for_that_consumer(cluster, stub):
    """RedeliverUnacknowledged with 100,000 positions never delivered (plus acknowledged
    ones, repeats, and three that are pending): exactly the three come again, with
    redelivery count 1 (before: all 100k went to the replay set, 49 s wedge)."""
    topic = f"persistent://public/default/redeliver-{uid()}"
    firsts = await produce_batches(cluster.service_url, topic, batches=20, size=1)
    ledger = firsts[0].ledger_id
    call = await open_stream(stub, topic, "s", permits=1000)
    got = []
    while len(got) < 20:
        resp = await asyncio.wait_for(call.read(), 30)
        if resp.WhichOneof("response") == "messages":
            got.extend(resp.messages.entries)
    entry_ids = [m.position.entry_id for m in got]
    resp = await request(call, pb.ConsumerRequest(ack=pb.Ack(request_id=1, positions=[
        pb.AckPosition(ledger_id=ledger, entry_id=e) for e in entry_ids[:5]])), 1)
    assert resp.WhichOneof("response") == "success", resp
    pending = entry_ids[10:13]
    bogus = [pb.Position(ledger_id=ledger + 1 + i % 7, entry_id=i) for i in range(100_000)]
    positions = bogus[:50_000] + [pb.Position(ledger_id=ledger, entry_id=e) for e in entry_ids[:5] + pending * 3] \
        + bogus[50_000:]
    prober = Prober(cluster.port, topic)
    try:
        started = time.monotonic()
        await call.write(pb.ConsumerRequest(redeliver=pb.RedeliverUnacknowledged(positions=positions)))
        again = []
        # An ack with a receipt after it: answered once the redelivery was handled (same order).
        resp = await request(call, pb.ConsumerRequest(ack=pb.Ack(request_id=2, positions=[
            pb.AckPosition(ledger_id=ledger, entry_id=entry_ids[19])])), 2, seen=again)
        assert resp.WhichOneof("response") == "success", resp
        while len(again) < 3 and time.monotonic() - started < 60:
            try:
                resp = await asyncio.wait_for(call.read(), 5)
            except asyncio.TimeoutError:
                break
            if resp.WhichOneof("response") == "messages":
                again.extend(resp.messages.entries)
        handled = time.monotonic() - started
        figures = prober.stop()
    finally:
        prober.kill()
    print(f"RedeliverUnacknowledged of {len(positions)} positions: handled in {handled:.2f} s, second client's "
          f"worst round trip {figures['max_s'] * 1000:.0f} ms over {figures['calls']} calls")
    assert sorted(m.position.entry_id for m in again) == sorted(pending)
    assert all(m.redelivery_count == 1 for m in again)
    assert figures["max_s"] < ROUND_TRIP_BOUND_S, figures
    # Nothing else comes: the replay set held only the three.
    with pytest.raises(asyncio.TimeoutError):
        while True:
            resp = await asyncio.wait_for(call.read(), 1.5)
            assert resp.WhichOneof("response") != "messages", resp
    call.cancel()


# ---------------------------------------------------------------------------- item 8
async def test_an_ack_of_a_million_positions_does_not_stall_other_clients(cluster, stub):
    """One Ack frame of 1,000,000 positions at or below the mark-delete position (each
    one ignored after a look): applied in chunks, yielding between them, so the
    second client's round trips stay short (before: one synchronous walk, ~1 s on
    this machine); the answer comes, and the next ack on the stream still works."""
    topic = f"persistent://public/default/ack-million-{uid()}"
    firsts = await produce_batches(cluster.service_url, topic, batches=3, size=1)
    ledger = firsts[0].ledger_id
    call = await open_stream(stub, topic, "s")
    assert ledger >= 1
    positions = [pb.AckPosition(ledger_id=ledger - 1, entry_id=7)] * 1_000_000
    prober = Prober(cluster.port, topic)
    try:
        started = time.monotonic()
        resp = await request(call, pb.ConsumerRequest(ack=pb.Ack(request_id=1, positions=positions)), 1)
        handled = time.monotonic() - started
        assert resp.WhichOneof("response") == "success", resp
        resp = await request(call, pb.ConsumerRequest(ack=pb.Ack(request_id=2, positions=[
            pb.AckPosition(ledger_id=ledger, entry_id=firsts[0].entry_id)])), 2)
        assert resp.WhichOneof("response") == "success", resp
        figures = prober.stop()
    finally:
        prober.kill()
    print(f"Ack of 1,000,000 positions: answered in {handled:.2f} s, second client's worst round trip "
          f"{figures['max_s'] * 1000:.0f} ms over {figures['calls']} calls")
    assert figures["max_s"] < ROUND_TRIP_BOUND_S, figures
    call.cancel()
    assert await backlog(cluster.service_url, topic, "s") == 2


async def test_a_produce_frame_of_many_garbage_sends_does_not_stall_other_clients(cluster, stub):
    """One Produce frame of 100,000 sends with undecodable entries: each gets its
    SendError, and the broker yields between slices of the frame and answers
    consecutive errors in SendErrorBatch frames, so a second client's round
    trips stay short (before: one synchronous walk of the frame, 7.8 s for
    200,000 sends; then one SendError frame per send, 16.7 s for 100,000 and
    0.8-1.3 s round trips); the stream then still stores a good send."""
    from client.entry_format import encode_entry
    from proto.pulsar_api_pb2 import MessageMetadata
    topic = f"persistent://public/default/produce-garbage-{uid()}"
    await produce_batches(cluster.service_url, topic, batches=1, size=1)  # the topic is loaded
    call = stub.Produce()
    await call.write(pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name="garbage")))
    assert (await call.read()).WhichOneof("response") == "success"
    n = 100_000
    prober = Prober(cluster.port, topic)
    try:
        started = time.monotonic()
        await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=[
            pb.Send(sequence_id=i, highest_sequence_id=i, num_messages=1, headers_and_payload=b"\x0e\x01garbage")
            for i in range(n)])))
        errors, frames = [], 0
        while len(errors) < n:
            resp = await asyncio.wait_for(call.read(), 120)
            kind = resp.WhichOneof("response")
            assert kind in ("send_error", "send_errors"), resp
            errors += [resp.send_error] if kind == "send_error" else list(resp.send_errors.errors)
            frames += 1
        handled = time.monotonic() - started
        figures = prober.stop()
    finally:
        prober.kill()
    md = MessageMetadata(producer_name="garbage", sequence_id=n, publish_time=1)
    await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=[pb.Send(
        sequence_id=n, highest_sequence_id=n, num_messages=1, headers_and_payload=encode_entry(md, b"good"))])))
    resp = await asyncio.wait_for(call.read(), 60)
    assert resp.WhichOneof("response") == "receipts" and resp.receipts.receipts[0].message_id.ledger_id >= 0, resp
    call.cancel()
    assert [e.sequence_id for e in errors] == list(range(n))               # each send answered, in order
    assert {e.error for e in errors} == {"CorruptedMessage"}
    print(f"Produce frame of {n:,} garbage sends: {len(errors):,} SendErrors in {frames} frames, {handled:.2f} s, "
          f"second client's "
          f"worst round trip {figures['max_s'] * 1000:.0f} ms over {figures['calls']} calls")
    assert figures["max_s"] < ROUND_TRIP_BOUND_S, figures


async def test_an_admin_body_over_http_max_request_size_is_refused_before_it_is_parsed(cluster, stub):
    """An Admin call whose JSON body holds 2,000,000 list elements (13 MB): refused
    with InvalidArgument naming http_max_request_size (1 MiB), without being parsed
    (before: json.loads of the whole body held the event loop, 0.35 s for a second
    client's round trip); the next admin call works."""
    topic = f"persistent://public/default/admin-body-{uid()}"
    await produce_batches(cluster.service_url, topic, batches=1, size=1)
    body = json.dumps({"topic": topic, "clusters": list(range(2_000_000))})
    prober = Prober(cluster.port, topic)
    try:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Admin(pb.AdminRequest(method="topics.set_replication_clusters", body_json=body))
        handled = time.monotonic() - started
        figures = prober.stop()
    finally:
        prober.kill()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "http_max_request_size=1,048,576" in err.value.details() and len(err.value.details()) < 300
    resp = await stub.Admin(pb.AdminRequest(method="topics.stats", body_json=json.dumps({"topic": topic})))
    assert json.loads(resp.body_json)["msgInCounter"] == 1
    print(f"Admin body of {len(body):,} characters: refused in {handled * 1000:.0f} ms, second client's worst "
          f"round trip {figures['max_s'] * 1000:.0f} ms over {figures['calls']} calls")
    assert figures["max_s"] < ROUND_TRIP_BOUND_S, figures
