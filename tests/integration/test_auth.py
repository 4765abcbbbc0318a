"""Token authentication end to end (issue 17, section 2 and the first bullet of
section 4): a real bookie and broker with ``authentication_enabled``; every
kind of bad credentials is refused with ``AuthenticationError`` naming what is
wrong, no data is returned, and the broker keeps serving valid clients; the
bookie refuses calls without the broker's token; long-lived streams survive
token expiry by reconnecting with a fresh token, without losing a message."""
from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from broker.security.tokens import create_key_pair, create_secret_key, create_token
from client import AdminClient, AsyncClient, AuthenticationToken
from client.consumer_config import InitialPosition
from client.errors import AuthenticationError
from proto import bookie_pb2, bookie_pb2_grpc
from tests.procs import ProcessTracker
from tests.security_support import Keys, create_namespace, start_secure_broker

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """(keys, bookie, broker): authentication on, authorization off (any valid role may act)."""
    base = tmp_path_factory.mktemp("auth")
    tracker = ProcessTracker()
    keys = Keys(base)
    try:
        bookie, broker = start_secure_broker(base, tracker, keys, authorization=False)
        create_namespace(broker.service_url, keys.token("admin"), "public/default")
        yield keys, bookie, broker
    finally:
        tracker.kill_all()


def _bad_tokens(keys: Keys) -> dict[str, tuple[str, str]]:
    """name -> (token, words the refusal must contain)."""
    good = keys.token("alice")
    head, payload, sig = good.split(".")
    forged_payload = keys.token("admin").split(".")[1]
    private, _ = create_key_pair()
    return {
        "garbage": ("not-a-jwt", "not a JWT"),
        "expired": (keys.token("alice", expires_in_s=60, now=time.time() - 3600), "expired"),
        "tampered": (f"{head}.{forged_payload}.{sig}", "signature does not verify"),
        "other secret": (create_token(create_secret_key(), "alice", "HS256"), "signature does not verify"),
        "RS256 for an HS256 broker": (create_token(private, "alice", "RS256"), "RS256"),
    }


async def test_no_token_is_refused_naming_the_missing_credentials(secure):
    keys, _, broker = secure
    async with AsyncClient(broker.service_url, operation_timeout_seconds=10) as client:
        with pytest.raises(AuthenticationError, match="no credentials") as info:
            await client.create_producer("persistent://public/default/auth-none")
        assert "Bearer" in str(info.value)
        with pytest.raises(AuthenticationError, match="no credentials"):
            await client.subscribe("persistent://public/default/auth-none", "s")
    async with AdminClient(broker.service_url, operation_timeout_seconds=10) as admin:
        with pytest.raises(AuthenticationError, match="no credentials"):
            await admin.list_topics("public/default")


@pytest.mark.parametrize("kind", ["garbage", "expired", "tampered", "other secret", "RS256 for an HS256 broker"])
async def test_bad_token_is_refused_and_the_broker_keeps_serving(secure, kind):
    keys, _, broker = secure
    topic = f"persistent://public/default/auth-bad-{kind.replace(' ', '-')}"
    token, words = _bad_tokens(keys)[kind]
    good = AuthenticationToken(keys.token("alice"))
    async with AsyncClient(broker.service_url, operation_timeout_seconds=10, authentication=good) as client:
        producer = await client.create_producer(topic)
        await producer.send(b"secret payload")
        async with AsyncClient(broker.service_url, operation_timeout_seconds=10,
                               authentication=AuthenticationToken(token)) as bad:
            with pytest.raises(AuthenticationError, match=words):
                await bad.create_producer(topic)
            with pytest.raises(AuthenticationError, match=words):
                await bad.subscribe(topic, "thief", initial_position=InitialPosition.Earliest)
            with pytest.raises(AuthenticationError, match=words):
                await bad.get_partitioned_topic_metadata(topic)
        async with AdminClient(broker.service_url, operation_timeout_seconds=10,
                               authentication=AuthenticationToken(token)) as admin:
            with pytest.raises(AuthenticationError, match=words):
                await admin.get_stats(topic)       # no stats (no data) for a refused caller
        # the broker still serves the valid client on the same topic
        consumer = await client.subscribe(topic, "reader", initial_position=InitialPosition.Earliest)
        msg = await consumer.receive(timeout_millis=20000)
        assert msg.data() == b"secret payload"
        consumer.acknowledge(msg)


