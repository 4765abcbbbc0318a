"""The pure rules of ``broker.security.replication_rules`` (issue 32): who may act as
a replicator, which producer identities are reserved, which entry origins a producer
may write, and the tenant's allowed clusters."""
from __future__ import annotations

import pytest

from broker.security.replication_rules import (check_clusters_for_tenant, check_entry_origin,
                                               check_producer_identity, may_replicate)
from proto.errors import AuthorizationError, InvalidArgument, NotAllowed
from proto.pulsar_api_pb2 import REPLICATED_SUBSCRIPTION_UPDATE, MessageMetadata


def md(**fields) -> MessageMetadata:
    return MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, **fields)


def test_who_may_replicate():
    assert may_replicate(None, False, [], [])                      # authorization off: anyone
    assert may_replicate("app", False, ["admin"], [])
    assert may_replicate("admin", True, ["admin"], [])
    assert may_replicate("repl", True, ["admin"], ["repl"])
    assert not may_replicate("app", True, ["admin"], ["repl"])
    assert not may_replicate(None, True, ["admin"], ["repl"])


@pytest.mark.parametrize("name,flag", [("pulsar.repl.east", True), ("pulsar.repl.east", False), ("app", True)])
def test_the_replicator_identity_is_reserved(name, flag):
    with pytest.raises(AuthorizationError, match="role 'app' may not act as a geo-replicator"):
        check_producer_identity(name, flag, "app", allowed=False)
    check_producer_identity(name, flag, "repl", allowed=True)


def test_ordinary_producers_need_nothing():
    for name in ("", "app", "pulsar.replica", "my.pulsar.repl.x"):
        check_producer_identity(name, False, "app", allowed=False)


def test_markers_are_server_only_whatever_the_security():
    marker = md(marker_type=REPLICATED_SUBSCRIPTION_UPDATE, replicated_from="east")
    for checked in (False, True):
        with pytest.raises(NotAllowed, match="markers are written by brokers only"):
            check_entry_origin(marker, "app", False, checked)
    check_entry_origin(marker, "pulsar.repl.east", True, True)    # a replicator forwards it
    with pytest.raises(NotAllowed, match="without replicated_from"):
        check_entry_origin(md(marker_type=REPLICATED_SUBSCRIPTION_UPDATE), "pulsar.repl.east", True, True)


def test_replicated_from_comes_from_replicators_when_roles_exist():
    copy = md(replicated_from="east", replicated_source_ledger_id=2**30, replicated_source_entry_id=0)
    with pytest.raises(AuthorizationError, match="geo-replicators only"):
        check_entry_origin(copy, "app", False, origin_checked=True)
    check_entry_origin(copy, "app", False, origin_checked=False)   # authentication off: as before
    check_entry_origin(copy, "pulsar.repl.east", True, origin_checked=True)


def test_replicate_to_stays_within_the_allowed_clusters():
    allowed = frozenset({"west"})
    with pytest.raises(AuthorizationError, match="east outside the tenant's allowed clusters"):
        check_entry_origin(md(replicate_to=["west", "east"]), "app", False, True, allowed)
    check_entry_origin(md(replicate_to=["west"]), "app", False, True, allowed)
    check_entry_origin(md(replicate_to=["east"]), "app", False, True, None)   # not checked
    check_entry_origin(md(replicate_to=["east"]), "pulsar.repl.x", True, True, allowed)


def test_clusters_for_tenant():
    check_clusters_for_tenant(["west"], "t", {"allowed_clusters": ["west", "east"]})
    with pytest.raises(InvalidArgument, match=r"cluster\(s\) mars are not allowed for tenant t \(allowed: west\)"):
        check_clusters_for_tenant(["west", "mars"], "t", {"allowed_clusters": ["west"]})
    with pytest.raises(InvalidArgument):
        check_clusters_for_tenant(["west"], "t", {})
