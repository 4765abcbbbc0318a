"""The broker's role matrix (issue 32): every broker RPC (gRPC ``PulsarBroker``), every
admin verb and ``/metrics``, called by each kind of caller, with forged fields where
the RPC has them (marker metadata, ``replicated_from``, ``replicate_to``, producer
names, ``is_replicator``, cluster lists), each with its expected answer.

One stack for the module (``tests.hostile_support``: two mutual-TLS bookies with
tokens, a TLS broker with authentication, authorization and
``authenticate_metrics_endpoint`` on); raw sync gRPC calls, no SDK check in between.
Callers: ``none`` (no token), ``mallory`` (another tenant's app), ``writer``
(produce-only on acme/ns), ``reader`` (consume-only), ``acme-admin`` (tenant admin),
``replicator`` (a ``replicator_roles`` role granted produce), ``admin`` (superuser).

Answers: ``UNAUTHENTICATED`` / ``PERMISSION_DENIED`` / ``INVALID_ARGUMENT`` (gRPC
status of the call), ``receipt`` (every entry stored), ``error:<Name>`` (the send
refused with that error), ``subscribed``, ``OK``, HTTP statuses for /metrics, and
``authorized`` for an admin verb that got past authorization (its own answer may be
OK or NotFound, AlreadyExists... depending on the order verbs run in). The cases are
listed by ``test_matrix_lists_its_cases`` (run with ``-s``) and by their ids.
"""
from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from typing import Callable, Optional

import grpc
import pytest

from broker.ledger.position import Position
from broker.replication import markers
from broker.service import admin as admin_verbs
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.entry_format import with_metadata
from tests.hostile_support import LOCAL, NS, ROLES, admin_call, entry, produce, start_stack
from tests.procs import ProcessTracker

pytestmark = pytest.mark.timeout(120)

TOPIC = f"persistent://{NS}/matrix"
SCRATCH_NS = "acme/scratch"
SCRATCH_TOPIC = f"persistent://{NS}/scratch-t"
AUTHENTICATED = frozenset(ROLES) - {"none"}
SUPER = frozenset({"admin"})
TENANT_ADMIN = frozenset({"acme-admin", "admin"})
PRODUCE = frozenset({"writer", "acme-admin", "replicator", "admin"})
CONSUME = frozenset({"reader", "acme-admin", "admin"})
LOOKUP = PRODUCE | CONSUME            # produce or consume: lookups, stats, last message id
NS_READ = LOOKUP                      # a namespace grant of either: list the namespace's topics
REPLICATE = frozenset({"replicator", "admin"}) & PRODUCE   # may replicate, and may produce here

