"""Connection plumbing shared by the client's producers, consumers and admin:
service URL parsing (``proto.service_url``, re-exported), the gRPC channel, reconnect ``Backoff`` and mapping of
gRPC errors to ``client.errors``.

Follows Pulsar's ``PulsarServiceNameResolver`` (URL checks), ``Backoff``
(exponential with jitter) and ``ConnectionHandler`` (reconnect policy); the
transport is one ``grpc.aio`` channel per broker, pooled per client
(``client.connection_pool``; HTTP/2 multiplexes every producer and consumer
stream over it, like Pulsar's pooled ClientCnx).
"""
from __future__ import annotations

import random
import time
from typing import Callable

import grpc

from client.errors import ConnectError, PulsarException, Timeout, error_from_status
from proto.channels import ChannelSecurity, open_channel
from proto.common import GRPC_MAX_MESSAGE_BYTES, grpc_message_size_options
from proto.service_url import DEFAULT_PORT, SCHEME, ServiceUrl, parse_service_url
from proto.tls_errors import describe_tls_failure

__all__ = ["ServiceUrl", "parse_service_url", "create_channel", "channel_options", "check_reachable", "Backoff",
           "map_rpc_error", "is_retriable", "MAX_GRPC_MESSAGE_BYTES", "SCHEME", "DEFAULT_PORT"]

MAX_GRPC_MESSAGE_BYTES = GRPC_MAX_MESSAGE_BYTES  # 64 MiB, both directions


def channel_options(keepalive_interval_seconds: float = 30, connection_timeout_ms: int = 10000) -> list[tuple]:
    """gRPC channel options: 64 MiB max send/receive message length (bytes),
    keepalive pings every ``keepalive_interval_seconds`` (Pulsar's
    keepAliveIntervalSeconds, default 30 s; only while calls are active; the
    broker accepts pings up to once a second) with an ack timeout of the same
    interval (an unanswered ping closes the connection), and
    reconnect backoff capped by ``connection_timeout_ms``."""
    return [
        *grpc_message_size_options(MAX_GRPC_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", int(keepalive_interval_seconds * 1000)),
        # a ping unanswered for the interval closes the connection (a paused broker keeps its
        # TCP connection open): its streams fail and reconnect elsewhere
        ("grpc.keepalive_timeout_ms", int(keepalive_interval_seconds * 1000)),
        # keep pinging while a stream waits for an answer (gRPC stops after 2 pings without data)
        ("grpc.http2.max_pings_without_data", 0),
        # any ping (keepalive or bandwidth probe) unanswered for the interval closes the connection:
        # without it gRPC waits for a probe ping that a paused broker never answers (1 min)
        ("grpc.http2.ping_timeout_ms", int(keepalive_interval_seconds * 1000)),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", max(1000, int(connection_timeout_ms))),
        ("grpc.enable_retries", 0),
    ]


def create_channel(service_url: str | ServiceUrl, keepalive_interval_seconds: float = 30,
                   connection_timeout_ms: int = 10000, security: ChannelSecurity | None = None) -> grpc.aio.Channel:
    """One ``grpc.aio`` channel to the broker (the first host of a multi-host
    URL; ``client.connection_pool`` handles several), secured by ``security``
    (``proto.channels.ChannelSecurity``; None: plaintext, no credentials); call
    from the event loop that will use it.  Raises ``InvalidConfiguration`` for a bad URL."""
    url = service_url if isinstance(service_url, ServiceUrl) else parse_service_url(service_url)
    return open_channel(url.target, channel_options(keepalive_interval_seconds, connection_timeout_ms), security)


async def check_reachable(service_url: str | ServiceUrl, timeout_seconds: float = 2.0) -> None:
    """Fail fast when nothing accepts TCP connections at ``service_url`` (the
    command-line tools call it first; the SDK itself keeps waiting up to its
    operation timeout, as Pulsar's client does). Tries to connect for up to
    ``timeout_seconds`` (a broker that is just starting); a multi-host URL is
    reachable when one of its hosts is (tried in turn, each round). Raises
    ``ConnectError`` naming the URL and the reason (connection refused, host
    not resolved, ...; per host for a multi-host URL); its ``unreachable``
    attribute is ``(url, reason)``."""
    import asyncio
    import socket

    url = service_url if isinstance(service_url, ServiceUrl) else parse_service_url(service_url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    reasons = {target: "no answer" for target in url.targets}
    while True:
        for (host, port), target in zip(url.addresses, url.targets):
            host = host[1:-1] if host.startswith("[") else host
            per_host = max(0.05, (deadline - loop.time()) / (len(url.addresses) if url.is_multi_host else 1))
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), per_host)
            except ConnectionRefusedError:
                reasons[target] = "connection refused"
            except socket.gaierror:
                reasons[target] = "host name not resolved"
            except (asyncio.TimeoutError, TimeoutError):
                reasons[target] = "connection timed out"
            except OSError as exc:
                reasons[target] = exc.strerror or str(exc)
            else:
                writer.close()
                return
        if loop.time() + 0.2 >= deadline:
            break
        await asyncio.sleep(0.2)
    reason = "; ".join(f"{t}: {r}" for t, r in reasons.items()) if url.is_multi_host else reasons[url.target]
    error = ConnectError(f"cannot connect to the broker at {url} ({reason}); check that the broker is running "
                         f"and that the service URL is right")
    error.unreachable = (str(url), reason)
    raise error


