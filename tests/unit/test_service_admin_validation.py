"""Unit tests of broker.service.admin's argument checking and of the verbs whose
logic needs only metadata: Arg / verb / check_body / dispatch, with a small fake
BrokerService holding a real Resources on a SqliteMetadataStore in tmp_path."""
from __future__ import annotations

import dataclasses
import json

import pytest

from broker.config import BrokerConfig
from broker.metadata import SqliteMetadataStore
from broker.service import admin
from broker.service.admin import HANDLERS, SCHEMAS, Arg, check_body, dispatch
from broker.service.broker_service import BrokerService
from broker.service.errors import AlreadyExists, InvalidArgument, NotFound, PreconditionFailed
from broker.service.resources import Policies, Resources
from proto.errors import InvalidTopicName

URL = "minipulsar://127.0.0.1:6650"


class FakeService:
    """What the metadata-only verbs use of a BrokerService: no topics loaded."""

    namespace_policies = BrokerService.namespace_policies     # the real lookup, on our resources

    def __init__(self, store, **config):
        self.config = BrokerConfig(**config)
        self.metadata = store
        self.resources = Resources(store)
        self.topics: dict = {}
        self.policy_changes: list[tuple[str, Policies]] = []

    async def on_policies_changed(self, namespace, policies):
        self.policy_changes.append((namespace, policies))

    async def list_topics(self, namespace):
        return []


@pytest.fixture
async def svc(tmp_path):
    store = await SqliteMetadataStore.open(str(tmp_path / "meta.db"))
    yield FakeService(store, cluster_name="local")
    await store.close()


async def call(svc, method, **body):
    return json.loads(await dispatch(svc, method, json.dumps(body)))


# ---------------------------------------------------------------------------- Arg / verb / check_body
def test_arg_optional_and_validated_return_changed_copies():
    base = Arg("a string", lambda v: isinstance(v, str))
    opt = base.optional()
    assert base.required is True and opt.required is False and opt.expected == "a string"
    seen = []
    checked = opt.validated(lambda k, v: seen.append((k, v)))
    assert checked.required is False and base.check is None and checked.check is not None
    checked.check("f", "v")
    assert seen == [("f", "v")]


def test_verb_registers_handler_and_schema():
    field = Arg("an integer", lambda v: isinstance(v, int))
    try:
        @admin.verb("test.only", n=field)
        async def handler(s, b):
            return b["n"]

        assert HANDLERS["test.only"] is handler and SCHEMAS["test.only"] == {"n": field}
        assert check_body("test.only", {"n": 3}) == {"n": 3}
    finally:
        HANDLERS.pop("test.only", None)
        SCHEMAS.pop("test.only", None)


def test_every_verb_has_a_schema_of_args():
    assert set(HANDLERS) == set(SCHEMAS) and len(HANDLERS) >= 30
    for method, fields in SCHEMAS.items():
        assert all(isinstance(a, Arg) for a in fields.values()), method


def test_check_body_null_means_absent():
    # A null required field is missing; a null optional one is dropped.
    with pytest.raises(InvalidArgument, match=r"topics.create: missing field 'topic' \(a string\)"):
        check_body("topics.create", {"topic": None})
    assert check_body("topics.reset_cursor", {"topic": "t", "subscription": "s", "message_id": None,
                                              "timestamp_ms": 5}) == {"topic": "t", "subscription": "s",
                                                                      "timestamp_ms": 5}


def test_check_body_lists_the_known_fields_of_an_unknown_one():
    with pytest.raises(InvalidArgument) as info:
        check_body("clusters.list", {"x": 1})
    assert "unknown field(s) 'x' (fields: none)" in info.value.message
    with pytest.raises(InvalidArgument) as info:
        check_body("topics.delete", {"topic": "t", "b": 1, "a": 2})
    assert "unknown field(s) 'a', 'b' (fields: topic, force)" in info.value.message


def test_check_body_names_the_wrong_json_value():
    cases = [({"topic": "t", "partitions": 1.5}, "got the number 1.5"),
             ({"topic": "t", "partitions": [1]}, "got a list [1]"),
             ({"topic": "t", "partitions": {"a": 1}}, 'got an object {"a": 1}'),
             ({"topic": ["t"], "partitions": 1}, "field 'topic' must be a string, got a list"),
             ({"topic": "t", "partitions": "x" * 100}, '"' + "x" * 59 + "...")]   # long values cut at 60
    for body, needle in cases:
        with pytest.raises(InvalidArgument) as info:
            check_body("topics.create_partitioned", body)
        assert needle in info.value.message, (body, info.value.message)


def test_check_body_validates_every_name_of_a_list():
    assert check_body("namespaces.set_clusters", {"namespace": "a/b", "clusters": ["x", "y"]})["clusters"] == ["x", "y"]
    with pytest.raises(InvalidArgument, match="invalid cluster name '..'"):
        check_body("namespaces.set_clusters", {"namespace": "a/b", "clusters": ["x", ".."]})
    with pytest.raises(InvalidTopicName):
        check_body("topics.create", {"topic": "persistent://a/b/c/d/e"})


# ---------------------------------------------------------------------------- dispatch
async def test_dispatch_refuses_a_body_over_http_max_request_size(svc):
    svc.config = BrokerConfig(http_max_request_size=1024)
    ok = json.dumps({"name": "c", "service_url": URL})
    assert json.loads(await dispatch(svc, "clusters.create", ok)) == {"ok": True}
    big = json.dumps({"name": "d", "service_url": URL + "/" + "x" * 1100})
    with pytest.raises(InvalidArgument, match="http_max_request_size=1,024 bytes"):
        await dispatch(svc, "clusters.create", big)
    assert await svc.resources.list_clusters() == ["c"]


