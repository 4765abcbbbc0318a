"""Authentication and authorization in a broker cluster (etcd, 2 brokers): the
brokers talk to each other with their own superuser token
(``broker_client_authentication_parameters``): a client of either broker
produces, consumes and reads stats of topics owned by the other, within its
permissions; a revoke handled by one broker disconnects the consumers on the
other at its next check."""
from __future__ import annotations

import asyncio

import pytest

from client import AdminClient, AsyncClient, AuthenticationToken
from client.consumer_config import InitialPosition
from client.errors import AuthorizationError
from tests.cluster import BrokerCluster
from tests.procs import ProcessTracker
from tests.security_support import Keys

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("authz-cluster")
    tracker = ProcessTracker()
    keys = Keys(base)
    config = {"authentication_enabled": True, "authorization_enabled": True, "token_secret_key": keys.url,
              "superuser_roles": ["admin", "broker"], "authentication_refresh_check_seconds": 1,
              "broker_client_authentication_parameters": f"token:{keys.token('broker')}"}
    try:
        yield BrokerCluster(base, tracker, brokers=2, bookies=2, config=config).start(), keys
    finally:
        tracker.kill_all()


async def test_cluster_serves_and_forwards_within_permissions(cluster):
    c, keys = cluster
    ns = "acme/data"
    async with AdminClient(c.service_url, operation_timeout_seconds=20,
                           authentication=AuthenticationToken(keys.token("admin"))) as admin:
        await admin.create_tenant("acme", ["standalone"], admin_roles=["acme-admin"])
        await admin.create_namespace(ns)
        await admin.grant_namespace_permission(ns, "app", ["produce", "consume"])
        topics = [f"persistent://{ns}/t-{i}" for i in range(8)]
        owners = {t: (await admin.lookup_topic(t))["broker_url"] for t in topics}
    assert len(set(owners.values())) == 2, "the topics should spread over both brokers"
    first = c.live_brokers[0].service_url                # every call through one broker
    async with AsyncClient(first, operation_timeout_seconds=20,
                           authentication=AuthenticationToken(keys.token("app"))) as client:
        consumers = [await client.subscribe(t, "s", initial_position=InitialPosition.Earliest) for t in topics]
        for t in topics:
            await (await client.create_producer(t)).send(t.encode())
        for t, consumer in zip(topics, consumers):
            assert (await consumer.receive(timeout_millis=20000)).data() == t.encode()
        async with AdminClient(first, operation_timeout_seconds=20,
                               authentication=AuthenticationToken(keys.token("app"))) as app_admin:
            for t in topics:                             # stats forwarded to the owner, as the broker
                assert (await app_admin.get_stats(t))["msgInCounter"] == 1
            with pytest.raises(AuthorizationError):
                await app_admin.unload_topic(topics[0])  # a tenant admin's verb
        async with AdminClient(c.live_brokers[1].service_url, operation_timeout_seconds=20,
                               authentication=AuthenticationToken(keys.token("acme-admin"))) as owner:
            await owner.revoke_namespace_permission(ns, "app")
        for consumer in consumers:                       # on both brokers, within their next check
            with pytest.raises(AuthorizationError, match="app"):
                async with asyncio.timeout(30):
                    await consumer.receive(timeout_millis=30000)
