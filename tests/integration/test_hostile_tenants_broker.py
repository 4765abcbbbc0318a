"""Hostile tenants, broker side (issue 32, cases 1, 3, 4 and ``/metrics``), over real
processes: two bookies with mutual TLS and tokens, a broker serving TLS with token
authentication and authorization on (``tests.hostile_support``), raw gRPC calls and
raw Pulsar-protocol frames with every field forged.

1. markers are server-only: a produce-only role's UPDATE marker (``replicated_from``
   a registered cluster) no longer empties another role's replicated subscription;
   its forged ``replicated_from`` no longer poisons the replicator's deduplication;
   a SEND with marker metadata over the Pulsar protocol is refused too;
3. the replicator identity (``pulsar.repl.`` names, ``is_replicator``) is reserved to
   roles that may replicate (superusers, ``replicator_roles``);
4. topic replication clusters and a message's ``replicate_to`` stay within the
   tenant's allowed clusters;
and ``authenticate_metrics_endpoint``: ``/metrics`` needs a superuser's token.
"""
from __future__ import annotations

import json
import re
import ssl
import time
import urllib.error
import urllib.request

import grpc
import pytest

from broker.ledger.position import Position
from broker.replication import markers
from proto.entry_format import with_metadata
from proto.pulsar_wire_pb2 import BaseCommand as T
from tests.hostile_support import LOCAL, NS, RawPulsar, admin_call, entry, produce, start_stack
from tests.procs import ProcessTracker

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile-broker")
    tracker = ProcessTracker()
    try:
        yield start_stack(base, tracker, extra="authenticate_metrics_endpoint = true\n")
    finally:
        tracker.kill_all()


def _stats(stack, topic: str) -> dict:
    return json.loads(admin_call(stack, "admin", "topics.stats", topic=topic))


