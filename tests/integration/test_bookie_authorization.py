"""Bookies serve the brokers only (issue 32, case 2; BookKeeper's ``BookieAuthZFactory``
with ``authorizedRoles``), over real processes: a mutual-TLS bookie with token
authentication and ``authorized_roles = ["broker"]``, a broker writing to it with
the node certificate and its own role.

- An application role holding what a hostile tenant can get (a client certificate
  of the same CA and its own valid token) calls the bookie directly:
  ReadLastAddConfirmed (enumerating ledgers), ReadEntries (another tenant's
  payloads), AddEntry (creating a ledger), Fence, DeleteLedger: each is
  PERMISSION_DENIED, and nothing was created, fenced or deleted; the tenant's own
  application is refused as well (a bookie knows ledgers, not tenants). The
  broker's role still reads the same ledger directly, and the broker still serves
  its clients.
- A bookie with authentication on and no ``authorized_roles`` refuses to start
  (flags or config file: exit status 2; an embedded ``BookieServer``: ValueError),
  saying what to set.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from client import AdminClient, AsyncClient, AuthenticationToken, InitialPosition
from tests.bookie_security_support import bookie_channel, call_rpc, make_certs, start_mtls_bookies_and_broker
from tests.procs import REPO_ROOT, ProcessTracker
from tests.security_support import BROKER_ROLE, Keys

pytestmark = pytest.mark.timeout(180)

TOPIC = "persistent://acme/data/payroll"
SECRET = b"acme payroll: secret entry"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("bookie-authz")
    tracker = ProcessTracker()
    keys = Keys(base)
    certs = make_certs(base)
    try:
        bookies, broker = start_mtls_bookies_and_broker(base, tracker, keys, certs)
        yield keys, certs, bookies[0], broker
    finally:
        tracker.kill_all()


async def _publish_and_find_ledger(broker, keys) -> int:
    """alice (acme's application) publishes SECRET through the broker; the id of the ledger holding it."""
    async with AdminClient(broker.service_url, operation_timeout_seconds=20,
                           authentication=AuthenticationToken(keys.token("admin"))) as admin:
        await admin.create_tenant("acme", None, ["acme-admin"])
        await admin.create_namespace("acme/data")
        await admin.grant_namespace_permission("acme/data", "alice", ["produce", "consume"])
        await admin.create_tenant("globex", None, ["globex-admin"])
        await admin.create_namespace("globex/app")
        await admin.grant_namespace_permission("globex/app", "mallory", ["produce", "consume"])
        async with AsyncClient(broker.service_url, operation_timeout_seconds=20,
                               authentication=AuthenticationToken(keys.token("alice"))) as client:
            await client.subscribe(TOPIC, "payroll", initial_position=InitialPosition.Earliest)
            msg_id = await (await client.create_producer(TOPIC)).send(SECRET)
        ledgers = [ld["ledgerId"] for ld in (await admin.get_internal_stats(TOPIC))["ledgers"]]
    assert msg_id.ledger_id in ledgers, (msg_id, ledgers)
    return msg_id.ledger_id


async def test_an_application_role_with_a_client_certificate_and_a_valid_token_gets_nothing_from_a_bookie(stack):
    keys, certs, bookie, broker = stack
    ledger = await _publish_and_find_ledger(broker, keys)
    broker_token = keys.token(BROKER_ROLE)
    channel = bookie_channel(bookie.address, certs, "app")      # the certificate an application may hold
    try:
        # what is at stake: the ledger holds alice's payload, as the broker's role reads it directly
        code, lac = await call_rpc(channel, "ReadLastAddConfirmed", broker_token, ledger, b"")
        assert code == "OK" and lac.last_entry_id >= 0, (code, lac)
        code, payloads = await call_rpc(channel, "ReadEntries", broker_token, ledger, b"")
        assert code == "OK" and SECRET in payloads[0], (code, payloads)

        new_ledger = 987_654_321
        for role in ("mallory", "alice"):      # another tenant's application, and acme's own
            token = keys.token(role)
            for rpc, ledger_id in (("ReadLastAddConfirmed", ledger), ("ReadEntries", ledger),
                                   ("AddEntry", new_ledger), ("Fence", ledger), ("DeleteLedger", ledger),
                                   ("GetBookieInfo", ledger)):
                code, details = await call_rpc(channel, rpc, token, ledger_id, b"guessed-master-key",
                                               payload=b"fill the disk")
                assert code == "PERMISSION_DENIED", f"{role} {rpc}: {code} {details}"
                assert details.startswith("AuthorizationError:") and f"role {role}" in details \
                    and "authorized_roles" in details, details

        # nothing was created, fenced or deleted
        code, details = await call_rpc(channel, "ReadLastAddConfirmed", broker_token, new_ledger, b"")
        assert code == "NOT_FOUND", (code, details)
        code, payloads = await call_rpc(channel, "ReadEntries", broker_token, ledger, b"")
        assert code == "OK" and SECRET in payloads[0]
    finally:
        await channel.close()

    # the broker, on its own role, still writes to and reads from the bookie
    async with AsyncClient(broker.service_url, operation_timeout_seconds=20,
                           authentication=AuthenticationToken(keys.token("alice"))) as client:
        consumer = await client.subscribe(TOPIC, "payroll", initial_position=InitialPosition.Earliest)
        await (await client.create_producer(TOPIC)).send(b"after")
        got = [(await consumer.receive(timeout_millis=20000)).data() for _ in range(2)]
        assert got == [SECRET, b"after"]


def _bookie(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bookie", "--port", "0", *args], cwd=str(REPO_ROOT),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("how", ["flags", "config-file", "empty-flag"])
def test_a_bookie_with_authentication_and_no_authorized_roles_refuses_to_start(tmp_path, how):
    keys = Keys(tmp_path)
    args = ["--data-dir", str(tmp_path / "data")]
    if how == "config-file":
        conf = tmp_path / "bookie.toml"
        conf.write_text(f'authentication_enabled = true\ntoken_secret_key = "{keys.url}"\n')
        args += ["--config", str(conf)]
    else:
        args += ["--authentication-enabled", "--token-secret-key", keys.url]
        if how == "empty-flag":
            args += ["--authorized-roles", " , "]
    proc = _bookie(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "BOOKIE_READY" not in proc.stdout
    assert "authentication_enabled = true needs authorized_roles" in proc.stderr, proc.stderr
    assert "--authorized-roles" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir()), \
        "a refused bookie must not touch its data dir"


async def test_an_embedded_bookie_server_with_authentication_and_no_authorized_roles_refuses_to_start(tmp_path):
    from bookie.server import BookieConfig, BookieServer

    keys = Keys(tmp_path)
    server = BookieServer(BookieConfig(port=0, data_dir=str(tmp_path / "data"), journal_sync=False,
                                       authentication_enabled=True, token_secret_key=keys.url))
    with pytest.raises(ValueError, match="authentication_enabled = true needs authorized_roles"):
        await server.start()
    assert server.port is None, "nothing may be served"
