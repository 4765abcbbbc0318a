"""A gRPC channel that adds an ``Authentication``'s metadata to every call (the
client half of Pulsar's authentication: the token travels with each call and
each stream as ``authorization: Bearer <token>``).

gRPC call credentials only travel on secure channels, and grpc.aio's client
interceptors wrap every stream in an intercepted call (its writes go through an
extra queue and async generator). Instead, :class:`AuthenticatedChannel` wraps
the channel's multi-callables: each call gets ``metadata=`` with the
credentials' pairs (asked anew per call, so a refreshed token is used from the
next call and every stream reconnect on), and streams stay plain grpc.aio
calls. Works on plaintext and TLS channels alike; ``with_authentication``
is what ``proto.channels.open_channel`` applies (the channel unchanged when
``security`` has no ``authentication``).
"""
from __future__ import annotations

from typing import Any, Optional

import grpc

__all__ = ["AuthenticatedChannel", "with_authentication"]


class _WithMetadata:
    """A multi-callable whose calls carry ``authentication.auth_metadata()`` after
    the caller's own metadata."""

    __slots__ = ("_inner", "_authentication")

    def __init__(self, inner: Any, authentication: Any):
        self._inner = inner
        self._authentication = authentication

    def __call__(self, *args, metadata=None, **kwargs):
        pairs = list(metadata or ()) + list(self._authentication.auth_metadata())
        return self._inner(*args, metadata=pairs, **kwargs)


class AuthenticatedChannel(grpc.aio.Channel):
    """``channel`` (a ``grpc.aio.Channel``) whose stubs send ``authentication``'s
    metadata (an object with ``auth_metadata() -> [(key, value)]``) on every call;
    everything else is the channel's own."""

    def __init__(self, channel: grpc.aio.Channel, authentication: Any):
        self._channel = channel
        self.authentication = authentication

    def unary_unary(self, *args, **kwargs):
        return _WithMetadata(self._channel.unary_unary(*args, **kwargs), self.authentication)

    def unary_stream(self, *args, **kwargs):
        return _WithMetadata(self._channel.unary_stream(*args, **kwargs), self.authentication)

    def stream_unary(self, *args, **kwargs):
        return _WithMetadata(self._channel.stream_unary(*args, **kwargs), self.authentication)

    def stream_stream(self, *args, **kwargs):
        return _WithMetadata(self._channel.stream_stream(*args, **kwargs), self.authentication)

    async def __aenter__(self):
        await self._channel.__aenter__()
        return self

    async def __aexit__(self, exc_type, exc_val, exc_tb):
        return await self._channel.__aexit__(exc_type, exc_val, exc_tb)

    async def close(self, grace: Optional[float] = None):
        return await self._channel.close(grace)

    def get_state(self, try_to_connect: bool = False):
        return self._channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state):
        return await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self):
        return await self._channel.channel_ready()

    def __getattr__(self, name: str):
        return getattr(self._channel, name)


def with_authentication(channel: grpc.aio.Channel, security: Optional[Any]) -> grpc.aio.Channel:
    """``channel`` sending ``security.authentication``'s metadata on every call, or
    ``channel`` itself when ``security`` is None or has no ``authentication``."""
    authentication = getattr(security, "authentication", None)
    if authentication is None:
        return channel
    return AuthenticatedChannel(channel, authentication)
