"""Server-side authentication (Pulsar's ``AuthenticationService`` with its
``AuthenticationProviderToken``), shared by the broker and the bookie (so it
lives in ``proto``, as pulsar-common; ``broker.security.authentication``
re-exports it).

A client sends ``authorization: Bearer <JWT>`` as gRPC metadata on every call
(``client.auth.AuthenticationToken`` through ``proto.channels.open_channel``).
:class:`AuthenticationService` turns that metadata into an
:class:`AuthenticationResult` (the role = the token's ``sub``, its expiry) or
raises ``AuthenticationError`` naming what is missing or wrong;
:class:`AuthenticationInterceptor` refuses every call without valid
credentials with status UNAUTHENTICATED before the servicer sees it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import grpc

from proto.errors import AuthenticationError, to_status

from proto.auth_tokens import (KEY_PAIR_ALGORITHMS, SECRET_ALGORITHMS, TokenError, load_public_key, read_key_value,
                     validate_token)

__all__ = ["AuthenticationResult", "AuthenticationProviderToken", "AuthenticationService",
           "AuthenticationInterceptor", "PROVIDER_NAMES", "token_from_metadata"]

# Names accepted in authentication_providers for the token provider (Pulsar's class name, short forms).
PROVIDER_NAMES = ("org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
                  "AuthenticationProviderToken", "token")
_CACHE_MAX = 4096


@dataclass(frozen=True)
class AuthenticationResult:
    """Who a call is: ``role`` (the token's subject; Pulsar's principal) and
    ``expires_at`` (the token's ``exp``, seconds since the epoch; None: never)."""

    role: str
    expires_at: Optional[float] = None

    def expired(self, now: Optional[float] = None) -> bool:
        """Whether the credentials have expired at ``now`` (default: the current time)."""
        return self.expires_at is not None and (time.time() if now is None else now) >= self.expires_at


class AuthenticationProviderToken:
    """Pulsar's token provider: tokens signed with ``token_secret_key`` (HS256/384/512)
    or the private key of ``token_public_key`` (RS256/384/512), key values as
    Pulsar's (``file:///path`` or ``data:;base64,...``). Raises TokenError at
    construction when the key cannot be read."""

    auth_method_name = "token"

    def __init__(self, token_secret_key: str = "", token_public_key: str = ""):
        if bool(token_secret_key) == bool(token_public_key):
            raise TokenError("token authentication needs exactly one of token_secret_key (HS256) or "
                             "token_public_key (RS256), as file:///path or data:;base64,...")
        if token_secret_key:
            self._key: Any = read_key_value(token_secret_key)
            self._algorithms = SECRET_ALGORITHMS
        else:
            self._key = load_public_key(read_key_value(token_public_key))
            self._algorithms = KEY_PAIR_ALGORITHMS

    def authenticate(self, token: str) -> AuthenticationResult:
        """The role and expiry of a valid ``token``; raises AuthenticationError
        saying why it is refused (malformed, wrong algorithm, bad signature, expired)."""
        try:
            claims = validate_token(token, self._key, self._algorithms)
        except TokenError as exc:
            raise AuthenticationError(f"token refused: {exc}") from None
        exp = claims.get("exp")
        return AuthenticationResult(claims["sub"], float(exp) if isinstance(exp, (int, float)) else None)


def token_from_metadata(metadata: Optional[Iterable[tuple[str, Any]]]) -> Optional[str]:
    """The bearer token of gRPC ``metadata`` (``authorization: Bearer <token>``), or
    None when there is no ``authorization`` entry. Raises AuthenticationError for
    an ``authorization`` entry that is not a bearer token."""
    for key, value in metadata or ():
        if key == "authorization":
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            scheme, _, token = str(value).strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthenticationError("the 'authorization' metadata must be 'Bearer <token>'")
            return token.strip()
    return None


class AuthenticationService:
    """The providers of one server (Pulsar's AuthenticationService); today only
    :class:`AuthenticationProviderToken`. Verified tokens are cached (at most
    4,096; their expiry is still checked at every use), so a call costs a dict
    lookup once its token has been seen."""

    def __init__(self, providers: Sequence[AuthenticationProviderToken]):
        if not providers:
            raise TokenError("authentication_enabled needs a provider: authentication_providers = "
                             "[\"AuthenticationProviderToken\"] and a token key")
        self.providers = list(providers)
        self._cache: dict[str, AuthenticationResult] = {}

    @classmethod
    def from_config(cls, config: Any) -> "AuthenticationService":
        """From a broker or bookie config's ``authentication_providers`` (names in
        :data:`PROVIDER_NAMES`; empty = the token provider), ``token_secret_key`` and
        ``token_public_key``. Raises TokenError for an unknown provider or an unusable key."""
        names = list(getattr(config, "authentication_providers", None) or ["AuthenticationProviderToken"])
        unknown = [n for n in names if n not in PROVIDER_NAMES]
        if unknown:
            raise TokenError(f"unknown authentication provider(s) {', '.join(unknown)}; minipulsar has "
                             f"{PROVIDER_NAMES[0]} (or AuthenticationProviderToken)")
        return cls([AuthenticationProviderToken(config.token_secret_key, config.token_public_key)])

    def authenticate(self, metadata) -> AuthenticationResult:
        """The caller of a call with gRPC ``metadata``; raises AuthenticationError
        naming what is missing (no token) or wrong (the provider's reason)."""
        token = token_from_metadata(metadata)
        if token is None:
            raise AuthenticationError("no credentials: this server requires a token; send "
                                      "'authorization: Bearer <token>' (Client(url, authentication="
                                      "AuthenticationToken(token)), or --auth-params token:... on the CLIs)")
        result = self._cache.get(token)
        if result is None:
            error: Optional[AuthenticationError] = None
            for provider in self.providers:
                try:
                    result = provider.authenticate(token)
                    break
                except AuthenticationError as exc:
                    error = exc
            if result is None:
                raise error or AuthenticationError("token refused")
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[token] = result
        if result.expired():
            self._cache.pop(token, None)
            raise AuthenticationError(f"token refused: the token of role {result.role} expired at "
                                      f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(result.expires_at))}; "
                                      f"get a new token")
        return result


def _refusing(handler: grpc.RpcMethodHandler, error: AuthenticationError) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that ends the call with ``error``'s status."""
    code, details = to_status(error)
    status = getattr(grpc.StatusCode, code)

    async def refuse(request_or_iterator, context):
        await context.abort(status, details)

    if handler.request_streaming and handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        make = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        make = grpc.unary_stream_rpc_method_handler
    else:
        make = grpc.unary_unary_rpc_method_handler
    return make(refuse, request_deserializer=None, response_serializer=handler.response_serializer)


class AuthenticationInterceptor(grpc.aio.ServerInterceptor):
    """Server interceptor: a call without valid credentials (``service.authenticate``
    of its metadata raises AuthenticationError) ends with UNAUTHENTICATED and the
    details ``"AuthenticationError: <why>"`` before the servicer runs; other calls
    go on unchanged. Put it first in the server's interceptors."""

    def __init__(self, service: AuthenticationService):
        self.service = service

    async def intercept_service(self, continuation, handler_call_details) -> Optional[grpc.RpcMethodHandler]:
        """The method's own handler when the caller authenticates, else one refusing the call."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        try:
            self.service.authenticate(handler_call_details.invocation_metadata)
        except AuthenticationError as exc:
            return _refusing(handler, exc)
        return handler
