"""TLS pure logic: certificates (``deploy.tls_certs``), ``minipulsar+ssl://``
URLs, TLS failure messages, the SDK's and the broker's TLS options, gRPC
credentials from files, and a local TLS handshake between a gRPC server and
channel in this process (no minipulsar server: see tests/integration/test_tls.py)."""
from __future__ import annotations

import os
import stat

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from broker.config import BrokerConfig
from broker.tls_security import bookie_client_security, broker_client_security, remote_service_url, \
    server_security
from client.tls import tls_channel_security
from deploy.tls_certs import TlsCertError, create_ca, create_cert
from proto.channels import ChannelSecurity, ServerSecurity, TlsConfigError, add_server_port, channel_credentials, \
    open_channel, server_credentials
from proto.errors import InvalidConfiguration
from proto.service_url import parse_service_url
from proto.tls_errors import describe_tls_failure, is_tls_handshake_failure, probe_speaks_tls

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    base = tmp_path_factory.mktemp("pki")
    ca = create_ca(str(base))
    server = create_cert(str(base), "server", ["127.0.0.1", "localhost", "broker.example"])
    client = create_cert(str(base), "client", [], server=False, client=True)
    other = tmp_path_factory.mktemp("other")
    other_ca = create_ca(str(other))
    return {"base": base, "ca": ca, "server": server, "client": client, "other_ca": other_ca}


def _cert(path):
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


# ---- certificates -------------------------------------------------------------------------------------------

def test_ca_and_server_certificate(pki):
    ca, server = _cert(pki["ca"].cert), _cert(pki["server"].cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert server.issuer == ca.subject
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "broker.example"]
    usages = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    server.verify_directly_issued_by(ca)
    assert stat.S_IMODE(os.stat(pki["server"].key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pki["ca"].key).st_mode) == 0o600


def test_client_certificate_usage(pki):
    client = _cert(pki["client"].cert)
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == \
        [ExtendedKeyUsageOID.CLIENT_AUTH]


@pytest.mark.parametrize("kwargs, needle", [
    ({"name": "../evil"}, "invalid certificate name"),
    ({"name": "ok", "hosts": ["bad host"]}, "invalid --host"),
    ({"name": "ok", "hosts": [""]}, "empty --host"),
    ({"name": "ok", "days": 0}, "days must be"),
    ({"name": "ok", "server": False, "client": False}, "at least one usage"),
    ({"name": "ok", "hosts": []}, "needs at least one --host"),
])
def test_bad_certificate_input(pki, kwargs, needle):
    with pytest.raises(TlsCertError, match=needle):
        create_cert(str(pki["base"]), **kwargs)


def test_missing_ca(tmp_path):
    with pytest.raises(TlsCertError, match="create-ca"):
        create_cert(str(tmp_path), "broker")


def test_tls_cli(tmp_path, capsys):
    from deploy.cli import main

    assert main(["tls", "create-ca", "--output-dir", str(tmp_path)]) == 0
    assert main(["tls", "create-cert", "--ca-dir", str(tmp_path), "--name", "b", "--host", "127.0.0.1,h.example",
                 "--client"]) == 0
    assert (tmp_path / "b.cert.pem").exists() and (tmp_path / "b.key.pem").exists()
    san = _cert(tmp_path / "b.cert.pem").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["h.example"]
    assert main(["tls", "create-cert", "--ca-dir", str(tmp_path / "none"), "--name", "b"]) == 2
    assert "create-ca" in capsys.readouterr().err


# ---- service URLs -------------------------------------------------------------------------------------------

def test_tls_service_urls():
    url = parse_service_url("minipulsar+ssl://h1:7000,h2")
    assert url.tls and url.addresses == (("h1", 7000), ("h2", 6601))
    assert str(url) == "minipulsar+ssl://h1:7000,h2:6601" and parse_service_url(str(url)) == url
    assert all(h.tls for h in url.hosts())
    plain = parse_service_url("minipulsar://h1")
    assert not plain.tls and plain.port == 6600 and str(plain) == "minipulsar://h1:6600"
    assert parse_service_url("MINIPULSAR+SSL://h:1").tls
    with pytest.raises(InvalidConfiguration, match="minipulsar\\+ssl://"):
        parse_service_url("pulsar+ssl://h:6651")


