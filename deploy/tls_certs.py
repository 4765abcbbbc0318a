"""A local certificate authority and certificates for the demo and the tests
(what Pulsar's TLS docs do with ``openssl``), made with the ``cryptography``
package.

- :func:`create_ca`: a self-signed CA (``ca.cert.pem`` + ``ca.key.pem``).
- :func:`create_cert`: a certificate signed by that CA for a server (brokers,
  bookies: serverAuth, with subject alternative names for every ``--host``) or
  a client (mutual TLS: clientAuth; brokers towards mTLS bookies use one with
  both usages).

Keys are EC P-256 (fast handshakes), written unencrypted with mode 0600; PEM
everywhere, as Pulsar's ``tlsCertificateFilePath`` / ``tlsKeyFilePath`` /
``tlsTrustCertsFilePath`` expect.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Iterable, Optional

__all__ = ["CertFiles", "create_ca", "create_cert", "DEFAULT_HOSTS", "TlsCertError"]

DEFAULT_HOSTS = ("127.0.0.1", "localhost")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HOST = re.compile(r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")


class TlsCertError(ValueError):
    """Bad input to the certificate tools (name, host, days, missing CA files); the message says which."""


@dataclass(frozen=True)
class CertFiles:
    """Paths of one certificate (``cert``) and its private key (``key``), PEM."""

    cert: str
    key: str


def _x509():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:  # pragma: no cover - a dependency of the distribution
        raise TlsCertError("the certificate tools need the 'cryptography' package (pip install cryptography)") \
            from exc
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise TlsCertError(f"invalid certificate name {name!r}: use letters, digits, '.', '_' or '-' "
                           "(it names the files <name>.cert.pem / <name>.key.pem)")


def _check_days(days: int) -> None:
    if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= 36500:
        raise TlsCertError(f"invalid validity {days!r}: days must be an integer in 1..36500")


def _write(path: str, data: bytes, private: bool) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    if private:
        os.chmod(path, 0o600)


def _key_pem(key, serialization) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def create_ca(output_dir: str, common_name: str = "minipulsar CA", days: int = 3650) -> CertFiles:
    """Create a self-signed CA in ``output_dir``: ``ca.cert.pem`` (give it as
    ``tls_trust_certs_file_path``) and ``ca.key.pem`` (keep it private; used by
    :func:`create_cert`), valid for ``days`` days. Overwrites existing files.
    Returns their paths; raises ``TlsCertError`` for bad input."""
    x509, hashes, serialization, ec, _, NameOID = _x509()
    _check_days(days)
    if not isinstance(common_name, str) or not common_name.strip():
        raise TlsCertError("the CA's common name must not be empty")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    files = CertFiles(os.path.join(output_dir, "ca.cert.pem"), os.path.join(output_dir, "ca.key.pem"))
    _write(files.key, _key_pem(key, serialization), private=True)
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return files


def _san(hosts: Iterable[str], x509) -> list:
    names = []
    for host in hosts:
        host = host.strip() if isinstance(host, str) else host
        if not host:
            raise TlsCertError("empty --host: give a host name or an IP address")
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
            continue
        except ValueError:
            pass
        if not _HOST.match(host):
            raise TlsCertError(f"invalid --host {host!r}: not an IP address nor a DNS name")
        names.append(x509.DNSName(host))
    return names


def create_cert(ca_dir: str, name: str, hosts: Optional[Iterable[str]] = None, output_dir: Optional[str] = None,
                server: bool = True, client: bool = False, days: int = 825) -> CertFiles:
    """Create ``<name>.cert.pem`` / ``<name>.key.pem`` in ``output_dir`` (default
    ``ca_dir``), signed by the CA in ``ca_dir`` (``ca.cert.pem`` / ``ca.key.pem``
    of :func:`create_ca`), valid ``days`` days.

    ``hosts``: the subject alternative names, IPs or DNS names (default
    ``127.0.0.1`` and ``localhost``); TLS clients check the host of the service
    URL against them. ``server`` / ``client``: the extended key usages
    (serverAuth for brokers and bookies, clientAuth for mutual TLS; both for a
    broker that serves clients and is itself a client of mTLS bookies).
    Raises ``TlsCertError`` for a bad name, host or days, or a missing CA.
    """
    x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID = _x509()
    _check_name(name)
    _check_days(days)
    if not (server or client):
        raise TlsCertError("a certificate needs at least one usage: server and/or client")
    hosts = list(DEFAULT_HOSTS if hosts is None else hosts)
    if server and not hosts:
        raise TlsCertError("a server certificate needs at least one --host")
    ca_files = CertFiles(os.path.join(ca_dir, "ca.cert.pem"), os.path.join(ca_dir, "ca.key.pem"))
    try:
        with open(ca_files.cert, "rb") as f:
            ca_cert = x509.load_pem_x509_certificate(f.read())
        with open(ca_files.key, "rb") as f:
            ca_key = serialization.load_pem_private_key(f.read(), password=None)
    except FileNotFoundError as exc:
        raise TlsCertError(f"no CA in {ca_dir}: {exc.filename} is missing; run `minipulsar tls create-ca "
                           f"--output-dir {ca_dir}` first") from None
    except ValueError as exc:
        raise TlsCertError(f"cannot read the CA in {ca_dir}: {exc}") from None
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + \
             ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                            crl_sign=False, content_commitment=False, data_encipherment=False,
                                            key_agreement=True, encipher_only=False, decipher_only=False),
                              critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san(hosts, x509)), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out = output_dir or ca_dir
    files = CertFiles(os.path.join(out, f"{name}.cert.pem"), os.path.join(out, f"{name}.key.pem"))
    _write(files.key, _key_pem(key, serialization), private=True)
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return files
