"""Helpers of the bookie authorization tests (issue 32, case 2): a demo CA, mutual-TLS
bookies with token authentication and ``authorized_roles``, a broker reaching them
with its node certificate and its own role, and raw calls of every bookie RPC as a
given caller (certificate and token), answered as a status name.

Builds on :mod:`tests.security_support` (``Keys``, ``BROKER_ROLE``, ``toml_list``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import grpc

from deploy.tls_certs import create_ca, create_cert
from proto import bookie_pb2 as pb
from proto import bookie_pb2_grpc as pbg
from proto.channels import ChannelSecurity, open_channel
from tests.procs import ProcessTracker, start_bookie, start_broker
from tests.security_support import BROKER_ROLE, Keys, toml_list

__all__ = ["Certs", "make_certs", "start_mtls_bookies_and_broker", "bookie_channel", "call_rpc", "BOOKIE_RPCS"]

# Every RPC of the Bookie service (proto/bookie.proto), in its order.
BOOKIE_RPCS = ("AddEntry", "ReadEntries", "ReadLastAddConfirmed", "Fence", "DeleteLedger", "GetBookieInfo")


@dataclass(frozen=True)
class Certs:
    """PEM paths: the CA, the node certificate (server + client: bookies serve it, the broker
    presents it) and an application's client certificate signed by the same CA (what the
    README tells application users to create for mutual TLS)."""

    ca: str
    node_cert: str
    node_key: str
    app_cert: str
    app_key: str


def make_certs(base: Path) -> Certs:
    """A CA under ``base/ca`` with a node and an application certificate for 127.0.0.1."""
    ca = create_ca(str(base / "ca"))
    node = create_cert(str(base / "ca"), "node", ["127.0.0.1", "localhost"], server=True, client=True)
    app = create_cert(str(base / "ca"), "app", ["127.0.0.1", "localhost"], server=False, client=True)
    return Certs(ca.cert, node.cert, node.key, app.cert, app.key)


def bookie_mtls_toml(certs: Certs, keys: Keys, authorized_roles=(BROKER_ROLE,)) -> str:
    """A bookie config: TLS only, client certificates of the CA required, tokens of ``keys``,
    ``authorized_roles`` (left out when None)."""
    text = (f'tls_enabled = true\ntls_certificate_file_path = "{certs.node_cert}"\n'
            f'tls_key_file_path = "{certs.node_key}"\ntls_trust_certs_file_path = "{certs.ca}"\n'
            "tls_require_trusted_client_cert_on_connect = true\n"
            f'authentication_enabled = true\ntoken_secret_key = "{keys.url}"\n')
    if authorized_roles is not None:
        text += f"authorized_roles = {toml_list(authorized_roles)}\n"
    return text


def start_mtls_bookies_and_broker(base: Path, tracker: ProcessTracker, keys: Keys, certs: Certs, bookies: int = 1,
                                  superusers=("admin", BROKER_ROLE)):
    """``bookies`` mutual-TLS bookies (tokens, ``authorized_roles = ["broker"]``) and a broker
    with authentication and authorization on, writing to them over mutual TLS with the node
    certificate and the token of role ``broker`` (a superuser). E = Qw = Qa = ``bookies``.
    Returns ``(bookie processes, broker process)``."""
    conf = base / "bookie.toml"
    conf.write_text(bookie_mtls_toml(certs, keys))
    procs = [start_bookie(base / f"bookie-{i}", journal_sync=False, extra_args=("--config", str(conf)),
                          tracker=tracker) for i in range(bookies)]
    token = keys.token(BROKER_ROLE)
    broker_conf = base / "broker.toml"
    broker_conf.write_text(
        f"managed_ledger_default_ensemble_size = {bookies}\nmanaged_ledger_default_write_quorum = {bookies}\n"
        f"managed_ledger_default_ack_quorum = {bookies}\n"
        "authentication_enabled = true\nauthorization_enabled = true\n"
        f'token_secret_key = "{keys.url}"\nsuperuser_roles = {toml_list(superusers)}\n'
        f'bookkeeper_client_authentication_parameters = "token:{token}"\n'
        f'broker_client_authentication_parameters = "token:{token}"\n'
        f'bookkeeper_tls_enabled = true\nbookkeeper_tls_trust_certs_file_path = "{certs.ca}"\n'
        "bookkeeper_tls_client_authentication = true\n"
        f'bookkeeper_tls_certificate_file_path = "{certs.node_cert}"\n'
        f'bookkeeper_tls_key_file_path = "{certs.node_key}"\n')
    broker = start_broker(base / "broker", [p.address for p in procs], config_file=broker_conf, tracker=tracker)
    return procs, broker


def bookie_channel(address: str, certs: Certs, cert: Optional[str] = "app") -> grpc.aio.Channel:
    """A TLS channel to a bookie trusting the CA, presenting the ``"app"`` or ``"node"``
    certificate, or none (``cert=None``: a mutual-TLS bookie refuses the handshake)."""
    pair = {"app": (certs.app_cert, certs.app_key), "node": (certs.node_cert, certs.node_key),
            None: (None, None)}[cert]
    return open_channel(address, [], ChannelSecurity(tls=True, tls_trust_certs_file_path=certs.ca,
                                                     tls_certificate_file_path=pair[0], tls_key_file_path=pair[1]))


async def call_rpc(channel: grpc.aio.Channel, rpc: str, token: Optional[str], ledger_id: int, master_key: bytes,
                   payload: bytes = b"forged", entry_id: int = 0) -> tuple[str, object]:
    """Call bookie ``rpc`` on ``ledger_id`` with ``master_key`` as the holder of ``token`` (None:
    no ``authorization`` metadata). Returns ``("OK", answer)`` (AddEntry: the AddStatus names of
    one add of ``entry_id`` with ``payload``; ReadEntries: the payloads of entries 0..0; others: the
    response message) or ``(status code name, details)`` when the call fails."""
    stub = pbg.BookieStub(channel)
    md = [("authorization", f"Bearer {token}")] if token else []
    ledger = pb.LedgerRequest(ledger_id=ledger_id, master_key=master_key)
    try:
        if rpc == "AddEntry":
            add = pb.AddEntryRequest(ledger_id=ledger_id, entry_id=entry_id, master_key=master_key,
                                     payload=payload, last_add_confirmed=entry_id - 1)
            req = pb.AddEntriesRequest(adds=[add])
            call = stub.AddEntry(iter([req]), metadata=md, timeout=10)
            return "OK", [pb.AddStatus.Name(r.status) async for resp in call for r in resp.results]
        if rpc == "ReadEntries":
            call = stub.ReadEntries(pb.ReadEntriesRequest(ledger_id=ledger_id, first_entry_id=0, last_entry_id=0),
                                    metadata=md, timeout=10)
            return "OK", [e.payload async for resp in call for e in resp.entries]
        if rpc == "GetBookieInfo":
            return "OK", await stub.GetBookieInfo(pb.BookieInfoRequest(), metadata=md, timeout=10)
        return "OK", await getattr(stub, rpc)(ledger, metadata=md, timeout=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or ""
