"""Bookie registration in etcd (BookKeeper's /ledgers/available/<host:port>) and the bookie
client choosing ensembles among the registered bookies, with real bookie processes and a
real etcd."""
from __future__ import annotations

import asyncio
import time

import aetcd
import pytest
from aetcd import rpc

from bookie.__main__ import config_problems
from bookie.client import AVAILABLE_BOOKIES_PATH, BookKeeper
from bookie.errors import NotEnoughBookiesError
from bookie.registration import BookieRegistration, RegistrationError
from bookie.server import BookieConfig
from broker.metadata import EtcdMetadataStore
from tests.procs import free_port

pytestmark = pytest.mark.timeout(120)


async def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached within {timeout} s"
        await asyncio.sleep(0.05)


async def test_ledgers_on_registered_bookies_and_a_killed_bookie_is_avoided(etcd, bookie_factory):
    bookies = [bookie_factory(extra_args=("--metadata-store-url", etcd.url)) for _ in range(3)]
    addresses = sorted(b.address for b in bookies)
    store = await EtcdMetadataStore.open(etcd.url)
    bk = BookKeeper(store, [])
    try:
        # registered before the ready line
        assert await store.get_children(AVAILABLE_BOOKIES_PATH) == addresses
        assert (await store.get("/ledgers")).version == 0  # parents materialized as the store does
        lh = await bk.create_ledger(3, 2, 2)
        assert sorted(lh.ensemble) == addresses
        for i in range(10):
            await lh.add_entry(f"entry-{i}".encode())
        await lh.close()
        reader = await bk.open_ledger(lh.ledger_id)
        assert await reader.read_entries(0, 9) == [f"entry-{i}".encode() for i in range(10)]

        victim = bookies[0]
        victim.kill()  # kill -9: no unregistering, the lease expires after its TTL (5 s)
        started = time.monotonic()
        await wait_for(lambda: _children_without(store, victim.address), 12, "the killed bookie unregistered")
        assert time.monotonic() - started < 9
        survivors = sorted(b.address for b in bookies[1:])
        await wait_for(lambda: bk.bookies == survivors, 5, "the client's watch to see it")
        lh2 = await bk.create_ledger(2, 2, 2)
        assert sorted(lh2.ensemble) == survivors
        await lh2.add_entry(b"after the kill")
        await lh2.close()
        assert await (await bk.open_ledger(lh2.ledger_id)).read_entries(0, 0) == [b"after the kill"]
        with pytest.raises(NotEnoughBookiesError, match="registered under /ledgers/available"):
            await bk.create_ledger(3, 2, 2)
    finally:
        await bk.close()
        await store.close()


async def _children_without(store, address) -> bool:
    return address not in await store.get_children(AVAILABLE_BOOKIES_PATH)


async def test_a_stopped_bookie_unregisters_at_once_and_a_restarted_one_registers_again(etcd, bookie_factory):
    bookie = bookie_factory(extra_args=("--metadata-store-url", etcd.url, "--advertised-address", "localhost"))
    store = await EtcdMetadataStore.open(etcd.url)
    try:
        name = f"localhost:{bookie.port}"
        assert await store.get_children(AVAILABLE_BOOKIES_PATH) == [name]
        assert bookie.terminate() == 0
        assert await store.get_children(AVAILABLE_BOOKIES_PATH) == []  # revoked on clean stop
        restarted = bookie.restart()
        assert await store.get_children(AVAILABLE_BOOKIES_PATH) == [f"localhost:{restarted.port}"]
    finally:
        await store.close()


async def test_a_bookie_registering_later_is_used_for_new_ledgers_and_as_a_spare(etcd, bookie_factory):
    store = await EtcdMetadataStore.open(etcd.url)
    bk = BookKeeper(store, None)
    try:
        with pytest.raises(NotEnoughBookiesError):
            await bk.create_ledger(1, 1, 1)
        first = bookie_factory(extra_args=("--metadata-store-url", etcd.url))
        lh = await bk.create_ledger(1, 1, 1)
        assert lh.ensemble == [first.address]
        await lh.add_entry(b"x")
        second = bookie_factory(extra_args=("--metadata-store-url", etcd.url))
        await wait_for(lambda: second.address in bk.bookies, 5, "the watch to see the new bookie")
        first.kill()
        assert await lh.add_entry(b"y") == 1  # ensemble change to the registered spare
        assert lh.ensemble == [second.address]
        await lh.close()
    finally:
        await bk.close()
        await store.close()


async def test_registration_renewed_after_its_lease_is_lost(etcd):
    reg = BookieRegistration(etcd.url, "127.0.0.1:3999", value=b"v", ttl_s=1)
    await reg.start()
    try:
        async with aetcd.Client(host="127.0.0.1", port=etcd.client_port) as raw:
            assert (await raw.get(reg.key)).value == b"v"
            old = reg.lease_id
            await raw.revoke_lease(old)  # as if it had expired
            assert await raw.get(reg.key) is None
            await wait_for(lambda: _key_present(raw, reg.key), 5, "registered again")
            assert reg.lease_id != old
        await reg.stop()
        async with aetcd.Client(host="127.0.0.1", port=etcd.client_port) as raw:
            assert await raw.get(reg.key) is None
            resp = await raw.kvstub.Range(rpc.RangeRequest(key=b"/ledgers/available"), timeout=5)
            assert resp.count == 1  # the parent stays
    finally:
        await reg.stop()


async def _key_present(raw, key) -> bool:
    return await raw.get(key) is not None


async def test_registration_fails_clearly_when_etcd_is_unreachable():
    url = f"etcd://127.0.0.1:{free_port()}"
    reg = BookieRegistration(url, "127.0.0.1:3181", connect_timeout_s=1)
    started = time.monotonic()
    with pytest.raises(RegistrationError, match=f"cannot register bookie 127.0.0.1:3181 in etcd at {url} after 1 s"):
        await reg.start()
    assert time.monotonic() - started < 4


def test_bookie_config_checks_the_registration_keys():
    assert config_problems(BookieConfig(metadata_store_url="etcd://127.0.0.1:2379,h2:2380")) == []
    problems = config_problems(BookieConfig(metadata_store_url="zk:localhost:2181", advertised_address="h:1"))
    assert [p.split(" ")[0] for p in problems] == ["metadata_store_url", "advertised_address"]
