"""ConsumerImpl's stream logic against a scripted in-process fake of the
Consume stream (no broker): subscribe handshake, flow permits, ack grouping
on the wire, negative acks, dead letters, seek ordering, reconnection."""
import asyncio

import grpc
import pytest

from client.batching import PendingMessage, message_metadata
from client.consumer import ConsumerType, DeadLetterPolicy, create_consumer
from client.entry_format import encode_entry
from client.errors import ConsumerBusy
from client.lookup import LookupResult
from proto import broker_pb2 as pb


class FakeCall:
    """One Consume stream: records requests, answers subscribe/requests itself."""

    def __init__(self, fail_subscribe=None):
        self.sent: list[pb.ConsumerRequest] = []
        self.responses: asyncio.Queue = asyncio.Queue()
        self.fail_subscribe = fail_subscribe
        self.cancelled = False

    async def write(self, req):
        self.sent.append(req)
        kind = req.WhichOneof("request")
        if kind == "subscribe":
            if self.fail_subscribe:
                self.responses.put_nowait(pb.ConsumerResponse(error=pb.CommandError(error=self.fail_subscribe)))
            else:
                self.responses.put_nowait(pb.ConsumerResponse(subscribed=pb.SubscribeSuccess()))
        elif kind in ("seek", "unsubscribe", "ack") and getattr(req, kind).request_id:
            self.responses.put_nowait(pb.ConsumerResponse(success=pb.CommandSuccess(
                request_id=getattr(req, kind).request_id)))

    async def read(self):
        item = await self.responses.get()
        if isinstance(item, BaseException):
            raise item
        return item

    async def done_writing(self):
        self.responses.put_nowait(grpc.aio.EOF)

    def cancel(self):
        self.cancelled = True

    def push(self, *entries):
        self.responses.put_nowait(pb.ConsumerResponse(messages=pb.MessageBatch(entries=list(entries))))

    def of(self, kind):
        return [getattr(r, kind) for r in self.sent if r.WhichOneof("request") == kind]


class FakeStub:
    def __init__(self):
        self.calls: list[FakeCall] = []
        self.fail_next: list = []

    def Consume(self):
        call = FakeCall(self.fail_next.pop(0) if self.fail_next else None)
        self.calls.append(call)
        return call


class FakeProducer:
    def __init__(self, topic):
        self.topic, self.sent = topic, []

    async def send(self, content, **kw):
        self.sent.append((content, kw))

    async def close(self):
        pass


class FakeClient:
    """The AsyncClient surface ConsumerImpl uses; every topic is served by ``stub``
    (a standalone broker: lookups answer proxy-through)."""
    operation_timeout_seconds = 2.0

    def __init__(self):
        self.stub = FakeStub()
        self.handles = []
        self.producers: dict[str, FakeProducer] = {}
        self.invalidated: list[str] = []

    async def lookup_topic(self, topic):
        return LookupResult("fake:1", "minipulsar://fake:1", proxy_through_service_url=True)

    def broker_stub(self, result):
        return self.stub

    async def connected_stub(self, result):
        return self.stub

    def mark_host_unresponsive(self, target):
        pass

    def invalidate_lookup(self, topic):
        self.invalidated.append(topic)

    def _check_open(self):
        pass

    def _register(self, h):
        self.handles.append(h)

    def _unregister(self, h):
        if h in self.handles:
            self.handles.remove(h)

    async def get_partitioned_topic_metadata(self, topic):
        return 0

    async def create_producer(self, topic, **kw):
        return self.producers.setdefault(topic, FakeProducer(topic))


def entry(payload, entry_id, redelivery=0, ledger=1, key=None):
    md = message_metadata(PendingMessage(payload, entry_id, partition_key=key), "prod", 1)
    return pb.EntryMessage(position=pb.Position(ledger_id=ledger, entry_id=entry_id),
                           headers_and_payload=encode_entry(md, payload), redelivery_count=redelivery)


async def until(cond, timeout=2.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


TOPIC = "persistent://public/default/fake"


async def test_subscribe_flow_and_refill_at_half():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", receiver_queue_size=4, consumer_name="me")
    call = client.stub.calls[0]
    sub = call.of("subscribe")[0]
    assert (sub.topic, sub.subscription, sub.consumer_name, sub.durable) == (TOPIC, "sub", "me", True)
    assert [f.permits for f in call.of("flow")] == [4]
    call.push(*(entry(b"%d" % i, i) for i in range(4)))
    assert (await c.receive(1000)).data() == b"0"
    await asyncio.sleep(0.05)
    assert [f.permits for f in call.of("flow")] == [4]
    assert (await c.receive(1000)).data() == b"1"
    await until(lambda: [f.permits for f in call.of("flow")] == [4, 2])  # half consumed: refill
    assert c in client.handles
    await c.close()
    assert c not in client.handles and call.cancelled


async def test_acks_grouped_into_one_frame_and_flushed_on_close():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", ack_group_time_ms=50)
    call = client.stub.calls[0]
    call.push(*(entry(b"x", i) for i in range(3)))
    for _ in range(3):
        c.acknowledge(await c.receive(1000))
    await until(lambda: call.of("ack"))
    (ack,) = call.of("ack")
    # a receipt is asked for: the acks stay in flight (filtering redeliveries) until the broker answers
    assert [p.entry_id for p in ack.positions] == [0, 1, 2] and ack.request_id
    call.push(entry(b"y", 3))
    c.acknowledge_cumulative(await c.receive(1000))
    await c.close()  # pending cumulative ack leaves with a request id, confirmed
    last = call.of("ack")[-1]
    assert last.ack_type == pb.Cumulative and last.positions[0].entry_id == 3 and last.request_id


async def test_subscribe_error_is_raised():
    client = FakeClient()
    client.stub.fail_next.append("ConsumerBusy")
    with pytest.raises(ConsumerBusy):
        await create_consumer(client, "fake", "sub")


async def test_negative_ack_on_shared_redelivers_positions():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", consumer_type=ConsumerType.Shared,
                              negative_ack_redelivery_delay_ms=50)
    call = client.stub.calls[0]
    call.push(entry(b"a", 0), entry(b"b", 1))
    c.negative_acknowledge(await c.receive(1000))
    await until(lambda: call.of("redeliver"))
    assert [p.entry_id for p in call.of("redeliver")[0].positions] == [0]
    assert (await c.receive(1000)).data() == b"b"  # still queued, not dropped


