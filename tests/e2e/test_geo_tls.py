"""``minipulsar geo up --tls`` end to end, on a small two-cluster topology
(configuration-store etcd; per cluster an etcd, two bookies, one broker; free
ports): every link over TLS, the bookies with mutual TLS. Messages produced in
one cluster arrive exactly once in the other; a plaintext client is refused
with a clear error; a client without a certificate of the demo CA cannot reach
a bookie; ``geo status`` sees everything healthy; ``geo down --purge``."""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from client import AsyncClient, ConsumerType, InitialPosition
from client.errors import ConnectError
from deploy.topology import load_topology
from proto import bookie_pb2, bookie_pb2_grpc
from proto.channels import ChannelSecurity, open_channel
from tests.e2e.geo_helpers import geo, kill_leftovers, write_topology

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# default ports of deploy/geo.toml (write_topology moves each to a free one)
SMALL = """
host = "127.0.0.1"
journal_sync = false
ensemble_size = 2
write_quorum = 2
ack_quorum = 2

[configuration_store]
etcd_port = 2390
etcd_peer_port = 2391

[[clusters]]
name = "a"
brokers = 1
broker_ports = [6600]
http_ports = [8080]
bookies = 2
bookie_ports = [3181, 3182]
etcd_port = 2392
etcd_peer_port = 2393

[[clusters]]
name = "b"
brokers = 1
broker_ports = [6601]
http_ports = [8081]
bookies = 2
bookie_ports = [3184, 3185]
etcd_port = 2394
etcd_peer_port = 2395

[[tenants]]
name = "geo"
allowed_clusters = ["a", "b"]

[[namespaces]]
name = "geo/tls"
clusters = ["a", "b"]

[[topics]]
name = "persistent://geo/tls/x"
partitions = 2
"""


@pytest.fixture(scope="module")
def stack():
    tmp = Path(tempfile.mkdtemp(prefix="minipulsar-geo-tls-"))
    topology = tmp / "geo.toml"
    write_topology(topology, SMALL)
    data = tmp / "data"
    try:
        yield topology, data
    finally:
        if data.exists():
            geo("down", "--data-dir", str(data), "--timeout", "5", timeout=180)
            kill_leftovers(data)
        shutil.rmtree(tmp, ignore_errors=True)


async def test_geo_up_tls_replicates_exactly_once_and_refuses_plaintext(stack):
    topology, data = stack
    up = geo("up", "--tls", "--topology", str(topology), "--data-dir", str(data), timeout=300)
    assert up.returncode == 0, f"{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
    assert "minipulsar+ssl://" in up.stdout and "TLS: every link" in up.stdout
    topo = load_topology(topology)
    ca = str(data / "tls" / "ca.cert.pem")
    url_a = topo.service_url("a").replace("minipulsar://", "minipulsar+ssl://")
    url_b = topo.service_url("b").replace("minipulsar://", "minipulsar+ssl://")
    topic, n = "persistent://geo/tls/x", 100
    async with AsyncClient(url_a, tls_trust_certs_file_path=ca) as a, \
            AsyncClient(url_b, tls_trust_certs_file_path=ca) as b:
        consumer = await b.subscribe(topic, "tls-sub", consumer_type=ConsumerType.Exclusive,
                                     initial_position=InitialPosition.Earliest)
        producer = await a.create_producer(topic)
        for i in range(n):
            producer.send_async(f"f-{i}".encode(), None)
        await producer.flush()
        await producer.close()
        got, deadline = [], time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                msg = await consumer.receive(timeout_millis=3_000 if len(got) >= n else 2_000)
            except Exception:  # noqa: BLE001 - receive timeout
                if len(got) >= n:
                    break        # a quiet period after all of them: no duplicate came
                continue
            got.append(msg.data())
            consumer.acknowledge(msg)
        await consumer.close()
    assert sorted(got) == sorted(f"f-{i}".encode() for i in range(n)), f"{len(got)} received"
    # a plaintext client is told the port speaks TLS
    async with AsyncClient(topo.service_url("a"), operation_timeout_seconds=20) as plain:
        with pytest.raises(ConnectError, match="speaks TLS"):
            await plain.create_producer(topic)
    # the bookies take only clients with a certificate of the demo CA (the brokers)
    channel = open_channel(topo.bookie_addresses("a")[0], [],
                           ChannelSecurity(tls=True, tls_trust_certs_file_path=ca))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await bookie_pb2_grpc.BookieStub(channel).GetBookieInfo(bookie_pb2.BookieInfoRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()
    status = geo("status", "--data-dir", str(data), timeout=120)
    assert status.returncode == 0, f"{status.stdout[-3000:]}\n{status.stderr[-3000:]}"
    assert "all processes healthy" in status.stdout
    down = geo("down", "--data-dir", str(data), "--purge", timeout=180)
    assert down.returncode == 0 and not data.exists()