# ---- failure messages ---------------------------------------------------------------------------------------

_TLS_AT_PLAIN = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Tls handshake failed "
                 "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:"
                 "WRONG_VERSION_NUMBER: Invalid certificate verification context: OK")
_WRONG_CA = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Tls handshake failed "
             "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
             "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK")
_HOSTNAME = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Custom verification check "
             "failed with error: UNAUTHENTICATED: Hostname Verification Check failed.")
_CLOSED = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Socket closed"
_REFUSED = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote "
            "host: Connection refused")


def test_describe_tls_failure():
    assert "does not speak TLS" in describe_tls_failure(_TLS_AT_PLAIN, True, "h:1")
    assert "tls_trust_certs_file_path" in describe_tls_failure(_WRONG_CA, True)
    assert "does not name this host" in describe_tls_failure(_HOSTNAME, True)
    assert "client certificates" in describe_tls_failure(_CLOSED, True)
    assert describe_tls_failure(_CLOSED, False) is None        # a plain client: only a probe can tell
    assert describe_tls_failure(_REFUSED, True) is None
    assert describe_tls_failure("", None) is None
    assert all(is_tls_handshake_failure(d) for d in (_TLS_AT_PLAIN, _WRONG_CA, _HOSTNAME))
    assert not is_tls_handshake_failure(_CLOSED) and not is_tls_handshake_failure(_REFUSED)


def test_map_rpc_error_names_the_tls_problem():
    from client.connection import map_rpc_error
    from client.errors import ConnectError

    class FakeError(grpc.RpcError):  # a unit test of the pure mapping: no transport
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return _WRONG_CA

    err = map_rpc_error(FakeError(), "create producer")
    assert isinstance(err, ConnectError) and err.message.startswith("create producer: TLS handshake failed")


# ---- SDK and broker options ---------------------------------------------------------------------------------

def test_client_tls_options(pki):
    tls = parse_service_url("minipulsar+ssl://127.0.0.1:1")
    plain = parse_service_url("minipulsar://127.0.0.1:1")
    sec = tls_channel_security(tls, tls_trust_certs_file_path=pki["ca"].cert)
    assert sec == ChannelSecurity(tls=True, tls_trust_certs_file_path=pki["ca"].cert)
    assert tls_channel_security(plain) is None
    assert tls_channel_security(plain, use_tls=True).tls
    with pytest.raises(InvalidConfiguration, match="not TLS"):
        tls_channel_security(plain, tls_trust_certs_file_path=pki["ca"].cert)
    with pytest.raises(InvalidConfiguration, match="no such file"):
        tls_channel_security(tls, tls_trust_certs_file_path="/nonexistent/ca.pem")
    with pytest.raises(InvalidConfiguration, match="go together"):
        tls_channel_security(tls, tls_certificate_file_path=pki["client"].cert)


def test_client_accepts_pulsar_tls_kwargs(pki):
    from client.client import AsyncClient

    client = AsyncClient("minipulsar+ssl://127.0.0.1:1", tls_trust_certs_file_path=pki["ca"].cert,
                         tls_allow_insecure_connection=False, tls_validate_hostname=True,
                         tls_certificate_file_path=pki["client"].cert, tls_key_file_path=pki["client"].key)
    assert client.security.tls and client.security.tls_key_file_path == pki["client"].key
    with pytest.raises(InvalidConfiguration, match="unknown client option"):
        AsyncClient("minipulsar://127.0.0.1:1", tls_trust_cert_path="x")