# every admin verb: (who gets past authorization, its body). Expectations written out here,
# not derived from the code under test; test_every_admin_verb_is_in_the_matrix keeps it complete.
VERBS: dict[str, tuple[frozenset, dict]] = {
    "brokers.health": (AUTHENTICATED, {}),
    "brokers.leader_broker": (SUPER, {}),
    "brokers.list": (SUPER, {}),
    "clusters.create": (SUPER, {"name": "matrix-c", "service_url": "minipulsar://127.0.0.1:2"}),
    "clusters.update": (SUPER, {"name": "matrix-c", "service_url": "minipulsar://127.0.0.1:3"}),
    "clusters.get": (SUPER, {"name": "matrix-c"}),
    "clusters.list": (AUTHENTICATED, {}),
    "clusters.delete": (SUPER, {"name": "matrix-c"}),
    "tenants.create": (SUPER, {"tenant": "matrix-t", "allowed_clusters": [LOCAL]}),
    "tenants.update": (SUPER, {"tenant": "acme", "allowed_clusters": [LOCAL], "admin_roles": ["acme-admin"]}),
    "tenants.get": (TENANT_ADMIN, {"tenant": "acme"}),
    "tenants.list": (SUPER, {}),
    "tenants.delete": (SUPER, {"tenant": "matrix-gone"}),
    "namespaces.create": (TENANT_ADMIN, {"namespace": SCRATCH_NS}),
    "namespaces.list": (TENANT_ADMIN, {"tenant": "acme"}),
    "namespaces.policies": (TENANT_ADMIN, {"namespace": NS}),
    "namespaces.bundles": (TENANT_ADMIN, {"namespace": NS}),
    "namespaces.set_deduplication": (TENANT_ADMIN, {"namespace": SCRATCH_NS, "enabled": True}),
    "namespaces.set_clusters": (TENANT_ADMIN, {"namespace": SCRATCH_NS, "clusters": [LOCAL]}),
    "namespaces.set_message_ttl": (TENANT_ADMIN, {"namespace": SCRATCH_NS, "ttl_seconds": 0}),
    "namespaces.set_retention": (TENANT_ADMIN, {"namespace": SCRATCH_NS, "retention_time_minutes": 0,
                                                "retention_size_mb": 0}),
    "namespaces.grant_permission": (TENANT_ADMIN, {"namespace": SCRATCH_NS, "role": "nobody",
                                                   "actions": ["produce"]}),
    "namespaces.revoke_permission": (TENANT_ADMIN, {"namespace": SCRATCH_NS, "role": "nobody"}),
    "namespaces.permissions": (TENANT_ADMIN, {"namespace": NS}),
    "namespaces.grant_subscription_permission": (TENANT_ADMIN, {"namespace": SCRATCH_NS, "subscription": "s",
                                                                "roles": ["nobody"]}),
    "namespaces.revoke_subscription_permission": (TENANT_ADMIN, {"namespace": SCRATCH_NS, "subscription": "s",
                                                                 "role": "nobody"}),
    "namespaces.unload": (TENANT_ADMIN, {"namespace": SCRATCH_NS}),
    "namespaces.split_bundle": (TENANT_ADMIN, {"namespace": SCRATCH_NS, "bundle": "0x00000000_0xffffffff"}),
    "namespaces.delete": (TENANT_ADMIN, {"namespace": SCRATCH_NS}),
    "topics.create": (TENANT_ADMIN, {"topic": SCRATCH_TOPIC}),
    "topics.create_partitioned": (TENANT_ADMIN, {"topic": f"persistent://{NS}/scratch-p", "partitions": 2}),
    "topics.update_partitioned": (TENANT_ADMIN, {"topic": f"persistent://{NS}/scratch-p", "partitions": 3}),
    "topics.partitioned_metadata": (LOOKUP, {"topic": TOPIC}),
    "topics.list": (NS_READ, {"namespace": NS}),
    "topics.list_partitioned": (NS_READ, {"namespace": NS}),
    "topics.stats": (LOOKUP, {"topic": TOPIC}),
    "topics.internal_stats": (LOOKUP, {"topic": TOPIC}),
    "topics.lookup": (LOOKUP, {"topic": TOPIC}),
    "topics.last_message_id": (LOOKUP, {"topic": TOPIC}),
    "topics.subscriptions": (CONSUME, {"topic": TOPIC}),
    "topics.create_subscription": (CONSUME, {"topic": TOPIC, "subscription": "m-created"}),
    "topics.reset_cursor": (CONSUME, {"topic": TOPIC, "subscription": "m-created", "message_id": "0:0"}),
    "topics.skip": (CONSUME, {"topic": TOPIC, "subscription": "m-created", "count": 1}),
    "topics.unsubscribe": (CONSUME, {"topic": TOPIC, "subscription": "m-never"}),
    "topics.set_replication_clusters": (TENANT_ADMIN, {"topic": SCRATCH_TOPIC, "clusters": [LOCAL]}),
    "topics.grant_permission": (TENANT_ADMIN, {"topic": SCRATCH_TOPIC, "role": "nobody", "actions": ["consume"]}),
    "topics.revoke_permission": (TENANT_ADMIN, {"topic": SCRATCH_TOPIC, "role": "nobody"}),
    "topics.permissions": (TENANT_ADMIN, {"topic": SCRATCH_TOPIC}),
    "topics.inject_send_failure": (TENANT_ADMIN, {"topic": SCRATCH_TOPIC, "count": 0}),
    "topics.unload": (TENANT_ADMIN, {"topic": SCRATCH_TOPIC}),
    "topics.delete": (TENANT_ADMIN, {"topic": SCRATCH_TOPIC, "force": True}),
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("role-matrix")
    tracker = ProcessTracker()
    try:
        s = start_stack(base, tracker, extra="authenticate_metrics_endpoint = true\n")
        s.grpc = s.channel()
        assert produce(s, "admin", TOPIC, [entry(1, b"first")], channel=s.grpc)[0][0] == "receipt"
        yield s
        s.grpc.close()
    finally:
        tracker.kill_all()


def _status(exc: grpc.RpcError) -> str:
    return exc.code().name


# ---- the RPC rows: (allowed callers, answer for them, answer for the others) -----------------
def _produce_row(entries: Callable[[str], list], name: str = "", is_replicator: bool = False, seq: int = 1):
    def run(s, caller: str, row: str) -> str:
        topic = f"persistent://{NS}/m-{row}-{caller}"
        answers = produce(s, caller, topic, entries(caller), producer_name=name, is_replicator=is_replicator,
                          channel=s.grpc, first_seq=seq)
        kinds = {a[0] if a[0] == "receipt" else f"error:{a[1]}" for a in answers}
        return kinds.pop() if len(kinds) == 1 else "mixed:" + ",".join(sorted(kinds))
    return run


def _consume(topic: str, subscription: Optional[str] = None):
    def run(s, caller: str, row: str) -> str:
        stub = broker_pb2_grpc.PulsarBrokerStub(s.grpc)
        call = stub.Consume(iter([pb.ConsumerRequest(subscribe=pb.Subscribe(
            topic=topic, subscription=subscription or f"m-{caller}", durable=True, initial_position=pb.Earliest))]),
            metadata=s.metadata(caller), timeout=20)
        try:
            return next(call).WhichOneof("response")
        finally:
            call.cancel()
    return run


def _unary(method: str, request):
    def run(s, caller: str, row: str) -> str:
        getattr(broker_pb2_grpc.PulsarBrokerStub(s.grpc), method)(request, metadata=s.metadata(caller), timeout=20)
        return "OK"
    return run


def _admin(method: str, **body):
    def run(s, caller: str, row: str) -> str:
        admin_call(s, caller, method, s.grpc, **body)
        return "OK"
    return run


def _metrics(s, caller: str, row: str) -> str:
    req = urllib.request.Request(f"https://127.0.0.1:{s.broker.http_port}/metrics")
    if caller != "none":
        req.add_header("Authorization", f"Bearer {s.keys.token(caller)}")
    try:
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=s.ca), timeout=20) as resp:
            return str(resp.status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)


