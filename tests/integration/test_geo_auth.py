"""A geo pair with authentication and authorization on (issue 17, sections 2, 3
and the last bullet of section 4): each cluster has its own secret key; each
registers the other with the credentials its replicators use there
(``clusters create ... authentication_parameters``, a token signed by the
remote's key for a role that is *not* a superuser there, listed in its
``replicator_roles`` and granted ``produce`` on the namespace). Messages produced
in both clusters are replicated exactly once each way, as without security;
without the grant, replication is refused."""
from __future__ import annotations

import asyncio
import collections
import time

import pytest

from client import AdminClient, AsyncClient, AuthenticationToken
from client.consumer_config import InitialPosition
from tests.procs import ProcessTracker, StandaloneProcess
from tests.security_support import Keys, toml_list

pytestmark = pytest.mark.timeout(300)

NS = "geo/secure"


def _broker_config(keys: Keys, other: str) -> str:
    # the other cluster's replicators present role repl-from-<other> here: a role that may
    # replicate (replicator_roles, issue 32), not a superuser
    return ("authentication_enabled = true\nauthorization_enabled = true\n"
            f'token_secret_key = "{keys.url}"\nsuperuser_roles = {toml_list(["admin"])}\n'
            f'replicator_roles = {toml_list([f"repl-from-{other}"])}\n'
            "authentication_refresh_check_seconds = 5\nreplication_policy_check_duration_seconds = 5\n")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("geo-auth")
    tracker = ProcessTracker()
    clusters = {}
    try:
        for name in ("a", "b"):
            (base / name).mkdir()
            keys = Keys(base / name)
            conf = base / f"{name}-broker.toml"
            conf.write_text(_broker_config(keys, "b" if name == "a" else "a"))
            proc = StandaloneProcess(base / name / "data", ["--cluster-name", name, "--no-journal-sync",
                                                             "--broker-config", str(conf)], tracker).start()
            clusters[name] = (proc, keys)
        yield clusters
    finally:
        for proc, _ in clusters.values():
            proc.terminate()
        tracker.kill_all()


def _admin(proc, keys: Keys) -> AdminClient:
    return AdminClient(proc.service_url, operation_timeout_seconds=20,
                       authentication=AuthenticationToken(keys.token("admin")))


async def _read(proc, keys: Keys, topic: str, sub: str, expect: int, quiet_s: float = 3.0,
                max_wait_s: float = 90.0) -> list[bytes]:
    """Every message of ``topic`` as role ``app`` until ``expect`` arrived and none more for
    ``quiet_s``, or ``max_wait_s`` passed."""
    async with AsyncClient(proc.service_url, operation_timeout_seconds=20,
                           authentication=AuthenticationToken(keys.token("app"))) as client:
        consumer = await client.subscribe(topic, sub, initial_position=InitialPosition.Earliest)
        got = []
        deadline = time.monotonic() + max_wait_s
        while time.monotonic() < deadline:
            try:
                msg = await consumer.receive(timeout_millis=int(quiet_s * 1000) if len(got) >= expect else 5000)
            except Exception:  # noqa: BLE001 - Timeout: nothing more for now
                if len(got) >= expect:
                    break
                continue
            got.append(msg.data())
            consumer.acknowledge(msg)
        return got


async def test_geo_pair_with_authentication_replicates_exactly_once(pair):
    (pa, ka), (pb, kb) = pair["a"], pair["b"]
    # each cluster: the other registered with the token of role "repl-from-<me>" signed by the OTHER's key
    for (me, proc, keys), (other, oproc, okeys) in ((("a", pa, ka), ("b", pb, kb)), (("b", pb, kb), ("a", pa, ka))):
        async with _admin(proc, keys) as admin:
            await admin.create_cluster(other, oproc.service_url,
                                       authentication_parameters=f"token:{okeys.token(f'repl-from-{me}')}")
            await admin.create_tenant("geo", ["a", "b"], admin_roles=["geo-admin"])
            await admin.create_namespace(NS)
            await admin.grant_namespace_permission(NS, "app", ["produce", "consume"])
            # the remote's replicators: produce only (not superusers here)
            await admin.grant_namespace_permission(NS, f"repl-from-{other}", ["produce"])
            await admin.set_namespace_clusters(NS, ["a", "b"])
            data = await admin.get_cluster(other)
            assert data["authentication_parameters"].startswith("token:")
    topic = f"persistent://{NS}/flights"
    n = 150
    for proc, keys, origin in ((pa, ka, "a"), (pb, kb, "b")):
        async with AsyncClient(proc.service_url, operation_timeout_seconds=20,
                               authentication=AuthenticationToken(keys.token("app"))) as client:
            producer = await client.create_producer(topic)
            await asyncio.gather(*(producer.send(f"{origin}-{i}".encode()) for i in range(n)))
    expected = sorted(f"{o}-{i}".encode() for o in "ab" for i in range(n))
    for proc, keys in ((pa, ka), (pb, kb)):
        got = await _read(proc, keys, topic, "check", 2 * n)
        counts = collections.Counter(got)
        assert sorted(counts) == expected, f"{len(counts)} distinct of {2 * n}"
        assert max(counts.values()) == 1, "a message arrived twice"


async def test_replication_without_produce_permission_is_refused(pair):
    """The replicator's role lost its grant in b: nothing more reaches b (the replicator is
    refused with AuthorizationError and retries); granting it again resumes replication."""
    (pa, ka), (pb, kb) = pair["a"], pair["b"]
    topic = f"persistent://{NS}/refused"
    async with _admin(pb, kb) as admin:
        await admin.revoke_namespace_permission(NS, "repl-from-a")
    async with AsyncClient(pa.service_url, operation_timeout_seconds=20,
                           authentication=AuthenticationToken(ka.token("app"))) as client:
        producer = await client.create_producer(topic)
        for i in range(20):
            await producer.send(f"r-{i}".encode())
    got = await _read(pb, kb, topic, "check", 1, max_wait_s=10.0)   # nothing may arrive in 10 s
    assert got == []
    # a's replicator was refused by b as its own role, saying what it lacks
    assert "AuthorizationError: role 'repl-from-a' is not authorized" in pa.stderr_log.read_text(errors="replace")
    async with _admin(pb, kb) as admin:
        await admin.grant_namespace_permission(NS, "repl-from-a", ["produce"])
    got = await _read(pb, kb, topic, "check", 20)
    assert sorted(got) == sorted(f"r-{i}".encode() for i in range(20))