async def test_bookie_refuses_calls_without_the_brokers_token(secure):
    keys, bookie, broker = secure
    async with grpc.aio.insecure_channel(bookie.address) as channel:
        stub = bookie_pb2_grpc.BookieStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetBookieInfo(bookie_pb2.BookieInfoRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "AuthenticationError" in info.value.details() and "no credentials" in info.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetBookieInfo(bookie_pb2.BookieInfoRequest(), timeout=10,
                                     metadata=[("authorization", f"Bearer {keys.token('x', now=0, expires_in_s=1)}")])
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "expired" in info.value.details()
        answer = await stub.GetBookieInfo(bookie_pb2.BookieInfoRequest(), timeout=10,
                                          metadata=[("authorization", f"Bearer {keys.token('broker')}")])
        assert answer is not None
    # and the broker, holding its token, stores entries on that bookie
    async with AsyncClient(broker.service_url, operation_timeout_seconds=10,
                           authentication=AuthenticationToken(keys.token("alice"))) as client:
        producer = await client.create_producer("persistent://public/default/auth-bookie")
        msg_id = await producer.send(b"stored")
        assert msg_id.entry_id >= 0


async def test_long_lived_streams_reconnect_with_a_fresh_token_without_loss(secure):
    """Tokens valid 3 s from a callable; the broker checks every second and ends the
    streams whose token expires before its next check; producer and consumer reconnect
    with a fresh token and every message arrives."""
    keys, _, broker = secure
    topic = "persistent://public/default/auth-refresh"
    issued = {"n": 0}

    def fresh() -> str:
        issued["n"] += 1
        return keys.token("alice", expires_in_s=3)

    auth = AuthenticationToken(fresh)
    async with AsyncClient(broker.service_url, operation_timeout_seconds=15, authentication=auth) as client:
        consumer = await client.subscribe(topic, "long", initial_position=InitialPosition.Earliest)
        producer = await client.create_producer(topic)
        sent = []
        deadline = time.monotonic() + 9           # three token lifetimes
        i = 0
        while time.monotonic() < deadline:
            payload = f"m-{i}".encode()
            await producer.send(payload)
            sent.append(payload)
            i += 1
            await asyncio.sleep(0.02)
        got = []
        end = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < end:
            msg = await consumer.receive(timeout_millis=20000)
            got.append(msg.data())
            consumer.acknowledge(msg)
        assert sorted(set(got)) == sorted(sent), f"{len(set(got))} distinct of {len(sent)} sent"
    log = broker.stderr_log.read_text(errors="replace")
    assert log.count("before the next check; reconnect with a fresh token") >= 2, \
        "the streams were never ended before their token expired"
    assert issued["n"] >= 4  # new tokens were asked for at the reconnects


async def test_cli_takes_auth_params_token_and_file(secure, tmp_path):
    keys, _, broker = secure
    import subprocess
    import sys
    token = keys.token("alice")
    token_file = tmp_path / "token.txt"
    token_file.write_text(token + "\n")
    base = [sys.executable, "-m", "client.admin_cli", "--service-url", broker.service_url, "--json"]
    for params in (f"token:{token}", f"file://{token_file}"):
        out = subprocess.run(base + ["--auth-params", params, "brokers", "health"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["ok"] is True
    out = subprocess.run(base + ["brokers", "health"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no credentials" in out.stderr, out.stderr
    produce = subprocess.run([sys.executable, "-m", "client.cli", "--service-url", broker.service_url,
                              "--auth-params", f"file://{token_file}", "--no-progress", "produce",
                              "persistent://public/default/auth-cli", "-m", "hi", "-n", "3"],
                             capture_output=True, text=True, timeout=60)
    assert produce.returncode == 0, produce.stderr


def test_sync_client_and_admin_take_authentication(secure):
    """The blocking facade (``client.Client``, ``SyncAdminClient``) passes ``authentication`` through."""
    from client import Client, SyncAdminClient
    keys, _, broker = secure
    topic = "persistent://public/default/auth-sync"
    client = Client(broker.service_url, operation_timeout_seconds=10,
                    authentication=AuthenticationToken(keys.token("alice")))
    try:
        client.create_producer(topic).send(b"sync")
    finally:
        client.close()
    with SyncAdminClient(broker.service_url, authentication=AuthenticationToken(keys.token("alice"))) as admin:
        assert admin.get_stats(topic)["msgInCounter"] == 1
    with SyncAdminClient(broker.service_url) as admin:
        with pytest.raises(AuthenticationError):
            admin.get_stats(topic)


async def test_a_stream_whose_static_token_expires_is_closed(secure):
    """A fixed token valid 3 s: the broker ends the producer's and consumer's streams before
    it expires; their reconnects with the same token end in AuthenticationError once it has."""
    keys, _, broker = secure
    topic = "persistent://public/default/auth-static-expiry"
    auth = AuthenticationToken(keys.token("alice", expires_in_s=3))
    async with AsyncClient(broker.service_url, operation_timeout_seconds=10, authentication=auth) as client:
        consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
        producer = await client.create_producer(topic)
        await producer.send(b"while valid")
        assert (await consumer.receive(timeout_millis=10000)).data() == b"while valid"
        with pytest.raises(AuthenticationError, match="expired"):
            async with asyncio.timeout(60):
                while True:
                    await consumer.receive(timeout_millis=60000)
        with pytest.raises(AuthenticationError, match="expired"):
            async with asyncio.timeout(60):
                while True:
                    await producer.send(b"too late")
                    await asyncio.sleep(0.2)
