"""Geo-replication between real clusters (each: 2 bookies + 1 broker)."""
from __future__ import annotations

import asyncio
import collections
import uuid

import grpc
import pytest

from tests.geo import connect_clusters, produce_raw, read_all, start_clusters
from tests.procs import ProcessTracker

BROKER_CONFIG = "enable_fault_injection = true\nreplication_policy_check_duration_seconds = 5\n"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    tracker = ProcessTracker()
    clusters = start_clusters(tmp_path_factory.mktemp("geo"), ["a", "b", "c"], tracker, BROKER_CONFIG)
    try:
        yield clusters
    finally:
        for c in clusters:
            c.proc.terminate()
        tracker.kill_all()


def new_topic(ns: str) -> str:
    return f"persistent://{ns}/t-{uuid.uuid4().hex[:8]}"


def check_exactly_once_in_order(messages, expected: dict[str, int]):
    """messages: [(md, payload)]; expected: producer -> count (seq 0..n-1)."""
    by_producer = collections.defaultdict(list)
    for md, payload in messages:
        by_producer[md.producer_name].append(int(payload.split(b"-")[-1]))
    assert {p: len(v) for p, v in by_producer.items()} == expected
    for p, seqs in by_producer.items():
        assert seqs == list(range(expected[p])), f"{p}: out of order or duplicated"


async def test_full_mesh_exactly_once_and_loop_prevention(mesh):
    a, b, c = mesh
    await connect_clusters(mesh, "mesh", "ns", ["a", "b", "c"])
    topic = new_topic("mesh/ns")
    n = 200
    await asyncio.gather(*(produce_raw(cl, topic, f"p-{cl.name}", [f"{cl.name}-{i}".encode() for i in range(n)])
                           for cl in mesh))
    expected = {f"p-{cl.name}": n for cl in mesh}
    for cl in mesh:
        got = await read_all(cl, topic, 3 * n)
        check_exactly_once_in_order(got, expected)
        for md, payload in got:
            origin = md.producer_name[2:]
            assert (md.replicated_from or cl.name) == origin
    # c did not forward a's messages to b: b's topic has exactly one replicator producer per origin
    stats = await b.admin("topics.stats", topic=topic)
    assert stats["msgInCounter"] == 3 * n


async def test_one_way_narrowing_and_local_only(mesh):
    a, b, c = mesh
    await connect_clusters(mesh, "oneway", "ns", ["a", "b"])
    # b and c list only themselves: nothing flows back to a
    await b.admin("namespaces.set_clusters", namespace="oneway/ns", clusters=["b"])
    await c.admin("namespaces.set_clusters", namespace="oneway/ns", clusters=["c"])
    topic = new_topic("oneway/ns")
    await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(50)])
    await produce_raw(a, topic, "local", [b"l-%d" % i for i in range(5)], replicate_to=["__local__"])
    await produce_raw(b, topic, "pb", [b"b-%d" % i for i in range(20)])
    check_exactly_once_in_order(await read_all(b, topic, 70), {"pa": 50, "pb": 20})
    check_exactly_once_in_order(await read_all(a, topic, 55, timeout_s=5), {"pa": 50, "local": 5})


async def test_replicate_to_narrowing(mesh):
    a, b, c = mesh
    await connect_clusters(mesh, "narrow", "ns", ["a", "b", "c"])
    topic = new_topic("narrow/ns")
    await produce_raw(a, topic, "only-b", [b"x-%d" % i for i in range(10)], replicate_to=["a", "b"])
    await produce_raw(a, topic, "all", [b"y-%d" % i for i in range(10)])
    check_exactly_once_in_order(await read_all(b, topic, 20), {"only-b": 10, "all": 10})
    check_exactly_once_in_order(await read_all(c, topic, 10), {"all": 10})


async def test_remote_refusing_one_send_loses_and_duplicates_nothing(mesh):
    a, b, c = mesh
    await connect_clusters(mesh, "refuse", "ns", ["a", "b"])
    topic = new_topic("refuse/ns")
    await b.admin("topics.inject_send_failure", topic=topic, count=1)
    await produce_raw(a, topic, "pa", [b"a-%d" % i for i in range(300)])
    check_exactly_once_in_order(await read_all(b, topic, 300), {"pa": 300})


async def test_bad_cluster_policies_get_clear_errors(mesh):
    a, b, c = mesh
    await connect_clusters(mesh, "bad", "ns", ["a"])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await a.admin("namespaces.set_clusters", namespace="bad/ns", clusters=["a", "nowhere"])
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "nowhere" in err.value.details()
    await a.admin("tenants.create", tenant="narrowtenant", allowed_clusters=["a"])
    await a.admin("namespaces.create", namespace="narrowtenant/ns")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await a.admin("namespaces.set_clusters", namespace="narrowtenant/ns", clusters=["a", "b"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not allowed" in err.value.details()
