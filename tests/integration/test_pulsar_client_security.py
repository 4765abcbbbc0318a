"""Token authentication and authorization through Pulsar's binary protocol, with the
official client (``pulsar-client``) against a REAL secure bookie + broker: CONNECT
carries ``auth_method_name = "token"``; a missing, forged or expired token is refused
at CONNECT with an AuthenticationError CommandError and the connection closed, as
Pulsar's ServerCnx does (the C++ client, seeing no CONNECTED, retries until its
operation timeout: a refused client here uses a 3 s one), a valid role without permission is refused at
produce / subscribe (AuthorizationError, the same check as the gRPC edge), and the
broker keeps serving the others."""
from __future__ import annotations

import socket
import time
import uuid

import pytest

pulsar = pytest.importorskip("pulsar", reason="pulsar-client (the `test` extra) is not installed")

from broker.security.tokens import create_secret_key, create_token  # noqa: E402
from tests.procs import ProcessTracker  # noqa: E402
from tests.security_support import Keys, create_namespace, start_secure_broker  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """(keys, broker): authentication and authorization on; superusers admin, broker."""
    base = tmp_path_factory.mktemp("pulsar-secure")
    tracker = ProcessTracker()
    keys = Keys(base)
    try:
        _, broker = start_secure_broker(base, tracker, keys, authorization=True)
        create_namespace(broker.service_url, keys.token("admin"), "public/default")
        yield keys, broker
    finally:
        tracker.kill_all()


def _client(broker, token=None, timeout_s: int = 30):
    auth = pulsar.AuthenticationToken(token) if token is not None else None
    return pulsar.Client(broker.pulsar_url, authentication=auth, operation_timeout_seconds=timeout_s)


def _connect_raw(port: int, token) -> tuple[int, object]:
    """CONNECT on a raw socket; (BaseCommand type answered, the command), after which
    the broker must have closed the connection when it refused."""
    from broker.protocols.pulsar.frames import FrameDecoder, encode_command
    from proto.pulsar_wire_pb2 import BaseCommand

    connect = {"client_version": "raw-test", "protocol_version": 20}
    if token is not None:
        connect.update(auth_method_name="token", auth_data=token.encode())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(encode_command(BaseCommand(type=BaseCommand.CONNECT, connect=connect)))
        decoder, frames, data = FrameDecoder(1 << 20), [], b"x"
        while not frames and data:
            data = s.recv(65536)
            frames = decoder.feed(data)
        cmd = frames[0][0]
        if cmd.type == BaseCommand.ERROR:
            assert s.recv(1024) == b""          # closed after the error
        return cmd.type, cmd


def test_a_superuser_token_produces_and_consumes(secure):
    keys, broker = secure
    from proto.pulsar_wire_pb2 import BaseCommand

    assert _connect_raw(broker.pulsar_port, keys.token("admin"))[0] == BaseCommand.CONNECTED
    topic = f"persistent://public/default/sec-{uuid.uuid4().hex[:8]}"
    client = _client(broker, keys.token("admin"))
    try:
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(b"allowed")
        assert consumer.receive(10_000).data() == b"allowed"
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["none", "garbage", "other secret", "expired"])
def test_a_refused_token_fails_at_connect_and_the_broker_keeps_serving(secure, kind):
    keys, broker = secure
    token = {"none": None, "garbage": "not-a-jwt",
             "other secret": create_token(create_secret_key(), "admin", "HS256"),
             "expired": keys.token("admin", expires_in_s=60, now=time.time() - 3600)}[kind]
    from proto.pulsar_wire_pb2 import BaseCommand, ServerError

    kind_answered, cmd = _connect_raw(broker.pulsar_port, token)
    assert kind_answered == BaseCommand.ERROR and cmd.error.error == ServerError.AuthenticationError, cmd
    client = _client(broker, token, timeout_s=3)
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(f"persistent://public/default/sec-{kind.replace(' ', '-')}")
    finally:
        client.close()
    good = _client(broker, keys.token("admin"))
    try:
        good.create_producer(f"persistent://public/default/sec-after-{uuid.uuid4().hex[:6]}").send(b"ok")
    finally:
        good.close()


def test_a_role_without_permission_is_refused_by_the_same_authorization(secure):
    keys, broker = secure
    client = _client(broker, keys.token("mallory"))
    try:
        with pytest.raises(pulsar.PulsarException) as info:
            client.create_producer(f"persistent://public/default/sec-{uuid.uuid4().hex[:8]}")
        assert "Authorization" in type(info.value).__name__, info.value
        with pytest.raises(pulsar.PulsarException) as info:
            client.subscribe(f"persistent://public/default/sec-{uuid.uuid4().hex[:8]}", "s")
        assert "Authorization" in type(info.value).__name__, info.value
    finally:
        client.close()


def test_an_expiring_token_ends_the_producer_and_cannot_be_reused(secure):
    """BrokerSecurity's periodic check ends a Pulsar-protocol producer whose token expired
    (CLOSE_PRODUCER); its re-creation on the same connection is refused and the connection
    closed, and the expired token cannot connect again: later sends fail."""
    keys, broker = secure
    client = _client(broker, keys.token("admin", expires_in_s=5), timeout_s=3)
    try:
        producer = client.create_producer(f"persistent://public/default/sec-exp-{uuid.uuid4().hex[:6]}",
                                          send_timeout_millis=3000, batching_enabled=False)
        producer.send(b"while valid")
        time.sleep(6.5)                                  # expired, and the 1 s check has run
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"after expiry")
    finally:
        client.close()
