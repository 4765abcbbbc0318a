"""A bookie whose whole data directory is wiped cannot rejoin as a new bookie, and ledger
recovery never takes its "no such entry" for the truth (BookKeeper's Cookie: kept in the
data dir AND in the metadata store under /ledgers/cookies/<bookie-id>; LedgerRecoveryOp).

Real processes: bookies, etcd, a broker, and the SDK. The broker is killed (-9) so its
ledger stays OPEN; bookie 0's data dir is removed entirely (cookie and database) and
bookie 1 is stopped; the broker restarts. Before: bookie 0 came back as a new bookie,
recovery closed the ledger at entry -1 and 0 of 50 acknowledged messages were readable.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import time

import pytest

from bookie.client import BookKeeper
from bookie.errors import BookieUnavailableError
from bookie.ledger_handle import ledger_path
from broker.metadata import EtcdMetadataStore
from client import AsyncClient, MessageId
from client.admin import AdminClient
from client.errors import PulsarException
from proto import metadata_pb2
from tests.cluster import BrokerCluster
from tests.procs import restart_bookie_same_port, start_bookie

pytestmark = pytest.mark.timeout(180)

State = metadata_pb2.LedgerMetadata.State


def _wipe(proc) -> None:
    """Remove the bookie's whole data dir (its logs go with it), as a replaced disk would."""
    shutil.rmtree(proc.data_dir)


async def test_recovery_distrusts_a_bookie_wiped_and_restarted_as_a_new_instance(bookie_factory, meta):
    """No metadata-store cookie (bookies without metadata_store_url): the wiped bookie starts
    as a new instance. A NEW client (a restarted broker, which never saw the old instance)
    recovers the ledger: the metadata's bookie_instance_ids tell it the bookie is another
    instance, so its "no such entry" does not count and the ledger stays IN_RECOVERY
    instead of being closed empty; once the intact bookie is back, all 20 entries are."""
    a, b = bookie_factory(), bookie_factory()
    writer = BookKeeper(meta, [a.address, b.address])
    try:
        lh = await writer.create_ledger(2, 2, 2)
        payloads = [b"acked-%d" % i for i in range(20)]
        assert await asyncio.gather(*(lh.add_entry_nowait(p) for p in payloads)) == list(range(20))
        md, _ = await writer.get_metadata(lh.ledger_id)
        assert set(md.bookie_instance_ids) == {a.address, b.address}
    finally:
        await writer.close()   # the writer dies with the ledger OPEN
    a.kill()
    b.kill()
    _wipe(a)
    a = restart_bookie_same_port(a)     # a new, empty bookie under the same address
    recoverer = BookKeeper(meta, [a.address, b.address], rpc_timeout_s=2)
    try:
        with pytest.raises(BookieUnavailableError, match="wiped"):
            await asyncio.wait_for(recoverer.open_ledger(lh.ledger_id, recovery=True), 60)
        md, _ = await recoverer.get_metadata(lh.ledger_id)
        assert md.state == State.IN_RECOVERY, md
    finally:
        await recoverer.close()
    b = restart_bookie_same_port(b)
    later = BookKeeper(meta, [a.address, b.address])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                ro = await later.open_ledger(lh.ledger_id, recovery=True)
                break
            except BookieUnavailableError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.5)
        assert ro.last_add_confirmed == 19
        assert await ro.read_entries(0, 19) == payloads
    finally:
        await later.close()


async def _read_all(client, topic: str, expect: int, timeout_s: float) -> list[bytes]:
    """Read from the earliest message for up to ``timeout_s`` s (the topic may not load while
    its last ledger cannot be recovered: ServiceNotReady, retried)."""
    deadline = time.monotonic() + timeout_s
    reader = None
    while reader is None:
        try:
            reader = await client.create_reader(topic, MessageId.earliest)
        except PulsarException:
            if time.monotonic() >= deadline:
                return []
            await asyncio.sleep(0.5)
    got: list[bytes] = []
    while len(got) < expect and time.monotonic() < deadline:
        try:
            got.append((await reader.read_next(timeout_millis=2000)).data())
        except PulsarException:
            pass
    await reader.close()
    return got


async def test_wiped_bookie_refuses_to_start_and_no_ledger_closes_short(tmp_path, process_tracker):
    cluster = BrokerCluster(tmp_path, process_tracker, brokers=1, bookies=2).start()
    topic = "persistent://public/default/wiped-bookie"
    store = await EtcdMetadataStore.open(cluster.etcd.url)
    try:
        async with AsyncClient(cluster.service_url) as client, AdminClient(cluster.service_url) as admin:
            try:
                await admin.create_namespace("public/default")
            except PulsarException:
                pass
            producer = await client.create_producer(topic, batching_enabled=False)
            acknowledged = [b"msg-%d" % i for i in range(50)]
            for m in acknowledged:
                await producer.send(m)
            ledger_id = (await admin.get_internal_stats(topic))["ledgers"][-1]["ledgerId"]
        # the cookies are in the metadata store, one per bookie
        stored = {n: json.loads((await store.get(f"/ledgers/cookies/{n}")).value)["instance_id"]
                  for n in await store.get_children("/ledgers/cookies")}
        assert sorted(stored) == sorted(b.address for b in cluster.bookies)

        broker = cluster.brokers[0]
        broker.kill()                                   # kill -9: the ledger stays OPEN
        b0, b1 = cluster.bookies
        b0.kill()
        _wipe(b0)                                       # bookie 0's data dir removed
        b1.terminate()                                  # bookie 1 stopped
        # a wiped bookie refuses to start: the store has its cookie, the data dir none
        with pytest.raises(RuntimeError) as refused:
            start_bookie(b0.data_dir, b0.journal_sync, ("--port", str(b0.port), *b0.extra_args),
                         tracker=process_tracker)
        assert "exited with 3 before ready" in str(refused.value)
        stderr = (b0.data_dir / "bookie.stderr.log").read_text()
        assert "data dir was wiped" in stderr and "--format" in stderr, stderr[-2000:]
        # the operator re-initializes it explicitly: a new instance, the stored cookie replaced
        b0 = cluster.bookies[0] = restart_bookie_same_port(b0, ("--format", *b0.extra_args))
        new_id = json.loads((await store.get(f"/ledgers/cookies/{b0.address}")).value)["instance_id"]
        assert new_id != stored[b0.address]

        cluster.brokers[0] = cluster.start_broker(0, port=broker.port)
        async with AsyncClient(cluster.service_url, operation_timeout_seconds=5) as client:
            # bookie 1 is down and bookie 0 is another instance: nothing can be read, and
            # the ledger is not closed short
            assert await _read_all(client, topic, 50, timeout_s=8) == []
            md = metadata_pb2.LedgerMetadata.FromString((await store.get(ledger_path(ledger_id))).value)
            assert md.state != State.CLOSED or md.last_entry_id >= 49, md
            cluster.bookies[1] = restart_bookie_same_port(b1, b1.extra_args)
            got = await _read_all(client, topic, 50, timeout_s=60)
        assert got == acknowledged
        md = metadata_pb2.LedgerMetadata.FromString((await store.get(ledger_path(ledger_id))).value)
        assert md.state == State.CLOSED and md.last_entry_id == 49, md
    finally:
        await store.close()