def _marker(caller: str) -> bytes:
    return with_metadata(markers.update("victim", {LOCAL: Position(1, 0)}),
                         lambda m: setattr(m, "replicated_from", "elsewhere"))


def _replicated(caller: str) -> list:
    return [entry(1, b"copy", replicated_from="elsewhere", replicated_source_ledger_id=1,
                  replicated_source_entry_id=0), _marker(caller)]


RPC_ROWS: dict[str, tuple[frozenset, str, str, Callable]] = {
    "Produce.plain": (PRODUCE, "receipt", "PERMISSION_DENIED", _produce_row(lambda c: [entry(1)])),
    "Produce.forged_marker": (PRODUCE, "error:NotAllowed", "PERMISSION_DENIED",
                              _produce_row(lambda c: [_marker(c)])),
    "Produce.forged_replicated_from": (PRODUCE, "error:AuthorizationError", "PERMISSION_DENIED",
                                       _produce_row(lambda c: [_replicated(c)[0]], seq=2 ** 62)),
    "Produce.replicate_to_outside_allowed_clusters": (
        PRODUCE, "error:AuthorizationError", "PERMISSION_DENIED",
        _produce_row(lambda c: [entry(1, replicate_to=["elsewhere"])])),
    "Produce.replicate_to_allowed_cluster": (PRODUCE, "receipt", "PERMISSION_DENIED",
                                             _produce_row(lambda c: [entry(1, replicate_to=[LOCAL])])),
    "Produce.as_replicator_forwarding_markers": (
        REPLICATE, "receipt", "PERMISSION_DENIED",
        _produce_row(_replicated, name="pulsar.repl.elsewhere", is_replicator=True, seq=1 << 32)),
    "Produce.replicator_name_only": (REPLICATE, "receipt", "PERMISSION_DENIED",
                                     _produce_row(lambda c: [entry(1)], name="pulsar.repl.elsewhere")),
    "Produce.is_replicator_flag_only": (REPLICATE, "receipt", "PERMISSION_DENIED",
                                        _produce_row(lambda c: [entry(1)], name="not-a-replicator",
                                                     is_replicator=True)),
    "Consume": (CONSUME, "subscribed", "PERMISSION_DENIED", _consume(TOPIC)),
    "Consume.reserved_subscription_name": (CONSUME, "INVALID_ARGUMENT", "PERMISSION_DENIED",
                                           _consume(TOPIC, "pulsar.repl.elsewhere")),
    "Consume.other_tenants_topic": (frozenset({"mallory", "admin"}), "subscribed", "PERMISSION_DENIED",
                                    _consume("persistent://evil/ns/secrets")),
    "GetPartitionedTopicMetadata": (LOOKUP, "OK", "PERMISSION_DENIED",
                                    _unary("GetPartitionedTopicMetadata", pb.TopicRequest(topic=TOPIC))),
    "GetLastMessageId": (LOOKUP, "OK", "PERMISSION_DENIED", _unary("GetLastMessageId", pb.TopicRequest(topic=TOPIC))),
    "Lookup": (LOOKUP, "OK", "PERMISSION_DENIED", _unary("Lookup", pb.LookupRequest(topic=TOPIC))),
    "GetTopicsOfNamespace": (NS_READ, "OK", "PERMISSION_DENIED",
                             _unary("GetTopicsOfNamespace", pb.NamespaceRequest(namespace=NS))),
    "Admin.topics.set_replication_clusters.outside_allowed": (
        TENANT_ADMIN, "INVALID_ARGUMENT", "PERMISSION_DENIED",
        _admin("topics.set_replication_clusters", topic=f"persistent://{NS}/outside", clusters=[LOCAL, "elsewhere"])),
    "Admin.namespaces.set_clusters.outside_allowed": (
        TENANT_ADMIN, "INVALID_ARGUMENT", "PERMISSION_DENIED",
        _admin("namespaces.set_clusters", namespace=NS, clusters=[LOCAL, "elsewhere"])),
    "Admin.tenants.update.widen_allowed_clusters": (
        frozenset(), "-", "PERMISSION_DENIED",      # a superuser's would succeed: left out (it would widen acme)
        _admin("tenants.update", tenant="acme", allowed_clusters=[LOCAL, "elsewhere"], admin_roles=["acme-admin"])),
    "HTTP./metrics": (SUPER, "200", "403", _metrics),
}


