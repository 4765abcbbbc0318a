"""Broker clusters under partial failure (issue 33): a broker cut off from etcd (its etcd
link through a TCP proxy that holds every byte, nothing closed) or paused (SIGSTOP) past
its session, while its clients stay connected.

Every process is real: one etcd, 2 bookies, 2 brokers; session timeout 2 s
(``tests.cluster.FAST_CONFIG``).
"""
from __future__ import annotations

import asyncio
import time

import pytest

from client import AsyncClient, InitialPosition
from client.consumer_config import ConsumerType
from tests.cluster import BrokerCluster
from tests.integration.test_broker_cluster import _read_all, admin_call, owner_of

pytestmark = pytest.mark.timeout(180)


def _log(proc) -> str:
    return "".join(p.read_text(errors="replace") for p in (proc.stdout_log, proc.stderr_log) if p.exists())


async def _wait_log(proc, needle: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in _log(proc):
        if time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} not in {proc.stdout_log} after {timeout_s}s")
        await asyncio.sleep(0.1)


async def _wait_owner(via_port: int, topic: str, want_url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = (await admin_call(via_port, "topics.lookup", {"topic": topic}, timeout=5))["broker_url"]
            if last == want_url:
                return
        except Exception as exc:  # noqa: BLE001 - the old owner's lease has not expired yet
            last = exc
        await asyncio.sleep(0.2)
    raise AssertionError(f"{topic} not owned by {want_url} after {timeout_s}s (last: {last})")


@pytest.fixture
def cut_cluster(tmp_path, process_tracker):
    """etcd + 2 bookies; broker 0 (started first: it owns what is looked up before broker 1
    exists) reaches etcd through a proxy; broker 1 directly. Yields (cluster, b0, proxy, b1)."""
    c = BrokerCluster(tmp_path, process_tracker, brokers=0, bookies=2).start()
    b0, proxy = c.start_broker_behind_etcd_proxy(0)
    try:
        yield c, b0, proxy
    finally:
        proxy.close()


async def test_a_broker_cut_off_from_etcd_writes_no_cursor_metadata_and_the_new_owner_keeps_acking(cut_cluster):
    """Issue 33 case 1: the cut-off owner's session is lost, it closes the topic; its last
    ManagedCursorInfo write must not reach etcd when the link returns (it is refused before
    it is sent, and a late one fails on the version the new owner bumped at recovery), so
    the new owner persists acknowledgments and nothing acknowledged comes back."""
    c, b0, proxy = cut_cluster
    topic = "persistent://public/default/zombie-cursor"
    async with AsyncClient(b0.service_url, operation_timeout_seconds=30) as client0:
        consumer0 = await client0.subscribe(topic, "sub", consumer_type=ConsumerType.Shared,
                                            initial_position=InitialPosition.Earliest)
        producer = await client0.create_producer(topic)
        for n in range(20):
            await producer.send(str(n).encode())
        got = {}
        while len(got) < 20:
            msg = await consumer0.receive(timeout_millis=10000)
            got[int(msg.data())] = msg
        for n in range(10):
            await consumer0.acknowledge_and_wait(got[n])       # cursor ledger + ManagedCursorInfo written by b0
        assert await owner_of(c, topic, via=b0.port) == b0.service_url
        b1 = c.start_broker(1)
        c.brokers.append(b1)

        proxy.hold()                                            # b0 loses etcd; its clients stay connected
        await _wait_owner(b1.port, topic, b1.service_url)
        async with AsyncClient(b1.service_url, operation_timeout_seconds=30) as client1:
            consumer1 = await client1.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
            redelivered = {}
            while len(redelivered) < 10:
                msg = await consumer1.receive(timeout_millis=15000)
                redelivered[int(msg.data())] = msg
            assert sorted(redelivered) == list(range(10, 20)), sorted(redelivered)
            await _wait_log(b0, "session event SessionLost", 20)
            await asyncio.sleep(1.5)                            # b0 closes the topic meanwhile (its last writes)
            proxy.release()                                     # whatever b0 sent reaches etcd now
            await asyncio.sleep(2.0)
            for n in range(10, 15):
                await asyncio.wait_for(consumer1.acknowledge_and_wait(redelivered[n]), 20)
            await consumer1.close()
        # consumer0 is still open and may have reconnected to the new owner (a Shared consumer
        # takes its share of 15..19); closing it hands what it holds back to the subscription
        for handle in (consumer0, producer):
            try:
                await asyncio.wait_for(handle.close(), 15)
            except Exception:  # noqa: BLE001 - a close refused by the zombie still drops the handle
                pass
        # the topic reloaded from the store (another broker, or b1 again) has the new owner's acks
        await admin_call(b1.port, "namespaces.unload", {"namespace": "public/default"})
        async with AsyncClient(b1.service_url, operation_timeout_seconds=30) as client2:
            consumer2 = await client2.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
            again = set()
            while True:
                try:
                    msg = await consumer2.receive(timeout_millis=3000)
                except Exception:  # noqa: BLE001 - Timeout: nothing more to deliver
                    break
                again.add(int(msg.data()))
            assert again == set(range(15, 20)), \
                f"expected exactly the unacknowledged 15..19 again, got {sorted(again)}"
    log = _log(b0)
    assert "metadata write refused" in log or "taken over by another owner" in log, \
        "the cut-off broker must refuse (or be refused) its cursor metadata writes"


@pytest.fixture
async def shared_meta(tmp_path):
    from broker.metadata import SqliteMetadataStore

    store = await SqliteMetadataStore.open(str(tmp_path / "metadata.db"))
    yield store
    await store.close()


async def test_a_cursor_taken_over_by_a_new_owner_fences_the_old_one_instead_of_failing_forever(
        bookie_factory, shared_meta):
    """Two owners of one managed ledger over one metadata store and real bookies (a zombie
    broker and the new owner): the new owner's recovery bumps the cursor node's version;
    the zombie's next cursor metadata write then fails with BadVersion, which fences its
    managed ledger once (listeners told: the topic closes and reloads) instead of an
    acknowledgment retried forever, and leaves the new owner's node untouched."""
    from bookie.client import BookKeeper
    from broker.ledger.errors import ManagedLedgerFencedError
    from broker.ledger.factory import ManagedLedgerFactory
    from broker.ledger.ml_config import ManagedLedgerConfig

    addrs = [bookie_factory().address for _ in range(2)]
    config = ManagedLedgerConfig(managed_ledger_default_ensemble_size=2, managed_ledger_default_write_quorum=2,
                                 managed_ledger_default_ack_quorum=2)
    name = "public/default/persistent/two-owners"
    bk_old, bk_new = BookKeeper(shared_meta, addrs), BookKeeper(shared_meta, addrs)
    old_factory, new_factory = ManagedLedgerFactory(shared_meta, bk_old, config), ManagedLedgerFactory(
        shared_meta, bk_new, config)
    try:
        old = await old_factory.open(name)
        fenced = []
        old.add_fenced_listener(fenced.append)
        cursor = await old.open_cursor("sub", initial_position="earliest")
        positions = [await old.add_entry(b"m%d" % i) for i in range(10)]
        await cursor.mark_delete(positions[3])

        new = await new_factory.open(name)                      # the new owner recovers (and fences) it
        node = await shared_meta.get(new.cursors["sub"].path)
        await new.cursors["sub"].mark_delete(positions[5])
        after_new = await shared_meta.get(new.cursors["sub"].path)
        assert after_new.version > node.version

        cursor._abandon_cursor_ledger()                         # the zombie's next persist writes the node
        with pytest.raises(ManagedLedgerFencedError):
            await cursor.mark_delete(positions[7])
        assert len(fenced) == 1 and isinstance(fenced[0], ManagedLedgerFencedError)
        with pytest.raises(ManagedLedgerFencedError):           # fenced for good: no retry
            await cursor.mark_delete(positions[8])
        assert len(fenced) == 1
        assert await shared_meta.get(new.cursors["sub"].path) == after_new   # the new owner's state stands
        await old.close()                                       # a fenced ledger writes nothing at close
        assert await shared_meta.get(new.cursors["sub"].path) == after_new
        recovered = await ManagedLedgerFactory(shared_meta, BookKeeper(shared_meta, addrs), config).open(name)
        assert recovered.cursors["sub"].mark_delete_position == positions[5]
    finally:
        await new_factory.close()
        await bk_old.close()
        await bk_new.close()


# ---- case 4: a send timeout never turns into a silent drop --------------------------------------
async def test_a_send_timeout_fails_every_pending_message_in_order(standalone):
    """Five sends, then five more 60 % of the send timeout later, all held by a proxy that
    forwards nothing: when the first five time out, the last five fail too, in send
    order (Pulsar's failPendingMessages), although their own timeout has not passed; so
    when the link comes back none of the later ones is stored while an earlier one failed."""
    from client.errors import Timeout
    from tests.tcp_proxy import TcpProxy

    topic = "persistent://public/default/send-timeout-order"
    async with TcpProxy.to_service_url(standalone.service_url) as proxy:
        async with AsyncClient(proxy.service_url, operation_timeout_seconds=30) as client:
            producer = await client.create_producer(topic, producer_name="p-timeout", send_timeout_millis=2000,
                                                    batching_enabled=False)
            await producer.send(b"before")
            settled = []

            def note(i):
                def cb(exc, mid):
                    settled.append((i, type(exc).__name__ if exc is not None else str(mid)))
                return cb

            proxy.hold()
            for i in range(5):
                producer.send_async(b"early-%d" % i, note(i))
            await asyncio.sleep(1.2)
            for i in range(5, 10):
                producer.send_async(b"late-%d" % i, note(i))
            deadline = time.monotonic() + 10
            while not settled and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)
            proxy.release()                      # the late five's own timeout has 1 s to go
            deadline = time.monotonic() + 10
            while len(settled) < 10 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert settled == [(i, Timeout.__name__) for i in range(10)], settled
            assert (await producer.send(b"after")).entry_id >= 0        # the producer serves again
            await producer.close()


