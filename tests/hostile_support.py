"""The hostile-tenant stack of issue 32 (broker side): two bookies with mutual TLS
and token authentication, one broker serving TLS (gRPC, HTTP, Pulsar protocol) with
token authentication and authorization on, and the roles a hostile tenant test
needs, plus raw callers (sync gRPC with every field forged, a raw Pulsar-protocol
connection) so no SDK check stands between the caller and the broker.

Roles: ``admin`` and ``broker`` (superusers; ``broker`` is what the broker presents to
its bookies), ``replicator`` (in the broker's ``replicator_roles``, granted produce on
``acme/ns`` as a remote cluster's replicator is), ``acme-admin`` (admin of tenant
``acme``), ``writer`` (produce on acme/ns), ``reader`` (consume on acme/ns),
``mallory`` (produce + consume on its own tenant ``evil``), and no token at all.
Cluster ``elsewhere`` is registered but not in acme's allowed clusters.
"""
from __future__ import annotations

import dataclasses
import socket
import ssl
import time
from pathlib import Path
from typing import Optional

import grpc

from deploy.tls_certs import create_ca, create_cert
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.entry_format import encode_entry
from proto.pulsar_api_pb2 import MessageMetadata
from tests.procs import BookieProcess, BrokerProcess, ProcessTracker
from tests.security_support import Keys, toml_list

LOCAL = "standalone"
NS = "acme/ns"
ROLES = ("none", "mallory", "writer", "reader", "acme-admin", "replicator", "admin")


@dataclasses.dataclass
class Stack:
    """The running stack: ``keys`` (token signer), ``ca`` (CA certificate path),
    ``bookies``, ``broker`` (a BrokerProcess serving TLS)."""
    keys: Keys
    ca: str
    bookies: list
    broker: BrokerProcess

    @property
    def target(self) -> str:
        """The broker's gRPC ``host:port``."""
        return f"127.0.0.1:{self.broker.port}"

    @property
    def tls_service_url(self) -> str:
        return f"minipulsar+ssl://127.0.0.1:{self.broker.port}"

    def metadata(self, role: str) -> list:
        """gRPC metadata of ``role`` ("none": no token)."""
        return [] if role == "none" else [("authorization", f"Bearer {self.keys.token(role)}")]

    def channel(self) -> grpc.Channel:
        """A sync TLS channel to the broker (trusting the stack's CA)."""
        creds = grpc.ssl_channel_credentials(root_certificates=Path(self.ca).read_bytes())
        return grpc.secure_channel(self.target, creds)


def _bookie_config(base: Path, keys: Keys) -> Path:
    """Token authentication on the bookie; its ``authorized_roles`` (the brokers' role)
    when this bookie knows the setting (BookKeeper's bookie authorization)."""
    from bookie.server import BookieConfig

    text = f'authentication_enabled = true\ntoken_secret_key = "{keys.url}"\n'
    if "authorized_roles" in {f.name for f in dataclasses.fields(BookieConfig)}:
        text += f"authorized_roles = {toml_list(['broker'])}\n"
    path = base / "bookie.toml"
    path.write_text(text)
    return path


def start_stack(base: Path, tracker: ProcessTracker, extra: str = "") -> Stack:
    """Start the stack under ``base`` (blocking, a few seconds); ``extra``: more broker TOML."""
    keys = Keys(base)
    create_ca(str(base / "ca"))
    node = create_cert(str(base / "ca"), "node", ["127.0.0.1", "localhost"], server=True, client=True)
    ca = str(base / "ca" / "ca.cert.pem")
    mtls = ["--tls-enabled", "--tls-certificate-file-path", node.cert, "--tls-key-file-path", node.key,
            "--tls-trust-certs-file-path", ca, "--tls-require-trusted-client-cert-on-connect",
            "--config", str(_bookie_config(base, keys))]
    bookies = [BookieProcess(base / f"bookie-{i}", journal_sync=False, extra_args=mtls, tracker=tracker).start()
               for i in range(2)]
    token = keys.token("broker")
    conf = base / "broker.toml"
    conf.write_text(
        "managed_ledger_default_ensemble_size = 2\nmanaged_ledger_default_write_quorum = 2\n"
        "managed_ledger_default_ack_quorum = 2\n"
        f'tls_enabled = true\ntls_certificate_file_path = "{node.cert}"\ntls_key_file_path = "{node.key}"\n'
        f'tls_trust_certs_file_path = "{ca}"\n'
        f'bookkeeper_tls_enabled = true\nbookkeeper_tls_trust_certs_file_path = "{ca}"\n'
        f'bookkeeper_tls_client_authentication = true\nbookkeeper_tls_certificate_file_path = "{node.cert}"\n'
        f'bookkeeper_tls_key_file_path = "{node.key}"\n'
        f'broker_client_tls_enabled = true\nbroker_client_trust_certs_file_path = "{ca}"\n'
        "authentication_enabled = true\nauthorization_enabled = true\n"
        f'token_secret_key = "{keys.url}"\nsuperuser_roles = {toml_list(["admin", "broker"])}\n'
        f"replicator_roles = {toml_list(['replicator'])}\n"
        f'bookkeeper_client_authentication_parameters = "token:{token}"\n'
        f'broker_client_authentication_parameters = "token:{token}"\n' + extra)
    broker = BrokerProcess(base / "broker", [b.address for b in bookies], conf, tracker=tracker).start()
    stack = Stack(keys, ca, bookies, broker)
    _set_up(stack)
    return stack


