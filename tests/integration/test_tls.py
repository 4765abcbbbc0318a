"""TLS on every link against REAL processes (issue 17, section 1 and 4):

- a TLS standalone (``tls_enabled``): produce/consume and admin over
  ``minipulsar+ssl://`` with the CA of ``minipulsar tls create-ca``, HTTPS
  metrics, the CLI with ``--tls-trust-certs-file-path``;
- mismatches fail at once with a ``ConnectError`` saying what to check: a
  plaintext client at the TLS port, a TLS client at a plain port, a CA that did
  not sign the broker's certificate; the broker keeps serving good clients;
- a bookie with mutual TLS (``tls_require_trusted_client_cert_on_connect``):
  a broker with its client certificate writes and reads through it, a client
  without a certificate (or with one from another CA) is refused;
- a geo pair whose brokers and replicators talk TLS only replicates every
  message exactly once.
"""
from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid

import grpc
import pytest

from client import AsyncClient, ConsumerType, InitialPosition
from client.admin import AdminClient
from client.errors import ConnectError
from deploy.tls_certs import create_ca, create_cert
from proto import bookie_pb2 as bpb
from proto import bookie_pb2_grpc
from proto.channels import ChannelSecurity, open_channel
from proto.tls_errors import describe_tls_failure
from tests.procs import REPO_ROOT, BookieProcess, BrokerProcess, StandaloneProcess

pytestmark = pytest.mark.timeout(240)