def test_broker_tls_config(pki):
    problems = BrokerConfig(tls_enabled=True).validate()
    assert any("tls_enabled = true needs tls_certificate_file_path" in p for p in problems)
    _, problems = BrokerConfig.parse({"tls_certificate_file_path": "c.pem",
                                      "tls_require_trusted_client_cert_on_connect": True,
                                      "bookkeeper_tls_client_authentication": True})
    text = "\n".join(problems)
    assert "go together" in text and "needs tls_trust_certs_file_path" in text
    assert "bookkeeper_tls_client_authentication = true needs bookkeeper_tls_certificate_file_path" in text
    assert "needs bookkeeper_tls_enabled" in text
    c = BrokerConfig(tls_enabled=True, tls_certificate_file_path="c", tls_key_file_path="k",
                     tls_trust_certs_file_path="ca", broker_client_tls_enabled=True,
                     broker_client_trust_certs_file_path="ca2", bookkeeper_tls_enabled=True,
                     bookkeeper_tls_trust_certs_file_path="ca3", bookkeeper_tls_certificate_file_path="bc",
                     bookkeeper_tls_key_file_path="bk")
    assert server_security(c) == ServerSecurity(True, "c", "k", "ca", False)
    assert broker_client_security(c) == ChannelSecurity(tls=True, tls_trust_certs_file_path="ca2")
    assert bookie_client_security(c) == ChannelSecurity(tls=True, tls_trust_certs_file_path="ca3")  # no client auth
    c.bookkeeper_tls_client_authentication = True
    assert bookie_client_security(c).tls_certificate_file_path == "bc"
    plain = BrokerConfig()
    assert (server_security(plain), broker_client_security(plain), bookie_client_security(plain)) == (None,) * 3
    data = {"service_url": "minipulsar://a:1", "service_url_tls": "minipulsar+ssl://a:2"}
    assert remote_service_url(data, True) == "minipulsar+ssl://a:2"
    assert remote_service_url(data, False) == "minipulsar://a:1"
    assert remote_service_url({"service_url": "minipulsar://a:1"}, True) == "minipulsar://a:1"


def test_credentials_from_files(pki, tmp_path):
    with pytest.raises(TlsConfigError, match="tls_trust_certs_file_path = '/nope': cannot read"):
        channel_credentials(ChannelSecurity(tls=True, tls_trust_certs_file_path="/nope"))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(TlsConfigError, match="not a PEM file"):
        channel_credentials(ChannelSecurity(tls=True, tls_trust_certs_file_path=str(junk)))
    with pytest.raises(TlsConfigError, match="are not set"):
        server_credentials(ServerSecurity(tls=True))
    with pytest.raises(TlsConfigError, match="needs tls_trust_certs_file_path"):
        server_credentials(ServerSecurity(True, pki["server"].cert, pki["server"].key, None, True))
    with pytest.raises(TlsConfigError, match="PRIVATE KEY"):
        server_credentials(ServerSecurity(True, pki["server"].cert, pki["server"].cert))


# ---- a handshake in this process ----------------------------------------------------------------------------

