"""RoutedMetadataStore (broker/metadata/routed_store.py): the configuration paths
(clusters, tenants, namespace policies, partitioned topics, topic policies) go to the
configuration store, everything else to the local store; watches and children follow.
Two real SQLite stores."""
from __future__ import annotations

import asyncio

import pytest

from broker.metadata import SqliteMetadataStore
from broker.metadata.routed_store import RoutedMetadataStore, is_configuration_path


@pytest.fixture
async def stores(tmp_path):
    local = await SqliteMetadataStore.open(str(tmp_path / "local.db"))
    config = await SqliteMetadataStore.open(str(tmp_path / "config.db"))
    routed = RoutedMetadataStore(local, config)
    yield routed, local, config
    await routed.close()


def test_which_paths_are_configuration():
    for path in ("/admin/clusters/east", "/admin/policies/geo", "/admin/policies/geo/ns",
                 "/admin/partitioned-topics/geo/ns/persistent/t", "/admin/topic-policies/geo/ns/persistent/t"):
        assert is_configuration_path(path), path
    for path in ("/admin/local-policies/geo/ns", "/managed-ledgers/geo/ns/persistent/t", "/ledgers/L1",
                 "/namespace/geo/ns/0x00000000_0xffffffff", "/loadbalance/leader", "/admin", "/admin/clustersX"):
        assert not is_configuration_path(path), path


async def test_each_path_lands_in_its_store(stores):
    routed, local, config = stores
    await routed.put("/admin/policies/geo/ns", b"policies")
    await routed.put("/managed-ledgers/geo/ns/persistent/t", b"ml")
    await routed.put("/admin/local-policies/geo/ns", b"bundles")
    assert (await config.get("/admin/policies/geo/ns")).value == b"policies"
    assert await local.get("/admin/policies/geo/ns") is None
    assert (await local.get("/managed-ledgers/geo/ns/persistent/t")).value == b"ml"
    assert (await local.get("/admin/local-policies/geo/ns")).value == b"bundles"
    assert await config.get("/admin/local-policies/geo/ns") is None
    assert await routed.get_children("/admin") == ["local-policies", "policies"]
    assert await routed.get_children("/admin/policies/geo") == ["ns"]
    assert await routed.increment_counter("/ledgers/idgen") == 1
    assert await local.exists("/ledgers/idgen")


async def test_watches_see_each_store_once(stores):
    routed, local, config = stores
    seen = []
    cancel = routed.watch(lambda n: seen.append((n.type, n.path)), prefix="/admin")
    await routed.put("/admin/clusters/east", b"url")
    await routed.put("/admin/local-policies/geo/ns", b"b")
    await local.put("/admin/clusters/ghost", b"not the configuration store's")  # not a local path
    await asyncio.sleep(0.05)
    assert ("created", "/admin/clusters/east") in seen
    assert ("created", "/admin/local-policies/geo/ns") in seen
    assert all(path != "/admin/clusters/ghost" for _, path in seen)
    cancel()
    seen.clear()
    await routed.put("/admin/clusters/west", b"url")
    await asyncio.sleep(0.05)
    assert seen == []


async def test_sessions_and_ephemeral_nodes_are_the_local_stores(stores):
    routed, local, config = stores
    await routed.put_ephemeral("/namespace/geo/ns/0x00000000_0xffffffff", b"owner")
    assert await local.exists("/namespace/geo/ns/0x00000000_0xffffffff")
    assert routed.shared is local.shared
