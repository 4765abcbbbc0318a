"""Where the client's gRPC channels go: one channel per broker (Pulsar's
``ConnectionPool``), the hosts of a multi-host service URL and which one to
ask (Pulsar's ``PulsarServiceNameResolver``), and a unary call that moves on to
the next host of the service URL when one is down.

- ``ConnectionPool``: one ``grpc.aio`` channel per gRPC target ``host:port``,
  shared by every producer, consumer, reader and lookup of a client (HTTP/2
  multiplexes their streams, as Pulsar shares one ClientCnx per broker), closed
  with the client.
- ``ServiceNameResolver`` (pure): the service URL's hosts; sticks to the host
  that last answered, moves to the next one in URL order when it fails.
- ``call_any_host``: a unary RPC on the service URL, host after host while
  they refuse connections (UNAVAILABLE from the transport), with rounds
  repeated for ``retry_for`` seconds.
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from client.connection import Backoff, channel_options, map_rpc_error
from client.errors import ConnectError
from proto.broker_pb2_grpc import PulsarBrokerStub
from proto.channels import ChannelSecurity, open_channel
from proto.service_url import ServiceUrl, parse_service_url
from proto.tls_errors import describe_tls_failure, is_tls_handshake_failure, plaintext_at_tls_port, probe_speaks_tls

__all__ = ["ConnectionPool", "ServiceNameResolver", "call_any_host", "is_connection_failure", "tls_connection_problem",
           "connection_failure_reason", "target_of", "wait_settled"]

log = logging.getLogger(__name__)


def target_of(url: str | ServiceUrl) -> str:
    """The gRPC target ``host:port`` of a broker URL ``minipulsar://host:port`` (the
    first host of a multi-host URL).  Raises ``InvalidConfiguration`` for a bad URL."""
    return (url if isinstance(url, ServiceUrl) else parse_service_url(url)).target


class ConnectionPool:
    """One ``grpc.aio`` channel per broker (Pulsar's ``ConnectionPool``), keyed by
    gRPC target ``"host:port"``.

    ``keepalive_interval_seconds`` and ``connection_timeout_ms`` configure every
    channel as ``client.connection.channel_options``; ``security``
    (``proto.channels.ChannelSecurity``, None: plaintext) secures every one.  Channels are created on
    first use, from the event loop that will use them, and live until
    ``close()`` (a broker that restarts is reconnected by gRPC itself).
    ``channel``/``stub`` raise ``ConnectError`` after ``close()``.
    """

    def __init__(self, keepalive_interval_seconds: float = 30, connection_timeout_ms: int = 10000,
                 security: ChannelSecurity | None = None):
        self._options = channel_options(keepalive_interval_seconds, connection_timeout_ms)
        self.security = security  # proto.channels.ChannelSecurity of every channel (None: plaintext)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, PulsarBrokerStub] = {}
        self._closed = False

    def channel(self, target: str) -> grpc.aio.Channel:
        """The channel to ``target`` (``"host:port"``), created on first use."""
        if self._closed:
            raise ConnectError(f"the client's connections are closed (asked for {target})")
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = open_channel(target, self._options, self.security)
            log.debug("new channel to %s (%d in the pool)", target, len(self._channels))
        return channel

    def stub(self, target: str) -> PulsarBrokerStub:
        """The ``PulsarBrokerStub`` on ``channel(target)``."""
        stub = self._stubs.get(target)
        if stub is None:
            stub = self._stubs[target] = PulsarBrokerStub(self.channel(target))
        return stub

    @property
    def targets(self) -> list[str]:
        """Targets that have a channel, in creation order."""
        return list(self._channels)

    def __len__(self) -> int:
        return len(self._channels)

    async def close(self) -> None:
        """Close every channel (their calls end with CANCELLED).  Idempotent."""
        self._closed = True
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            try:
                await channel.close()
            except Exception as exc:  # noqa: BLE001 - closing the others matters more
                log.debug("closing a channel failed: %r", exc)


class ServiceNameResolver:
    """The hosts of a service URL and which one to ask (Pulsar's
    ``PulsarServiceNameResolver``).  Pure: no I/O.

    ``current`` is the gRPC target ``"host:port"`` to ask first: the first host
    of the URL until one fails, then the host that last answered.  Unlike
    Pulsar (a random host per request), it sticks to a live host, so that a
    client's lookups and streams through the service URL share one connection.
    """

    def __init__(self, url: ServiceUrl):
        self.url = url
        self._targets = url.targets
        self._current = 0

    @property
    def current(self) -> str:
        """The target to ask first (``"host:port"``)."""
        return self._targets[self._current]

    def candidates(self) -> list[str]:
        """Every target, ``current`` first, then the following ones in URL order (wrapping)."""
        n = len(self._targets)
        return [self._targets[(self._current + i) % n] for i in range(n)]

    def mark_failed(self, target: str) -> None:
        """``target`` could not be reached: when it is ``current``, the next host becomes current."""
        if target == self.current:
            self._current = (self._current + 1) % len(self._targets)

    def mark_ok(self, target: str) -> None:
        """``target`` answered: it becomes ``current`` (unknown targets are ignored)."""
        if target in self._targets:
            self._current = self._targets.index(target)


def is_connection_failure(exc: grpc.aio.AioRpcError) -> bool:
    """True when a call failed because the broker could not be reached (gRPC
    UNAVAILABLE from the transport: connection refused, host not resolved,
    connection lost), not because a broker answered with an error (a broker's
    ``ServiceNotReady`` is UNAVAILABLE too, but carries its class name)."""
    try:
        code = exc.code()
    except Exception:  # noqa: BLE001
        return False
    return code == grpc.StatusCode.UNAVAILABLE and type(map_rpc_error(exc)) is ConnectError


def connection_failure_reason(exc: grpc.aio.AioRpcError) -> str:
    """Why a connection failed, short: 'connection refused', 'host name not resolved', ..."""
    details = (exc.details() or "").lower()
    for needle, reason in (("refused", "connection refused"), ("lookup", "host name not resolved"),
                           ("resolv", "host name not resolved"), ("dns", "host name not resolved"),
                           ("timeout", "connection timed out"), ("timed out", "connection timed out"),
                           ("unreachable", "network unreachable")):
        if needle in details:
            return reason
    return (exc.details() or "unavailable").splitlines()[0][:120]


async def tls_connection_problem(security: ChannelSecurity | None, target: str,
                                 exc: grpc.aio.AioRpcError) -> tuple[str, bool] | None:
    """``(message, definite)`` when connection failure ``exc`` on a channel to
    ``target`` secured by ``security`` is a TLS problem (``proto.tls_errors``): a failed
    handshake of a TLS client (definite), a plaintext client at a TLS port
    (``Socket closed``, confirmed by a TLS probe of the port: definite), a TLS
    client whose handshake the server closed (mutual TLS without a client
    certificate; not definite, a restarting server looks the same). None otherwise."""
    details = exc.details() or ""
    tls = bool(security is not None and security.tls)
    if is_tls_handshake_failure(details):
        return describe_tls_failure(details, tls, target), True
    if "socket closed" not in details.lower():
        return None
    if tls:
        return describe_tls_failure(details, tls, target), False
    host, _, port = target.rpartition(":")
    if port.isdigit() and await probe_speaks_tls(host, int(port)):
        return plaintext_at_tls_port(target), True
    return None


async def wait_settled(channel: grpc.aio.Channel, timeout: float) -> bool:
    """Wait until ``channel`` is READY or TRANSIENT_FAILURE (starting a connection
    from IDLE); False when it is still connecting after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    state = channel.get_state(try_to_connect=True)
    while state not in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                        grpc.ChannelConnectivity.SHUTDOWN):
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), remaining)
        except asyncio.TimeoutError:
            return False
        state = channel.get_state(try_to_connect=True)
    return True