async def test_negative_ack_on_exclusive_redelivers_everything_and_clears_queue():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", negative_ack_redelivery_delay_ms=50)
    call = client.stub.calls[0]
    call.push(entry(b"a", 0), entry(b"b", 1), entry(b"c", 2))
    c.negative_acknowledge(await c.receive(1000))
    await until(lambda: call.of("redeliver"))
    assert list(call.of("redeliver")[0].positions) == []  # all, as Pulsar for non-shared
    assert len(c._queue) == 0  # queued b, c dropped: the broker sends them again


async def test_dead_letter_instead_of_delivery():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", consumer_type=ConsumerType.Shared,
                              dead_letter_policy=DeadLetterPolicy(max_redeliver_count=3), ack_group_time_ms=0)
    call = client.stub.calls[0]
    # as Pulsar: redelivery count == max is still delivered, above it goes to the dead-letter topic
    call.push(entry(b"bad", 0, redelivery=4), entry(b"ok", 1, redelivery=3))
    assert (await c.receive(1000)).data() == b"ok"
    producer = client.producers[f"{TOPIC}-sub-DLQ"]
    await until(lambda: call.of("ack"))
    (content, kw), = producer.sent
    assert content == b"bad" and kw["properties"] == {"REAL_TOPIC": TOPIC, "ORIGIN_MESSAGE_ID": "1:0:-1:-1"}
    assert [p.entry_id for p in call.of("ack")[0].positions] == [0]


async def test_seek_clears_what_came_before_the_success_only():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub")
    call = client.stub.calls[0]
    call.push(entry(b"old", 5))
    await until(lambda: len(c._queue) == 1)
    original_write = call.write

    async def write(req):
        await original_write(req)
        if req.WhichOneof("request") == "seek":
            call.push(entry(b"new", 0))  # re-dispatched right after the CommandSuccess
    call.write = write
    from client.message_id import MessageId
    await c.seek(MessageId(1, 0))
    assert (await c.receive(1000)).data() == b"new"
    assert call.of("seek")[0].message_id.entry_id == 0


async def test_reconnect_after_stream_error_resubscribes():
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub", receiver_queue_size=10)
    first = client.stub.calls[0]
    first.push(entry(b"a", 0), entry(b"b", 1))
    assert (await c.receive(1000)).data() == b"a"
    await until(lambda: len(c._queue) == 1)
    first.responses.put_nowait(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "gone"))
    await until(lambda: len(client.stub.calls) == 2 and client.stub.calls[1].of("flow"))
    second = client.stub.calls[1]
    assert len(c._queue) == 0  # b dropped: the broker redelivers it
    assert [f.permits for f in second.of("flow")] == [10]
    second.push(entry(b"b", 1, redelivery=1))
    m = await c.receive(1000)
    assert m.data() == b"b" and m.redelivery_count() == 1
    await c.close()


class _AnswerAsClosed(FakeCall):
    """A Consume stream whose subscribe answer arrives in the same loop turns as
    the application's close(): the read hands back ``subscribed`` and, from
    inside it, closes the consumer (the close runs two loop turns later, after
    the answer is on its way, before the reconnect code resumes)."""

    def __init__(self, on_answer):
        super().__init__()
        self.on_answer = on_answer

    async def read(self):
        item = await super().read()
        if isinstance(item, pb.ConsumerResponse) and item.WhichOneof("response") == "subscribed":
            asyncio.get_running_loop().call_soon(self.on_answer)
        return item


async def test_close_while_the_reconnect_answer_arrives_leaves_no_stream_open():
    """Found by the durability model: a consumer closed while its reconnection's
    subscribe answer arrived kept the new stream open (Python 3.11's wait_for
    returned the answer and swallowed the cancellation), so the broker kept it
    attached and an Exclusive subscription answered ConsumerBusy to everyone."""
    client = FakeClient()
    c = await create_consumer(client, "fake", "sub")
    impl = c._impl
    impl._maintenance_task.cancel()  # close() then runs without pausing before it cancels the tasks
    await asyncio.sleep(0)
    closing: list[asyncio.Task] = []
    client.stub.Consume = lambda: client.stub.calls.append(
        _AnswerAsClosed(lambda: closing.append(asyncio.ensure_future(c.close())))) or client.stub.calls[-1]
    client.stub.calls[0].responses.put_nowait(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "gone"))
    await until(lambda: closing)
    await closing[0]
    await asyncio.sleep(0.05)
    second = client.stub.calls[1]
    assert second.of("subscribe"), "the consumer did not try to reconnect"
    assert second.cancelled, "the stream opened while closing was left open: the broker keeps the consumer"
    assert impl._call is None and impl._run_task.done()