def _expected_rpc(row: str, caller: str) -> str:
    allowed, yes, no, _ = RPC_ROWS[row]
    if caller == "none":
        return "401" if row == "HTTP./metrics" else "UNAUTHENTICATED"
    return yes if caller in allowed else no


def _rpc_cases():
    for row in RPC_ROWS:
        for caller in ROLES:
            if row == "Admin.tenants.update.widen_allowed_clusters" and caller == "admin":
                continue
            yield pytest.param(row, caller, id=f"{row}-{caller}")


def _verb_cases():
    for method in VERBS:
        for caller in ROLES:
            yield pytest.param(method, caller, id=f"{method}-{caller}")


def _run(fn, s, caller: str, row: str) -> str:
    try:
        return fn(s, caller, row)
    except grpc.RpcError as exc:
        return _status(exc)


@pytest.mark.parametrize("row,caller", list(_rpc_cases()))
def test_rpc(stack, row, caller):
    expected = _expected_rpc(row, caller)
    got = _run(RPC_ROWS[row][3], stack, caller, row.replace(".", "_"))
    print(f"{row:58s} {caller:11s} expected {expected:26s} got {got}")
    assert got == expected


@pytest.mark.parametrize("method,caller", list(_verb_cases()))
def test_admin_verb(stack, method, caller):
    allowed, body = VERBS[method]
    expected = "UNAUTHENTICATED" if caller == "none" else "authorized" if caller in allowed else "PERMISSION_DENIED"
    got = _run(_admin(method, **body), stack, caller, method)
    shown = "authorized" if got not in ("UNAUTHENTICATED", "PERMISSION_DENIED") else got
    print(f"{method:58s} {caller:11s} expected {expected:26s} got {got}")
    assert shown == expected


def test_every_admin_verb_is_in_the_matrix():
    assert sorted(VERBS) == sorted(admin_verbs.HANDLERS)


def test_matrix_lists_its_cases():
    rows = [(r, c, _expected_rpc(r, c)) for r, c in (p.values for p in _rpc_cases())]
    rows += [(m, c, "UNAUTHENTICATED" if c == "none" else "authorized" if c in VERBS[m][0] else "PERMISSION_DENIED")
             for m, c in (p.values for p in _verb_cases())]
    for row, caller, expected in rows:
        print(f"{row:58s} {caller:11s} {expected}")
    print(f"{len(rows)} cases: {len(RPC_ROWS)} RPC rows and {len(VERBS)} admin verbs x {len(ROLES)} callers")
    assert len(rows) == len(list(_rpc_cases())) + len(VERBS) * len(ROLES)