async def call_any_host(pool: ConnectionPool, resolver: ServiceNameResolver, method: str, request, *,
                        timeout: float, what: str, connect_timeout: float, retry_for: float = 0.0,
                        map_errors: bool = True):
    """Send the unary RPC ``method`` (a ``PulsarBrokerStub`` attribute name, e.g.
    ``"Lookup"``) to the service URL: ``resolver.current`` first, then the next
    hosts while they cannot be reached.  Returns ``(response, target)``, the
    target being the host that answered (it becomes ``resolver.current``).

    Each host gets up to ``connect_timeout`` seconds to accept a connection
    (Pulsar's connectionTimeoutMs) and the call is fail-fast (not
    ``wait_for_ready``), so a refused connection moves on at once.  When no host
    could be reached, the round is repeated, with a backoff of 0.1 s doubling up
    to 1 s, until ``retry_for`` seconds have passed (0: one round; the total
    never exceeds ``timeout`` seconds).

    A host answering ``MetadataSessionLost`` (a broker that lost its metadata session:
    "ask another broker") counts as unreachable for this call: the next host is asked at
    once. Raises the broker's error as soon as a host answers with one (that host
    becomes ``resolver.current``): as ``client.errors`` (``map_rpc_error``), or
    the ``grpc.aio.AioRpcError`` itself when ``map_errors`` is False;
    ``Timeout`` when a connected host did not answer within ``timeout`` (that
    host is marked failed, so that the next call asks another one first), ``ConnectError`` when no host could be
    reached, naming each host's reason (its ``unreachable`` attribute is
    ``(service_url, reasons)`` for the command-line tools).
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + timeout
    backoff = Backoff(0.1, 1.0)
    reasons: dict[str, str] = {}
    refusals: dict[str, grpc.aio.AioRpcError] = {}   # hosts that answered "ask another broker"
    while True:
        for target in resolver.candidates():
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            channel = pool.channel(target)
            if channel.get_state(try_to_connect=False) != grpc.ChannelConnectivity.READY:
                if not await wait_settled(channel, min(remaining, connect_timeout)):
                    reasons[target] = "connection timed out"
                    resolver.mark_failed(target)
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
            try:
                response = await getattr(pool.stub(target), method)(request, timeout=remaining,
                                                                    wait_for_ready=False)
            except grpc.aio.AioRpcError as exc:
                if not is_connection_failure(exc):
                    refusal = map_rpc_error(exc, what)
                    if getattr(refusal, "try_another_host", False):
                        # a broker without its metadata session (MetadataSessionLost): the next host now
                        reasons[target] = refusal.message
                        refusals[target] = exc
                        resolver.mark_failed(target)
                        continue
                    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        resolver.mark_failed(target)  # a stuck host (paused broker): the next call starts elsewhere
                    else:
                        resolver.mark_ok(target)
                    if not map_errors:
                        raise
                    raise map_rpc_error(exc, what) from None
                reasons[target] = connection_failure_reason(exc)
                tls_problem = await tls_connection_problem(pool.security, target, exc)
                if tls_problem is not None:
                    reasons[target] = tls_problem[0]
                    if tls_problem[1]:  # a definite TLS misconfiguration: retrying cannot help
                        error = ConnectError(f"{what}: {tls_problem[0]}" if what else tls_problem[0])
                        error.retriable = error.retriable_at_creation = False
                        error.tls_problem = True  # the CLIs print its message as is
                        raise error
                log.debug("%s: %s unreachable (%s); trying the next host", what, target, reasons[target])
                resolver.mark_failed(target)
                continue
            resolver.mark_ok(target)
            return response, target
        now = loop.time()
        if now - start >= retry_for or now >= deadline:
            break
        await asyncio.sleep(min(backoff.next(), max(0.0, min(deadline, start + retry_for) - now)))
    if refusals and set(refusals) == set(reasons):
        # every host answered, none can tell (all without their metadata session: etcd down for the
        # whole cluster): the broker's retriable refusal, not "cannot connect"
        last = list(refusals.values())[-1]
        if not map_errors:
            raise last
        raise map_rpc_error(last, what) from None
    url = resolver.url
    text = "; ".join(f"{t}: {r}" for t, r in reasons.items()) or "no answer in time"
    if not url.is_multi_host:
        text = next(iter(reasons.values()), "no answer in time")
    prefix = f"{what}: " if what else ""
    error = ConnectError(f"{prefix}cannot connect to the broker at {url} ({text}); check that the broker "
                         "is running and that the service URL is right")
    error.unreachable = (str(url), text)
    raise error
