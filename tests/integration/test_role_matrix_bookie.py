"""Role matrix of the bookie (issue 32): every Bookie RPC called by each kind of
caller, each with its expected answer, over real processes (a mutual-TLS bookie
with token authentication and ``authorized_roles = ["broker"]``; a broker on it
with authorization on, where the roles below are set up for real: tenant
``acme`` with admin ``acme-admin``, ``acme-producer`` granted produce only,
``acme-consumer`` consume only; ``mallory`` an application of tenant ``globex``;
``admin`` a superuser).

The rule is BookKeeper's (``BookieAuthZFactory``, ``authorizedRoles``): a bookie
serves ledgers, not tenants, so only the roles in ``authorized_roles`` (the
brokers') pass, whatever the RPC; a Pulsar superuser that is not a broker role
is refused like any application. Callers (rows) and their answer on every RPC:

=============================  ===================================================
caller                         answer on every RPC
=============================  ===================================================
no token (client cert of CA)   UNAUTHENTICATED ("no credentials")
token signed by another key    UNAUTHENTICATED ("token refused")
no client certificate          UNAVAILABLE (the mutual-TLS handshake is refused),
                               even with the broker's token
another tenant's application   PERMISSION_DENIED (AuthorizationError)
produce-only role              PERMISSION_DENIED
consume-only role              PERMISSION_DENIED
tenant admin                   PERMISSION_DENIED
superuser, not a broker role   PERMISSION_DENIED
broker role (authorized_roles) OK: AddEntry EOK, ReadEntries the payload,
                               ReadLastAddConfirmed / Fence / DeleteLedger /
                               GetBookieInfo answer
=============================  ===================================================

Columns: AddEntry, ReadEntries, ReadLastAddConfirmed, Fence, DeleteLedger,
GetBookieInfo (all of proto/bookie.proto: ``test_the_matrix_covers_every_bookie_rpc``
fails when an RPC is added without a row here). 9 callers x 6 RPCs = 54 cases,
each its own ledger with the right master key (so only authorization can stop
a refused caller); after a refused call the ledger is checked untouched (still
readable, not fenced, not created).
"""
from __future__ import annotations

import itertools

import pytest

from client import AdminClient, AuthenticationToken
from proto import bookie_pb2
from tests.bookie_security_support import BOOKIE_RPCS, bookie_channel, call_rpc, make_certs, \
    start_mtls_bookies_and_broker
from tests.procs import ProcessTracker
from tests.security_support import BROKER_ROLE, Keys

pytestmark = pytest.mark.timeout(120)

MASTER_KEY = b"ledger-master-key"

# caller: (certificate presented, role of the token or a special value, expected status, detail in the answer)
CALLERS = {
    "no-token": ("app", None, "UNAUTHENTICATED", "no credentials"),
    "forged-token": ("app", "@forged", "UNAUTHENTICATED", "token refused"),
    "no-client-cert": (None, BROKER_ROLE, "UNAVAILABLE", ""),
    "other-tenant-app": ("app", "mallory", "PERMISSION_DENIED", "role mallory may not call the bookie"),
    "produce-only": ("app", "acme-producer", "PERMISSION_DENIED", "role acme-producer may not call the bookie"),
    "consume-only": ("app", "acme-consumer", "PERMISSION_DENIED", "role acme-consumer may not call the bookie"),
    "tenant-admin": ("app", "acme-admin", "PERMISSION_DENIED", "role acme-admin may not call the bookie"),
    "superuser-not-broker": ("app", "admin", "PERMISSION_DENIED", "role admin may not call the bookie"),
    "broker-role": ("node", BROKER_ROLE, "OK", ""),
}
CASES = list(itertools.product(BOOKIE_RPCS, CALLERS))
_ledger_ids = itertools.count(500_000)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    import asyncio

    base = tmp_path_factory.mktemp("bookie-matrix")
    tracker = ProcessTracker()
    keys = Keys(base)
    (base / "other").mkdir()
    other_keys = Keys(base / "other")        # another secret key: tokens a bookie cannot verify
    certs = make_certs(base)

    async def roles(url: str) -> None:
        async with AdminClient(url, operation_timeout_seconds=20,
                               authentication=AuthenticationToken(keys.token("admin"))) as admin:
            await admin.create_tenant("acme", None, ["acme-admin"])
            await admin.create_namespace("acme/data")
            await admin.grant_namespace_permission("acme/data", "acme-producer", ["produce"])
            await admin.grant_namespace_permission("acme/data", "acme-consumer", ["consume"])
            await admin.create_tenant("globex", None, ["globex-admin"])
            await admin.create_namespace("globex/app")
            await admin.grant_namespace_permission("globex/app", "mallory", ["produce", "consume"])

    try:
        bookies, broker = start_mtls_bookies_and_broker(base, tracker, keys, certs)
        asyncio.run(roles(broker.service_url))
        yield keys, other_keys, certs, bookies[0]
    finally:
        tracker.kill_all()


