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

__all__ = ["ChannelSecurity", "ServerSecurity", "open_channel", "add_server_port"]


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
    credentials). Call from the event loop that will use it."""
    options = list(options or [])
    if security is None:
        return grpc.aio.insecure_channel(target, options=options)
    # authentication: the credentials' metadata is added to every call
    return with_authentication(grpc.aio.insecure_channel(target, options=options), security)


def add_server_port(server: grpc.aio.Server, address: str, security: Optional[ServerSecurity] = None) -> int:
    """Bind ``server`` to ``address`` (``"host:port"``, port 0 = any free one),
    secured as ``security`` says (None: plaintext). Returns the port bound;
    raises ``RuntimeError`` when it cannot be bound (gRPC's error)."""
    return server.add_insecure_port(address)
