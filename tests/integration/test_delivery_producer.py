"""Producer delivery rules against REAL standalone clusters (bookies + broker
processes): KeyBased batching with deduplication (Pulsar #15413), what a
dropped duplicate returns, and the reconnect/resend path of chunked messages.

Every topic has a durable subscription before anything is produced: a topic
without one is trimmed at once, so a Reader could miss what it should count.
"""
from __future__ import annotations

import asyncio
import uuid

import pytest

from client import AsyncClient, BatchingType, MessageId
from client.admin import AdminClient
from client.errors import PulsarException
from client.consumer_config import InitialPosition
from client.producer import is_duplicate

pytestmark = pytest.mark.timeout(240)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def dedup_namespace(admin: AdminClient, enabled: bool = True) -> str:
    ns = f"{unique('dlv')}/ns"
    await admin.create_tenant(ns.split("/")[0])
    await admin.create_namespace(ns)
    await admin.set_deduplication(ns, enabled)
    return ns


async def read_all(client: AsyncClient, topic: str, idle_ms: int = 3000) -> list[bytes]:
    """Every message of ``topic`` from the earliest one, with a Reader (until
    no more is available)."""
    reader = await client.create_reader(topic, start_message_id=MessageId.earliest)
    out = []
    try:
        while await reader.has_message_available():
            out.append((await reader.read_next(timeout_millis=idle_ms)).data())
    finally:
        await reader.close()
    return out


# ---------------------------------------------------------------- case 1 + 2
async def test_key_based_batching_with_dedup_stores_every_message(standalone):
    """2,000 messages over 4 keys, KeyBased batching, dedup on: every send()
    resolves to a stored id (none is -1:-1) and the topic holds each message
    exactly once.  Before: the key batches carried overlapping sequence-id
    ranges (A 0..1996, B 1..1997, ...), the broker took every batch after the
    first as a duplicate: 1,499 sends resolved -1:-1 and only 501 were stored."""
    async with AdminClient(standalone.service_url) as admin, AsyncClient(standalone.service_url) as client:
        ns = await dedup_namespace(admin)
        topic = f"persistent://{ns}/keyed"
        sub = await client.subscribe(topic, "keep", initial_position=InitialPosition.Earliest)
        producer = await client.create_producer(topic, batching_type=BatchingType.KeyBased,
                                                batching_max_messages=1000, batching_max_publish_delay_ms=50,
                                                max_pending_messages=5000)
        keys = [f"key-{k}" for k in range(4)]
        futs = [asyncio.ensure_future(producer.send(b"m-%d" % i, partition_key=keys[i % 4])) for i in range(2000)]
        ids = await asyncio.gather(*futs)
        dups = [i for i, mid in enumerate(ids) if is_duplicate(mid) or mid.ledger_id < 0]
        assert not dups, f"{len(dups)} of 2000 sends resolved as duplicates (-1:-1), e.g. {dups[:5]}"
        assert len(set(ids)) == 2000
        got = await read_all(client, topic)
        assert len(got) == 2000 and sorted(got) == sorted(b"m-%d" % i for i in range(2000))
        # per key, the order of sends is kept
        for k in range(4):
            seq = [int(m.split(b"-")[1]) for m in got if int(m.split(b"-")[1]) % 4 == k]
            assert seq == sorted(seq)
        await producer.close()
        await sub.close()


async def test_resent_sequence_id_is_reported_as_duplicate(standalone):
    """A send the broker drops as a duplicate resolves with MessageId -1:-1,
    which ``is_duplicate`` recognises; nothing new is stored."""
    async with AdminClient(standalone.service_url) as admin, AsyncClient(standalone.service_url) as client:
        ns = await dedup_namespace(admin)
        topic = f"persistent://{ns}/dup"
        sub = await client.subscribe(topic, "keep", initial_position=InitialPosition.Earliest)
        producer = await client.create_producer(topic, producer_name="dp", batching_enabled=False)
        first = await producer.send(b"first", sequence_id=7)
        again = await producer.send(b"again", sequence_id=7)
        assert not is_duplicate(first) and first.ledger_id >= 0
        assert is_duplicate(again) and again == MessageId(-1, -1)
        assert await read_all(client, topic) == [b"first"]
        await producer.close()
        await sub.close()


