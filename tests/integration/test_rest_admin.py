"""Pulsar's REST admin API on the broker's web port (issue 37), called with a plain
HTTP client (aiohttp) against real processes: one standalone cluster (bookies +
broker) for the resources, one broker with token authentication and authorization
on for 401 / 403. Answers are checked against Pulsar's JSON shapes, status codes
and ``{"reason": ...}`` errors, and against what the gRPC admin says in the same run.
"""
from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest

from client import AsyncClient, InitialPosition
from client.admin import AdminClient
from tests.procs import ProcessTracker, start_standalone
from tests.security_support import Keys, start_secure_broker

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def standalone_web(tmp_path_factory):
    """(StandaloneProcess, ``http://127.0.0.1:<web port>``) shared by this module."""
    tracker = ProcessTracker()
    proc = start_standalone(tmp_path_factory.mktemp("rest-standalone"), tracker=tracker)
    text = proc.stdout_log.read_text()
    http_port = int(re.findall(r"http_port=(\d+)", text)[-1])
    try:
        yield proc, f"http://127.0.0.1:{http_port}"
    finally:
        proc.terminate()
        tracker.kill_all()


async def call(method: str, url: str, body=None, token: str | None = None, raw: bytes | None = None,
               redirects: bool = True):
    """(status, decoded JSON or text or None, headers) of one HTTP call."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    if data is not None:
        headers["Content-Type"] = "application/json"
    async with aiohttp.ClientSession() as s:
        async with s.request(method, url, data=data, headers=headers, allow_redirects=redirects) as r:
            text = await r.text()
            try:
                value = json.loads(text) if text else None
            except ValueError:
                value = text
            return r.status, value, r.headers


async def test_clusters_tenants_namespaces_policies(standalone_web):
    _, web = standalone_web
    a = f"{web}/admin/v2"
    status, clusters, _ = await call("GET", f"{a}/clusters")
    assert (status, clusters) == (200, ["standalone"])
    status, data, _ = await call("GET", f"{a}/clusters/standalone")
    assert status == 200 and data["brokerServiceUrl"].startswith("minipulsar://127.0.0.1:")
    status, err, _ = await call("GET", f"{a}/clusters/nowhere")
    assert status == 404 and "nowhere" in err["reason"]

    # tenants: PUT creates (204), a second PUT conflicts (409), POST updates, DELETE removes
    assert (await call("PUT", f"{a}/tenants/acme", {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}))[0] == 204
    status, err, _ = await call("PUT", f"{a}/tenants/acme", {"allowedClusters": ["standalone"]})
    assert status == 409 and "acme" in err["reason"]
    assert (await call("GET", f"{a}/tenants/acme"))[:2] == (200, {"adminRoles": ["ops"],
                                                                 "allowedClusters": ["standalone"]})
    assert (await call("POST", f"{a}/tenants/acme", {"adminRoles": ["ops", "dev"],
                                                     "allowedClusters": ["standalone"]}))[0] == 204
    assert (await call("GET", f"{a}/tenants/acme"))[1]["adminRoles"] == ["ops", "dev"]
    assert "acme" in (await call("GET", f"{a}/tenants"))[1]

    # namespaces and their policies, in Pulsar's JSON shapes
    ns = f"{a}/namespaces/acme/app"
    assert (await call("PUT", ns))[0] == 204
    assert (await call("GET", f"{a}/namespaces/acme"))[1] == ["acme/app"]
    assert (await call("POST", f"{ns}/deduplication", True))[0] == 204
    assert (await call("GET", f"{ns}/deduplication"))[:2] == (200, True)
    assert (await call("POST", f"{ns}/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10}))[0] == 204
    assert (await call("GET", f"{ns}/retention"))[1] == {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10}
    assert (await call("POST", f"{ns}/replication", ["standalone"]))[0] == 204
    assert (await call("GET", f"{ns}/replication"))[1] == ["standalone"]
    status, err, _ = await call("POST", f"{ns}/replication", ["nowhere"])
    assert status == 404 and "nowhere" in err["reason"]
    assert (await call("POST", f"{ns}/permissions/app-role", ["produce", "consume"]))[0] == 204
    assert (await call("GET", f"{ns}/permissions"))[1] == {"app-role": ["consume", "produce"]}
    status, err, _ = await call("POST", f"{ns}/permissions/app-role", ["fly"])
    assert status == 400 and "fly" in err["reason"]
    assert (await call("DELETE", f"{ns}/permissions/app-role"))[0] == 204
    assert (await call("GET", f"{ns}/permissions"))[1] == {}
    policies = (await call("GET", ns))[1]
    assert policies["deduplicationEnabled"] is True and policies["replication_clusters"] == ["standalone"]
    assert policies["retention_policies"] == {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10}
    # the gRPC admin sees what REST wrote (one set of admin verbs)
    async with AdminClient(standalone_web[0].service_url) as grpc_admin:
        assert (await grpc_admin.get_tenant("acme"))["admin_roles"] == ["ops", "dev"]
    # a standalone broker has no bundles to list (412 with the reason), a tenant with namespaces stays
    status, err, _ = await call("GET", f"{ns}/bundles")
    assert status == 412 and "standalone" in err["reason"]
    status, err, _ = await call("DELETE", f"{a}/tenants/acme")
    assert status == 412 and "namespaces" in err["reason"]
    assert (await call("DELETE", ns))[0] == 204
    assert (await call("DELETE", f"{a}/tenants/acme"))[0] == 204
    assert (await call("GET", f"{a}/tenants/acme"))[0] == 404


async def test_topics_stats_subscriptions_skip_reset_last_message_id(standalone_web):
    proc, web = standalone_web
    t = f"{web}/admin/v2/persistent/public/default/rest-t1"
    assert (await call("PUT", t))[0] == 204
    assert (await call("PUT", t))[0] == 409
    assert "persistent://public/default/rest-t1" in (await call("GET", f"{web}/admin/v2/persistent/public/default"))[1]
    async with AsyncClient(proc.service_url) as client:
        consumer = await client.subscribe("persistent://public/default/rest-t1", "s1",
                                          initial_position=InitialPosition.Earliest)
        producer = await client.create_producer("persistent://public/default/rest-t1", batching_enabled=False)
        ids = [await producer.send(f"m{i}".encode()) for i in range(10)]
        await consumer.close()
        status, stats, _ = await call("GET", f"{t}/stats")
        assert status == 200 and stats["msgInCounter"] == 10
        assert stats["subscriptions"]["s1"]["msgBacklog"] == 10
        async with AdminClient(proc.service_url) as grpc_admin:   # same figures as the gRPC admin
            grpc_stats = await grpc_admin.get_stats("persistent://public/default/rest-t1")
        assert grpc_stats["msgInCounter"] == stats["msgInCounter"]
        assert (await call("GET", f"{t}/subscriptions"))[1] == ["s1"]
        internal = (await call("GET", f"{t}/internalStats"))[1]
        assert "s1" in internal["cursors"]
        last = (await call("GET", f"{t}/lastMessageId"))[1]
        assert (last["ledgerId"], last["entryId"], last["partitionIndex"]) == (ids[-1].ledger_id, ids[-1].entry_id, -1)

        sub = f"{t}/subscription/s1"
        assert (await call("POST", f"{sub}/skip/3"))[0] == 204
        assert (await call("GET", f"{t}/stats"))[1]["subscriptions"]["s1"]["msgBacklog"] == 7
        status, err, _ = await call("POST", f"{sub}/skip/0")
        assert status == 400 and "count" in err["reason"]
        assert (await call("POST", f"{sub}/skip_all"))[0] == 204
        assert (await call("GET", f"{t}/stats"))[1]["subscriptions"]["s1"]["msgBacklog"] == 0
        assert (await call("POST", f"{sub}/resetcursor/0"))[0] == 204          # back to the first message
        assert (await call("GET", f"{t}/stats"))[1]["subscriptions"]["s1"]["msgBacklog"] == 10
        mid = {"ledgerId": ids[5].ledger_id, "entryId": ids[5].entry_id}
        assert (await call("POST", f"{sub}/resetcursor", mid))[0] == 204        # m5 is the next one delivered
        consumer = await client.subscribe("persistent://public/default/rest-t1", "s1")
        msg = await consumer.receive(timeout_millis=10000)
        assert msg.data() == b"m5"
        await consumer.close()
        # a subscription created at a message id, then deleted
        assert (await call("PUT", f"{t}/subscription/s2", {"ledgerId": ids[8].ledger_id,
                                                          "entryId": ids[8].entry_id}))[0] == 204
        assert (await call("GET", f"{t}/stats"))[1]["subscriptions"]["s2"]["msgBacklog"] == 2
        assert (await call("DELETE", f"{t}/subscription/s2"))[0] == 204
        status, err, _ = await call("DELETE", f"{t}/subscription/s2")
        assert status == 404 and "s2" in err["reason"]
        await producer.close()

    # partitioned topics: create, grow, metadata, stats of the partitions merged
    p = f"{web}/admin/v2/persistent/public/default/rest-p1"
    assert (await call("PUT", f"{p}/partitions", 2))[0] == 204
    assert (await call("GET", f"{p}/partitions"))[1] == {"partitions": 2}
    assert (await call("POST", f"{p}/partitions", 3))[0] == 204
    status, err, _ = await call("POST", f"{p}/partitions", 1)
    assert status == 400 and "only grow" in err["reason"]
    assert "persistent://public/default/rest-p1" in (
        await call("GET", f"{web}/admin/v2/persistent/public/default/partitioned"))[1]
    assert (await call("DELETE", f"{p}/partitions"))[0] == 204
    assert (await call("GET", f"{p}/partitions"))[1] == {"partitions": 0}
    # lookup v2: the standalone broker itself, with its web URL
    look = (await call("GET", f"{web}/lookup/v2/topic/persistent/public/default/rest-t1"))[1]
    assert look["brokerUrl"] == proc.service_url and look["httpUrl"] == web
    assert (await call("DELETE", t, None))[0] in (204, 412)


async def test_bad_requests_answer_pulsar_errors_and_metrics_stay(standalone_web):
    _, web = standalone_web
    a = f"{web}/admin/v2"
    cases = [
        ("PUT", f"{a}/tenants/bad%20name", None, None, 400),                      # invalid name
        ("PUT", f"{a}/tenants/ok-tenant", None, b"{not json", 400),                # malformed body
        ("POST", f"{a}/namespaces/public/default/retention", [1, 2], None, 400),   # wrong shape
        ("POST", f"{a}/namespaces/public/default/deduplication", "yes", None, 400),
        ("PUT", f"{a}/persistent/public/default/t/partitions", "many", None, 400),
        ("POST", f"{a}/persistent/public/default/t/subscription/s/skip/lots", None, None, 400),
        ("POST", f"{a}/persistent/public/default/t/subscription/s/resetcursor", {"ledgerId": "x"}, None, 400),
        ("GET", f"{a}/persistent/nope/none/t/stats", None, None, 404),
        ("GET", f"{a}/persistent/public/default/never-made/internalStats", None, None, 404),
        ("GET", f"{a}/namespaces/public/none", None, None, 404),
        ("PUT", f"{a}/tenants/big", None, b"[" + b"1," * 600_000 + b"1]", 400),    # over http_max_request_size
        ("GET", f"{web}/admin/v2/nothing-here", None, None, 404),
    ]
    for method, url, body, raw, want in cases:
        status, err, _ = await call(method, url, body, raw=raw)
        assert status == want, (method, url, status, err)
        assert isinstance(err, dict) and err.get("reason"), (method, url, err)
    # /metrics stays the Prometheus text
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{web}/metrics") as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            assert "pulsar_in_messages_total" in await r.text()


@pytest.fixture(scope="module")
def secure_web(tmp_path_factory):
    """A broker with authentication and authorization on: (keys, broker, web URL)."""
    tracker = ProcessTracker()
    base = tmp_path_factory.mktemp("rest-secure")
    keys = Keys(base)
    try:
        _, broker = start_secure_broker(base, tracker, keys)
        yield keys, broker, f"http://127.0.0.1:{broker.http_port}"
    finally:
        tracker.kill_all()


async def test_authentication_and_authorization(secure_web):
    keys, broker, web = secure_web
    a = f"{web}/admin/v2"
    admin, app = keys.token("admin"), keys.token("app")
    status, err, _ = await call("GET", f"{a}/tenants")
    assert status == 401 and "token" in err["reason"]
    status, err, _ = await call("GET", f"{a}/tenants", token="not-a-jwt")
    assert status == 401 and "refused" in err["reason"]
    status, err, _ = await call("GET", f"{a}/tenants", token=keys.token("admin", expires_in_s=-10))
    assert status == 401 and "expired" in err["reason"]
    status, err, _ = await call("GET", f"{a}/tenants", token=app)
    assert status == 403 and "superuser" in err["reason"]
    assert (await call("PUT", f"{a}/tenants/sec", {"allowedClusters": ["standalone"]}, token=admin))[0] == 204
    assert (await call("PUT", f"{a}/namespaces/sec/ns", token=admin))[0] == 204
    topic = "persistent/sec/ns/t1"
    status, err, _ = await call("GET", f"{web}/lookup/v2/topic/{topic}", token=app)
    assert status == 403 and "app" in err["reason"]
    status, err, _ = await call("PUT", f"{a}/{topic}", token=app)                  # tenant-admin verb
    assert status == 403
    assert (await call("POST", f"{a}/namespaces/sec/ns/permissions/app", ["consume"], token=admin))[0] == 204
    status, look, _ = await call("GET", f"{web}/lookup/v2/topic/{topic}", token=app)
    assert status == 200 and look["brokerUrl"] == broker.service_url
    assert (await call("PUT", f"{a}/{topic}", token=admin))[0] == 204
    assert (await call("GET", f"{a}/{topic}/stats", token=app))[0] == 200        # lookup permission
    assert (await call("GET", f"{a}/{topic}/lastMessageId", token=app))[0] == 200
    status, _, _ = await call("POST", f"{a}/{topic}/subscription/s/skip_all", token=keys.token("other"))
    assert status == 403
    # /metrics answers as before (no authentication on it here)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{web}/metrics") as r:
            assert r.status == 200
