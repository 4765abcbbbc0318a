"""The TLS compose stack (``minipulsar geo compose --tls > docker-compose.tls.yml``):
the committed file is the generated one and has the shape the module doc of
``deploy/compose.py`` promises (``geo-certs`` first, the TLS directory mounted
read-only everywhere else, TLS flags and TLS health probes); ``geo probe
--tls-dir`` really speaks mutual TLS to a bookie; ``geo certs`` creates the
material once. The slow test brings the committed file up for real (podman
through ``../shared/tools/compose-up.sh``, or Docker; skipped with the reason
where neither can run a container, as ``test_geo_compose.py`` does), produces
in us-east and consumes the replicated copy in eu-central over
``minipulsar+ssl://`` with the CA the stack wrote into a host directory, and
checks that a plaintext client is refused.

The TLS stack authenticates and authorizes as ``geo up --tls --auth``:
``geo-certs --auth`` writes the token key and tokens beside the certificates,
the brokers run on their own role ``geo-broker`` (the only one the bookies
serve), clients present the administrator's token. The slow test replicates
exactly once with it, sees a client without a token refused, each broker
log its own role, and (from inside the stack, where the bookies listen) an
application and the administrator refused on every bookie RPC with
PERMISSION_DENIED while the brokers' token is served.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time

import pytest

from client import AsyncClient, AuthenticationToken, ConsumerType, InitialPosition
from client.errors import AuthenticationError, ConnectError
from deploy.compose import (AUTH_MOUNT, CERTS_SERVICE, TLS_DIR_VARIABLE, TLS_MOUNT, TLS_PROJECT_NAME, compose_model,
                            render_compose)
from deploy.geo_auth import BROKER_ROLE, bookie_auth_args, token_role
from deploy.topology import load_topology, port_variable
from tests.e2e.geo_helpers import REPO_ROOT, free_ports, geo
from tests.bookie_security_support import BOOKIE_RPCS
from tests.procs import start_bookie

TLS_FILE = "docker-compose.tls.yml"
FIXED_PORT = r"^(\s+- 127\.0\.0\.1:)(\d+)(:\2)$"     # a port published on the host under its own number
HEALTHY = {"condition": "service_healthy"}


# ---- the generated file ------------------------------------------------------------
@pytest.mark.timeout(120)
def test_committed_tls_compose_file_is_the_generated_one():
    committed = (REPO_ROOT / TLS_FILE).read_text()
    generated = render_compose(load_topology(), tls=True)
    assert committed == generated, f"{TLS_FILE} is stale: regenerate it with `minipulsar geo compose --tls > {TLS_FILE}`"
    cli = geo("compose", "--tls", timeout=60)
    assert cli.returncode == 0 and cli.stdout == generated
    # the plaintext file is not touched by --tls
    assert (REPO_ROOT / "docker-compose.yml").read_text() == render_compose(load_topology())


def test_tls_compose_mounts_the_certificates_and_speaks_tls_everywhere():
    topo = load_topology()
    plain = compose_model(topo)
    model = compose_model(topo, tls=True)
    services = model["services"]
    assert model["name"] == TLS_PROJECT_NAME != plain["name"], "own project: own volumes, no clash with the plain stack"
    assert list(services)[:2] == ["geo-net", CERTS_SERVICE]
    assert set(services) == set(plain["services"]) | {CERTS_SERVICE}
    assert model["volumes"] == plain["volumes"]
    host_dir = f"${{{TLS_DIR_VARIABLE}:-./data/compose-tls}}"
    certs = services[CERTS_SERVICE]
    assert certs["command"][:6] == ["minipulsar", "geo", "certs", "--tls-dir", TLS_MOUNT, "--auth"]
    assert certs["command"][-1] == "--keep-running", "service_healthy, not service_completed_successfully (podman)"
    assert certs["healthcheck"]["test"][1:] == ["minipulsar", "geo", "certs", "--tls-dir", TLS_MOUNT, "--auth",
                                                "--check"], "dependents start once the tokens are there too"
    assert AUTH_MOUNT == f"{TLS_MOUNT}/auth"
    assert certs["volumes"] == [f"{host_dir}:{TLS_MOUNT}"]
    assert certs["depends_on"] == {"geo-net": {"condition": "service_started"}}
    ro = f"{host_dir}:{TLS_MOUNT}:ro"
    for name, svc in services.items():
        if name.startswith(("bookie-", "broker-")) or name in ("geo-setup", "geo-dashboard"):
            assert svc["depends_on"][CERTS_SERVICE] == HEALTHY, name
            assert ro in svc["volumes"], name
        elif name != CERTS_SERVICE:
            assert CERTS_SERVICE not in svc.get("depends_on", {}) and "/tls" not in str(svc), name
            assert svc == plain["services"][name], f"{name}: only the TLS users change"
        if name.startswith("bookie-"):
            cmd = svc["command"]
            assert "--tls-enabled" in cmd and "--tls-require-trusted-client-cert-on-connect" in cmd
            assert cmd[cmd.index("--tls-trust-certs-file-path") + 1] == f"{TLS_MOUNT}/ca.cert.pem"
            assert svc["volumes"][0].endswith(":/data")
            # tokens of the stack's key, and only the brokers' own role served
            assert cmd[-len(bookie_auth_args(AUTH_MOUNT)):] == bookie_auth_args(AUTH_MOUNT) == [
                "--authentication-enabled", "--token-secret-key", f"file://{AUTH_MOUNT}/secret.key",
                "--authorized-roles", BROKER_ROLE], cmd
        if name.startswith("broker-") or name == "geo-setup":
            assert svc["command"][-4:] == ["--tls-dir", TLS_MOUNT, "--auth-dir", AUTH_MOUNT], name
            assert svc["command"][:-4] == plain["services"][name]["command"], name
        if name == "geo-dashboard":
            assert svc["command"][-4:] == ["--tls-dir", TLS_MOUNT, "--token-file", f"{AUTH_MOUNT}/admin.token"]
            assert svc["command"][:-4] == plain["services"][name]["command"], name
        if name.startswith(("bookie-", "broker-")):
            test = svc["healthcheck"]["test"]
            assert test[-4:] == ["--tls-dir", TLS_MOUNT, "--auth-dir", AUTH_MOUNT] and \
                all(" " not in arg for arg in test), test
        assert not name.startswith("bookie-") or "--authorized-roles" not in plain["services"][name]["command"]


# ---- the container actions -----------------------------------------------------------
@pytest.mark.timeout(180)
def test_probe_speaks_mutual_tls_to_a_bookie_and_certs_are_created_once(tmp_path, process_tracker):
    tls = tmp_path / "tls"
    made = geo("certs", "--tls-dir", str(tls), timeout=60)
    assert made.returncode == 0, made.stderr
    files = {f: (tls / f).read_bytes() for f in ("ca.cert.pem", "ca.key.pem", "node.cert.pem", "node.key.pem")}
    again = geo("certs", "--tls-dir", str(tls), timeout=60)
    assert again.returncode == 0, again.stderr
    assert {f: (tls / f).read_bytes() for f in files} == files, "a restart of geo-certs keeps the CA"
    assert geo("certs", "--tls-dir", str(tls), "--check", timeout=60).returncode == 0
    assert geo("certs", "--tls-dir", str(tmp_path / "none"), "--check", timeout=60).returncode == 1
    assert not (tmp_path / "none").exists(), "--check creates nothing"
    # a second CA: its node certificate is not trusted by the bookie, and it does not trust the bookie
    other = tmp_path / "other"
    assert geo("certs", "--tls-dir", str(other), timeout=60).returncode == 0
    mixed = tmp_path / "mixed"          # trusts the right CA, presents a certificate of the other
    mixed.mkdir()
    (mixed / "ca.cert.pem").write_bytes(files["ca.cert.pem"])
    for f in ("node.cert.pem", "node.key.pem"):
        (mixed / f).write_bytes((other / f).read_bytes())
    bookie = start_bookie(tmp_path / "bookie", journal_sync=False, tracker=process_tracker, extra_args=[
        "--tls-enabled", "--tls-certificate-file-path", str(tls / "node.cert.pem"),
        "--tls-key-file-path", str(tls / "node.key.pem"), "--tls-trust-certs-file-path", str(tls / "ca.cert.pem"),
        "--tls-require-trusted-client-cert-on-connect"])

    def probe(*extra):
        return geo("probe", "bookie", bookie.address, "--timeout", "10", *extra, timeout=60).returncode
    assert probe("--tls-dir", str(tls)) == 0
    assert probe("--tls-dir", str(mixed)) == 1, "the bookie refuses a client certificate of another CA"
    assert probe("--tls-dir", str(other)) == 1, "the bookie's certificate is not of the probe's CA"
    # a broker probe over TLS against the bookie's port does not pass for a broker
    assert geo("probe", "broker", bookie.address, "--tls-dir", str(tls), "--timeout", "5",
               timeout=60).returncode == 1


@pytest.mark.timeout(180)
def test_certs_auth_writes_the_tokens_once_and_the_bookie_probe_needs_the_brokers_role(tmp_path, process_tracker):
    tls = tmp_path / "tls"
    assert geo("certs", "--tls-dir", str(tls), timeout=60).returncode == 0
    assert geo("certs", "--tls-dir", str(tls), "--auth", "--check", timeout=60).returncode == 1, "no tokens yet"
    assert not (tls / "auth").exists(), "without --auth: no tokens"
    made = geo("certs", "--tls-dir", str(tls), "--auth", timeout=60)
    assert made.returncode == 0, made.stderr
    auth = tls / "auth"
    files = {f: (auth / f).read_bytes() for f in ("secret.key", "broker.token", "admin.token")}
    assert all(os.stat(auth / f).st_mode & 0o777 == 0o600 for f in files)
    assert token_role(auth / "broker.token") == BROKER_ROLE and token_role(auth / "admin.token") == "geo-admin"
    assert geo("certs", "--tls-dir", str(tls), "--auth", timeout=60).returncode == 0
    assert {f: (auth / f).read_bytes() for f in files} == files, "a restart of geo-certs keeps the key and tokens"
    assert geo("certs", "--tls-dir", str(tls), "--auth", "--check", timeout=60).returncode == 0
    # a mutual-TLS bookie of the compose TLS stack: tokens of that key, only the brokers' role served
    bookie = start_bookie(tmp_path / "bookie", journal_sync=False, tracker=process_tracker, extra_args=[
        "--tls-enabled", "--tls-certificate-file-path", str(tls / "node.cert.pem"),
        "--tls-key-file-path", str(tls / "node.key.pem"), "--tls-trust-certs-file-path", str(tls / "ca.cert.pem"),
        "--tls-require-trusted-client-cert-on-connect", *bookie_auth_args(str(auth))])
    wrong = tmp_path / "wrong"          # the administrator's token where the brokers' should be
    wrong.mkdir()
    for f in files:
        (wrong / f).write_bytes(files["admin.token" if f == "broker.token" else f])

    def probe(*extra):
        return geo("probe", "bookie", bookie.address, "--tls-dir", str(tls), "--timeout", "10", *extra,
                   timeout=60).returncode
    assert probe("--auth-dir", str(auth)) == 0, "GetBookieInfo with broker.token answers"
    assert probe("--auth-dir", str(wrong)) == 1, "the bookie refuses any other role: unhealthy"
    assert probe("--auth-dir", str(tmp_path / "none")) == 1, "no tokens: unhealthy"


@pytest.mark.timeout(120)
def test_container_actions_refuse_an_auth_dir_without_tokens(tmp_path):
    tls = tmp_path / "tls"
    assert geo("certs", "--tls-dir", str(tls), timeout=60).returncode == 0
    for action in (["setup", "--compose"], ["broker", "--cluster", "us-east", "--compose"]):
        proc = geo(*action, "--tls-dir", str(tls), "--auth-dir", str(tls / "auth"), timeout=60)
        assert proc.returncode == 1, (action, proc.stdout, proc.stderr)
        assert "missing secret.key, broker.token, admin.token" in proc.stderr and "geo certs" in proc.stderr


@pytest.mark.timeout(120)
def test_container_actions_refuse_a_tls_dir_without_certificates(tmp_path):
    for action in (["setup", "--compose"], ["broker", "--cluster", "us-east", "--compose"]):
        proc = geo(*action, "--tls-dir", str(tmp_path), timeout=60)
        assert proc.returncode == 1, (action, proc.stdout, proc.stderr)
        assert "missing ca.cert.pem, node.cert.pem, node.key.pem" in proc.stderr and "geo certs" in proc.stderr


# ---- the stack, for real ---------------------------------------------------------------
async def _replicated_over_tls(url_from: str, url_to: str, ca: str, token: str, n: int = 20) -> list[bytes]:
    """Produce ``n`` messages in one cluster, return what a consumer in the other gets
    (both clients present ``token``)."""
    topic = "persistent://geo/flights/compose-tls"
    auth = AuthenticationToken(token)
    async with AsyncClient(url_from, tls_trust_certs_file_path=ca, operation_timeout_seconds=60,
                           authentication=auth) as a, \
            AsyncClient(url_to, tls_trust_certs_file_path=ca, operation_timeout_seconds=60, authentication=auth) as b:
        consumer = await b.subscribe(topic, "compose-tls", consumer_type=ConsumerType.Exclusive,
                                     initial_position=InitialPosition.Earliest)
        producer = await a.create_producer(topic)
        for i in range(n):
            await producer.send(f"tls-{i}".encode())
        await producer.close()
        got, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                msg = await consumer.receive(timeout_millis=3_000)
            except Exception:  # noqa: BLE001 - receive timeout
                if len(got) >= n:
                    break        # a quiet period after all of them: no duplicate came
                continue
            got.append(msg.data())
            assert msg.replicated_from() == "us-east"
            consumer.acknowledge(msg)
        await consumer.close()
    return got


async def _plaintext_refused(url: str) -> None:
    async with AsyncClient(url, operation_timeout_seconds=20) as plain:
        with pytest.raises(ConnectError, match="speaks TLS"):
            await plain.create_producer("persistent://geo/flights/compose-tls")


async def _anonymous_refused(url: str, ca: str) -> None:
    async with AsyncClient(url, tls_trust_certs_file_path=ca, operation_timeout_seconds=20) as anonymous:
        with pytest.raises(AuthenticationError):
            await anonymous.create_producer("persistent://geo/flights/compose-tls")


async def _cluster_tls_url(url: str, ca: str, name: str, token: str) -> str | None:
    from client.admin import AdminClient

    admin = AdminClient(url, operation_timeout_seconds=10, tls_trust_certs_file_path=ca,
                        authentication=AuthenticationToken(token))
    try:
        return (await admin.get_cluster(name)).get("service_url_tls")
    finally:
        await admin.close()


# Run inside a container of the stack (the bookies listen on 127.0.0.1 of its network namespace and
# publish no port): every Bookie RPC as each caller of argv[1] ({name: [cert, key, token]}), printed
# as {name: {rpc: [status, details]}}. Only the image's own modules (proto) are used.
BOOKIE_CALLS = r"""
import asyncio, json, sys
import grpc
from proto import bookie_pb2 as pb, bookie_pb2_grpc as pbg
from proto.channels import ChannelSecurity, open_channel

