"""What a failed TLS handshake means, in words a user can act on.

gRPC reports every transport failure as UNAVAILABLE with the TLS library's
reason buried in the details (``Tls handshake failed (TSI_PROTOCOL_FAILURE):
SSL_ERROR_SSL: ... WRONG_VERSION_NUMBER``); a plaintext client that reaches a
TLS port only sees ``Socket closed``. :func:`describe_tls_failure` turns those
details into one sentence naming what to check (Pulsar's client says the same
things in its ``PulsarClientException`` messages). Pure: no I/O; the probe that
tells a TLS port from a plain one is :func:`probe_speaks_tls`.
"""
from __future__ import annotations

import asyncio
import ssl
from typing import Optional

__all__ = ["describe_tls_failure", "is_tls_handshake_failure", "probe_speaks_tls"]

_HANDSHAKE = ("tls handshake failed", "ssl handshake failed", "ssl_error_ssl", "handshake failed",
              "hostname verification check failed", "custom verification check failed")


def is_tls_handshake_failure(details: str) -> bool:
    """True when gRPC error ``details`` report a failed TLS handshake of a TLS client."""
    text = (details or "").lower()
    return any(needle in text for needle in _HANDSHAKE)


def describe_tls_failure(details: str, tls: Optional[bool], target: str = "") -> Optional[str]:
    """A clear sentence for a connection failure with gRPC ``details`` on a
    channel to ``target`` (``"host:port"``) that is TLS (``tls`` True), plain
    (False) or unknown (None); None when the details show no TLS problem.

    Cases: a TLS client at a plain port (``WRONG_VERSION_NUMBER``), a server
    certificate not signed by the trusted CA (``CERTIFICATE_VERIFY_FAILED``), a
    certificate that does not name the host, and a TLS client whose connection
    the server closed during the handshake (mutual TLS without a trusted client
    certificate). A plaintext client at a TLS port only sees ``Socket closed``:
    see :func:`probe_speaks_tls`.
    """
    text = (details or "").lower()
    at = f" at {target}" if target else ""
    if "wrong_version_number" in text or "http_request" in text or "packet_length_too_long" in text:
        return (f"TLS handshake failed{at}: the server does not speak TLS on this port (a plain port?); use a "
                f"minipulsar:// URL for a plain port, or the server's TLS port (is tls_enabled on there?)")
    if "certificate_verify_failed" in text or "unable to get local issuer" in text or "self signed" in text \
            or "self-signed" in text:
        return (f"TLS handshake failed{at}: the server's certificate is not trusted; check "
                f"tls_trust_certs_file_path (--tls-trust-certs-file-path): it must hold the CA that signed the "
                f"server's certificate")
    if "peer name" in text or "hostname verification" in text or "subject alternative" in text \
            or "name mismatch" in text:
        return (f"TLS handshake failed{at}: the server's certificate does not name this host; connect with a "
                f"host listed in its subject alternative names (`minipulsar tls create-cert --host HOST`)")
    if "certificate_expired" in text or "certificate has expired" in text:
        return f"TLS handshake failed{at}: a certificate has expired; renew it"
    if is_tls_handshake_failure(details):
        first = (details or "").strip().splitlines()[0][:200]
        return f"TLS handshake failed{at} ({first}); check the TLS settings of both sides"
    if tls and ("socket closed" in text or "connection reset" in text):
        return (f"the server{at} closed the connection during the TLS handshake: if it requires client "
                f"certificates (tls_require_trusted_client_cert_on_connect), set tls_certificate_file_path and "
                f"tls_key_file_path to a certificate signed by a CA it trusts")
    return None


async def probe_speaks_tls(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether ``host:port`` completes a TLS handshake (no verification: only to
    tell a TLS port from a plain one when a plaintext client saw ``Socket
    closed``). False on any failure or after ``timeout`` seconds."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    host = host[1:-1] if host.startswith("[") else host
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=context), timeout)
    except Exception:  # noqa: BLE001 - any failure means "not a TLS port we could reach"
        return False
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except Exception:  # noqa: BLE001
        pass
    return True


def plaintext_at_tls_port(target: str) -> str:
    """The message for a plaintext client that reached a TLS port at ``target``."""
    return (f"the server at {target} speaks TLS on this port: use a minipulsar+ssl:// URL (or the "
            f"--tls-trust-certs-file-path / tls_trust_certs_file_path of its CA), or the server's plain port")


__all__.append("plaintext_at_tls_port")
