"""The geo demo with TLS and authentication/authorization on, end to end:
``minipulsar geo up --tls --auth`` on the three broker clusters of
deploy/geo.toml (free ports), then ``geo demo`` replays flights through them
exactly once as without security (the replicators authenticate as the
brokers' superuser role, over TLS). Around it, as a user meets them: a client
without a token is refused with ``AuthenticationError``; a role without
permission with ``AuthorizationError``, until ``namespaces grant-permission``;
the bookies serve only the brokers' role (``geo-broker``), refusing the administrator's
superuser role and an application on every RPC; ``geo status`` works with the demo's own
credentials; ``geo down --purge``."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from client import AsyncClient, AuthenticationToken, ConsumerType, InitialPosition
from client.errors import AuthenticationError, AuthorizationError
from deploy.topology import load_topology
from proto.channels import ChannelSecurity, open_channel
from tests.bookie_security_support import BOOKIE_RPCS, call_rpc
from tests.e2e.geo_helpers import REPO_ROOT, geo, kill_leftovers, write_topology

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FLIGHTS = 6000


@pytest.fixture(scope="module")
def stack():
    pytest.importorskip("hdrh")
    tmp = Path(tempfile.mkdtemp(prefix="minipulsar-geo-secure-"))
    topology = tmp / "geo.toml"
    write_topology(topology)
    data = tmp / "data"
    try:
        yield tmp, topology, data
    finally:
        if data.exists():
            geo("down", "--data-dir", str(data), "--timeout", "5", timeout=180)
            kill_leftovers(data)
        shutil.rmtree(tmp, ignore_errors=True)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=str(REPO_ROOT), capture_output=True, text=True,
                          timeout=120)


async def test_geo_demo_over_tls_with_authentication_replicates_exactly_once(stack):
    tmp, topology, data = stack
    up = geo("up", "--tls", "--auth", "--topology", str(topology), "--data-dir", str(data), timeout=600)
    assert up.returncode == 0, f"{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
    assert "authentication and authorization: on" in up.stdout and "TLS: every link" in up.stdout
    assert "minipulsar+ssl://" in up.stdout

    out = tmp / "demo.json"
    demo = geo("demo", "--data-dir", str(data), "--plain", "--json", str(out), "--limit", str(FLIGHTS), timeout=600)
    print(demo.stdout[-5000:])
    assert demo.returncode == 0, f"{demo.stdout[-5000:]}\n{demo.stderr[-5000:]}"
    result = json.loads(out.read_text())
    assert result["ok"] and result["flights"] == FLIGHTS
    for cluster, check in result["checks"].items():
        assert (check["distinct"], check["duplicates"], check["missing"], check["order_violations"]) == \
            (FLIGHTS, 0, 0, 0), (cluster, check)
    for region, board in result["boards"].items():
        assert (board["flights"], board["duplicates"], board["losses"]) == (FLIGHTS, 0, 0), (region, board)

    topo = load_topology(topology)
    ca = str(data / "tls" / "ca.cert.pem")
    url = topo.service_url("us-west").replace("minipulsar://", "minipulsar+ssl://")
    topic = "persistent://geo/flights/departures"
    # no token: refused, naming what is missing
    async with AsyncClient(url, tls_trust_certs_file_path=ca, operation_timeout_seconds=15) as anonymous:
        with pytest.raises(AuthenticationError):
            await anonymous.subscribe(topic, "anonymous", initial_position=InitialPosition.Earliest)
    # a token of another role: authenticated, not authorized, until granted
    key = f"file://{data / 'auth' / 'secret.key'}"
    made = _cli("deploy.cli", "tokens", "create", "--secret-key", key, "--subject", "analyst")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    async with AsyncClient(url, tls_trust_certs_file_path=ca, authentication=AuthenticationToken(token),
                           operation_timeout_seconds=15) as analyst:
        with pytest.raises(AuthorizationError):
            await analyst.subscribe(topic, "analyst", initial_position=InitialPosition.Earliest)
        admin_token = f"file://{data / 'auth' / 'admin.token'}"
        grant = _cli("client.admin_cli", "--service-url", url, "--tls-trust-certs-file-path", ca,
                     "--auth-params", admin_token, "namespaces", "grant-permission", "geo/flights",
                     "--role", "analyst", "--actions", "consume")
        assert grant.returncode == 0, grant.stderr
        deadline, consumer = time.monotonic() + 30, None
        while consumer is None:
            try:
                consumer = await analyst.subscribe(topic, "analyst", consumer_type=ConsumerType.Shared,
                                                   initial_position=InitialPosition.Earliest)
            except AuthorizationError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        msg = await consumer.receive(timeout_millis=30_000)
        assert json.loads(msg.data())["carrier"]
        await consumer.close()

    # the bookies serve the brokers' role only: the administrator (a superuser) and an application are
    # refused on every RPC even with the demo's node certificate; the brokers' token passes
    tokens = {"geo-admin": (data / "auth" / "admin.token").read_text().strip(), "analyst": token,
              "geo-broker": (data / "auth" / "broker.token").read_text().strip()}
    channel = open_channel(topo.bookie_addresses("us-west")[0], [], ChannelSecurity(
        tls=True, tls_trust_certs_file_path=ca, tls_certificate_file_path=str(data / "tls" / "node.cert.pem"),
        tls_key_file_path=str(data / "tls" / "node.key.pem")))
    try:
        for role in ("geo-admin", "analyst"):
            for rpc in BOOKIE_RPCS:
                code, details = await call_rpc(channel, rpc, tokens[role], 1, b"key")
                assert code == "PERMISSION_DENIED" and f"role {role} may not call the bookie" in details, \
                    (role, rpc, code, details)
        code, info = await call_rpc(channel, "GetBookieInfo", tokens["geo-broker"], 1, b"key")
        assert code == "OK" and info.instance_id, (code, info)
    finally:
        await channel.close()

    status = geo("status", "--data-dir", str(data), timeout=120)
    assert status.returncode == 0 and "all processes healthy" in status.stdout, status.stdout[-3000:]
    down = geo("down", "--data-dir", str(data), "--purge", timeout=180)
    assert down.returncode == 0 and not data.exists()