spec = json.loads(sys.argv[1])

async def rpcs(stub, md):
    ledger = pb.LedgerRequest(ledger_id=1, master_key=b"forged")
    add = pb.AddEntriesRequest(adds=[pb.AddEntryRequest(ledger_id=1 << 40, entry_id=0, master_key=b"forged",
                                                        payload=b"forged", last_add_confirmed=-1)])
    async def add_entry():
        return [r.status async for resp in stub.AddEntry(iter([add]), metadata=md, timeout=10) for r in resp.results]
    async def read_entries():
        req = pb.ReadEntriesRequest(ledger_id=1, first_entry_id=0, last_entry_id=0)
        return [e.payload async for resp in stub.ReadEntries(req, metadata=md, timeout=10) for e in resp.entries]
    return {"AddEntry": add_entry, "ReadEntries": read_entries,
            "ReadLastAddConfirmed": lambda: stub.ReadLastAddConfirmed(ledger, metadata=md, timeout=10),
            "Fence": lambda: stub.Fence(ledger, metadata=md, timeout=10),
            "DeleteLedger": lambda: stub.DeleteLedger(ledger, metadata=md, timeout=10),
            "GetBookieInfo": lambda: stub.GetBookieInfo(pb.BookieInfoRequest(), metadata=md, timeout=10)}

