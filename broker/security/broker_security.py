"""The broker's security checks in one object (the part of Pulsar's
``ServerCnx`` / ``BrokerService`` that calls ``AuthenticationService`` and
``AuthorizationService``), used by the gRPC servicer:

- ``authenticate(context)``: the caller's :class:`AuthenticationResult` (None
  with ``authentication_enabled`` off);
- ``check_topic`` / ``check_admin`` / ``check_namespace_read``: no-ops with
  ``authorization_enabled`` off, else ``AuthorizationError`` naming what is missing;
- :meth:`BrokerSecurity.sweep`: every ``authentication_refresh_check_seconds``
  (Pulsar's ``authenticationRefreshCheckSeconds``) the long-lived producer and
  consumer streams are checked: a stream whose token expires before the next
  check is ended with a retriable ``ServiceNotReady`` (the client reconnects
  with a fresh token from its supplier, before the old one expires: no message
  lost, as after a topic unload; a client whose supplier hands out the same
  token reconnects until it has expired, then is refused), and, with
  authorization on, one whose role lost its permission is ended with
  ``AuthorizationError`` (the client gives up). :meth:`recheck_namespace`
  runs the permission part at once after a grant or revoke on this broker.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from proto.errors import AuthenticationError, AuthorizationError, ServiceNotReady

from .authentication import AuthenticationResult, AuthenticationService
from .authorization import AuthorizationService
from .replication_rules import may_replicate

__all__ = ["BrokerSecurity"]

log = logging.getLogger(__name__)


class BrokerSecurity:
    """Authentication and authorization of one broker from its config
    (``authentication_enabled``, ``authentication_providers``, ``token_secret_key``
    / ``token_public_key``, ``superuser_roles``, ``authorization_enabled``,
    ``authentication_refresh_check_seconds``) over ``resources`` (the broker's
    ``Resources``). Raises TokenError at construction for an unusable key."""

    def __init__(self, config: Any, resources: Any):
        self.config = config
        self.authentication: Optional[AuthenticationService] = (
            AuthenticationService.from_config(config) if config.authentication_enabled else None)
        self.authorization: Optional[AuthorizationService] = (
            AuthorizationService(resources, config.superuser_roles) if config.authorization_enabled else None)
        self._sweeper: Optional[asyncio.Task] = None

    def bind(self, resources: Any) -> None:
        """Read tenants and namespace policies from ``resources`` (the broker's
        ``Resources``, created after this object)."""
        if self.authorization is not None:
            self.authorization.resources = resources

    @property
    def enabled(self) -> bool:
        """Whether authentication or authorization is on."""
        return self.authentication is not None or self.authorization is not None

    def authenticate(self, context) -> Optional[AuthenticationResult]:
        """The caller of gRPC call ``context`` (None with authentication off). Raises
        AuthenticationError (the interceptor already refused such calls; a token
        that expired since is refused here)."""
        if self.authentication is None:
            return None
        return self.authentication.authenticate(context.invocation_metadata())

    def _role(self, who: Optional[AuthenticationResult]) -> Optional[str]:
        return None if who is None else who.role

    # ---- replicator identity (``replication_rules``, issue 32) --------------
    def may_replicate(self, who: Optional[AuthenticationResult]) -> bool:
        """Whether ``who`` may act as a geo-replicator (producer ``pulsar.repl.*`` /
        ``is_replicator``): always with authorization off, else a superuser or one of
        ``replicator_roles``."""
        return may_replicate(self._role(who), self.authorization is not None, self.config.superuser_roles,
                             getattr(self.config, "replicator_roles", ()))

    @property
    def checks_origin(self) -> bool:
        """Whether ``replicated_from`` is reserved to replicator producers (authentication
        on: roles exist); off, brokers replicate anonymously and any producer may set it."""
        return self.authentication is not None

    def check_metrics(self, headers: list) -> None:
        """``/metrics`` with ``authenticate_metrics_endpoint`` on (Pulsar's
        authenticateMetricsEndpoint): ``headers`` (``[("authorization", "Bearer ...")]``)
        must carry a valid token (AuthenticationError) of a superuser role
        (AuthorizationError; with authorization off any authenticated role). No-op when off."""
        if not getattr(self.config, "authenticate_metrics_endpoint", False):
            return
        if self.authentication is None:
            raise AuthenticationError("authenticate_metrics_endpoint needs authentication_enabled")
        who = self.authentication.authenticate(headers)
        if self.authorization is not None and not self.authorization.is_superuser(who.role):
            raise AuthorizationError(f"/metrics lists every tenant's topics: it needs a superuser role "
                                     f"(superuser_roles); role {who.role!r} is not one")

    async def check_topic(self, who: Optional[AuthenticationResult], topic, action: str,
                          subscription: Optional[str] = None) -> None:
        """``action`` ("produce", "consume", "lookup") on ``topic`` by ``who``;
        AuthorizationError when refused (no-op with authorization off)."""
        if self.authorization is not None:
            await self.authorization.check_topic(topic, self._role(who) or "", action, subscription)

    async def check_namespace_read(self, who: Optional[AuthenticationResult], namespace: str) -> None:
        """List ``namespace``'s topics; AuthorizationError when refused."""
        if self.authorization is not None:
            await self.authorization.check_namespace_read(namespace, self._role(who) or "")

    async def check_admin(self, who: Optional[AuthenticationResult], method: str, body: dict) -> None:
        """Admin ``method`` with ``body``; AuthorizationError when refused."""
        if self.authorization is not None:
            await self.authorization.check_admin(method, body, self._role(who) or "")

    # ---- long-lived streams -------------------------------------------------
    def start(self, service) -> None:
        """Start the periodic check of ``service``'s producer and consumer streams."""
        if self.enabled and self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop(service))

    async def close(self) -> None:
        """Stop the periodic check."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._sweeper = None

    @property
    def refresh_interval_s(self) -> float:
        """Seconds between two checks of the long-lived streams (at least 1)."""
        return max(1.0, float(self.config.authentication_refresh_check_seconds))

    async def _sweep_loop(self, service) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval_s)
            try:
                await self.sweep(service)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep checking
                log.exception("checking the credentials of connected streams failed")

    async def sweep(self, service, namespace: Optional[str] = None, expiry: bool = True) -> int:
        """Check every producer and consumer of ``service``'s loaded topics (of
        ``namespace`` only, when given): end those whose token expired (``expiry``)
        or whose role may no longer produce / consume. Returns how many were ended."""
        ended = 0
        memo: dict = {}  # (topic, role, action, subscription) -> refusal: one policy read per distinct check
        for topic in list(service.topics.values()):
            if namespace is not None and topic.name.namespace != namespace:
                continue
            for producer in list(topic.producers.values()):
                if producer.closed:
                    continue
                reason = await self._refusal(getattr(producer, "auth", None), topic.name, "produce", None, expiry,
                                             memo)
                if reason is not None:
                    log.info("[%s] disconnecting producer %s: %s", topic.name, producer.name, reason)
                    producer.disconnect(reason)
                    ended += 1
            for subscription in list(topic.subscriptions.values()):
                for consumer in list(subscription.consumers):
                    if consumer.closed:
                        continue
                    reason = await self._refusal(getattr(consumer, "auth", None), topic.name, "consume",
                                                 subscription.name, expiry, memo)
                    if reason is not None:
                        log.info("[%s][%s] disconnecting consumer %s: %s", topic.name, subscription.name,
                                 consumer.name, reason)
                        consumer.disconnect_error = reason
                        consumer.disconnect()
                        ended += 1
        return ended

    async def _refusal(self, who: Optional[AuthenticationResult], topic, action: str,
                       subscription: Optional[str], expiry: bool, memo: dict) -> Optional[BaseException]:
        if who is None:
            return None
        if expiry and who.expired(time.time() + self.refresh_interval_s):
            # expired, or expiring before the next check: end the stream now, so that no stream
            # outlives its token and a client with a token supplier reconnects before expiry
            return ServiceNotReady(f"the token of role {who.role} expires at "
                                   f"{time.strftime('%H:%M:%SZ', time.gmtime(who.expires_at))}, before the next "
                                   f"check; reconnect with a fresh token")
        if self.authorization is None:
            return None
        key = (str(topic), who.role, action, subscription)
        if key not in memo:
            try:
                await self.authorization.check_topic(topic, who.role, action, subscription)
                memo[key] = None
            except AuthorizationError as exc:
                memo[key] = exc
        return memo[key]

    async def recheck_namespace(self, service, namespace: str) -> None:
        """After a permission change on ``namespace``: end the streams whose role lost
        its permission (no-op with authorization off)."""
        if self.authorization is not None:
            await self.sweep(service, namespace, expiry=False)