def test_the_matrix_covers_every_bookie_rpc():
    service = bookie_pb2.DESCRIPTOR.services_by_name["Bookie"]
    assert sorted(m.name for m in service.methods) == sorted(BOOKIE_RPCS)
    assert len(CASES) == len(BOOKIE_RPCS) * len(CALLERS) == 54


@pytest.mark.parametrize("rpc,caller", CASES,
                         ids=[f"{rpc}-by-{caller}-{CALLERS[caller][2]}" for rpc, caller in CASES])
async def test_bookie_rpc_by_caller(stack, rpc, caller):
    keys, other_keys, certs, bookie = stack
    cert, role, expected, detail = CALLERS[caller]
    token = None if role is None else other_keys.token("admin") if role == "@forged" else keys.token(role)
    broker = bookie_channel(bookie.address, certs, "node")
    channel = bookie_channel(bookie.address, certs, cert)
    broker_token = keys.token(BROKER_ROLE)
    ledger, fresh = next(_ledger_ids), next(_ledger_ids)
    payload = f"{rpc}/{caller}".encode()
    try:
        # a ledger of the broker's, entry 0 written with the master key the caller is given too
        assert await call_rpc(broker, "AddEntry", broker_token, ledger, MASTER_KEY, payload) == ("OK", ["EOK"])
        target = fresh if rpc == "AddEntry" else ledger
        code, answer = await call_rpc(channel, rpc, token, target, MASTER_KEY, payload=b"by " + caller.encode())
        assert code == expected, f"{rpc} by {caller}: {code} {answer}"
        if expected != "OK":
            assert detail in answer, answer
            if expected == "PERMISSION_DENIED":
                assert answer.startswith("AuthorizationError:") and f"({rpc})" in answer, answer
            # untouched: nothing created, the ledger still there and not fenced
            code, answer = await call_rpc(broker, "ReadLastAddConfirmed", broker_token, fresh, b"")
            assert code == "NOT_FOUND", (code, answer)
            assert await call_rpc(broker, "ReadEntries", broker_token, ledger, b"") == ("OK", [payload])
            assert await call_rpc(broker, "AddEntry", broker_token, ledger, MASTER_KEY, b"next",
                                  entry_id=1) == ("OK", ["EOK"])
            return
        if rpc == "AddEntry":
            assert answer == ["EOK"]
        elif rpc == "ReadEntries":
            assert answer == [payload]
        elif rpc == "ReadLastAddConfirmed":
            assert answer.last_entry_id == 0
        elif rpc == "Fence":
            assert answer.last_entry_id == 0
            assert await call_rpc(broker, "AddEntry", broker_token, ledger, MASTER_KEY, b"late",
                                  entry_id=1) == ("OK", ["E_LEDGER_FENCED"])
        elif rpc == "DeleteLedger":
            code, answer = await call_rpc(broker, "ReadLastAddConfirmed", broker_token, ledger, b"")
            assert code == "NOT_FOUND", (code, answer)
        else:
            assert answer.instance_id
    finally:
        await channel.close()
        await broker.close()
