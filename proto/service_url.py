"""Service URLs ``minipulsar://host[:port]`` (Pulsar's ``PulsarServiceNameResolver``
checks), parsed once for the client, the broker (cluster metadata, replicators)
and the tools."""
from __future__ import annotations

import re
from dataclasses import dataclass

from proto.errors import InvalidConfiguration

__all__ = ["ServiceUrl", "parse_service_url", "SCHEME", "DEFAULT_PORT"]

SCHEME = "minipulsar"
DEFAULT_PORT = 6600  # the broker's gRPC port (DESIGN.md)
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)$")


@dataclass(frozen=True)
class ServiceUrl:
    """A parsed ``minipulsar://host:port`` service URL.

    ``host``: host name or IP (IPv6 in brackets); ``port``: TCP port (int);
    ``target``: the gRPC target string ``"host:port"``.
    """

    host: str
    port: int

    @property
    def target(self) -> str:
        """The gRPC target ``"host:port"`` (for ``grpc.aio.insecure_channel``)."""
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{SCHEME}://{self.host}:{self.port}"


def parse_service_url(url: str) -> ServiceUrl:
    """Parse a service URL ``minipulsar://host[:port]`` (port defaults to 6600;
    a trailing ``/`` is accepted).

    Raises ``InvalidConfiguration`` naming the problem for anything else: another
    scheme (``pulsar://`` is Pulsar's binary protocol, not this gRPC endpoint),
    several hosts, a path, a bad host or a port outside 1..65535.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidConfiguration(f"invalid service URL {url!r}: expected {SCHEME}://host:port")
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise InvalidConfiguration(f"invalid service URL {url!r}: missing scheme, expected {SCHEME}://host:port")
    if scheme.lower() != SCHEME:
        hint = " (pulsar:// is Pulsar's binary protocol; minipulsar brokers speak gRPC at minipulsar://)" \
            if scheme.lower() in ("pulsar", "pulsar+ssl", "http", "https") else ""
        raise InvalidConfiguration(f"invalid service URL {url!r}: unsupported scheme {scheme!r}, "
                                   f"expected {SCHEME}://host:port{hint}")
    rest = rest.rstrip("/")
    if "/" in rest or "?" in rest or "#" in rest:
        raise InvalidConfiguration(f"invalid service URL {url!r}: no path allowed, expected {SCHEME}://host:port")
    if "," in rest:
        raise InvalidConfiguration(f"invalid service URL {url!r}: several hosts are not supported, "
                                   f"give one broker as {SCHEME}://host:port")
    if "@" in rest:
        raise InvalidConfiguration(f"invalid service URL {url!r}: credentials do not go in the URL")
    if rest.startswith("["):  # IPv6 literal
        end = rest.find("]")
        if end < 0:
            raise InvalidConfiguration(f"invalid service URL {url!r}: unclosed '[' in IPv6 host")
        host, port_text = rest[:end + 1], rest[end + 1:]
        if port_text and not port_text.startswith(":"):
            raise InvalidConfiguration(f"invalid service URL {url!r}: expected ':port' after the IPv6 host")
        port_text = port_text[1:]
    else:
        host, _, port_text = rest.partition(":")
    if not host or not _HOST.match(host):
        raise InvalidConfiguration(f"invalid service URL {url!r}: bad or missing host {host!r}")
    if port_text == "":
        if rest.endswith(":"):
            raise InvalidConfiguration(f"invalid service URL {url!r}: empty port")
        port = DEFAULT_PORT
    else:
        if not port_text.isdigit():
            raise InvalidConfiguration(f"invalid service URL {url!r}: port {port_text!r} is not a number")
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise InvalidConfiguration(f"invalid service URL {url!r}: port {port} is outside 1..65535")
    return ServiceUrl(host, port)
