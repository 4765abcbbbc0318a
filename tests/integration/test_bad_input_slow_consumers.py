"""Slow consumers cost bounded broker memory (issue 21 item 7), with real processes.

A consumer that grants 2**32-1 permits and never reads (here: its connection goes
through a TCP proxy that stops reading, so the broker's socket fills up, as with a
client that stopped reading its socket) used to make the broker
buffer the whole backlog for it (~50 MB per subscription, 420 MB for 8). Now,
as Pulsar's channel writability: a consumer stream whose outgoing queue is over
its high-water mark (2 MiB) gets no more entries until it drains; reads are
sized to the room left; permits are clamped (broker.service.consumer.MAX_PERMITS);
the frames a consumer was never sent are dropped when it goes.

Figures asserted: per hostile consumer the broker pushes a bounded number of
entries (here < 1/3 of a 300-entry backlog; before: all of it), the broker's
RSS grows by less than MEMORY_BOUND_MB for 8 such consumers (before: ~8 x the
40 MB backlog), and after they disconnect every message is still delivered.
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid

import grpc
import pytest

from client import AsyncClient, InitialPosition
from client.admin import AdminClient
from client.consumer import ConsumerType
from client.errors import Timeout
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc

pytestmark = pytest.mark.timeout(300)

ENTRIES = 300
ENTRY_BYTES = 128 * 1024
SUBSCRIPTIONS = 8
MEMORY_BOUND_MB = 120


class StopReadingProxy:
    """TCP proxy in front of the broker whose ``stop_reading()`` stops reading what
    the broker sends (client -> broker keeps flowing): the broker's socket fills
    up exactly as with a client that no longer reads its socket."""

    def __init__(self, port: int):
        self.target_port = port
        self.upstreams: list[asyncio.StreamReader] = []
        self.stopped = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.server = None

    async def start(self) -> "StopReadingProxy":
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, c_reader, c_writer):
        u_reader, u_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.tasks.append(asyncio.ensure_future(self._pipe(c_reader, u_writer, stoppable=False)))
        self.tasks.append(asyncio.ensure_future(self._pipe(u_reader, c_writer, stoppable=True)))

    async def _pipe(self, reader, writer, stoppable: bool):
        try:
            while True:
                if stoppable and self.stopped.is_set():
                    await asyncio.Event().wait()        # never read again (until close)
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def stop_reading(self) -> None:
        self.stopped.set()

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.server.close()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def out_counters(admin, topic) -> dict[str, list[int]]:
    stats = await admin.get_stats(topic)
    return {name: [c["msgOutCounter"] for c in s["consumers"]] for name, s in stats["subscriptions"].items()}


async def test_consumers_that_never_read_cost_bounded_memory(standalone_factory):
    cluster = standalone_factory()
    topic = f"persistent://public/default/slow-{uuid.uuid4().hex[:8]}"
    subs = [f"slow-{i}" for i in range(SUBSCRIPTIONS)]
    async with AsyncClient(cluster.service_url) as client, AdminClient(cluster.service_url) as admin:
        for sub in subs:   # the subscriptions exist before the backlog is written
            consumer = await client.subscribe(topic, sub, consumer_type=ConsumerType.Exclusive,
                                              initial_position=InitialPosition.Earliest)
            await consumer.close()
        producer = await client.create_producer(topic, batching_enabled=False)
        payload = os.urandom(ENTRY_BYTES - 64)   # incompressible: the entries really are this big
        futs = [asyncio.ensure_future(producer.send(payload + b"%06d" % i)) for i in range(ENTRIES)]
        await asyncio.gather(*futs)
        await producer.close()
        await asyncio.sleep(1.0)
        before = rss_mb(cluster.pid)

        proxy = await StopReadingProxy(cluster.port).start()
        channel = grpc.aio.insecure_channel(proxy.address)
        stub = broker_pb2_grpc.PulsarBrokerStub(channel)
        calls = []
        for sub in subs:
            call = stub.Consume()
            await call.write(pb.ConsumerRequest(subscribe=pb.Subscribe(
                topic=topic, subscription=sub, sub_type=pb.Exclusive, durable=True, initial_position=pb.Earliest)))
            assert (await asyncio.wait_for(call.read(), 30)).WhichOneof("response") == "subscribed"
            calls.append(call)
        proxy.stop_reading()          # from now on nothing the broker sends is read
        for call in calls:
            await call.write(pb.ConsumerRequest(flow=pb.Flow(permits=2**32 - 1)))
        # Let dispatch run until it stops (counters stable for 2 s).
        last, stable_since = None, time.monotonic()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            counters = await out_counters(admin, topic)
            if counters != last:
                last, stable_since = counters, time.monotonic()
            elif time.monotonic() - stable_since > 2.0 and all(counters[s] for s in subs):
                break
            await asyncio.sleep(0.25)
        during = rss_mb(cluster.pid)
        stats = await admin.get_stats(topic)
        pushed = {s: sum(last[s]) for s in subs}
        permits = [c["availablePermits"] for s in subs for c in stats["subscriptions"][s]["consumers"]]
        print(f"{SUBSCRIPTIONS} consumers granting 2**32-1 permits, never reading, {ENTRIES} x "
              f"{ENTRY_BYTES // 1024} KiB backlog: entries pushed per consumer {sorted(pushed.values())}, "
              f"broker RSS {before:.0f} -> {during:.0f} MB (+{during - before:.0f})")
        assert all(0 < n < ENTRIES // 3 for n in pushed.values()), pushed
        assert all(p <= 1 << 20 for p in permits), permits
        # the stats tell where the frames stopped: queued at the broker, not written
        outbound = [(c["outboundQueuedFrames"], c["outboundQueuedBytes"], c["outboundFramesWritten"])
                    for s in subs for c in stats["subscriptions"][s]["consumers"]]
        assert all(frames > 0 and size > 0 for frames, size, _ in outbound), outbound
        # ... and dispatch to them waits: over the high-water mark, a consumer has no permits
        states = {stats["subscriptions"][s]["dispatcherState"] for s in subs}
        assert states == {"waiting for permits"}, states
        assert during - before < MEMORY_BOUND_MB, (before, during)

        for call in calls:
            call.cancel()
        await channel.close()
        await proxy.close()           # the connection goes: the broker sees the streams end
        deadline = time.monotonic() + 30
        while True:
            stats = await admin.get_stats(topic)
            if not any(stats["subscriptions"][s]["consumers"] for s in subs):
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        after = rss_mb(cluster.pid)
        print(f"after the slow consumers disconnected: broker RSS {after:.0f} MB")
        assert after - before < MEMORY_BOUND_MB, (before, after)

        # Nothing was lost: a normal consumer of each of two subscriptions gets the whole backlog in order.
        for sub in subs[:2]:
            consumer = await client.subscribe(topic, sub, consumer_type=ConsumerType.Exclusive,
                                              initial_position=InitialPosition.Earliest)
            got = []
            while True:
                try:
                    msg = await consumer.receive(timeout_millis=3000)
                except Timeout:
                    break
                got.append(int(msg.data()[-6:]))
                consumer.acknowledge(msg)
            impl, = consumer._impls()
            counts = (impl.entries_received, impl.stale_entries_dropped, impl.reconnections)
            await consumer.close()
            assert got == list(range(ENTRIES)), (sub, len(got))
            assert counts == (ENTRIES, 0, 0), counts   # the SDK's own count of what its stream brought
