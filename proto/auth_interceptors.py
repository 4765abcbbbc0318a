"""gRPC client interceptors adding an ``Authentication``'s metadata to every call
(the client half of Pulsar's authentication: the token travels with each call
and each stream as ``authorization: Bearer <token>``).

gRPC call credentials only travel on secure channels; these interceptors work
on plaintext and TLS channels alike. ``auth_interceptors(security)`` is what
``proto.channels.open_channel`` installs: none when ``security`` has no
``authentication``, so unauthenticated channels keep their plain call path.
"""
from __future__ import annotations

from typing import Any, Optional

import grpc

__all__ = ["auth_interceptors"]


def _with_auth(details: grpc.aio.ClientCallDetails, authentication: Any) -> grpc.aio.ClientCallDetails:
    """``details`` with ``authentication.auth_metadata()`` appended to its metadata
    (asked anew for every call: a refreshed token is picked up)."""
    extra = list(authentication.auth_metadata())
    metadata = list(details.metadata or ()) + extra
    return grpc.aio.ClientCallDetails(details.method, details.timeout, grpc.aio.Metadata(*metadata),
                                      details.credentials, details.wait_for_ready)


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, authentication: Any):
        self.authentication = authentication

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(_with_auth(client_call_details, self.authentication), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, authentication: Any):
        self.authentication = authentication

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(_with_auth(client_call_details, self.authentication), request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, authentication: Any):
        self.authentication = authentication

    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(_with_auth(client_call_details, self.authentication), request_iterator)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, authentication: Any):
        self.authentication = authentication

    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(_with_auth(client_call_details, self.authentication), request_iterator)


def auth_interceptors(security: Optional[Any]) -> Optional[list]:
    """The client interceptors sending ``security.authentication``'s metadata on
    every call of a channel (one per call kind), or None when there is no
    ``authentication`` (the channel is then opened without interceptors)."""
    authentication = getattr(security, "authentication", None)
    if authentication is None:
        return None
    return [_UnaryUnary(authentication), _UnaryStream(authentication), _StreamUnary(authentication),
            _StreamStream(authentication)]