async def test_a_resent_sequence_id_never_stored_is_refused_not_acknowledged_as_duplicate(standalone):
    """Ids 0-2 and 6 stored, 3-5 never (a send timeout failed them while 6 got through):
    a resend of 4 must fail with a clear error, not come back as MessageId(-1, -1)
    (stored nowhere); a resend of a stored id still is a duplicate."""
    from client.errors import PreconditionFailed
    from client.producer import is_duplicate

    from tests.procs import ensure_namespace

    await ensure_namespace(standalone.service_url, "public/seq-behind")     # its own: the standalone is shared
    topic = "persistent://public/seq-behind/t"
    await admin_call(int(standalone.service_url.rsplit(":", 1)[1]), "namespaces.set_deduplication",
                     {"namespace": "public/seq-behind", "enabled": True})
    async with AsyncClient(standalone.service_url) as client:
        producer = await client.create_producer(topic, producer_name="p-behind", batching_enabled=False)
        for seq in (0, 1, 2, 6):
            assert not is_duplicate(await producer.send(b"m%d" % seq, sequence_id=seq))
        assert is_duplicate(await producer.send(b"m1", sequence_id=1))          # stored: a real duplicate
        with pytest.raises(PreconditionFailed, match="below the last stored one"):
            await producer.send(b"m4", sequence_id=4)
        assert not is_duplicate(await producer.send(b"m7", sequence_id=7))     # the producer goes on
        await producer.close()


