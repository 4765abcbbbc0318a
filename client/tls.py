"""The SDK's TLS options (pulsar-client's names: ``tls_trust_certs_file_path``,
``tls_allow_insecure_connection``, ``tls_validate_hostname``,
``tls_certificate_file_path`` / ``tls_key_file_path``, ``use_tls``) turned into
the ``proto.channels.ChannelSecurity`` of a client's channels.

A ``minipulsar+ssl://`` service URL (Pulsar's ``pulsar+ssl://``) or
``use_tls=True`` means TLS on every channel of the client: to the service URL
and to every broker a lookup names. gRPC always verifies the server's
certificate chain and that it names the host of the URL, so
``tls_allow_insecure_connection=True`` and ``tls_validate_hostname=False`` are
accepted (Pulsar's defaults are False / False) but cannot loosen the checks: a
warning says so.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

from proto.channels import ChannelSecurity
from proto.errors import InvalidConfiguration
from proto.service_url import ServiceUrl

__all__ = ["tls_channel_security", "TLS_OPTION_NAMES"]

log = logging.getLogger(__name__)

# the client keyword arguments this module reads (Pulsar's Client(...) names)
TLS_OPTION_NAMES = ("use_tls", "tls_trust_certs_file_path", "tls_allow_insecure_connection", "tls_validate_hostname",
                    "tls_certificate_file_path", "tls_key_file_path")


def tls_channel_security(url: ServiceUrl, use_tls: bool = False, tls_trust_certs_file_path: Optional[str] = None,
                         tls_allow_insecure_connection: bool = False, tls_validate_hostname: Optional[bool] = None,
                         tls_certificate_file_path: Optional[str] = None,
                         tls_key_file_path: Optional[str] = None) -> Optional[ChannelSecurity]:
    """The ``ChannelSecurity`` of a client of ``url`` (None: plaintext).

    TLS when ``url.tls`` (``minipulsar+ssl://``) or ``use_tls``; the server
    certificate must chain to ``tls_trust_certs_file_path`` (PEM; None: the
    system roots) and name the URL's host; ``tls_certificate_file_path`` /
    ``tls_key_file_path``: a client certificate (mutual TLS). Raises
    ``InvalidConfiguration`` when a file does not exist, when only one of the
    certificate and key is given, or when TLS files are given for a plaintext
    ``minipulsar://`` URL (a TLS setting that would silently do nothing).
    """
    files = {"tls_trust_certs_file_path": tls_trust_certs_file_path,
             "tls_certificate_file_path": tls_certificate_file_path, "tls_key_file_path": tls_key_file_path}
    for name, path in files.items():
        if path is not None and not isinstance(path, str):
            raise InvalidConfiguration(f"{name} must be a file path (str), got {type(path).__name__}")
        if path and not os.path.isfile(path):
            raise InvalidConfiguration(f"{name} = {path!r}: no such file")
    if bool(tls_certificate_file_path) != bool(tls_key_file_path):
        raise InvalidConfiguration("tls_certificate_file_path and tls_key_file_path go together (a client "
                                   "certificate for mutual TLS needs its private key)")
    tls = bool(url.tls or use_tls)
    if not tls:
        given = [name for name, path in files.items() if path]
        if given:
            raise InvalidConfiguration(f"{', '.join(given)} given but the service URL {url} is not TLS: use "
                                       f"minipulsar+ssl://host:port for a broker with tls_enabled")
        return None
    if tls_allow_insecure_connection:
        log.warning("tls_allow_insecure_connection=True is ignored: gRPC always verifies the broker's "
                    "certificate; give its CA as tls_trust_certs_file_path")
    if tls_validate_hostname is False:
        log.debug("tls_validate_hostname=False: gRPC still checks that the certificate names the URL's host")
    return ChannelSecurity(tls=True, tls_trust_certs_file_path=tls_trust_certs_file_path or None,
                           tls_certificate_file_path=tls_certificate_file_path or None,
                           tls_key_file_path=tls_key_file_path or None)
