"""Authorization end to end (issue 17, section 3 and the first bullet of
section 4): a real bookie and broker with authentication and authorization on.
Superusers, tenant admins, namespace / topic / subscription permissions, each
refusal an ``AuthorizationError`` naming the role and what it lacks, no data
returned; a consumer (and producer) whose permission is revoked is disconnected."""
from __future__ import annotations

import asyncio
import re
import time

import pytest

from client import AdminClient, AsyncClient, AuthenticationToken
from client.consumer_config import InitialPosition
from client.errors import AuthorizationError
from tests.procs import ProcessTracker
from tests.security_support import Keys, create_namespace, start_secure_broker

pytestmark = pytest.mark.timeout(240)

NS = "acme/orders"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """(keys, broker): tenant ``acme`` administered by role ``acme-admin``, namespace acme/orders."""
    base = tmp_path_factory.mktemp("authz")
    tracker = ProcessTracker()
    keys = Keys(base)
    try:
        _, broker = start_secure_broker(base, tracker, keys, authorization=True)
        create_namespace(broker.service_url, keys.token("admin"), NS, admin_roles=["acme-admin"])
        yield keys, broker
    finally:
        tracker.kill_all()


def client_as(broker, keys: Keys, role: str) -> AsyncClient:
    return AsyncClient(broker.service_url, operation_timeout_seconds=10,
                       authentication=AuthenticationToken(keys.token(role)))


def admin_as(broker, keys: Keys, role: str) -> AdminClient:
    return AdminClient(broker.service_url, operation_timeout_seconds=10,
                       authentication=AuthenticationToken(keys.token(role)))


async def test_a_role_without_permission_is_refused_everything(secure):
    keys, broker = secure
    topic = f"persistent://{NS}/no-perm"
    async with client_as(broker, keys, "acme-admin") as owner:       # tenant admin: may produce
        producer = await owner.create_producer(topic)
        await producer.send(b"confidential")
    async with client_as(broker, keys, "mallory") as c:
        with pytest.raises(AuthorizationError, match="role 'mallory' is not authorized to produce"):
            await c.create_producer(topic)
        with pytest.raises(AuthorizationError, match="role 'mallory' is not authorized to (produce or )?consume"):
            await c.subscribe(topic, "steal", initial_position=InitialPosition.Earliest)
        with pytest.raises(AuthorizationError, match="produce or consume"):
            await c.get_partitioned_topic_metadata(topic)
        with pytest.raises(AuthorizationError, match="no permission on namespace acme/orders"):
            await c.subscribe(re.compile(f"persistent://{NS}/.*"), "pattern")       # GetTopicsOfNamespace
    async with admin_as(broker, keys, "mallory") as admin:
        with pytest.raises(AuthorizationError, match="mallory"):
            await admin.get_stats(topic)                                # stats read
        with pytest.raises(AuthorizationError, match="mallory"):
            await admin.list_topics(NS)
        with pytest.raises(AuthorizationError, match="tenant acme"):
            await admin.delete_topic(topic, force=True)
        with pytest.raises(AuthorizationError, match="tenant acme"):
            await admin.grant_namespace_permission(NS, "mallory", ["produce", "consume"])
        with pytest.raises(AuthorizationError, match="superuser"):
            await admin.create_tenant("mallory-corp")
        assert (await admin.health())["ok"] is True                      # any authenticated role
    # still there, still served to those allowed
    async with admin_as(broker, keys, "acme-admin") as admin:
        assert (await admin.get_stats(topic))["msgInCounter"] == 1
        with pytest.raises(AuthorizationError, match="superuser"):       # a tenant admin is no superuser
            await admin.create_cluster("elsewhere", "minipulsar://127.0.0.1:1")