def unique(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA with a server+client certificate for 127.0.0.1/localhost (``broker``),
    and a second, unrelated CA with its own certificate (``other``)."""
    base = tmp_path_factory.mktemp("certs")
    ca = create_ca(str(base / "ca"))
    broker = create_cert(str(base / "ca"), "broker", ["127.0.0.1", "localhost"], server=True, client=True)
    other_ca = create_ca(str(base / "other"), "another CA")
    other = create_cert(str(base / "other"), "intruder", server=True, client=True)
    return {"ca": ca.cert, "cert": broker.cert, "key": broker.key, "other_ca": other_ca.cert,
            "other_cert": other.cert, "other_key": other.key, "dir": base}


def tls_broker_toml(certs, extra: str = "") -> str:
    return (f'tls_enabled = true\ntls_certificate_file_path = "{certs["cert"]}"\n'
            f'tls_key_file_path = "{certs["key"]}"\n{extra}')


@pytest.fixture(scope="module")
def tls_standalone(tmp_path_factory, certs):
    """A standalone whose broker serves TLS only (gRPC and HTTP)."""
    from tests.procs import ProcessTracker

    base = tmp_path_factory.mktemp("tls-standalone")
    cfg = base / "broker.toml"
    cfg.write_text(tls_broker_toml(certs))
    tracker = ProcessTracker()
    proc = StandaloneProcess(base / "data", ["--no-journal-sync", "--broker-config", str(cfg)], tracker).start()
    try:
        yield proc
    finally:
        proc.terminate()
        tracker.kill_all()


def tls_url(proc) -> str:
    return f"minipulsar+ssl://127.0.0.1:{proc.port}"


async def produce_consume(client: AsyncClient, topic: str, n: int) -> list[bytes]:
    producer = await client.create_producer(topic, batching_enabled=False)
    consumer = await client.subscribe(topic, "s", consumer_type=ConsumerType.Exclusive,
                                      initial_position=InitialPosition.Earliest)
    try:
        for i in range(n):
            await producer.send(f"m{i}".encode())
        got = []
        for _ in range(n):
            msg = await consumer.receive(timeout_millis=20_000)
            got.append(msg.data())
            consumer.acknowledge(msg)
        return got
    finally:
        await producer.close()
        await consumer.close()


async def test_produce_consume_admin_and_metrics_over_tls(tls_standalone, certs):
    topic = unique("tls")
    async with AsyncClient(tls_url(tls_standalone), tls_trust_certs_file_path=certs["ca"]) as client:
        assert await produce_consume(client, topic, 20) == [f"m{i}".encode() for i in range(20)]
    async with AdminClient(tls_url(tls_standalone), tls_trust_certs_file_path=certs["ca"]) as admin:
        stats = await admin.call("topics.stats", topic=topic)
        assert stats["msgInCounter"] == 20
        cluster = await admin.get_cluster("standalone")
        assert cluster["service_url"] == tls_url(tls_standalone)
        assert cluster["service_url_tls"] == tls_url(tls_standalone)
    # the HTTP metrics port serves HTTPS only
    http_port = int(tls_standalone.stdout_log.read_text().split("http_port=")[-1].split()[0])
    ctx = ssl.create_default_context(cafile=certs["ca"])
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"https://127.0.0.1:{http_port}/metrics",
                                                                  context=ctx, timeout=10).read())
    assert b"pulsar_" in body
    # so does the REST admin API (issue 37), with the topic's stats as the gRPC admin gives them
    stats_url = f"https://127.0.0.1:{http_port}/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[1]}/stats"
    rest = await asyncio.to_thread(lambda: urllib.request.urlopen(stats_url, context=ctx, timeout=10).read())
    assert json.loads(rest)["msgInCounter"] == 20
    with pytest.raises((OSError, ValueError)):  # plain HTTP is refused (connection reset / bad status line)
        await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics",
                                                               timeout=10).read())


async def test_plaintext_client_at_tls_port_fails_clearly(tls_standalone):
    started = time.monotonic()
    async with AsyncClient(f"minipulsar://127.0.0.1:{tls_standalone.port}", operation_timeout_seconds=20) as client:
        with pytest.raises(ConnectError) as info:
            await client.create_producer(unique("plain-at-tls"))
    assert "speaks TLS" in info.value.message and "minipulsar+ssl://" in info.value.message
    assert time.monotonic() - started < 15, "a TLS mismatch is not retried until the operation timeout"


async def test_tls_client_at_plain_port_fails_clearly(standalone, certs):
    started = time.monotonic()
    async with AsyncClient(f"minipulsar+ssl://127.0.0.1:{standalone.port}", operation_timeout_seconds=20,
                           tls_trust_certs_file_path=certs["ca"]) as client:
        with pytest.raises(ConnectError) as info:
            await client.create_producer(unique("tls-at-plain"))
    assert "does not speak TLS" in info.value.message
    assert time.monotonic() - started < 15


async def test_wrong_ca_fails_and_the_broker_serves_others(tls_standalone, certs):
    async with AsyncClient(tls_url(tls_standalone), operation_timeout_seconds=20,
                           tls_trust_certs_file_path=certs["other_ca"]) as client:
        with pytest.raises(ConnectError) as info:
            await client.create_producer(unique("wrong-ca"))
    assert "not trusted" in info.value.message and "tls_trust_certs_file_path" in info.value.message
    async with AdminClient(tls_url(tls_standalone), tls_trust_certs_file_path=certs["other_ca"]) as admin:
        with pytest.raises(ConnectError) as info:
            await admin.list_clusters()
    assert "not trusted" in info.value.message
    async with AsyncClient(tls_url(tls_standalone), tls_trust_certs_file_path=certs["ca"]) as client:
        assert await produce_consume(client, unique("after-wrong-ca"), 3) == [b"m0", b"m1", b"m2"]


def test_cli_over_tls(tls_standalone, certs):
    topic = unique("tls-cli")
    env_cmd = [sys.executable, "-m", "client.cli", "--service-url", tls_url(tls_standalone)]
    ok = subprocess.run(env_cmd + ["--tls-trust-certs-file-path", certs["ca"], "produce", topic, "-m", "hi",
                                   "-n", "3", "--no-progress"],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(env_cmd + ["--tls-trust-certs-file-path", certs["other_ca"], "produce", topic, "-m", "x",
                                    "--no-progress"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0
    assert "not trusted" in bad.stderr and "Traceback" not in bad.stderr
    admin = subprocess.run([sys.executable, "-m", "client.admin_cli", "--service-url", tls_url(tls_standalone),
                            "--tls-trust-certs-file-path", certs["ca"], "topics", "stats", topic, "--json"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert admin.returncode == 0, admin.stderr


async def _bookie_call(address: str, security: ChannelSecurity):
    channel = open_channel(address, [], security)
    try:
        stub = bookie_pb2_grpc.BookieStub(channel)
        return await stub.GetBookieInfo(bpb.BookieInfoRequest(), timeout=10)
    finally:
        await channel.close()


async def test_mutual_tls_bookie(tmp_path, certs, process_tracker):
    mtls = ["--tls-enabled", "--tls-certificate-file-path", certs["cert"], "--tls-key-file-path", certs["key"],
            "--tls-trust-certs-file-path", certs["ca"], "--tls-require-trusted-client-cert-on-connect"]
    bookies = [BookieProcess(tmp_path / f"bookie-{i}", journal_sync=False, extra_args=mtls,
                             tracker=process_tracker).start() for i in range(2)]
    # a client without a certificate, or with one another CA signed, is refused in the handshake
    for security in (ChannelSecurity(tls=True, tls_trust_certs_file_path=certs["ca"]),
                     ChannelSecurity(tls=True, tls_trust_certs_file_path=certs["ca"],
                                     tls_certificate_file_path=certs["other_cert"],
                                     tls_key_file_path=certs["other_key"])):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _bookie_call(bookies[0].address, security)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "client certificates" in describe_tls_failure(info.value.details(), True, bookies[0].address)
    with pytest.raises(grpc.aio.AioRpcError) as info:  # and a plaintext client
        await _bookie_call(bookies[0].address, None)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # the broker presents its client certificate: produce and consume go through the bookies
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'bookkeeper_tls_enabled = true\nbookkeeper_tls_trust_certs_file_path = "{certs["ca"]}"\n'
                   f'bookkeeper_tls_client_authentication = true\n'
                   f'bookkeeper_tls_certificate_file_path = "{certs["cert"]}"\n'
                   f'bookkeeper_tls_key_file_path = "{certs["key"]}"\n'
                   f'managed_ledger_default_ensemble_size = 2\nmanaged_ledger_default_write_quorum = 2\n'
                   f'managed_ledger_default_ack_quorum = 2\n')
    broker = BrokerProcess(tmp_path / "broker", [b.address for b in bookies], cfg, tracker=process_tracker).start()
    async with AdminClient(broker.service_url) as admin:
        await admin.create_tenant("mtls")
        await admin.call("namespaces.create", namespace="mtls/ns")
    topic = f"persistent://mtls/ns/t-{uuid.uuid4().hex[:8]}"
    async with AsyncClient(broker.service_url) as client:
        assert await produce_consume(client, topic, 10) == [f"m{i}".encode() for i in range(10)]


async def test_geo_pair_over_tls_replicates_exactly_once(tmp_path, certs, process_tracker):
    """Two clusters whose brokers serve TLS only and whose replicators use TLS
    (``broker_client_tls_enabled``): every message of each side arrives once on the other."""
    extra = (f'broker_client_tls_enabled = true\nbroker_client_trust_certs_file_path = "{certs["ca"]}"\n'
             f'replication_policy_check_duration_seconds = 1\n')
    procs = {}
    for name in ("east", "west"):
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(tls_broker_toml(certs, extra))
        procs[name] = StandaloneProcess(tmp_path / name, ["--cluster-name", name, "--no-journal-sync",
                                                          "--broker-config", str(cfg)], process_tracker).start()
    for name, proc in procs.items():
        async with AdminClient(tls_url(proc), tls_trust_certs_file_path=certs["ca"]) as admin:
            for other, other_proc in procs.items():
                if other != name:
                    await admin.create_cluster(other, tls_url(other_proc), tls_url(other_proc))
            await admin.create_tenant("geo", ["east", "west"])
            await admin.call("namespaces.create", namespace="geo/tls")
            await admin.set_namespace_clusters("geo/tls", ["east", "west"])
    topic = f"persistent://geo/tls/t-{uuid.uuid4().hex[:8]}"
    n = 200
    clients = {name: AsyncClient(tls_url(proc), tls_trust_certs_file_path=certs["ca"]) for name, proc in procs.items()}
    try:
        consumers = {name: await c.subscribe(topic, "geo-sub", consumer_type=ConsumerType.Exclusive,
                                             initial_position=InitialPosition.Earliest)
                     for name, c in clients.items()}
        for name, c in clients.items():
            producer = await c.create_producer(topic, producer_name=f"p-{name}")
            for i in range(n):
                producer.send_async(f"{name}-{i}".encode(), None)
            await producer.flush()
            await producer.close()
        for name, consumer in consumers.items():
            got = []
            deadline = time.monotonic() + 90
            while len(got) < 2 * n and time.monotonic() < deadline:
                try:
                    msg = await consumer.receive(timeout_millis=2_000)
                except Exception:  # noqa: BLE001 - a receive timeout: poll again until the deadline
                    continue
                got.append(msg.data())
                consumer.acknowledge(msg)
            # a short grace period: nothing more (no duplicate) arrives
            extra_msgs = []
            try:
                while True:
                    extra_msgs.append((await consumer.receive(timeout_millis=3_000)).data())
            except Exception:  # noqa: BLE001 - the expected receive timeout
                pass
            everything = got + extra_msgs
            expected = {f"{side}-{i}".encode() for side in procs for i in range(n)}
            assert set(everything) == expected, f"{name}: missing {len(expected - set(everything))}"
            assert len(everything) == len(expected), f"{name}: {len(everything) - len(expected)} duplicates"
            await consumer.close()
    finally:
        for c in clients.values():
            await c.close()


async def test_broker_cluster_over_tls(tmp_path, certs, process_tracker):
    """Two brokers on etcd serving TLS only, talking TLS to each other
    (``broker_client_tls_enabled``): topics spread over both, lookups answer
    ``minipulsar+ssl://`` owners, admin calls are forwarded to the owner."""
    from tests.cluster import BrokerCluster

    config = {"tls_enabled": True, "tls_certificate_file_path": certs["cert"], "tls_key_file_path": certs["key"],
              "broker_client_tls_enabled": True, "broker_client_trust_certs_file_path": certs["ca"]}
    cluster = BrokerCluster(tmp_path, process_tracker, brokers=2, bookies=2, config=config).start()
    url = "minipulsar+ssl://" + ",".join(f"127.0.0.1:{b.port}" for b in cluster.brokers)
    tls_urls = {f"minipulsar+ssl://127.0.0.1:{b.port}" for b in cluster.brokers}
    topics = [f"persistent://public/default/spread-{i}" for i in range(12)]
    async with AsyncClient(url, operation_timeout_seconds=30, tls_trust_certs_file_path=certs["ca"]) as client:
        for topic in topics:
            producer = await client.create_producer(topic)
            await producer.send(topic.encode())
            await producer.close()
        for topic in topics:
            consumer = await client.subscribe(topic, "r", initial_position=InitialPosition.Earliest)
            msg = await consumer.receive(timeout_millis=20_000)
            assert msg.data() == topic.encode()
            await consumer.close()
    owners = {}
    for b in cluster.brokers:  # every broker answers lookups (and forwards admin calls) over TLS
        async with AdminClient(f"minipulsar+ssl://127.0.0.1:{b.port}", tls_trust_certs_file_path=certs["ca"]) as admin:
            for topic in topics:
                owner = (await admin.call("topics.lookup", topic=topic))["broker_url"]
                assert owners.setdefault(topic, owner) == owner
                assert (await admin.call("topics.stats", topic=topic))["msgInCounter"] == 1
    assert set(owners.values()) == tls_urls, owners


async def test_broker_requiring_client_certificates(tmp_path, certs, process_tracker):
    """``tls_require_trusted_client_cert_on_connect`` on the broker: the SDK with
    ``tls_certificate_file_path`` / ``tls_key_file_path`` gets through; without a
    certificate the client fails with a ConnectError naming client certificates."""
    cfg = tmp_path / "broker.toml"
    cfg.write_text(tls_broker_toml(certs, f'tls_trust_certs_file_path = "{certs["ca"]}"\n'
                                          f'tls_require_trusted_client_cert_on_connect = true\n'))
    proc = StandaloneProcess(tmp_path / "data", ["--no-journal-sync", "--broker-config", str(cfg)],
                             process_tracker).start()
    async with AsyncClient(tls_url(proc), tls_trust_certs_file_path=certs["ca"],
                           tls_certificate_file_path=certs["cert"], tls_key_file_path=certs["key"]) as client:
        assert await produce_consume(client, unique("mtls-client"), 3) == [b"m0", b"m1", b"m2"]
    async with AsyncClient(tls_url(proc), tls_trust_certs_file_path=certs["ca"],
                           operation_timeout_seconds=5) as client:
        with pytest.raises(ConnectError) as info:
            await client.create_producer(unique("no-client-cert"))
    assert "client certificates" in info.value.message


def test_sync_admin_client_over_tls(tls_standalone, certs):
    from client.admin import SyncAdminClient

    with SyncAdminClient(tls_url(tls_standalone), tls_trust_certs_file_path=certs["ca"]) as admin:
        assert "standalone" in admin.list_clusters()


def test_sync_client_over_tls(tls_standalone, certs):
    from client import Client

    client = Client(tls_url(tls_standalone), tls_trust_certs_file_path=certs["ca"])
    try:
        topic = unique("sync-tls")
        consumer = client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
        producer = client.create_producer(topic)
        producer.send(b"over-tls")
        assert consumer.receive(timeout_millis=20_000).data() == b"over-tls"
    finally:
        client.close()
