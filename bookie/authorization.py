"""Bookie authorization: only the brokers' roles reach a bookie (BookKeeper's
``BookieAuthZFactory`` with ``authorizedRoles``).

A bookie with ``authentication_enabled`` first authenticates every call (the
token of ``authorization: Bearer <JWT>``, :mod:`proto.auth_server`), then checks
that the token's role is one of its ``authorized_roles``: the roles the brokers
present (their ``bookkeeper_client_authentication_parameters``). Any other role,
even a Pulsar superuser or a tenant's application with a valid token and a client
certificate of the same CA, ends with PERMISSION_DENIED on *every* bookie RPC
(AddEntry, ReadEntries, ReadLastAddConfirmed, Fence, DeleteLedger,
GetBookieInfo): a bookie serves ledgers, not tenants, so it has no finer rule.
As in BookKeeper, where ``BookieAuthZFactory`` refuses to initialize without
``authorizedRoles``, a bookie with authentication on and no ``authorized_roles``
refuses to start (:func:`authorization_problem`). Without authentication there
is no role to check and nothing is refused here (TLS client certificates, when
required, are the only gate then).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import grpc

from proto.auth_server import AuthenticationInterceptor, AuthenticationService, _refusing
from proto.errors import AuthenticationError, AuthorizationError

__all__ = ["BookieAuthorizationInterceptor", "authorization_problem", "interceptor_for", "parse_roles"]


def parse_roles(value: Any) -> list[str]:
    """``authorized_roles`` as a list of role names: a list of strings as is, or a
    comma-separated string (the ``--authorized-roles`` flag: ``"broker,broker-east"``);
    blanks dropped, order kept. Raises ValueError for anything else (a number, a list
    holding a non-string)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [r.strip() for r in value.split(",") if r.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(r, str) for r in value):
        return [r.strip() for r in value if r.strip()]
    raise ValueError(f"authorized_roles must be a list of role names (or a comma-separated string), got {value!r}")


def authorization_problem(config: Any) -> Optional[str]:
    """Why ``config`` (a ``BookieConfig``) cannot start for lack of authorization, or None:
    authentication on and ``authorized_roles`` empty (BookKeeper's BookieAuthZFactory
    refuses to initialize without ``authorizedRoles``), or a role that is not a string."""
    try:
        roles = parse_roles(getattr(config, "authorized_roles", None))
    except ValueError as exc:
        return str(exc)
    if getattr(config, "authentication_enabled", False) is True and not roles:
        return ("authentication_enabled = true needs authorized_roles: the roles the brokers present to this "
                "bookie (their bookkeeper_client_authentication_parameters token's subject), e.g. "
                "authorized_roles = [\"broker\"] or --authorized-roles broker; every other role is refused "
                "(BookKeeper's bookie authorization, authorizedRoles)")
    return None


class BookieAuthorizationInterceptor(AuthenticationInterceptor):
    """Server interceptor of a bookie with authentication on: a call without valid
    credentials ends with UNAUTHENTICATED (as :class:`AuthenticationInterceptor`);
    one whose role is not in ``authorized_roles`` ends with PERMISSION_DENIED and
    ``"AuthorizationError: role R may not call the bookie (...)"`` before the servicer
    runs, whatever the RPC. Raises ValueError when ``authorized_roles`` is empty."""

    def __init__(self, service: AuthenticationService, authorized_roles: Iterable[str] | str):
        super().__init__(service)
        self.authorized_roles = frozenset(parse_roles(authorized_roles))
        if not self.authorized_roles:
            raise ValueError("a bookie with authentication needs authorized_roles (the brokers' roles)")

    async def intercept_service(self, continuation, handler_call_details) -> Optional[grpc.RpcMethodHandler]:
        """The method's own handler when the caller authenticates with an authorized role,
        else one refusing the call (UNAUTHENTICATED or PERMISSION_DENIED)."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        try:
            result = self.service.authenticate(handler_call_details.invocation_metadata)
        except AuthenticationError as exc:
            return _refusing(handler, exc)
        if result.role not in self.authorized_roles:
            method = handler_call_details.method.rsplit("/", 1)[-1]
            return _refusing(handler, AuthorizationError(
                f"role {result.role} may not call the bookie ({method}): a bookie serves only the brokers' "
                f"roles (its authorized_roles)"))
        return handler


def interceptor_for(config: Any) -> BookieAuthorizationInterceptor:
    """The first interceptor of a bookie with ``authentication_enabled`` (a ``BookieConfig``):
    its token providers and ``authorized_roles``. Raises ValueError saying what to set
    (:func:`authorization_problem`) and ``proto.auth_tokens.TokenError`` for an unusable key."""
    problem = authorization_problem(config)
    if problem:
        raise ValueError(problem)
    return BookieAuthorizationInterceptor(AuthenticationService.from_config(config), config.authorized_roles)