async def test_namespace_topic_and_subscription_permissions(secure):
    keys, broker = secure
    topic = f"persistent://{NS}/perms"
    other = f"persistent://{NS}/perms-other"
    async with admin_as(broker, keys, "acme-admin") as admin:
        assert await admin.grant_namespace_permission(NS, "writer", ["produce", "functions"]) \
            == {"writer": ["functions", "produce"]}
        await admin.grant_namespace_permission(NS, "reader", ["consume"])
        await admin.grant_topic_permission(topic, "guest", ["produce"])
        await admin.grant_subscription_permission(NS, "audit", ["auditor"])
        await admin.grant_namespace_permission(NS, "auditor", ["consume"])
        perms = await admin.get_namespace_permissions(NS)
        assert perms["writer"] == ["functions", "produce"] and perms["reader"] == ["consume"]
        assert (await admin.get_topic_permissions(topic))["guest"] == ["produce"]
    async with client_as(broker, keys, "writer") as w:
        producer = await w.create_producer(topic)
        await producer.send(b"one")
        with pytest.raises(AuthorizationError, match="consume"):
            await w.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
    async with client_as(broker, keys, "guest") as g:
        await (await g.create_producer(topic)).send(b"two")              # topic-level grant
        with pytest.raises(AuthorizationError, match="'guest' is not authorized to (produce or consume|produce) on persistent://acme/orders/perms-other"):
            await g.create_producer(other)
    async with client_as(broker, keys, "reader") as r:
        with pytest.raises(AuthorizationError, match="produce"):
            await r.create_producer(topic)
        with pytest.raises(AuthorizationError, match="subscription 'audit'"):
            await r.subscribe(topic, "audit", initial_position=InitialPosition.Earliest)
        consumer = await r.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
        got = {(await consumer.receive(timeout_millis=20000)).data() for _ in range(2)}
        assert got == {b"one", b"two"}
    async with client_as(broker, keys, "auditor") as a:
        consumer = await a.subscribe(topic, "audit", initial_position=InitialPosition.Earliest)
        assert (await consumer.receive(timeout_millis=20000)).data() == b"one"
    async with admin_as(broker, keys, "acme-admin") as admin:
        await admin.revoke_topic_permission(topic, "guest")
        assert "guest" not in await admin.get_topic_permissions(topic)
    async with client_as(broker, keys, "guest") as g:
        with pytest.raises(AuthorizationError, match="guest"):
            await g.create_producer(topic)


async def test_revoked_consumer_and_producer_are_disconnected(secure):
    keys, broker = secure
    topic = f"persistent://{NS}/revoke"
    async with admin_as(broker, keys, "acme-admin") as admin:
        await admin.grant_namespace_permission(NS, "temp", ["produce", "consume"])
    async with client_as(broker, keys, "temp") as c:
        consumer = await c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
        producer = await c.create_producer(topic)
        await producer.send(b"before")
        assert (await consumer.receive(timeout_millis=20000)).data() == b"before"
        async with admin_as(broker, keys, "acme-admin") as admin:
            await admin.revoke_namespace_permission(NS, "temp")
        with pytest.raises(AuthorizationError, match="temp"):
            async with asyncio.timeout(30):
                await consumer.receive(timeout_millis=30000)
        deadline = time.monotonic() + 30
        with pytest.raises(AuthorizationError):
            while time.monotonic() < deadline:
                await producer.send(b"after")
                await asyncio.sleep(0.2)
    async with client_as(broker, keys, "acme-admin") as owner:          # nothing "after" was stored
        reader = await owner.subscribe(topic, "check", initial_position=InitialPosition.Earliest)
        assert (await reader.receive(timeout_millis=20000)).data() == b"before"
        with pytest.raises(Exception):
            await reader.receive(timeout_millis=1500)


async def test_admin_cli_grants_and_lists_permissions(secure):
    import json
    import subprocess
    import sys
    keys, broker = secure
    base = [sys.executable, "-m", "client.admin_cli", "--service-url", broker.service_url,
            "--auth-params", f"token:{keys.token('acme-admin')}"]
    out = subprocess.run(base + ["namespaces", "grant-permission", NS, "--role", "cli-role",
                                 "--actions", "produce,consume"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    out = subprocess.run(base + ["--json", "namespaces", "permissions", NS], capture_output=True, text=True,
                         timeout=60)
    assert json.loads(out.stdout)["cli-role"] == ["consume", "produce"]
    out = subprocess.run(base + ["namespaces", "grant-permission", NS, "--role", "x", "--actions", "delete"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "unknown action" in out.stderr


def test_metrics_endpoint_is_not_authenticated_by_default(secure):
    """``authenticate_metrics_endpoint`` is off by default (as Pulsar's): /metrics answers
    without a token (tests/integration/test_hostile_tenants_broker.py covers it on)."""
    import urllib.request
    _, broker = secure
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/metrics", timeout=20) as resp:
        assert resp.status == 200 and b"# TYPE" in resp.read()
