"""The synchronous facade's machinery without a broker: LoopThread, the generic
SyncWrapper (as used for consumers/readers), package exports, AsyncClient
construction rules."""
from __future__ import annotations

import asyncio
import threading

import pytest

import client
from client.errors import AlreadyClosed, InvalidConfiguration
from client.sync import Client, LoopThread, SyncWrapper


class FakeConsumer:
    """Stands in for the asyncio consumer: async and plain methods."""

    def __init__(self):
        self.queue: asyncio.Queue | None = None
        self.closed = False
        self.acked = []
        self.loop_thread = None

    async def receive(self, timeout_millis=None):
        if self.closed:
            raise AlreadyClosed("closed")
        if self.queue is None:
            self.queue = asyncio.Queue()
            for i in range(3):
                self.queue.put_nowait(f"m{i}")
        if self.queue.empty():
            self.closed = True
            raise AlreadyClosed("closed")
        return self.queue.get_nowait()

    def acknowledge(self, msg):
        self.loop_thread = threading.current_thread()
        self.acked.append(msg)

    def topic(self):
        return "persistent://public/default/t"

    async def close(self):
        self.closed = True

    subscription_name = "sub"


@pytest.fixture
def lt():
    t = LoopThread("test-loop")
    yield t
    t.stop()


def test_loop_thread_runs_coroutines_and_functions(lt):
    async def add(a, b):
        await asyncio.sleep(0)
        return a + b
    assert lt.run(add(1, 2)) == 3
    assert lt.call(threading.current_thread) is lt.thread
    with pytest.raises(ZeroDivisionError):
        lt.call(lambda: 1 / 0)


def test_loop_thread_refuses_blocking_calls_from_its_own_thread(lt):
    async def inner():
        return 1

    def from_loop():
        try:
            lt.run(inner())
        except RuntimeError as e:
            return str(e)
    assert "deadlock" in lt.call(from_loop)


def test_stopped_loop_thread_raises_already_closed():
    t = LoopThread()
    t.stop()
    t.stop()  # idempotent

    async def nothing():
        return None
    with pytest.raises(AlreadyClosed):
        t.run(nothing())


def test_sync_wrapper_blocks_on_async_methods_and_iterates(lt):
    fake = FakeConsumer()
    c = SyncWrapper(fake, lt)
    assert c.receive(timeout_millis=10) == "m0"
    c.acknowledge("m0")
    assert fake.acked == ["m0"] and fake.loop_thread is lt.thread  # plain methods run on the loop thread
    assert c.topic() == "persistent://public/default/t" and c.subscription_name == "sub"
    assert list(c) == ["m1", "m2"]  # iteration stops when the consumer is closed
    assert c.receive.__name__ == "receive"
    with pytest.raises(AttributeError):
        c.no_such_method
    with SyncWrapper(FakeConsumer(), lt) as c2:
        pass
    assert c2.async_object.closed


def test_sync_client_rejects_bad_url_in_the_callers_thread():
    before = threading.active_count()
    with pytest.raises(InvalidConfiguration):
        Client("pulsar://localhost:6650")
    assert threading.active_count() == before


def test_sync_client_close_is_idempotent_without_broker():
    c = Client("minipulsar://127.0.0.1:1", operation_timeout_seconds=1)
    assert c.async_client.operation_timeout_seconds == 1.0
    c.close()
    c.close()
    with pytest.raises(AlreadyClosed):
        c.get_topic_partitions("t")


async def test_async_client_contract_attributes():
    c = client.AsyncClient("minipulsar://127.0.0.1:1", operation_timeout_seconds=2)
    assert c.loop is asyncio.get_running_loop()
    assert type(c.stub).__name__ == "PulsarBrokerStub" and c.operation_timeout_seconds == 2.0

    class Handle:
        closed = False

        async def close(self):
            Handle.closed = True
    h = Handle()
    c._register(h)
    c._unregister(object())  # unknown: ignored
    c._check_open()
    await c.close()
    assert Handle.closed
    with pytest.raises(AlreadyClosed):
        c._check_open()


def test_async_client_outside_a_loop_binds_lazily():
    c = client.AsyncClient("minipulsar://127.0.0.1:1")
    with pytest.raises(InvalidConfiguration):
        c.stub
    with pytest.raises(InvalidConfiguration):
        client.AsyncClient("minipulsar://h:1", operation_timeout_seconds=0)
    with pytest.raises(InvalidConfiguration):
        client.AsyncClient("minipulsar://h:1", no_such_option=1)


def test_package_exports():
    for name in ["Client", "AsyncClient", "MessageId", "CompressionType", "PartitionsRoutingMode", "HashingScheme",
                 "BatchingType", "AdminClient", "SyncAdminClient", "PulsarException", "Timeout", "NotFound",
                 "ProducerQueueIsFull"]:
        assert hasattr(client, name), name
    for name in ["ConsumerType", "InitialPosition", "DeadLetterPolicy", "BatchReceivePolicy", "Message"]:
        assert hasattr(client, name), name
