"""A full disk recovers: real bookies on real small filesystems (tmpfs of 24 MiB each).

BookKeeper's rules, with real processes (etcd, 2 bookies registered in it, 1 broker that
chooses ensembles among the registered bookies):

* a bookie whose disk reaches ``disk_usage_threshold`` turns read-only and registers under
  ``/ledgers/available/readonly`` (``registerBookie(readOnly)``); placement never puts it
  in a new ensemble, so the broker creates no ledgers while every bookie is full and sends
  fail with a clear error naming NotEnoughBookies (not a bare send timeout);
* deleting a topic frees pages inside the bookies' SQLite files (their freelist), which
  counts as free space (``LedgerStorage.disk_usage``): usage falls below
  ``disk_usage_lwm_threshold``, the bookies are writable again (no vacuum needed) and the
  cluster serves again; nothing acknowledged on the topic that was kept is lost.

Figures (printed, and in the assertion messages): ledgers created per minute while full,
seconds from the topic deletion to the first acknowledged send.

Needs ``mount -t tmpfs`` (root): skipped with that reason otherwise.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from bookie.ledger_handle import LEDGER_ID_COUNTER_PATH
from broker.metadata import EtcdMetadataStore
from client import AsyncClient, MessageId
from client.admin import AdminClient
from client.errors import PulsarException
from tests.cluster import BrokerCluster

pytestmark = pytest.mark.timeout(240)

AVAILABLE_BOOKIES_PATH = "/ledgers/available"            # BookKeeper's paths
READONLY_BOOKIES_PATH = "/ledgers/available/readonly"
FS_SIZE = "24m"
PAYLOAD_BYTES = 16 * 1024


def _mount_tmpfs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE}", "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a {FS_SIZE} tmpfs (needs root): {result.stderr.strip()}")


@pytest.fixture
def tmpfs_dirs(tmp_path):
    """Two 24 MiB tmpfs mounts (the bookies' data dirs), unmounted at teardown."""
    dirs = [tmp_path / f"disk-{i}" for i in range(2)]
    mounted = []
    try:
        for d in dirs:
            _mount_tmpfs(d)
            mounted.append(d)
        yield dirs
    finally:
        for d in mounted:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


async def _counter(store) -> int:
    res = await store.get(LEDGER_ID_COUNTER_PATH)
    return int.from_bytes(res.value, "big", signed=True) if res is not None and res.value else 0


async def _addresses(store, path: str) -> list[str]:
    return sorted(n for n in await store.get_children(path) if ":" in n)


async def test_full_tmpfs_turns_bookies_read_only_and_deleting_a_topic_serves_again(tmp_path, tmpfs_dirs,
                                                                                     process_tracker):
    cluster = BrokerCluster(tmp_path, process_tracker, brokers=1, bookies=0, static_bookies=False,
                            config={"managed_ledger_max_entries_per_ledger": 200,
                                    "managed_ledger_min_ledger_rollover_time_minutes": 0})
    cluster.start()   # etcd + broker; the bookies on the tmpfs mounts next (the broker discovers them)
    from tests.procs import start_bookie
    for i, d in enumerate(tmpfs_dirs):   # logs in bookie-<i>, the ledger database on the tmpfs
        cluster.bookies.append(start_bookie(tmp_path / f"bookie-{i}", tracker=process_tracker, extra_args=(
            "--data-dir", str(d), "--metadata-store-url", cluster.etcd.url, "--disk-check-interval-s", "0.25")))
    store = await EtcdMetadataStore.open(cluster.etcd.url)
    keep, filler = (f"persistent://public/default/{name}-{uuid.uuid4().hex[:6]}" for name in ("keep", "filler"))
    acknowledged: list[bytes] = []
    try:
        async with AsyncClient(cluster.service_url, operation_timeout_seconds=10) as client, \
                AdminClient(cluster.service_url) as admin:
            try:
                await admin.create_namespace("public/default")
            except PulsarException:
                pass
            keeper = await client.create_producer(keep, batching_enabled=False, send_timeout_millis=4000)
            for i in range(20):
                await keeper.send(b"keep-%d" % i)
                acknowledged.append(b"keep-%d" % i)
            # fill both disks through the other topic until sends fail
            fill = await client.create_producer(filler, batching_enabled=False, send_timeout_millis=4000)
            payload = os.urandom(PAYLOAD_BYTES)
            error = None
            deadline = time.monotonic() + 120
            while error is None:
                assert time.monotonic() < deadline, "the 24 MiB disks never filled up"
                results = await asyncio.gather(*(fill.send(payload) for _ in range(32)), return_exceptions=True)
                error = next((r for r in results if isinstance(r, BaseException)), None)
            full_at = time.monotonic()
            # every bookie is registered read-only, none writable
            for _ in range(40):
                if not await _addresses(store, AVAILABLE_BOOKIES_PATH):
                    break
                await asyncio.sleep(0.25)
            readonly = await _addresses(store, READONLY_BOOKIES_PATH)
            assert readonly == sorted(b.address for b in cluster.bookies), readonly
            assert await _addresses(store, AVAILABLE_BOOKIES_PATH) == []
            # a send while full fails with a clear error naming the cause
            with pytest.raises(PulsarException) as failed:
                await keeper.send(b"while-full")
            text = str(failed.value)
            assert "NotEnoughBookies" in text and "read-only" in text, text
            # while full, the broker creates (almost) no ledgers: measure for 10 s
            before, t0 = await _counter(store), time.monotonic()
            for _ in range(5):
                with pytest.raises(PulsarException):
                    await keeper.send(b"while-full")
            await asyncio.sleep(max(0.0, 10 - (time.monotonic() - t0)))
            per_minute = (await _counter(store) - before) * 60 / (time.monotonic() - t0)
            print(f"\nfirst send error: {error!r}\nledgers created per minute while full: {per_minute:.1f}")
            assert per_minute <= 12, f"{per_minute:.0f} ledgers created per minute while every bookie is full"

            # free space by deleting the filler topic: the bookies turn writable, sends succeed again
            await fill.close()
            deleted_at = time.monotonic()
            await admin.delete_topic(filler, force=True)
            served_after = None
            while served_after is None:
                assert time.monotonic() - deleted_at < 60, "no send acknowledged within 60 s of freeing space"
                try:
                    await keeper.send(b"after-free")
                    served_after = time.monotonic() - deleted_at
                except PulsarException:
                    await asyncio.sleep(0.2)
            acknowledged.append(b"after-free")
            print(f"time to serve again after deleting the topic: {served_after:.1f} s "
                  f"(disks full for {deleted_at - full_at:.1f} s)")
            assert await _addresses(store, AVAILABLE_BOOKIES_PATH) == sorted(b.address for b in cluster.bookies)
            for i in range(20):
                await keeper.send(b"after-%d" % i)
                acknowledged.append(b"after-%d" % i)
            # nothing acknowledged on the kept topic is lost (sends that failed were not stored)
            reader = await client.create_reader(keep, MessageId.earliest)
            got = []
            while await reader.has_message_available():
                got.append((await reader.read_next(timeout_millis=10_000)).data())
            assert [m for m in got if m != b"while-full"] == acknowledged
            assert b"while-full" not in got
    finally:
        await store.close()