# ---- case 3: an owner cut off from etcd sends its clients elsewhere -------------------------------
async def test_clients_of_an_owner_cut_off_from_etcd_serve_again_through_another_broker(cut_cluster):
    """The owner's etcd link is held for 15 s while its producer (service URL: that broker
    first) keeps sending: once its session is lost it closes the topic and answers lookups
    "ask another broker" (MetadataSessionLost), the client asks the next host at once, and
    sends are acknowledged again through the new owner while the link is still cut."""
    c, b0, proxy = cut_cluster
    topic = "persistent://public/default/cut-owner"
    async with AsyncClient(b0.service_url) as setup:
        await (await setup.create_producer(topic)).send(b"owned by b0")
    b1 = c.start_broker(1)
    c.brokers.append(b1)
    url = f"minipulsar://127.0.0.1:{b0.port},127.0.0.1:{b1.port}"
    async with AsyncClient(url, operation_timeout_seconds=30) as client:
        producer = await client.create_producer(topic, producer_name="p-cut", send_timeout_millis=0)
        assert (await producer.send(b"before")).entry_id >= 0
        proxy.hold()
        t_cut = time.monotonic()
        await _wait_log(b0, "session event SessionLost", 20)
        t_lost = time.monotonic()
        served_at = None
        n = 0
        while time.monotonic() - t_cut < 15:
            try:
                await asyncio.wait_for(producer.send(b"during %d" % n), 1.0)
                if time.monotonic() > t_lost + 0.5:
                    served_at = time.monotonic()
                    break
            except asyncio.TimeoutError:
                pass
            n += 1
        proxy.release()
        assert served_at is not None, "the producer did not serve again while its owner was cut off from etcd"
        print(f"\nstall after the owner's session loss: {served_at - t_lost:.1f}s (cut at -{t_lost - t_cut:.1f}s)")
        assert await owner_of(c, topic, via=b1.port) == b1.service_url


