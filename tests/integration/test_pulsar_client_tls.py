"""Pulsar's binary protocol over TLS (``pulsar+ssl://``, ``broker_service_port_pulsar_tls``)
with the official client against a REAL standalone whose broker serves TLS only: the
client trusting the CA produces and consumes (our SDK reads the same messages over its
own TLS port); the plaintext Pulsar port is not opened; a client that does not trust
the CA, or speaks plaintext to the TLS port, fails and the broker keeps serving."""
from __future__ import annotations

import uuid

import pytest

pulsar = pytest.importorskip("pulsar", reason="pulsar-client (the `test` extra) is not installed")

from client import Client as SdkClient  # noqa: E402
from client import InitialPosition as SdkInitialPosition  # noqa: E402
from deploy.tls_certs import create_ca, create_cert  # noqa: E402
from tests.procs import ProcessTracker, StandaloneProcess  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def test_pulsar_ssl_with_the_broker_certificate(tmp_path):
    ca = create_ca(str(tmp_path / "ca"))
    cert = create_cert(str(tmp_path / "ca"), "broker", ["127.0.0.1", "localhost"], server=True, client=True)
    other = create_ca(str(tmp_path / "other"), "another CA")
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'tls_enabled = true\ntls_certificate_file_path = "{cert.cert}"\n'
                   f'tls_key_file_path = "{cert.key}"\n')
    tracker = ProcessTracker()
    try:
        proc = StandaloneProcess(tmp_path / "data", ["--no-journal-sync", "--broker-config", str(cfg)], tracker).start()
        assert proc.pulsar_port == -1 and proc.pulsar_tls_port > 0      # TLS only
        assert proc.pulsar_url.startswith("pulsar+ssl://")
        topic = f"persistent://public/default/tls-{uuid.uuid4().hex[:8]}"
        client = pulsar.Client(proc.pulsar_url, tls_trust_certs_file_path=ca.cert, tls_validate_hostname=True,
                               operation_timeout_seconds=30)
        try:
            consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            client.create_producer(topic).send(b"over tls", properties={"k": "v"})
            msg = consumer.receive(10_000)
            assert (msg.data(), msg.properties()) == (b"over tls", {"k": "v"})
        finally:
            client.close()
        with SdkClient(f"minipulsar+ssl://127.0.0.1:{proc.port}", tls_trust_certs_file_path=ca.cert) as sdk:
            ours = sdk.subscribe(topic, "sdk", initial_position=SdkInitialPosition.Earliest)
            assert ours.receive(timeout_millis=10_000).data() == b"over tls"
            ours.close()
        for bad in (pulsar.Client(proc.pulsar_url, tls_trust_certs_file_path=other.cert, operation_timeout_seconds=3),
                    pulsar.Client(f"pulsar://127.0.0.1:{proc.pulsar_tls_port}", operation_timeout_seconds=3)):
            try:
                with pytest.raises(pulsar.PulsarException):
                    bad.create_producer(topic)
            finally:
                bad.close()
        again = pulsar.Client(proc.pulsar_url, tls_trust_certs_file_path=ca.cert, operation_timeout_seconds=30)
        try:
            again.create_producer(topic).send(b"still serving")
        finally:
            again.close()
    finally:
        tracker.kill_all()