async def test_dispatch_empty_body_is_an_empty_object_and_answers_sorted_json(svc):
    assert await dispatch(svc, "clusters.list", "") == "[]"
    assert await dispatch(svc, "brokers.health", "") == '{"cluster": "local", "ok": true, "topics": 0}'


# ---------------------------------------------------------------------------- metadata verbs
async def test_tenant_create_defaults_to_the_local_cluster(svc):
    await call(svc, "clusters.create", name="local", service_url=URL)
    assert await call(svc, "tenants.create", tenant="t") == {"ok": True}
    assert await call(svc, "tenants.get", tenant="t") == {"allowed_clusters": ["local"]}
    with pytest.raises(NotFound, match="unknown cluster"):
        await call(svc, "tenants.create", tenant="u", allowed_clusters=["elsewhere"])


async def test_namespace_policy_verbs_check_their_values(svc):
    await call(svc, "clusters.create", name="local", service_url=URL)
    await call(svc, "clusters.create", name="remote", service_url=URL)
    await call(svc, "tenants.create", tenant="t")
    await call(svc, "namespaces.create", namespace="t/ns")
    with pytest.raises(InvalidArgument, match="ttl_seconds must be >= 0"):
        await call(svc, "namespaces.set_message_ttl", namespace="t/ns", ttl_seconds=-1)
    got = await call(svc, "namespaces.set_message_ttl", namespace="t/ns", ttl_seconds=0)
    assert got["message_ttl_in_seconds"] == 0
    with pytest.raises(InvalidArgument, match="must be >= -1"):
        await call(svc, "namespaces.set_retention", namespace="t/ns", retention_time_minutes=-2,
                   retention_size_mb=0)
    got = await call(svc, "namespaces.set_retention", namespace="t/ns", retention_time_minutes=-1,
                     retention_size_mb=-1)
    assert (got["retention_time_in_minutes"], got["retention_size_in_mb"]) == (-1, -1)
    with pytest.raises(NotFound, match="unknown cluster"):
        await call(svc, "namespaces.set_clusters", namespace="t/ns", clusters=["local", "mars"])
    with pytest.raises(InvalidArgument, match="not allowed for tenant t"):
        await call(svc, "namespaces.set_clusters", namespace="t/ns", clusters=["local", "remote"])
    await call(svc, "tenants.update", tenant="t", allowed_clusters=["local", "remote"])
    got = await call(svc, "namespaces.set_clusters", namespace="t/ns", clusters=["local", "remote"])
    assert got["replication_clusters"] == ["local", "remote"]
    policies = await svc.resources.get_policies("t/ns")
    assert policies == Policies(replication_clusters=["local", "remote"], message_ttl_in_seconds=0,
                                retention_time_in_minutes=-1, retention_size_in_mb=-1)
    # Every successful policy change was announced (replication checks), the refused ones never.
    assert [dataclasses.asdict(p)["replication_clusters"] for _, p in svc.policy_changes] == [
        [], [], ["local", "remote"]]


async def test_partitioned_topics_only_grow(svc):
    await call(svc, "tenants.create", tenant="t", allowed_clusters=[])
    with pytest.raises(Exception, match="namespace t/ns does not exist"):
        await call(svc, "topics.create_partitioned", topic="t/ns/p", partitions=2)
    await call(svc, "namespaces.create", namespace="t/ns")
    with pytest.raises(InvalidArgument, match="names a partition"):
        await call(svc, "topics.create_partitioned", topic="t/ns/p-partition-0", partitions=2)
    assert await call(svc, "topics.create_partitioned", topic="t/ns/p", partitions=2) == {"ok": True, "partitions": 2}
    with pytest.raises(AlreadyExists):
        await call(svc, "topics.create_partitioned", topic="t/ns/p", partitions=3)
    with pytest.raises(InvalidArgument, match="can only grow"):
        await call(svc, "topics.update_partitioned", topic="t/ns/p", partitions=1)
    assert await call(svc, "topics.update_partitioned", topic="t/ns/p", partitions=2) == {
        "ok": True, "partitions": 2, "previous": 2}
    assert await call(svc, "topics.update_partitioned", topic="t/ns/p", partitions=5) == {
        "ok": True, "partitions": 5, "previous": 2}
    assert await call(svc, "topics.partitioned_metadata", topic="t/ns/p") == {"partitions": 5}
    assert await call(svc, "topics.list_partitioned", namespace="t/ns") == ["persistent://t/ns/p"]
    with pytest.raises(NotFound, match="is not a partitioned topic"):
        await call(svc, "topics.update_partitioned", topic="t/ns/q", partitions=2)


async def test_verbs_refused_before_touching_topics(svc):
    with pytest.raises(PreconditionFailed, match="fault injection is off"):
        await call(svc, "topics.inject_send_failure", topic="t/ns/x", count=1)
    with pytest.raises(InvalidArgument, match="reserved"):
        await call(svc, "topics.create_subscription", topic="t/ns/x", subscription="pulsar.repl.x")
    with pytest.raises(InvalidArgument, match="give 'ledger:entry', 'earliest' or 'latest'"):
        await call(svc, "topics.create_subscription", topic="t/ns/x", subscription="s", message_id="1-2")
    assert svc.topics == {}