async def _call(port: int, security):
    channel = open_channel(f"127.0.0.1:{port}", [], security)
    try:
        await channel.unary_unary("/t.T/M")(b"", timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc
    finally:
        await channel.close()


async def test_handshakes(pki):
    server = grpc.aio.server()
    mtls = grpc.aio.server()
    port = add_server_port(server, "127.0.0.1:0", ServerSecurity(True, pki["server"].cert, pki["server"].key))
    mport = add_server_port(mtls, "127.0.0.1:0", ServerSecurity(True, pki["server"].cert, pki["server"].key,
                                                                pki["ca"].cert, True))
    await server.start()
    await mtls.start()
    try:
        trusted = ChannelSecurity(tls=True, tls_trust_certs_file_path=pki["ca"].cert)
        # handshake done: the (empty) server answers UNIMPLEMENTED
        assert (await _call(port, trusted)).code() == grpc.StatusCode.UNIMPLEMENTED
        wrong = await _call(port, ChannelSecurity(tls=True, tls_trust_certs_file_path=pki["other_ca"].cert))
        assert wrong.code() == grpc.StatusCode.UNAVAILABLE and "not trusted" in describe_tls_failure(wrong.details(),
                                                                                                    True)
        assert (await _call(mport, trusted)).code() == grpc.StatusCode.UNAVAILABLE   # no client certificate
        with_cert = ChannelSecurity(tls=True, tls_trust_certs_file_path=pki["ca"].cert,
                                    tls_certificate_file_path=pki["client"].cert,
                                    tls_key_file_path=pki["client"].key)
        assert (await _call(mport, with_cert)).code() == grpc.StatusCode.UNIMPLEMENTED
        named = ChannelSecurity(tls=True, tls_trust_certs_file_path=pki["ca"].cert,
                                tls_hostname_override="broker.example")
        assert (await _call(port, named)).code() == grpc.StatusCode.UNIMPLEMENTED
        assert await probe_speaks_tls("127.0.0.1", port) is True
        plain = grpc.aio.server()
        plain_port = add_server_port(plain, "127.0.0.1:0", None)
        await plain.start()
        try:
            assert await probe_speaks_tls("127.0.0.1", plain_port, timeout=2) is False
        finally:
            await plain.stop(None)
    finally:
        await server.stop(None)
        await mtls.stop(None)


# ---- `geo up --tls`: the plan --------------------------------------------------------------------------------

def test_geo_tls_plan(tmp_path, monkeypatch):
    import tomllib

    import deploy.cluster as cluster
    from deploy.geo import ensure_tls_material, resolve_topology
    from deploy.geo_processes import plan_processes
    from deploy.topology import load_topology

    monkeypatch.setattr(cluster, "find_etcd", lambda: "/usr/bin/etcd")
    plain = load_topology()
    assert plain.service_url("us-east").startswith("minipulsar://") and plain.client_tls_options() == {}
    topo = ensure_tls_material(plain, tmp_path)
    assert resolve_topology(None, tmp_path).tls_dir == topo.tls_dir    # the data dir stays a TLS demo
    assert topo.service_url("us-east") == "minipulsar+ssl://127.0.0.1:6600,127.0.0.1:6610"
    assert topo.client_tls_options() == {"tls_trust_certs_file_path": str(tmp_path / "tls" / "ca.cert.pem")}
    procs = {p.label: p for p in plan_processes(topo, tmp_path)}
    bookie = procs["us-east/bookie-0"].command()
    assert "--tls-enabled" in bookie and "--tls-require-trusted-client-cert-on-connect" in bookie
    (tmp_path / "us-west").mkdir()
    broker = procs["us-west/broker-0"]
    broker.command()
    config = tomllib.loads(broker.config_file.read_text())
    assert config["tls_enabled"] and config["broker_client_tls_enabled"] and config["bookkeeper_tls_enabled"]
    assert config["bookkeeper_tls_client_authentication"]
    node = _cert(config["tls_certificate_file_path"])
    assert list(node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == \
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    assert procs["us-west/broker-0"].url == "minipulsar+ssl://127.0.0.1:6601"


def test_the_url_scheme_decides_tls_of_a_brokers_own_links():
    from broker.tls_security import security_for_url

    config = BrokerConfig(broker_client_trust_certs_file_path="ca.pem")
    auth = object()
    assert security_for_url(None, "minipulsar://h:1", config) is None
    assert security_for_url(None, "minipulsar+ssl://h:1", config) == \
        ChannelSecurity(tls=True, tls_trust_certs_file_path="ca.pem")
    plain_with_auth = ChannelSecurity(authentication=auth)
    upgraded = security_for_url(plain_with_auth, "minipulsar+ssl://h:1", config)
    assert upgraded.tls and upgraded.authentication is auth and upgraded.tls_trust_certs_file_path == "ca.pem"
    tls = ChannelSecurity(tls=True, tls_trust_certs_file_path="other.pem", authentication=auth)
    assert security_for_url(tls, "minipulsar+ssl://h:1", config) is tls
    downgraded = security_for_url(tls, "minipulsar://h:1", config)
    assert not downgraded.tls and downgraded.authentication is auth