# ---- case 2: a paused owner's clients leave it --------------------------------------------------
@pytest.fixture
def cluster3(tmp_path, process_tracker):
    return BrokerCluster(tmp_path, process_tracker, brokers=3, bookies=2).start()


async def test_clients_of_a_paused_owner_serve_again_while_it_is_still_paused(cluster3):
    """SIGSTOP of the owner for 15 s (session 2 s) while a producer sends and a consumer
    receives through a multi-host URL, keepalive 1 s: the unanswered pings close their
    connection, the owner's bundle moves when its session expires, and both serve again
    through the new owner while the old one is still paused. Nothing acknowledged is lost
    or stored twice (dedup on, the SDK resends)."""
    c = cluster3
    await admin_call(c.brokers[0].port, "namespaces.set_deduplication", {"namespace": "public/default",
                                                                         "enabled": True})
    topic = "persistent://public/default/paused-owner"
    async with AsyncClient(c.service_url, operation_timeout_seconds=30, keep_alive_interval_seconds=1,
                           connection_timeout_ms=1000) as client:
        consumer = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared,
                                          initial_position=InitialPosition.Earliest)
        producer = await client.create_producer(topic, producer_name="p-paused", send_timeout_millis=0)
        for n in range(20):
            await producer.send(str(n).encode())
        received = set()
        while len(received) < 20:
            msg = await consumer.receive(timeout_millis=10000)
            received.add(int(msg.data()))
            await consumer.acknowledge_and_wait(msg)
        victim = c.broker_by_url(await owner_of(c, topic))
        c.pause(victim)
        t_pause = time.monotonic()
        try:
            stored_during = []
            sending = asyncio.ensure_future(producer.send(b"20"))
            n = 21
            while time.monotonic() - t_pause < 15:
                done, _ = await asyncio.wait({sending}, timeout=0.2)
                if done:
                    stored_during.append((n - 1, time.monotonic() - t_pause))
                    sending = asyncio.ensure_future(producer.send(str(n).encode()))
                    n += 1
                    if len(stored_during) >= 3:
                        break
            got_during = None
            while got_during is None and time.monotonic() - t_pause < 15:
                try:
                    msg = await consumer.receive(timeout_millis=500)
                except Exception:  # noqa: BLE001 - Timeout: not yet
                    continue
                received.add(int(msg.data()))
                await consumer.acknowledge_and_wait(msg)
                got_during = time.monotonic() - t_pause
            still_paused = time.monotonic() - t_pause < 15
        finally:
            c.resume(victim)
        assert stored_during, "no send was acknowledged while the old owner was paused"
        assert got_during is not None and still_paused, "the consumer received nothing while the old owner was paused"
        print(f"\npaused owner: first send acknowledged {stored_during[0][1]:.1f}s after SIGSTOP, "
              f"first message received {got_during:.1f}s after it")
        await asyncio.wait_for(sending, 30)
        while len(received) < n:
            msg = await consumer.receive(timeout_millis=15000)
            received.add(int(msg.data()))
            await consumer.acknowledge_and_wait(msg)
        assert received == set(range(n))
        stored = [int(x) for x in await _read_all(client, topic)]
        assert sorted(stored) == list(range(n)), "every acknowledged send stored exactly once"
