"""Unit tests of broker.service.resources (Pulsar's PulsarResources: clusters,
tenants, namespaces, partitioned topics, topic policies) on a real
SqliteMetadataStore in tmp_path: paths, JSON values, errors."""
from __future__ import annotations

import json

import pytest

from broker.metadata import SqliteMetadataStore
from broker.service.errors import AlreadyExists, InvalidArgument, NotFound, PreconditionFailed
from broker.service.resources import Policies, Resources, check_subscription_name

URL = "minipulsar://127.0.0.1:6650"


@pytest.fixture
async def res(tmp_path):
    store = await SqliteMetadataStore.open(str(tmp_path / "meta.db"))
    yield Resources(store)
    await store.close()


# ---------------------------------------------------------------------------- policies
def test_policies_json_round_trip_ignores_unknown_keys_and_defaults_missing_ones():
    p = Policies(replication_clusters=["a", "b"], deduplication_enabled=True, message_ttl_in_seconds=60,
                 retention_time_in_minutes=-1, retention_size_in_mb=10)
    raw = json.loads(p.to_json())
    assert list(raw) == sorted(raw)                     # sorted keys: a stable stored value
    assert Policies.from_json(p.to_json()) == p
    got = Policies.from_json(b'{"message_ttl_in_seconds": 5, "some_future_policy": 1}')
    assert got == Policies(message_ttl_in_seconds=5)
    assert got.replication_clusters == [] and got.deduplication_enabled is None


# ---------------------------------------------------------------------------- clusters
async def test_cluster_lifecycle_and_stored_value(res):
    await res.create_cluster("east", URL)
    stored = await res.store.get("/admin/clusters/east")
    assert json.loads(stored.value) == {"service_url": URL}
    assert await res.get_cluster("east") == {"name": "east", "service_url": URL}
    await res.create_cluster("west", "minipulsar://h:1")
    assert await res.list_clusters() == ["east", "west"]
    await res.update_cluster("east", "minipulsar://other:2")
    assert (await res.get_cluster("east"))["service_url"] == "minipulsar://other:2"
    await res.delete_cluster("east")
    assert await res.list_clusters() == ["west"]
    with pytest.raises(NotFound, match="cluster east does not exist"):
        await res.get_cluster("east")


async def test_cluster_errors(res):
    assert await res.list_clusters() == []
    await res.create_cluster("c", URL)
    with pytest.raises(AlreadyExists):
        await res.create_cluster("c", URL)
    for bad_url in ("pulsar://h:6650", "", None):
        with pytest.raises(InvalidArgument, match="invalid service URL"):
            await res.create_cluster("d", bad_url)
    with pytest.raises(InvalidArgument, match="invalid service URL"):
        await res.update_cluster("c", "http://h")
    with pytest.raises(InvalidArgument, match="invalid cluster name"):
        await res.create_cluster("..", URL)
    with pytest.raises(NotFound):
        await res.update_cluster("nope", URL)           # existence is checked before the URL
    with pytest.raises(NotFound):
        await res.delete_cluster("nope")
    assert await res.list_clusters() == ["c"]           # nothing written by the failed calls


# ---------------------------------------------------------------------------- tenants
async def test_tenant_lifecycle(res):
    await res.create_cluster("c1", URL)
    await res.create_cluster("c2", URL)
    await res.create_tenant("acme", ["c1"])
    assert await res.get_tenant("acme") == {"allowed_clusters": ["c1"]}
    await res.update_tenant("acme", ["c1", "c2"])
    assert await res.get_tenant("acme") == {"allowed_clusters": ["c1", "c2"]}
    await res.create_tenant("beta", [])
    assert await res.list_tenants() == ["acme", "beta"]
    await res.delete_tenant("beta")
    assert await res.list_tenants() == ["acme"]


async def test_tenant_errors(res):
    await res.create_cluster("c1", URL)
    with pytest.raises(NotFound, match="unknown cluster"):
        await res.create_tenant("t", ["c1", "missing"])
    assert await res.list_tenants() == []               # not created
    for bad in ("c1", [1], None):
        with pytest.raises(InvalidArgument, match="clusters must be a list of names"):
            await res.create_tenant("t", bad)
    await res.create_tenant("t", ["c1"])
    with pytest.raises(AlreadyExists):
        await res.create_tenant("t", ["c1"])
    with pytest.raises(NotFound):
        await res.update_tenant("other", ["c1"])
    with pytest.raises(NotFound, match="unknown cluster"):
        await res.update_tenant("t", ["nope"])
    assert await res.get_tenant("t") == {"allowed_clusters": ["c1"]}
    with pytest.raises(NotFound, match="tenant other does not exist"):
        await res.get_tenant("other")
    with pytest.raises(InvalidArgument):
        await res.get_tenant("a/b")