async def main():
    out = {}
    for who, (cert, key, token) in spec["callers"].items():
        channel = open_channel(spec["bookie"], [], ChannelSecurity(
            tls=True, tls_trust_certs_file_path="/tls/ca.cert.pem", tls_certificate_file_path=cert,
            tls_key_file_path=key))
        out[who] = {}
        for rpc, call in (await rpcs(pbg.BookieStub(channel), [("authorization", "Bearer " + token)])).items():
            if who == "geo-broker" and rpc != "GetBookieInfo":
                continue   # the brokers' role: one harmless call
            try:
                await call()
                out[who][rpc] = ["OK", ""]
            except grpc.aio.AioRpcError as exc:
                out[who][rpc] = [exc.code().name, exc.details() or ""]
        await channel.close()
    print(json.dumps(out))

asyncio.run(main())
"""


def _bookie_answers(engine, project: str, tls_dir, bookie: str) -> dict:
    """Every bookie RPC at ``bookie`` (inside the stack) as an application role ("analyst", with a
    client certificate of the stack's CA and a valid token of its key), the administrator
    (``geo-admin``, a superuser, node certificate) and the brokers' role (``geo-broker``)."""
    from deploy.tls_certs import create_cert
    from proto.auth_tokens import create_token

    create_cert(str(tls_dir), "app", ["127.0.0.1"], str(tls_dir / "app"), server=False, client=True)
    app_token = create_token((tls_dir / "auth" / "secret.key").read_bytes(), "analyst", "HS256")
    node = [f"{TLS_MOUNT}/node.cert.pem", f"{TLS_MOUNT}/node.key.pem"]
    callers = {"analyst": [f"{TLS_MOUNT}/app/app.cert.pem", f"{TLS_MOUNT}/app/app.key.pem", app_token],
               "geo-admin": node + [(tls_dir / "auth" / "admin.token").read_text().strip()],
               "geo-broker": node + [(tls_dir / "auth" / "broker.token").read_text().strip()]}
    done = engine.exec(project, "broker-us-east-0", "python", "-c", BOOKIE_CALLS,
                       json.dumps({"bookie": bookie, "callers": callers}))
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_tls_compose_stack_replicates_over_tls_and_refuses_plaintext(tmp_path, compose_turn):
    from tests.e2e.test_geo_compose import Engine, _preflight, _wait_configured

    engine = Engine()
    _preflight(engine)
    topo = load_topology()
    project = f"minipulsar-geo-tls-test-{os.getpid()}"
    brokers = [(c.name, i) for c in topo.clusters for i in range(len(c.brokers))]
    committed = (REPO_ROOT / TLS_FILE).read_text()
    fixed = sorted({int(g[1]) for g in re.findall(FIXED_PORT, committed, re.M)})
    ports = free_ports(len(brokers) + len(fixed))
    host_ports = dict(zip(brokers, ports))
    # the committed file, its fixed published ports (Pulsar protocol, HTTP, dashboard) on free host ports: a
    # geo demo running here on the default ports does not keep geo-net from starting
    moved = dict(zip(fixed, ports[len(brokers):]))
    compose_file = REPO_ROOT / f".{TLS_FILE}.test-{os.getpid()}"
    compose_file.write_text(re.sub(FIXED_PORT, lambda m: f"{m.group(1)}{moved[int(m.group(2))]}{m.group(3)}",
                                   committed, flags=re.M))
    tls_dir = tmp_path / "tls"          # the bind mount: the host gets the CA here
    env = dict(os.environ, COMPOSE_PROJECT_NAME=project, COMPOSE_FILE=str(compose_file), **engine.env)
    env[TLS_DIR_VARIABLE] = str(tls_dir)
    env.update({port_variable(c, i): str(p) for (c, i), p in host_ports.items()})
    urls = {c.name: "minipulsar+ssl://" + ",".join(f"127.0.0.1:{host_ports[(c.name, i)]}"
                                                   for i in range(len(c.brokers))) for c in topo.clusters}
    try:
        t0 = time.monotonic()
        up = subprocess.run(engine.up(REPO_ROOT, "-d", "--build"), env=env, capture_output=True, text=True,
                            timeout=1500)
        assert up.returncode == 0, f"compose up failed:\n{up.stdout[-5000:]}\n{up.stderr[-5000:]}"
        ca = tls_dir / "ca.cert.pem"
        assert ca.is_file(), f"{CERTS_SERVICE} did not write the CA into the bind mount {tls_dir}"
        admin_token = (tls_dir / "auth" / "admin.token").read_text().strip()
        asyncio.run(_wait_configured(urls, 300, tls_trust_certs_file_path=str(ca),
                                     authentication=AuthenticationToken(admin_token)))
        print(f"TLS compose stack of {len(topo.clusters)} broker clusters configured in {time.monotonic() - t0:.0f}s")
        assert asyncio.run(_cluster_tls_url(urls["us-east"], str(ca), "eu-central", admin_token)) == \
            urls["eu-central"], "the replicators reach eu-central over TLS (Pulsar's brokerServiceUrlTls)"
        t1 = time.monotonic()
        got = asyncio.run(_replicated_over_tls(urls["us-east"], urls["eu-central"], str(ca), admin_token))
        assert sorted(got) == sorted(f"tls-{i}".encode() for i in range(20)), f"{len(got)} received: {got}"
        print(f"20 messages produced in us-east, consumed once each in eu-central over TLS with tokens "
              f"({time.monotonic() - t1:.1f}s)")
        asyncio.run(_plaintext_refused(urls["us-east"].replace("minipulsar+ssl://", "minipulsar://")))
        asyncio.run(_anonymous_refused(urls["us-east"], str(ca)))
        # each broker runs on its own role; the bookies serve that role only
        for c, i in brokers:
            log = engine.logs(project, f"broker-{c}-{i}")
            assert f"own role {BROKER_ROLE} (a superuser) towards the bookies" in log, (c, i, log[-2000:])
        answers = _bookie_answers(engine, project, tls_dir, topo.bookie_addresses("us-east")[0])
        print(f"bookie answers from inside the stack: {answers}")
        for role in ("analyst", "geo-admin"):
            for rpc in BOOKIE_RPCS:
                code, details = answers[role][rpc]
                assert code == "PERMISSION_DENIED" and f"role {role} may not call the bookie" in details, \
                    (role, rpc, code, details)
        assert answers["geo-broker"] == {"GetBookieInfo": ["OK", ""]}, answers["geo-broker"]
    finally:
        down = subprocess.run(engine.down(REPO_ROOT), env=env, capture_output=True, text=True, timeout=600)
        compose_file.unlink()
        assert down.returncode == 0, f"compose down failed:\n{down.stdout[-3000:]}\n{down.stderr[-3000:]}"
