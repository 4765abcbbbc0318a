"""The broker's TLS settings (``BrokerConfig``'s ``tls_*``, ``broker_client_*``
and ``bookkeeper_tls_*`` keys) as ``proto.channels`` security objects, one per
kind of link (Pulsar's ``tlsEnabled``, ``brokerClientTlsEnabled`` and
``bookkeeperTLS*`` families). Pure: the files are read when a port is bound or
a channel opened."""
from __future__ import annotations

import dataclasses
from typing import Optional

from broker.config import BrokerConfig
from proto.channels import ChannelSecurity, ServerSecurity

__all__ = ["server_security", "bookie_client_security", "broker_client_security", "remote_service_url",
           "security_for_url"]


def server_security(config: BrokerConfig) -> Optional[ServerSecurity]:
    """The broker port's ``ServerSecurity`` (None: plaintext): TLS with
    ``tls_certificate_file_path`` / ``tls_key_file_path``, client certificates
    checked against ``tls_trust_certs_file_path`` and required when
    ``tls_require_trusted_client_cert_on_connect``."""
    if not config.tls_enabled:
        return None
    return ServerSecurity(tls=True, tls_certificate_file_path=config.tls_certificate_file_path,
                          tls_key_file_path=config.tls_key_file_path,
                          tls_trust_certs_file_path=config.tls_trust_certs_file_path or None,
                          tls_require_trusted_client_cert_on_connect=config.tls_require_trusted_client_cert_on_connect)


def bookie_client_security(config: BrokerConfig) -> Optional[ChannelSecurity]:
    """The ``ChannelSecurity`` of the links to the bookies (None: plaintext):
    TLS when ``bookkeeper_tls_enabled``, trusting
    ``bookkeeper_tls_trust_certs_file_path`` (empty: the system roots), with the
    client certificate when ``bookkeeper_tls_client_authentication``."""
    if not config.bookkeeper_tls_enabled:
        return None
    client_auth = config.bookkeeper_tls_client_authentication
    return ChannelSecurity(tls=True, tls_trust_certs_file_path=config.bookkeeper_tls_trust_certs_file_path or None,
                           tls_certificate_file_path=(config.bookkeeper_tls_certificate_file_path or None)
                           if client_auth else None,
                           tls_key_file_path=(config.bookkeeper_tls_key_file_path or None) if client_auth else None)


def broker_client_security(config: BrokerConfig) -> Optional[ChannelSecurity]:
    """The ``ChannelSecurity`` of the broker's own links to other brokers and to
    remote clusters (None: plaintext): TLS when ``broker_client_tls_enabled``,
    trusting ``broker_client_trust_certs_file_path`` (empty: the system roots),
    with ``broker_client_certificate_file_path`` / ``broker_client_key_file_path``
    as client certificate when set."""
    if not config.broker_client_tls_enabled:
        return None
    return ChannelSecurity(tls=True, tls_trust_certs_file_path=config.broker_client_trust_certs_file_path or None,
                           tls_certificate_file_path=config.broker_client_certificate_file_path or None,
                           tls_key_file_path=config.broker_client_key_file_path or None)


def remote_service_url(cluster_data: dict, tls: bool) -> str:
    """The URL a broker uses to reach a cluster registered with ``cluster_data``
    (``/admin/clusters/<name>``): Pulsar's ``brokerServiceUrlTls``
    (``service_url_tls``) when the broker's client links are TLS and the cluster
    has one, else ``service_url``. Raises ``KeyError`` when neither is there."""
    if tls and cluster_data.get("service_url_tls"):
        return cluster_data["service_url_tls"]
    return cluster_data["service_url"]


def security_for_url(security: Optional[ChannelSecurity], url: str,
                     config: BrokerConfig) -> Optional[ChannelSecurity]:
    """The security of a broker's own link to ``url`` (another broker, a remote
    cluster): as in Pulsar's client, the URL's scheme decides TLS. A
    ``minipulsar+ssl://`` URL gets TLS (``security``'s trust and certificate,
    else ``broker_client_trust_certs_file_path`` / the system roots) even when
    ``broker_client_tls_enabled`` is off; a ``minipulsar://`` URL is plaintext.
    Everything else in ``security`` (its ``authentication``) is kept."""
    tls = url.strip().lower().startswith("minipulsar+ssl://")
    if security is None:
        if not tls:
            return None
        return ChannelSecurity(tls=True, tls_trust_certs_file_path=config.broker_client_trust_certs_file_path or None,
                               tls_certificate_file_path=config.broker_client_certificate_file_path or None,
                               tls_key_file_path=config.broker_client_key_file_path or None)
    if security.tls == tls:
        return security
    if not tls:
        return dataclasses.replace(security, tls=False)
    return dataclasses.replace(
        security, tls=True,
        tls_trust_certs_file_path=security.tls_trust_certs_file_path or config.broker_client_trust_certs_file_path
        or None,
        tls_certificate_file_path=security.tls_certificate_file_path or config.broker_client_certificate_file_path
        or None,
        tls_key_file_path=security.tls_key_file_path or config.broker_client_key_file_path or None)