class Backoff:
    """Exponential backoff with jitter, as Pulsar's ``Backoff``.

    Delays (seconds) start at ``initial`` (100 ms) and double up to ``max_delay``
    (30 s); each ``next()`` returns the current delay minus a random jitter of
    up to 10 % (Pulsar's ``rand % (current / 10)``), never below ``initial``
    unless ``initial`` is 0.  ``mandatory_stop`` (seconds, 0 = none): once that
    much time has passed since the first ``next()`` after a ``reset()``, the
    next delay is shortened to land on that deadline exactly once (Pulsar uses
    it for operation timeouts).  ``reset()`` after a success.  ``clock``
    (seconds, monotonic) and ``rng`` are injectable for tests.
    """

    def __init__(self, initial: float = 0.1, max_delay: float = 30.0, mandatory_stop: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None):
        if initial < 0 or max_delay < initial:
            raise ValueError(f"invalid backoff: initial {initial}s, max {max_delay}s")
        self.initial = initial
        self.max_delay = max_delay
        self.mandatory_stop = mandatory_stop
        self._clock = clock
        self._rng = rng or random.Random()
        self.reset()

    def reset(self) -> None:
        """Back to the initial delay (call after a successful (re)connection)."""
        self._next = self.initial
        self._first_attempt: float | None = None
        self._stop_applied = False
        self.attempts = 0

    def next(self) -> float:
        """The delay to wait before the next attempt (seconds), and advance."""
        current = self._next
        if current < self.max_delay:
            self._next = min(self.max_delay, self._next * 2)
        now = self._clock()
        if self._first_attempt is None:
            self._first_attempt = now
        if self.mandatory_stop > 0 and not self._stop_applied:
            remaining = self._first_attempt + self.mandatory_stop - now
            if current > remaining:
                self._stop_applied = True
                current = max(self.initial, remaining)
        if current > self.initial:
            current = max(self.initial, current - self._rng.random() * current / 10)
        self.attempts += 1
        return current

    def elapsed(self) -> float:
        """Seconds since the first ``next()`` after the last reset (0 if none)."""
        return 0.0 if self._first_attempt is None else self._clock() - self._first_attempt


def is_retriable(exc: BaseException) -> bool:
    """Whether the operation (create, send, subscribe) may succeed after a reconnect:
    the exception's own ``PulsarException.retriable``; socket errors (``OSError``) too."""
    if isinstance(exc, PulsarException):
        return bool(exc.retriable)
    return isinstance(exc, (ConnectionError, OSError))


def map_rpc_error(error: grpc.aio.AioRpcError | grpc.RpcError, what: str = "") -> PulsarException:
    """Turn a gRPC error into the matching ``client.errors`` exception
    (``errors.error_from_status`` of its code and details ``"ClassName: message"``).

    A transport-level UNAVAILABLE (no class name in the details) becomes
    ``ConnectError`` (a failed TLS handshake: a message saying what to check,
    ``proto.tls_errors``), a deadline ``Timeout``; ``what`` (e.g. ``"create producer
    on persistent://..."``) is prefixed to messages that carry no class.
    Never raises.
    """
    try:
        code = error.code()
        details = error.details() or ""
    except Exception:  # a RpcError without code()/details()
        return ConnectError(f"{what}: {error}" if what else str(error))
    exc = error_from_status(code, details)
    head = details.partition(": ")[0]
    if type(exc).__name__ != head and details != type(exc).__name__:  # no class name from the server
        prefix = f"{what}: " if what else ""
        code_name = getattr(code, "name", str(code))
        if code_name == "UNAVAILABLE" and describe_tls_failure(details, None) is not None:
            exc = ConnectError(prefix + describe_tls_failure(details, None))
        elif code_name == "UNAVAILABLE":
            exc = ConnectError(f"{prefix}broker unavailable ({details or 'connection failed'})")
        elif code_name == "DEADLINE_EXCEEDED":
            exc = Timeout(f"{prefix}deadline exceeded ({details or 'no answer in time'})")
        elif code_name == "CANCELLED":
            exc = ConnectError(f"{prefix}call cancelled ({details or 'connection closed'})")
        elif prefix:
            exc = type(exc)(prefix + exc.message)
    return exc
