"""The one place where gRPC channels are opened and server ports bound.

Every link (client -> broker, broker -> bookie, replicator -> remote broker,
broker -> broker, admin) opens its channel with :func:`open_channel` and every
server binds with :func:`add_server_port`, so that transport security (TLS,
Pulsar's ``tlsEnabled`` / ``brokerClientTlsEnabled`` family) and
authentication (Pulsar's ``AuthenticationProvider`` / client
``Authentication``) are applied the same way on every link.

- :class:`ChannelSecurity`: how a *client side* secures and authenticates its
  channel: TLS trust and optional client certificate (mutual TLS), and an
  ``authentication`` object (the SDK's ``client.auth.Authentication`` shape:
  ``auth_metadata() -> list[(key, value)]``, sent as gRPC metadata on every
  call).
- :class:`ServerSecurity`: how a *server* binds its port (TLS certificate,
  key, trust and whether client certificates are required).

``None`` for either means plaintext without credentials (today's default).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import grpc

from proto.auth_channel import with_authentication

__all__ = ["ChannelSecurity", "ServerSecurity", "open_channel", "add_server_port", "TlsConfigError",
           "channel_credentials", "server_credentials"]


@dataclass(frozen=True)
class ChannelSecurity:
    """Client-side security of one gRPC link.

    ``tls``: use TLS (a ``minipulsar+ssl://`` URL, Pulsar's
    ``brokerClientTlsEnabled`` for a broker's own links);
    ``tls_trust_certs_file_path``: PEM CA bundle to trust (None: the system
    roots); ``tls_certificate_file_path`` / ``tls_key_file_path``: PEM client
    certificate and key for mutual TLS (both or neither);
    ``tls_hostname_override``: the name to check the server certificate
    against when it differs from the target host (gRPC's
    ``grpc.ssl_target_name_override``);
    ``authentication``: an object with ``auth_metadata() -> list[tuple[str, str]]``
    (called per call, so a refreshed token is picked up), or None.
    """

    tls: bool = False
    tls_trust_certs_file_path: Optional[str] = None
    tls_certificate_file_path: Optional[str] = None
    tls_key_file_path: Optional[str] = None
    tls_hostname_override: Optional[str] = None
    authentication: Any = None


@dataclass(frozen=True)
class ServerSecurity:
    """Server-side security of one gRPC port (Pulsar's ``tlsEnabled`` family).

    ``tls``: serve TLS only; ``tls_certificate_file_path`` /
    ``tls_key_file_path``: PEM server certificate and key;
    ``tls_trust_certs_file_path``: PEM CA bundle for client certificates;
    ``tls_require_trusted_client_cert_on_connect``: refuse clients without a
    certificate signed by that CA (mutual TLS).
    """

    tls: bool = False
    tls_certificate_file_path: Optional[str] = None
    tls_key_file_path: Optional[str] = None
    tls_trust_certs_file_path: Optional[str] = None
    tls_require_trusted_client_cert_on_connect: bool = False


def open_channel(target: str, options: Optional[Sequence[tuple]] = None,
                 security: Optional[ChannelSecurity] = None) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to ``target`` (``"host:port"``) with ``options``
    (gRPC channel args), secured as ``security`` says (None: plaintext, no
    credentials; ``tls``: gRPC SSL credentials from its PEM files, the server's
    certificate checked against ``tls_trust_certs_file_path`` and the target's
    host or ``tls_hostname_override``; ``authentication``: its metadata on every
    call, ``proto.auth_channel``). Call from the event loop that will use
    it. Raises ``TlsConfigError`` when a TLS file is missing or not PEM."""
    options = list(options or [])
    if security is None:
        return grpc.aio.insecure_channel(target, options=options)
    if security.tls:
        credentials = channel_credentials(security)
        if security.tls_hostname_override:
            options.append(("grpc.ssl_target_name_override", security.tls_hostname_override))
        channel = grpc.aio.secure_channel(target, credentials, options=options)
    else:
        channel = grpc.aio.insecure_channel(target, options=options)
    # authentication: the credentials' metadata is added to every call (TLS or not)
    return with_authentication(channel, security)


def add_server_port(server: grpc.aio.Server, address: str, security: Optional[ServerSecurity] = None) -> int:
    """Bind ``server`` to ``address`` (``"host:port"``, port 0 = any free one),
    secured as ``security`` says (None: plaintext). Returns the port bound;
    raises ``RuntimeError`` when it cannot be bound (gRPC's error) and
    ``TlsConfigError`` when its TLS files are missing or unreadable."""
    if security is not None and security.tls:
        return server.add_secure_port(address, server_credentials(security))
    return server.add_insecure_port(address)


# ---- TLS (Pulsar's tlsEnabled / tlsCertificateFilePath / tlsKeyFilePath / tlsTrustCertsFilePath) ----------

class TlsConfigError(ValueError):
    """A TLS setting that cannot be used: a missing, unreadable or non-PEM
    certificate, key or trust file, or a certificate without its key. The
    message names the setting and the file."""


def _read_pem(path: Optional[str], setting: str, marker: bytes) -> Optional[bytes]:
    """The bytes of PEM file ``path`` for ``setting`` (None when ``path`` is
    empty); ``TlsConfigError`` when it is missing, unreadable or has no
    ``-----BEGIN ...<marker>`` block."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise TlsConfigError(f"{setting} = {path!r}: cannot read it ({exc.strerror or exc})") from None
    if b"-----BEGIN" not in data or marker not in data:
        raise TlsConfigError(f"{setting} = {path!r}: not a PEM file with a {marker.decode()} block")
    return data


def _key_pair(cert_path: Optional[str], key_path: Optional[str], required: bool,
              who: str) -> tuple[Optional[bytes], Optional[bytes]]:
    if bool(cert_path) != bool(key_path):
        raise TlsConfigError(f"{who}: tls_certificate_file_path and tls_key_file_path go together "
                             f"(got certificate {cert_path!r}, key {key_path!r})")
    if required and not cert_path:
        raise TlsConfigError(f"{who}: TLS is enabled but tls_certificate_file_path / tls_key_file_path are not set")
    return (_read_pem(cert_path, "tls_certificate_file_path", b"CERTIFICATE"),
            _read_pem(key_path, "tls_key_file_path", b"PRIVATE KEY"))


def channel_credentials(security: ChannelSecurity) -> grpc.ChannelCredentials:
    """gRPC SSL channel credentials of ``security`` (its files are read now):
    the trust bundle (None: the system roots) and, for mutual TLS, the client
    certificate chain and key. Raises ``TlsConfigError`` for bad files."""
    roots = _read_pem(security.tls_trust_certs_file_path, "tls_trust_certs_file_path", b"CERTIFICATE")
    chain, key = _key_pair(security.tls_certificate_file_path, security.tls_key_file_path, False, "TLS client")
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)


def server_credentials(security: ServerSecurity) -> grpc.ServerCredentials:
    """gRPC SSL server credentials of ``security`` (its files are read now):
    certificate and key (required), and the client trust bundle; clients must
    present a certificate it signs when
    ``tls_require_trusted_client_cert_on_connect`` (mutual TLS). Raises
    ``TlsConfigError`` for bad or missing files."""
    chain, key = _key_pair(security.tls_certificate_file_path, security.tls_key_file_path, True, "TLS server")
    roots = _read_pem(security.tls_trust_certs_file_path, "tls_trust_certs_file_path", b"CERTIFICATE")
    if security.tls_require_trusted_client_cert_on_connect and roots is None:
        raise TlsConfigError("tls_require_trusted_client_cert_on_connect needs tls_trust_certs_file_path: the CA "
                             "that signs the clients' certificates")
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=roots,
                                       require_client_auth=bool(security.tls_require_trusted_client_cert_on_connect))