# ---------------------------------------------------------------- case 4: reconnect / resend
class CuttableProxy:
    """A TCP proxy in front of the broker.  ``hold()``: bytes from the broker are
    kept back (the client's requests still reach the broker), so the broker
    stores sends whose receipts the client never sees; ``cut()``: every
    connection is closed and new ones are forwarded normally (the client's
    channel reconnects through the proxy)."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.held = False
        self.server = None
        self.conns: list = []
        self.tasks: set = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    def hold(self) -> None:
        self.held = True

    def cut(self) -> None:
        self.held = False
        for w in self.conns:
            w.transport.abort()
        self.conns.clear()

    async def close(self) -> None:
        self.cut()
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _serve(self, c_reader, c_writer):
        task = asyncio.current_task()
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        try:
            b_reader, b_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            c_writer.transport.abort()
            return
        self.conns += [c_writer, b_writer]

        async def pump(reader, writer, holdable):
            try:
                while data := await reader.read(65536):
                    if holdable and self.held:
                        continue  # the broker's answers are lost; the connection is cut later
                    writer.write(data)
                    await writer.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                writer.transport.abort()

        await asyncio.gather(pump(c_reader, b_writer, False), pump(b_reader, c_writer, True))


@pytest.fixture(scope="module")
def small_messages_cluster(tmp_path_factory):
    """A standalone cluster with max_message_size = 16 KiB (chunks stay small,
    under HTTP/2's initial flow-control window while the proxy holds) and
    fault injection (admin ``topics.inject_send_failure``)."""
    from tests.procs import ProcessTracker, start_standalone

    base = tmp_path_factory.mktemp("small-msgs")
    conf = base / "broker.toml"
    conf.write_text("max_message_size = 16384\nenable_fault_injection = true\n")
    tracker = ProcessTracker()
    proc = start_standalone(base / "data", ("--broker-config", str(conf)), tracker=tracker)
    try:
        yield proc
    finally:
        proc.terminate()
        tracker.kill_all()


@pytest.mark.parametrize("dedup", [True, False], ids=["dedup-on", "dedup-off"])
async def test_sends_stored_before_a_broken_stream_are_not_sent_again(small_messages_cluster, dedup):
    """The broker stores m0, the 3 chunks of m1 and m2, but their receipts never
    reach the producer and the stream breaks.  On reconnect the broker's last
    sequence id (2) shows them stored: the producer sends none of them again,
    each send resolves (as a duplicate, id unknown) and the topic holds exactly
    5 entries and the 3 messages once.  Before: everything was resent; with
    dedup on the first 2 chunks of m1 were stored again (only the last chunk
    is deduplicated: 7 entries, and a consumer is left with an incomplete
    copy of m1), with dedup off every message was stored twice."""
    cluster = small_messages_cluster
    big = bytes(range(256)) * 160  # 40,960 bytes: 3 chunks under 16 KiB
    async with AdminClient(cluster.service_url) as admin, AsyncClient(cluster.service_url) as direct:
        ns = await dedup_namespace(admin, dedup)
        topic = f"persistent://{ns}/cut"
        await (await direct.subscribe(topic, "keep", initial_position=InitialPosition.Earliest)).close()
        proxy = CuttableProxy(cluster.port)
        port = await proxy.start()
        try:
            async with AsyncClient(f"minipulsar://127.0.0.1:{port}", operation_timeout_seconds=30) as client:
                producer = await client.create_producer(topic, producer_name="cut-producer", batching_enabled=False,
                                                        chunking_enabled=True, compression_type="NONE")
                proxy.hold()
                futs = [asyncio.ensure_future(producer.send(p)) for p in (b"m0", big, b"m2")]
                async with asyncio.timeout(30):
                    while (await admin.get_internal_stats(topic))["entriesAddedCounter"] < 5:
                        await asyncio.sleep(0.05)
                assert not any(f.done() for f in futs)
                proxy.cut()
                async with asyncio.timeout(60):
                    ids = await asyncio.gather(*futs)
                assert all(is_duplicate(i) for i in ids)  # stored by the first transmission; id unknown
                assert producer.last_sequence_id() == 2
                after = await producer.send(b"m3")  # the stream works again
                assert after.ledger_id >= 0
                await producer.close()
        finally:
            await proxy.close()
        assert (await admin.get_internal_stats(topic))["entriesAddedCounter"] == 6
        assert await read_all(direct, topic) == [b"m0", big, b"m2", b"m3"]


@pytest.mark.parametrize("dedup", [True, False], ids=["dedup-on", "dedup-off"])
async def test_refused_send_is_never_reported_as_stored(small_messages_cluster, dedup):
    """The broker refuses the first of 6 sends written in one frame (injected
    retriable error) and ends the stream; it went on storing the 5 others
    first.  Every send either fails or resolves, and the topic holds exactly
    the messages whose send did not fail, once each.  Before: the refused
    message was resent, dropped by deduplication as a duplicate of the later
    ones, and its send resolved -1:-1 like a stored message (it was lost);
    with dedup off the 5 others were stored twice."""
    cluster = small_messages_cluster
    async with AdminClient(cluster.service_url) as admin, AsyncClient(cluster.service_url) as client:
        ns = await dedup_namespace(admin, dedup)
        topic = f"persistent://{ns}/refused"
        await (await client.subscribe(topic, "keep", initial_position=InitialPosition.Earliest)).close()
        producer = await client.create_producer(topic, batching_enabled=False, chunking_enabled=True,
                                                compression_type="NONE")
        await producer.send(b"warm")
        await admin.call("topics.inject_send_failure", topic=topic, count=1)
        payloads = [b"m0", b"m1", bytes(range(256)) * 100, b"m3", b"m4", b"m5"]  # m2: 2 chunks
        async with asyncio.timeout(60):
            results = await asyncio.gather(*(producer.send(p) for p in payloads), return_exceptions=True)
        failed = [i for i, r in enumerate(results) if isinstance(r, PulsarException)]
        assert all(isinstance(r, (MessageId, PulsarException)) for r in results), results
        stored = await read_all(client, topic)
        assert sorted(stored) == sorted([b"warm"] + [p for i, p in enumerate(payloads) if i not in failed])
        assert len(stored) == len(set(stored))
        # Only the refused send may fail (reported lost, not as a duplicate); a broker that
        # stores nothing after a refused send would make it succeed on the resend.
        assert failed in ([], [0])
        await producer.close()