async def test_a_tenant_with_namespaces_cannot_be_deleted(res):
    await res.create_tenant("t", [])
    await res.create_namespace("t/ns")
    with pytest.raises(PreconditionFailed, match="still has namespaces"):
        await res.delete_tenant("t")
    await res.delete_namespace("t/ns")
    await res.delete_tenant("t")
    assert await res.list_tenants() == []
    with pytest.raises(NotFound):
        await res.delete_tenant("t")


# ---------------------------------------------------------------------------- namespaces
async def test_namespace_lifecycle_and_policies(res):
    await res.create_tenant("t", [])
    await res.create_namespace("t/a")
    await res.create_namespace("t/b", Policies(message_ttl_in_seconds=30))
    assert await res.list_namespaces("t") == ["t/a", "t/b"]
    assert await res.get_policies("t/a") == Policies()
    assert (await res.get_policies("t/b")).message_ttl_in_seconds == 30
    stored = await res.store.get("/admin/policies/t/b")
    assert json.loads(stored.value)["message_ttl_in_seconds"] == 30
    await res.set_policies("t/a", Policies(replication_clusters=["x"], deduplication_enabled=False))
    got = await res.get_policies("t/a")
    assert got.replication_clusters == ["x"] and got.deduplication_enabled is False
    await res.delete_namespace("t/a")
    assert await res.list_namespaces("t") == ["t/b"]


async def test_namespace_errors(res):
    with pytest.raises(NotFound, match="tenant t does not exist"):
        await res.create_namespace("t/a")
    await res.create_tenant("t", [])
    await res.create_namespace("t/a")
    with pytest.raises(AlreadyExists):
        await res.create_namespace("t/a")
    for bad in ("t", "t/a/b", "/a", "t/..", 5):
        with pytest.raises(InvalidArgument):
            await res.create_namespace(bad)
    with pytest.raises(NotFound, match="namespace t/zz does not exist"):
        await res.get_policies("t/zz")
    with pytest.raises(NotFound):
        await res.set_policies("t/zz", Policies())
    with pytest.raises(NotFound):
        await res.delete_namespace("t/zz")
    with pytest.raises(NotFound):
        await res.list_namespaces("other")
    assert not await res.store.exists("/admin/policies/t/zz")   # set_policies created nothing


# ---------------------------------------------------------------------------- partitioned topics
async def test_partitioned_topic_metadata(res):
    name = "t/ns/persistent/orders"
    assert Resources.partitioned_path(name) == "/admin/partitioned-topics/t/ns/persistent/orders"
    assert await res.get_partitions(name) == 0          # not partitioned: 0, no NotFound
    await res.create_partitioned_topic(name, 4)
    assert await res.get_partitions(name) == 4
    assert json.loads((await res.store.get(Resources.partitioned_path(name))).value) == {"partitions": 4}
    await res.create_partitioned_topic("t/ns/persistent/a", 1)
    assert await res.list_partitioned_topics("t/ns") == ["a", "orders"]
    assert await res.list_partitioned_topics("t/other") == []
    with pytest.raises(AlreadyExists):
        await res.create_partitioned_topic(name, 8)
    assert await res.get_partitions(name) == 4
    for bad in (0, -1, "4", 2.0):
        with pytest.raises(InvalidArgument, match="partitions must be an integer >= 1"):
            await res.create_partitioned_topic("t/ns/persistent/b", bad)
    await res.delete_partitioned_topic(name)
    await res.delete_partitioned_topic(name)            # absent: no error
    assert await res.get_partitions(name) == 0
    assert await res.list_partitioned_topics("t/ns") == ["a"]
    with pytest.raises(InvalidArgument):
        await res.list_partitioned_topics("t")


async def test_topic_policies(res):
    name = "t/ns/persistent/x"
    assert await res.get_topic_policies(name) == {}
    await res.set_topic_policies(name, {"replication_clusters": ["a"], "b": 1})
    assert await res.get_topic_policies(name) == {"replication_clusters": ["a"], "b": 1}
    assert await res.store.exists("/admin/topic-policies/t/ns/persistent/x")
    await res.set_topic_policies(name, {})
    assert await res.get_topic_policies(name) == {}


# ---------------------------------------------------------------------------- names
def test_subscription_names():
    for good in ("sub", "a/b", "a.b", "..a", "ünï", "with space"):
        assert check_subscription_name(good) == good
    for bad in ("", ".", "..", "a/../b", "a/.", "a\nb", "a\x7fb", "\ud800", None, 5):
        with pytest.raises(InvalidArgument, match="invalid subscription name"):
            check_subscription_name(bad)