def _wait(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def _geo_namespace(stack, ns: str) -> None:
    """``ns`` (tenant ``geo-<x>`` allowing both clusters) replicated to ``elsewhere``;
    ``attacker`` may produce, ``victim`` consume, ``replicator`` produce (as remote
    replicators are granted)."""
    tenant = ns.split("/")[0]
    admin_call(stack, "admin", "tenants.create", tenant=tenant, allowed_clusters=[LOCAL, "elsewhere"])
    admin_call(stack, "admin", "namespaces.create", namespace=ns)
    for role, actions in (("attacker", ["produce"]), ("victim", ["consume"]), ("replicator", ["produce"])):
        admin_call(stack, "admin", "namespaces.grant_permission", namespace=ns, role=role, actions=actions)
    admin_call(stack, "admin", "namespaces.set_clusters", namespace=ns, clusters=[LOCAL, "elsewhere"])


def test_case1_a_produce_only_role_cannot_empty_a_replicated_subscription_with_a_marker(stack):
    """Before: the attacker's UPDATE marker was stored (a normal receipt) and applied by the
    replicated-subscriptions controller: the victim's backlog went 10 -> 0. Now refused
    (NotAllowed: markers are written by brokers only) and the backlog stays 10."""
    _geo_namespace(stack, "geo-one/ns")
    topic = "persistent://geo-one/ns/orders"
    with stack.channel() as ch:
        from proto import broker_pb2 as pb
        from proto import broker_pb2_grpc
        stub = broker_pb2_grpc.PulsarBrokerStub(ch)
        # the victim's replicated subscription (PIP-33), created by subscribing
        call = stub.Consume(iter([pb.ConsumerRequest(subscribe=pb.Subscribe(
            topic=topic, subscription="victim-sub", durable=True, initial_position=pb.Earliest,
            replicate_subscription_state=True))]), metadata=stack.metadata("victim"), timeout=20)
        assert next(call).WhichOneof("response") == "subscribed"
        call.cancel()
        answers = produce(stack, "admin", topic, [entry(i, b"order-%d" % i) for i in range(1, 11)], channel=ch)
        assert [a[0] for a in answers] == ["receipt"] * 10
        last = Position(answers[-1][1], answers[-1][2])
        # the controller runs once the topic replicates (its replicator to "elsewhere" retries forever)
        assert _wait(lambda: "elsewhere" in _stats(stack, topic)["replication"])
        assert _stats(stack, topic)["subscriptions"]["victim-sub"]["isReplicated"] is True
        assert _stats(stack, topic)["subscriptions"]["victim-sub"]["msgBacklog"] == 10

        forged = with_metadata(markers.update("victim-sub", {LOCAL: last}),
                               lambda m: setattr(m, "replicated_from", "elsewhere"))
        got = produce(stack, "attacker", topic, [forged], channel=ch)
        assert got[0][0] == "error" and got[0][1] == "NotAllowed", got
        assert "markers are written by brokers only" in got[0][2]
        time.sleep(1.5)  # what the controller would have needed to apply it
        assert _stats(stack, topic)["subscriptions"]["victim-sub"]["msgBacklog"] == 10


def test_case1_forged_replicated_from_cannot_poison_the_replicators_deduplication(stack):
    """Before: a produce-only role's entry with ``replicated_from = elsewhere`` and a huge
    source position was stored; once the topic reloaded (unload, restart, new owner) its
    deduplication state, replayed from the entries, credited it to producer
    ``pulsar.repl.elsewhere``: the real replicator's next entries were answered as
    duplicates (-1:-1) and lost. Now refused (AuthorizationError); the replicator role's
    entry is stored after the reload."""
    _geo_namespace(stack, "geo-two/ns")
    topic = "persistent://geo-two/ns/flights"
    huge = 2 ** 30
    forged = entry(7, b"forged", replicated_from="elsewhere", replicated_source_ledger_id=huge,
                   replicated_source_entry_id=0)
    got = produce(stack, "attacker", topic, [forged], first_seq=2 ** 62)
    assert got[0][:2] == ("error", "AuthorizationError"), got
    assert "replicated_from" in got[0][2] and "geo-replicators only" in got[0][2]
    admin_call(stack, "admin", "topics.unload", topic=topic)   # deduplication state replayed from the entries
    real = entry(1, b"real", replicated_from="elsewhere", replicated_source_ledger_id=3,
                 replicated_source_entry_id=0)
    got = produce(stack, "replicator", topic, [real], producer_name="pulsar.repl.elsewhere", is_replicator=True,
                  first_seq=3 << 32)
    assert got[0][0] == "receipt" and got[0][1] >= 0, f"the replicated entry was dropped: {got}"


def _pulsar_tls_port(stack) -> int:
    text = stack.broker.stdout_log.read_text(errors="replace")
    return int(re.findall(r"pulsar_tls_port=(\d+)", text)[-1])


def test_case1_pulsar_protocol_send_with_marker_metadata_is_refused(stack):
    """The official protocol edge: a SEND whose metadata carries a marker type gets a
    SEND_ERROR naming the refusal (before: SEND_RECEIPT, stored); a plain SEND after it
    is stored."""
    topic = f"persistent://{NS}/pulsar-edge-marker"
    raw = RawPulsar(_pulsar_tls_port(stack), stack.ca, stack.keys.token("writer"))
    try:
        assert raw.connected.type == T.CONNECTED
        raw.send(T(type=T.PRODUCER, producer={"topic": topic, "producer_id": 1, "request_id": 1}))
        assert raw.expect(T.PRODUCER_SUCCESS, T.ERROR).type == T.PRODUCER_SUCCESS
        marker = with_metadata(markers.snapshot_request("x", "elsewhere"),
                               lambda m: setattr(m, "replicated_from", "elsewhere"))
        raw.send(T(type=T.SEND, send={"producer_id": 1, "sequence_id": 1}), marker)
        answer = raw.expect(T.SEND_RECEIPT, T.SEND_ERROR)
        assert answer.type == T.SEND_ERROR, "a client's marker was stored"
        assert "markers are written by brokers only" in answer.send_error.message
        raw.send(T(type=T.SEND, send={"producer_id": 1, "sequence_id": 2}), entry(2, b"plain"))
        assert raw.expect(T.SEND_RECEIPT, T.SEND_ERROR).type == T.SEND_RECEIPT
    finally:
        raw.close()


def test_case3_the_replicator_identity_is_reserved(stack):
    """Before: a produce-only role opened ``pulsar.repl.elsewhere`` with is_replicator (the real
    replicator then got ProducerBusy). Now PERMISSION_DENIED for the name, the flag, or both,
    over gRPC and the Pulsar protocol; the ``replicator_roles`` role and a superuser may."""
    topic = f"persistent://{NS}/repl-identity"
    for name, flag in (("pulsar.repl.elsewhere", True), ("pulsar.repl.elsewhere", False), ("", True)):
        with pytest.raises(grpc.RpcError) as info:
            produce(stack, "writer", topic, [entry(1)], producer_name=name, is_replicator=flag)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, (name, flag)
        assert "may not act as a geo-replicator" in info.value.details()
    for role in ("replicator", "admin"):
        got = produce(stack, role, topic, [entry(1, b"r", replicated_from="elsewhere", replicated_source_ledger_id=1,
                                                  replicated_source_entry_id=0)],
                      producer_name="pulsar.repl.elsewhere", is_replicator=True, first_seq=(1 << 32) + len(role))
        assert got[0][0] == "receipt", (role, got)
    raw = RawPulsar(_pulsar_tls_port(stack), stack.ca, stack.keys.token("writer"))
    try:
        raw.send(T(type=T.PRODUCER, producer={"topic": topic, "producer_id": 1, "request_id": 1,
                                              "producer_name": "pulsar.repl.elsewhere"}))
        answer = raw.expect(T.PRODUCER_SUCCESS, T.ERROR)
        assert answer.type == T.ERROR and "may not act as a geo-replicator" in answer.error.message
    finally:
        raw.close()


def test_case4_replication_clusters_stay_within_the_tenants_allowed_clusters(stack):
    """Before: a tenant admin's topics set-replication-clusters with ``elsewhere`` (not allowed
    for acme) was accepted. Now refused as the namespace verb is, for a superuser too
    (Pulsar's validateClusterForTenant); a client's ``replicate_to`` naming it is refused."""
    topic = f"persistent://{NS}/outside"
    for role in ("acme-admin", "admin"):
        for method, body in (("topics.set_replication_clusters", {"topic": topic}),
                             ("namespaces.set_clusters", {"namespace": NS})):
            with pytest.raises(grpc.RpcError) as info:
                admin_call(stack, role, method, clusters=[LOCAL, "elsewhere"], **body)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (role, method)
            assert "not allowed for tenant acme" in info.value.details()
    assert json.loads(admin_call(stack, "acme-admin", "topics.set_replication_clusters", topic=topic,
                                 clusters=[LOCAL]))["replication_clusters"] == [LOCAL]
    got = produce(stack, "writer", topic, [entry(1, replicate_to=["elsewhere"]), entry(2, replicate_to=[LOCAL])])
    assert got[0][:2] == ("error", "AuthorizationError") and "outside the tenant's allowed clusters" in got[0][2]
    assert got[1][0] == "receipt"


def _get_metrics(stack, role: str):
    ctx = ssl.create_default_context(cafile=stack.ca)
    req = urllib.request.Request(f"https://127.0.0.1:{stack.broker.http_port}/metrics")
    if role != "none":
        req.add_header("Authorization", f"Bearer {stack.keys.token(role)}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=20) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_endpoint_needs_a_superuser_token(stack):
    """``authenticate_metrics_endpoint = true``: before, /metrics (every tenant's topic names)
    answered 200 to anyone; now 401 without a valid token, 403 for a non-superuser, 200 for
    a superuser."""
    produce(stack, "writer", f"persistent://{NS}/metrics-visible", [entry(1)])
    status, body = _get_metrics(stack, "none")
    assert status == 401 and "acme" not in body, body[:300]
    status, body = _get_metrics(stack, "writer")
    assert status == 403 and "superuser" in body and "metrics-visible" not in body
    status, body = _get_metrics(stack, "admin")
    assert status == 200 and "metrics-visible" in body
