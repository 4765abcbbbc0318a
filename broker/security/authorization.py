"""Authorization (Pulsar's ``AuthorizationService`` with its
``PulsarAuthorizationProvider``): who may produce, consume, look up and
administer what.

The model is Pulsar's:

- **superusers** (``superuser_roles`` of the broker config) may do everything;
- **tenant admins** (the tenant's ``admin_roles``, ``tenants create --admin-roles``)
  may administer the tenant's namespaces and topics, and produce and consume on them;
- **permissions** ``produce`` / ``consume`` (``functions`` and the other Pulsar
  actions accepted and ignored) granted to a role on a namespace
  (``auth_policies.namespace_auth``) or on one topic
  (``auth_policies.destination_auth``, keyed by the topic's full name, of the
  partitioned topic for its partitions), both stored in the namespace's policies;
- **subscription permissions**: a subscription listed in
  ``auth_policies.subscription_auth_roles`` may be consumed only by the roles
  listed there (an empty list: by anyone with ``consume``).

Lookups (and stats, partition metadata, last message id) need ``produce`` or
``consume``. The pure decisions are the functions of this module;
:class:`AuthorizationService` reads the policies and raises
``AuthorizationError`` naming the role, the action and the resource.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from proto.errors import AuthorizationError, NotFound
from proto.topic_name import TopicName

__all__ = ["ACTIONS", "IGNORED_ACTIONS", "check_actions", "topic_actions", "subscription_allows",
           "AuthorizationService", "admin_rule"]

ACTIONS = ("produce", "consume")
# Pulsar's other AuthAction values: accepted in grants, never needed by minipulsar
IGNORED_ACTIONS = ("functions", "sources", "sinks", "packages")


def check_actions(actions: Any) -> list[str]:
    """The sorted, de-duplicated action list of a grant (``["consume", "produce"]``);
    raises ValueError naming an unknown action or an empty list."""
    if isinstance(actions, str):
        actions = [a.strip() for a in actions.split(",") if a.strip()]
    if not isinstance(actions, (list, tuple)) or not actions or not all(isinstance(a, str) for a in actions):
        raise ValueError("actions must be a non-empty list of produce, consume (functions ignored)")
    unknown = [a for a in actions if a not in ACTIONS + IGNORED_ACTIONS]
    if unknown:
        raise ValueError(f"unknown action(s) {', '.join(unknown)}; use produce, consume "
                         f"(or {', '.join(IGNORED_ACTIONS)}, accepted and ignored)")
    return sorted(set(actions))


def topic_actions(auth_policies: dict, topic: TopicName, role: str) -> set[str]:
    """The actions ``role`` holds on ``topic`` from a namespace's ``auth_policies``:
    its namespace grant plus the grants on the topic (and, for a partition, on its
    partitioned topic)."""
    actions = set((auth_policies.get("namespace_auth") or {}).get(role, ()))
    destinations = auth_policies.get("destination_auth") or {}
    for name in {str(topic), str(topic.partitioned_topic_name)}:
        actions.update((destinations.get(name) or {}).get(role, ()))
    return actions


def subscription_allows(auth_policies: dict, subscription: Optional[str], role: str) -> bool:
    """Whether the subscription-level restriction lets ``role`` use ``subscription``:
    true unless the subscription lists roles and ``role`` is not one of them (Pulsar's
    ``subscription_auth_roles``)."""
    if not subscription:
        return True
    roles = (auth_policies.get("subscription_auth_roles") or {}).get(subscription)
    return not roles or role in roles


# admin method -> (what it needs, the body field naming the resource)
_SUPERUSER, _ANY, _TENANT_ADMIN, _LOOKUP, _CONSUME, _NS_READ = \
    "superuser", "any", "tenant-admin", "lookup", "consume", "namespace-read"
_ADMIN_RULES: dict[str, tuple[str, Optional[str]]] = {
    "clusters.create": (_SUPERUSER, None), "clusters.update": (_SUPERUSER, None),
    "clusters.delete": (_SUPERUSER, None), "clusters.get": (_SUPERUSER, None), "clusters.list": (_ANY, None),
    "tenants.create": (_SUPERUSER, None), "tenants.update": (_SUPERUSER, None),
    "tenants.delete": (_SUPERUSER, None), "tenants.list": (_SUPERUSER, None),
    "tenants.get": (_TENANT_ADMIN, "tenant"), "namespaces.list": (_TENANT_ADMIN, "tenant"),
    "brokers.health": (_ANY, None), "brokers.list": (_SUPERUSER, None), "brokers.leader_broker": (_SUPERUSER, None),
    "topics.list": (_NS_READ, "namespace"), "topics.list_partitioned": (_NS_READ, "namespace"),
    "topics.stats": (_LOOKUP, "topic"), "topics.internal_stats": (_LOOKUP, "topic"),
    "topics.partitioned_metadata": (_LOOKUP, "topic"), "topics.lookup": (_LOOKUP, "topic"),
    "topics.subscriptions": (_CONSUME, "topic"), "topics.unsubscribe": (_CONSUME, "topic"),
    "topics.create_subscription": (_CONSUME, "topic"), "topics.reset_cursor": (_CONSUME, "topic"),
    "topics.skip": (_CONSUME, "topic"), "topics.last_message_id": (_LOOKUP, "topic"),
}


def admin_rule(method: str) -> tuple[str, Optional[str]]:
    """``(need, field)`` of admin ``method``: ``need`` is "superuser", "any" (any
    authenticated role), "tenant-admin", "lookup", "consume" or "namespace-read";
    ``field`` the body field naming the tenant / namespace / topic. Other
    ``namespaces.*`` and ``topics.*`` verbs need a tenant admin of their namespace
    or topic; anything else a superuser."""
    if method in _ADMIN_RULES:
        return _ADMIN_RULES[method]
    if isinstance(method, str) and method.startswith("namespaces."):
        return _TENANT_ADMIN, "namespace"
    if isinstance(method, str) and method.startswith("topics."):
        return _TENANT_ADMIN, "topic"
    return _SUPERUSER, None


class AuthorizationService:
    """Authorization checks of one broker over its metadata (``resources``:
    ``broker.service.resources.Resources``) and ``superuser_roles``. Each
    ``check_*`` returns None when allowed and raises ``AuthorizationError``
    naming the role, the action and the resource otherwise; ``can_*`` answer
    True/False. A namespace or tenant that does not exist grants nothing (a
    superuser then gets the real NotFound from the call itself)."""

    def __init__(self, resources: Any, superuser_roles: Iterable[str]):
        self.resources = resources
        self.superuser_roles = frozenset(superuser_roles)

    def is_superuser(self, role: Optional[str]) -> bool:
        """Whether ``role`` is one of ``superuser_roles``."""
        return role is not None and role in self.superuser_roles

    async def is_tenant_admin(self, tenant: str, role: str) -> bool:
        """Whether ``role`` is a superuser or one of ``tenant``'s ``admin_roles``."""
        if self.is_superuser(role):
            return True
        try:
            info = await self.resources.get_tenant(tenant)
        except (NotFound, ValueError, Exception):  # noqa: BLE001 - a bad name grants nothing either
            return False
        return role in (info.get("admin_roles") or [])

    async def _auth_policies(self, namespace: str) -> dict:
        try:
            return dict((await self.resources.get_policies(namespace)).auth_policies or {})
        except Exception:  # noqa: BLE001 - NotFound, bad name: no grants
            return {}

    async def can_topic(self, topic: str | TopicName, role: str, action: str,
                        subscription: Optional[str] = None) -> bool:
        """Whether ``role`` may ``action`` ("produce", "consume" or "lookup" = either)
        on ``topic`` (a consume through ``subscription``): superuser, tenant admin,
        or a grant, within the subscription's restriction."""
        tn = topic if isinstance(topic, TopicName) else TopicName.get(topic)
        if self.is_superuser(role):
            return True
        if await self.is_tenant_admin(tn.tenant, role):
            return True
        auth = await self._auth_policies(tn.namespace)
        held = topic_actions(auth, tn, role)
        if action == "lookup":
            return bool(held & {"produce", "consume"})
        if action == "consume" and not subscription_allows(auth, subscription, role):
            return False
        return action in held

    async def check_topic(self, topic: str | TopicName, role: str, action: str,
                          subscription: Optional[str] = None) -> None:
        """Raise AuthorizationError unless :meth:`can_topic`."""
        if not await self.can_topic(topic, role, action, subscription):
            what = "produce or consume" if action == "lookup" else action
            sub = ""
            if action == "consume" and subscription:
                auth = await self._auth_policies(TopicName.get(str(topic)).namespace)
                if not subscription_allows(auth, subscription, role):
                    sub = (f" through subscription {subscription!r} (reserved to roles "
                           f"{', '.join(sorted(auth['subscription_auth_roles'][subscription]))})")
            raise AuthorizationError(f"role {role!r} is not authorized to {what} on {topic}{sub}; grant it with: "
                                     f"minipulsar-admin namespaces grant-permission NS --role {role} "
                                     f"--actions {what.replace(' or ', ',')} "
                                     f"(or topics grant-permission)")

    async def check_namespace_read(self, namespace: str, role: str) -> None:
        """List a namespace's topics: superuser, tenant admin, or a namespace grant."""
        if self.is_superuser(role) or await self.is_tenant_admin(namespace.split("/")[0], role):
            return
        auth = await self._auth_policies(namespace)
        if set((auth.get("namespace_auth") or {}).get(role, ())) & {"produce", "consume"}:
            return
        raise AuthorizationError(f"role {role!r} has no permission on namespace {namespace}")

    async def check_admin(self, method: str, body: dict, role: str) -> None:
        """Whether ``role`` may run admin ``method`` with ``body`` (see :func:`admin_rule`);
        raises AuthorizationError naming what it needs. A body without the field
        naming the resource needs a superuser (the verb reports the bad body)."""
        need, field = admin_rule(method)
        if need == _ANY or self.is_superuser(role):
            return
        value = body.get(field) if field and isinstance(body, dict) else None
        if need == _SUPERUSER or not isinstance(value, str):
            raise AuthorizationError(f"admin {method} needs a superuser role (superuser_roles); "
                                     f"role {role!r} is not one")
        try:
            if need == _TENANT_ADMIN:
                tenant = value.split("/")[0] if field != "topic" else TopicName.get(value).tenant
                if await self.is_tenant_admin(tenant, role):
                    return
                raise AuthorizationError(f"admin {method} needs an admin of tenant {tenant} "
                                         f"(tenants create/update --admin-roles) or a superuser; "
                                         f"role {role!r} is neither")
            if need == _NS_READ:
                await self.check_namespace_read(value, role)
                return
            await self.check_topic(value, role, "consume" if need == _CONSUME else "lookup",
                                   body.get("subscription") if need == _CONSUME else None)
        except AuthorizationError:
            raise
        except Exception:  # noqa: BLE001 - a malformed name: the verb itself reports it to a superuser
            raise AuthorizationError(f"admin {method}: role {role!r} is not authorized on {value!r}") from None
