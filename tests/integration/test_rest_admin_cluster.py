"""The REST admin API on a broker cluster (issue 37): two real brokers on a real etcd
and bookies. A topic verb sent to a broker that does not own the topic is answered
307 with the owner's web service URL (Pulsar's ``validateTopicOwnership``), the
owner answers it; lookup v2 names the owner's broker and HTTP URLs; brokers,
leaderBroker, bundles and unload answer from any broker.
"""
from __future__ import annotations

import urllib.parse

import aiohttp
import pytest

from client import AsyncClient
from tests.cluster import BrokerCluster
from tests.procs import ProcessTracker
from tests.integration.test_rest_admin import call

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    tracker = ProcessTracker()
    try:
        yield BrokerCluster(tmp_path_factory.mktemp("rest-cluster"), tracker, brokers=2, bookies=2).start()
    finally:
        tracker.kill_all()


def web(b) -> str:
    return f"http://127.0.0.1:{b.http_port}"


async def test_topic_verbs_redirect_307_to_the_owner(cluster2):
    c = cluster2
    topic = "persistent://public/default/rest-owned"
    async with AsyncClient(c.service_url) as client:
        producer = await client.create_producer(topic)
        for i in range(5):
            await producer.send(f"m{i}".encode())
        await producer.close()
    status, look, _ = await call("GET", f"{web(c.brokers[0])}/lookup/v2/topic/persistent/public/default/rest-owned")
    assert status == 200
    owner = c.broker_by_url(look["brokerUrl"])
    other = next(b for b in c.brokers if b is not owner)
    assert look["httpUrl"] == web(owner) and look["nativeUrl"] == owner.service_url

    path = "/admin/v2/persistent/public/default/rest-owned/stats"
    status, _, headers = await call("GET", f"{web(other)}{path}?x=1", redirects=False)
    assert status == 307
    location = urllib.parse.urlsplit(headers["Location"])
    assert (location.port, location.path) == (owner.http_port, path)
    assert urllib.parse.parse_qs(location.query) == {"x": ["1"], "authoritative": ["true"]}
    status, stats, _ = await call("GET", headers["Location"], redirects=False)   # the owner answers, no loop
    assert status == 200 and stats["msgInCounter"] == 5 and stats["ownerBroker"] == owner.service_url
    # a client following redirects (as pulsar-admin does) just gets the answer
    for verb in ("stats", "lastMessageId", "internalStats"):
        status, value, _ = await call("GET", f"{web(other)}/admin/v2/persistent/public/default/rest-owned/{verb}")
        assert status == 200, (verb, value)
    # the owner answers itself, no redirect
    assert (await call("GET", f"{web(owner)}{path}", redirects=False))[0] == 200
    # authoritative=true on a broker that is not the owner: answered through the owner, not redirected again
    status, stats, _ = await call("GET", f"{web(other)}{path}?authoritative=true", redirects=False)
    assert status == 200 and stats["ownerBroker"] == owner.service_url
    # the redirect keeps the method: a subscription created through the other broker exists on the owner
    status, _, headers = await call("PUT", f"{web(other)}/admin/v2/persistent/public/default/rest-owned/"
                                           f"subscription/via-redirect", redirects=False)
    assert status == 307
    assert (await call("PUT", headers["Location"]))[0] == 204
    assert "via-redirect" in (await call("GET", f"{web(owner)}/admin/v2/persistent/public/default/rest-owned/"
                                                f"subscriptions"))[1]


async def test_brokers_leader_bundles_unload_from_any_broker(cluster2):
    c = cluster2
    ids = sorted(f"127.0.0.1:{b.http_port}" for b in c.brokers)
    for b in c.brokers:
        status, listed, _ = await call("GET", f"{web(b)}/admin/v2/brokers")
        assert (status, sorted(listed)) == (200, ids)
        assert sorted((await call("GET", f"{web(b)}/admin/v2/brokers/standalone"))[1]) == ids
        status, leader, _ = await call("GET", f"{web(b)}/admin/v2/brokers/leaderBroker")
        assert status == 200 and leader["brokerId"] in ids and leader["serviceUrl"] == f"http://{leader['brokerId']}"
    status, err, _ = await call("GET", f"{web(c.brokers[0])}/admin/v2/brokers/nowhere")
    assert status == 404 and "nowhere" in err["reason"]
    # a topic makes its bundle owned; bundles lists it with its owner, unload releases it
    await call("GET", f"{web(c.brokers[0])}/lookup/v2/topic/persistent/public/default/rest-bundle")
    status, bundles, _ = await call("GET", f"{web(c.brokers[1])}/admin/v2/namespaces/public/default/bundles")
    assert status == 200 and bundles["numBundles"] == len(bundles["boundaries"]) - 1
    owned = {r: o for r, o in bundles["owners"].items() if o}
    assert owned and set(owned.values()) <= {b.service_url for b in c.brokers}
    some_range = next(iter(owned))
    assert (await call("PUT", f"{web(c.brokers[0])}/admin/v2/namespaces/public/default/{some_range}/unload"))[0] == 204
    status, err, _ = await call("PUT", f"{web(c.brokers[0])}/admin/v2/namespaces/public/default/0x1_0x2/unload")
    assert status == 400 and err["reason"]
    async with aiohttp.ClientSession() as s:      # /metrics on every broker
        for b in c.brokers:
            async with s.get(f"{web(b)}/metrics") as r:
                assert r.status == 200 and "pulsar_" in await r.text()
