"""Service URLs ``minipulsar://host[:port][,host[:port]...]`` and, over TLS,
``minipulsar+ssl://...`` (Pulsar's ``pulsar+ssl://``) (Pulsar's
``PulsarServiceNameResolver`` / ``ServiceURI`` checks), parsed once for the
client, the broker (cluster metadata, replicators) and the tools.

As in Pulsar (``pulsar://h1:6650,h2:6650``), one URL may list several hosts of
the same cluster: a client asks any live one of them (lookups, metadata,
admin) and moves on to the next when one is down.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from proto.errors import InvalidConfiguration

__all__ = ["ServiceUrl", "parse_service_url", "SCHEME", "TLS_SCHEME", "DEFAULT_PORT", "DEFAULT_TLS_PORT"]

SCHEME = "minipulsar"
TLS_SCHEME = "minipulsar+ssl"  # Pulsar's pulsar+ssl://: the same gRPC endpoint over TLS
DEFAULT_PORT = 6600  # the broker's gRPC port (DESIGN.md)
DEFAULT_TLS_PORT = 6601  # the default port of a minipulsar+ssl:// URL without one (Pulsar: 6651 beside 6650)
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)$")


@dataclass(frozen=True)
class ServiceUrl:
    """A parsed service URL ``minipulsar://host:port`` or ``minipulsar://h1:p1,h2:p2``.

    ``host``/``port``: the first (or only) host, a host name or IP (IPv6 in
    brackets) and its TCP port (int); ``addresses``: every ``(host, port)`` in
    the order given (one element for a single-host URL); ``target``: the gRPC
    target ``"host:port"`` of the first host, ``targets``: those of all hosts.
    ``tls``: a ``minipulsar+ssl://`` URL (connect with TLS).
    ``str()`` gives back the normalised URL, all hosts with their ports
    (``parse_service_url(str(u)) == u``).
    """

    host: str
    port: int
    addresses: tuple[tuple[str, int], ...] = ()
    tls: bool = False

    def __post_init__(self) -> None:
        if not self.addresses:
            object.__setattr__(self, "addresses", ((self.host, self.port),))
        elif tuple(self.addresses[0]) != (self.host, self.port):
            raise ValueError(f"ServiceUrl: first address {self.addresses[0]} is not ({self.host!r}, {self.port})")
        else:
            object.__setattr__(self, "addresses", tuple((h, int(p)) for h, p in self.addresses))

    @property
    def target(self) -> str:
        """The gRPC target ``"host:port"`` of the first host (for ``grpc.aio.insecure_channel``)."""
        return f"{self.host}:{self.port}"

    @property
    def targets(self) -> list[str]:
        """The gRPC targets ``"host:port"`` of every host, in URL order."""
        return [f"{h}:{p}" for h, p in self.addresses]

    @property
    def is_multi_host(self) -> bool:
        """True when the URL lists more than one host."""
        return len(self.addresses) > 1

    def hosts(self) -> list["ServiceUrl"]:
        """One single-host ``ServiceUrl`` per host, in URL order."""
        return [ServiceUrl(h, p, tls=self.tls) for h, p in self.addresses]

    @property
    def scheme(self) -> str:
        """``minipulsar+ssl`` for a TLS URL, else ``minipulsar``."""
        return TLS_SCHEME if self.tls else SCHEME

    def __str__(self) -> str:
        return f"{self.scheme}://" + ",".join(f"{h}:{p}" for h, p in self.addresses)


def _parse_host_port(url: str, item: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """One ``host[:port]`` of a service URL (port defaults to ``default_port``); ``InvalidConfiguration`` otherwise."""
    if item.startswith("["):  # IPv6 literal
        end = item.find("]")
        if end < 0:
            raise InvalidConfiguration(f"invalid service URL {url!r}: unclosed '[' in IPv6 host")
        host, port_text = item[:end + 1], item[end + 1:]
        if port_text and not port_text.startswith(":"):
            raise InvalidConfiguration(f"invalid service URL {url!r}: expected ':port' after the IPv6 host")
        port_text = port_text[1:]
    else:
        host, _, port_text = item.partition(":")
    if not host or not _HOST.match(host):
        raise InvalidConfiguration(f"invalid service URL {url!r}: bad or missing host {host!r}")
    if port_text == "":
        if item.endswith(":"):
            raise InvalidConfiguration(f"invalid service URL {url!r}: empty port")
        return host, default_port
    if not port_text.isdigit():
        raise InvalidConfiguration(f"invalid service URL {url!r}: port {port_text!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise InvalidConfiguration(f"invalid service URL {url!r}: port {port} is outside 1..65535")
    return host, port


def parse_service_url(url: str) -> ServiceUrl:
    """Parse a service URL ``minipulsar://host[:port]`` or, several hosts of one
    cluster, ``minipulsar://h1[:p1],h2[:p2],...`` (each port defaults to 6600; a
    trailing ``/`` is accepted); ``minipulsar+ssl://...`` for the same over TLS
    (ports default to 6601; Pulsar's ``pulsar+ssl://``). Returns a ``ServiceUrl``
    whose ``host``/``port`` are the first host's and ``tls`` says which scheme.

    Raises ``InvalidConfiguration`` naming the problem for anything else: another
    scheme (``pulsar://`` is Pulsar's binary protocol, not this gRPC endpoint),
    a scheme repeated inside the host list, an empty or repeated host, a path,
    a bad host or a port outside 1..65535.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidConfiguration(f"invalid service URL {url!r}: expected {SCHEME}://host:port")
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise InvalidConfiguration(f"invalid service URL {url!r}: missing scheme, expected {SCHEME}://host:port")
    if scheme.lower() not in (SCHEME, TLS_SCHEME):
        hint = " (pulsar:// is Pulsar's binary protocol; minipulsar brokers speak gRPC at minipulsar:// " \
               "or, over TLS, minipulsar+ssl://)" if scheme.lower() in ("pulsar", "pulsar+ssl", "http", "https") \
            else ""
        raise InvalidConfiguration(f"invalid service URL {url!r}: unsupported scheme {scheme!r}, "
                                   f"expected {SCHEME}://host:port{hint}")
    tls = scheme.lower() == TLS_SCHEME
    rest = rest.rstrip("/")
    if "://" in rest:
        raise InvalidConfiguration(f"invalid service URL {url!r}: one scheme per URL; list the hosts of one "
                                   f"cluster as {SCHEME}://host1:port1,host2:port2")
    if "/" in rest or "?" in rest or "#" in rest:
        raise InvalidConfiguration(f"invalid service URL {url!r}: no path allowed, expected {SCHEME}://host:port")
    if "@" in rest:
        raise InvalidConfiguration(f"invalid service URL {url!r}: credentials do not go in the URL")
    items = rest.split(",")
    if len(items) > 1 and any(not item.strip() for item in items):
        raise InvalidConfiguration(f"invalid service URL {url!r}: empty host in the host list, expected "
                                   f"{SCHEME}://host1:port1,host2:port2")
    addresses: list[tuple[str, int]] = []
    for item in items:
        address = _parse_host_port(url, item.strip() if len(items) > 1 else item,
                                   DEFAULT_TLS_PORT if tls else DEFAULT_PORT)
        if address in addresses:
            raise InvalidConfiguration(f"invalid service URL {url!r}: host {address[0]}:{address[1]} is "
                                       "listed twice")
        addresses.append(address)
    return ServiceUrl(addresses[0][0], addresses[0][1], tuple(addresses), tls)