def admin_call(stack: Stack, caller: str, method: str, channel: Optional[grpc.Channel] = None, **body) -> str:
    """Admin ``method`` with ``body`` as ``caller`` (a role, "none") over gRPC; the JSON
    answer (raises grpc.RpcError)."""
    import json
    own = channel is None
    channel = channel or stack.channel()
    try:
        stub = broker_pb2_grpc.PulsarBrokerStub(channel)
        return stub.Admin(pb.AdminRequest(method=method, body_json=json.dumps(body)),
                          metadata=stack.metadata(caller), timeout=20).body_json
    finally:
        if own:
            channel.close()


def _set_up(stack: Stack) -> None:
    with stack.channel() as ch:
        def call(method, **body):
            return admin_call(stack, "admin", method, ch, **body)
        call("clusters.create", name="elsewhere", service_url="minipulsar://127.0.0.1:1")
        call("tenants.create", tenant="acme", allowed_clusters=[LOCAL], admin_roles=["acme-admin"])
        call("namespaces.create", namespace=NS)
        call("namespaces.grant_permission", namespace=NS, role="writer", actions=["produce"])
        call("namespaces.grant_permission", namespace=NS, role="reader", actions=["consume"])
        call("namespaces.grant_permission", namespace=NS, role="replicator", actions=["produce"])
        call("tenants.create", tenant="evil", allowed_clusters=[LOCAL], admin_roles=["evil-admin"])
        call("namespaces.create", namespace="evil/ns")
        call("namespaces.grant_permission", namespace="evil/ns", role="mallory", actions=["produce", "consume"])


def entry(seq: int, payload: bytes = b"x", **metadata) -> bytes:
    """Entry bytes (checksum, MessageMetadata, payload) with any MessageMetadata fields forged."""
    md = MessageMetadata(producer_name=metadata.pop("producer_name", "raw"), sequence_id=seq,
                         publish_time=int(time.time() * 1000), **metadata)
    return encode_entry(md, payload)


def produce(stack: Stack, caller: str, topic: str, entries: list[bytes], producer_name: str = "",
            is_replicator: bool = False, channel: Optional[grpc.Channel] = None, first_seq: int = 1):
    """Create a producer as ``caller`` with any ``producer_name`` / ``is_replicator`` and send
    ``entries`` (sequence ids from ``first_seq``) on a raw Produce stream. Returns the
    answers: ``("receipt", ledger_id, entry_id)`` or ``("error", name, message)`` per
    entry; raises grpc.RpcError when the create (or the stream) is refused."""
    own = channel is None
    channel = channel or stack.channel()
    sends = [pb.Send(sequence_id=first_seq + i, highest_sequence_id=first_seq + i, num_messages=1,
                     headers_and_payload=data) for i, data in enumerate(entries)]
    requests = [pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name=producer_name,
                                                            is_replicator=is_replicator))]
    if sends:
        requests.append(pb.ProducerRequest(sends=pb.SendBatch(sends=sends)))
    answers = []
    try:
        stub = broker_pb2_grpc.PulsarBrokerStub(channel)
        for resp in stub.Produce(iter(requests), metadata=stack.metadata(caller), timeout=20):
            kind = resp.WhichOneof("response")
            if kind == "receipts":
                answers += [("receipt", r.message_id.ledger_id, r.message_id.entry_id) for r in resp.receipts.receipts]
            elif kind == "send_error":
                answers.append(("error", resp.send_error.error, resp.send_error.message))
            elif kind == "send_errors":
                answers += [("error", e.error, e.message) for e in resp.send_errors.errors]
            if len(answers) >= len(entries):
                break
    finally:
        if own:
            channel.close()
    return answers


class RawPulsar:
    """A raw Pulsar binary protocol connection over TLS (``port``: the broker's
    Pulsar TLS port, trusting ``ca``), CONNECTed with ``token`` (None: none)."""

    def __init__(self, port: int, ca: str, token: Optional[str]):
        from broker.protocols.pulsar.frames import FrameDecoder
        from proto.pulsar_wire_pb2 import BaseCommand as T

        ctx = ssl.create_default_context(cafile=ca)
        self.sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                    server_hostname="127.0.0.1")
        self.decoder = FrameDecoder(64 << 20)
        self.frames: list = []
        connect = {"client_version": "hostile", "protocol_version": 20}
        if token is not None:
            connect.update(auth_method_name="token", auth_data=token.encode())
        self.send(T(type=T.CONNECT, connect=connect))
        self.connected = self.expect(T.CONNECTED, T.ERROR)

    def send(self, cmd, payload: Optional[bytes] = None) -> None:
        from broker.protocols.pulsar.frames import encode_command, encode_payload_command
        self.sock.sendall(encode_command(cmd) if payload is None else encode_payload_command(cmd, payload))

    def expect(self, *kinds: int):
        """The first received command of one of ``kinds`` (others are kept)."""
        while True:
            for i, (cmd, _) in enumerate(self.frames):
                if cmd.type in kinds:
                    return self.frames.pop(i)[0]
            data = self.sock.recv(1 << 16)
            assert data, "connection closed"
            self.frames += self.decoder.feed(data)

    def close(self) -> None:
        self.sock.close()
