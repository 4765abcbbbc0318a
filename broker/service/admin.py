"""Admin verbs (Pulsar's admin REST resources: Clusters, Tenants, Namespaces,
PersistentTopics) as ``method -> handler(service, body) -> JSON-able result``.

:data:`HANDLERS` maps a method name ("topics.create", ...) to its handler and
:data:`SCHEMAS` to its body's fields (:class:`Arg`); :func:`dispatch` checks a
request with :func:`check_body` before the handler runs, so handlers only see
bodies of the right shape. Handlers raise NotFound / AlreadyExists /
InvalidArgument / PreconditionFailed (broker.service.errors), answered with
the gRPC status of that name.

Each broker keeps its own cluster's metadata: a call changes only the broker
it is sent to. The geo demo configures every cluster by calling each one.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, Awaitable, Callable, Optional

from broker.ledger.position import Position
from broker.security.replication_rules import check_clusters_for_tenant
from proto.errors import NotAllowed
from proto.topic_name import TopicName

from .broker_service import BrokerService
from .errors import InvalidArgument, NotFound, ServiceNotReady
from .resources import Resources, check_name, check_subscription_name

Handler = Callable[[BrokerService, dict], Awaitable[Any]]
HANDLERS: dict[str, Handler] = {}
SCHEMAS: dict[str, dict[str, "Arg"]] = {}


@dataclasses.dataclass(frozen=True)
class Arg:
    """One field of an admin request body: its JSON type (``expected`` names it
    for the error message, ``is_type`` tests it), an optional ``check`` of the
    value (raises InvalidArgument / InvalidTopicName) and whether it is required.
    A null value counts as absent."""

    expected: str
    is_type: Callable[[Any], bool]
    check: Optional[Callable[[str, Any], Any]] = None
    required: bool = True

    def optional(self) -> "Arg":
        """This Arg with ``required=False`` (the field may be absent or null)."""
        return dataclasses.replace(self, required=False)

    def validated(self, check: Callable[[str, Any], Any]) -> "Arg":
        """This Arg with ``check(key, value)`` run after the type test; ``check``
        raises InvalidArgument / InvalidTopicName on a bad value."""
        return dataclasses.replace(self, check=check)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_STR = Arg("a string", lambda v: isinstance(v, str))
_INT = Arg("an integer", _is_int)
_BOOL = Arg("true or false", lambda v: isinstance(v, bool))
_STR_LIST = Arg("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))


def _check_topic(key: str, value: str) -> None:
    TopicName.get(value)                                   # InvalidTopicName saying what is wrong


def _check_namespace(key: str, value: str) -> None:
    Resources._split_ns(value)                             # InvalidArgument: use tenant/namespace


def _named(kind: str) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        for name in (value if isinstance(value, list) else [value]):
            check_name(kind, name)
    return check


def _check_subscription(key: str, value: str) -> None:
    check_subscription_name(value)


def _check_service_url(key: str, value: str) -> None:
    from proto.service_url import parse_service_url
    from proto.errors import InvalidConfiguration
    try:
        parse_service_url(value)
    except InvalidConfiguration as exc:
        raise InvalidArgument(exc.message) from None


TOPIC = _STR.validated(_check_topic)
NAMESPACE = _STR.validated(_check_namespace)
TENANT = _STR.validated(_named("tenant"))
CLUSTER = _STR.validated(_named("cluster"))
CLUSTERS = _STR_LIST.validated(_named("cluster"))
SUBSCRIPTION = _STR.validated(_check_subscription)
SERVICE_URL = _STR.validated(_check_service_url)


def _check_role(key: str, value: Any) -> None:
    for role in (value if isinstance(value, list) else [value]):
        if not role.strip():
            raise InvalidArgument(f"{key}: a role must be a non-empty string")


def _check_actions(key: str, value: Any) -> None:
    from broker.security.authorization import check_actions
    try:
        check_actions(value)
    except ValueError as exc:
        raise InvalidArgument(f"{key}: {exc}") from None


ROLE = _STR.validated(_check_role)
ROLES = _STR_LIST.validated(_check_role)
ACTIONS = _STR_LIST.validated(_check_actions)


def verb(method: str, /, **fields: Arg):
    """Register the handler of admin ``method`` whose body has ``fields`` (checked by :func:`check_body`)."""
    def register(fn: Handler) -> Handler:
        HANDLERS[method] = fn
        SCHEMAS[method] = fields
        return fn
    return register


def _json_kind(value: Any) -> str:
    """A JSON value named for a user: 'the number 5', 'the string "5"', 'null'."""
    if value is None:
        return "null"
    kind = ("true/false" if isinstance(value, bool) else "the number" if isinstance(value, (int, float))
            else "the string" if isinstance(value, str) else "a list" if isinstance(value, list)
            else "an object" if isinstance(value, dict) else f"a {type(value).__name__}")
    text = json.dumps(value, default=str)
    return f"{kind} {text[:60] + '...' if len(text) > 63 else text}"


def check_body(method: str, body: dict) -> dict:
    """The one place admin arguments are checked: every required field present,
    no unknown field, each value of its JSON type and valid for its kind (topic
    names, namespaces, tenant/cluster/subscription names, service URLs). Returns
    the body without null fields; raises InvalidArgument / InvalidTopicName
    naming the method, the field and what to send instead."""
    fields = SCHEMAS[method]
    body = {k: v for k, v in body.items() if v is not None}
    unknown = sorted(set(body) - set(fields))
    if unknown:
        known = ", ".join(fields) if fields else "none"
        raise InvalidArgument(f"{method}: unknown field(s) {', '.join(map(repr, unknown))} (fields: {known})")
    for key, arg in fields.items():
        if key not in body:
            if arg.required:
                raise InvalidArgument(f"{method}: missing field {key!r} ({arg.expected})")
            continue
        value = body[key]
        if not arg.is_type(value):
            raise InvalidArgument(f"{method}: field {key!r} must be {arg.expected}, got {_json_kind(value)}")
        if arg.check is not None:
            arg.check(key, value)
    return body


async def dispatch(service: BrokerService, method: str, body_json: str) -> str:
    """Run one admin verb; returns the JSON answer (sorted keys). Raises
    InvalidArgument for an unknown verb, a body longer than the broker config's
    ``http_max_request_size`` (Pulsar's httpMaxRequestSize; 1 MiB for a service
    without a config; compared with the body's length in characters, before it
    is parsed), malformed JSON, JSON that
    is not an object, or a body that does not fit the verb's fields
    (:func:`check_body`), and the handler's errors."""
    if not isinstance(method, str) or method not in HANDLERS:
        raise InvalidArgument(f"unknown admin method {method!r}; known: {', '.join(sorted(HANDLERS))}")
    handler = HANDLERS[method]
    limit = getattr(getattr(service, "config", None), "http_max_request_size", 1024 * 1024)
    if len(body_json) > limit:
        raise InvalidArgument(f"{method}: the request body has {len(body_json):,} characters, over "
                              f"http_max_request_size={limit:,} bytes; send a smaller request")
    try:
        body = json.loads(body_json) if body_json else {}
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidArgument(f"admin request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidArgument(f"{method}: the request body must be a JSON object, got {_json_kind(body)}")
    result = await handler(service, check_body(method, body))
    return json.dumps(result, sort_keys=True, default=str)


# ---- clusters -----------------------------------------------------------
def _cluster_auth(b: dict) -> dict:
    """The cluster data keys of Pulsar's ClusterData.authenticationPlugin / Parameters
    (the replicators' credentials towards that cluster) given in ``b``."""
    from proto.authentication import authentication_from_params
    from proto.errors import InvalidConfiguration
    extra = {k: b[k] for k in ("authentication_plugin", "authentication_parameters") if k in b}
    try:
        authentication_from_params(extra.get("authentication_plugin"), extra.get("authentication_parameters"))
    except InvalidConfiguration as exc:
        raise InvalidArgument(f"authentication_parameters: {exc.message}") from None
    return extra


@verb("clusters.create", name=CLUSTER, service_url=SERVICE_URL, service_url_tls=SERVICE_URL.optional(),
      authentication_plugin=_STR.optional(), authentication_parameters=_STR.optional())
async def _clusters_create(s: BrokerService, b: dict):
    await s.resources.create_cluster(b["name"], b["service_url"], b.get("service_url_tls"), _cluster_auth(b))
    return {"ok": True}


@verb("clusters.update", name=CLUSTER, service_url=SERVICE_URL, service_url_tls=SERVICE_URL.optional(),
      authentication_plugin=_STR.optional(), authentication_parameters=_STR.optional())
async def _clusters_update(s: BrokerService, b: dict):
    await s.resources.update_cluster(b["name"], b["service_url"], b.get("service_url_tls"), _cluster_auth(b))
    if "authentication_parameters" in b:
        await s.on_cluster_credentials_changed(b["name"])
    return {"ok": True}


@verb("clusters.list")
async def _clusters_list(s: BrokerService, b: dict):
    return await s.resources.list_clusters()


@verb("clusters.get", name=CLUSTER)
async def _clusters_get(s: BrokerService, b: dict):
    return await s.resources.get_cluster(b["name"])


@verb("clusters.delete", name=CLUSTER)
async def _clusters_delete(s: BrokerService, b: dict):
    name = b["name"]
    await s.resources.delete_cluster(name)
    await s.on_cluster_deleted(name)
    return {"ok": True}


# ---- tenants ------------------------------------------------------------
@verb("tenants.create", tenant=TENANT, allowed_clusters=CLUSTERS.optional(), admin_roles=ROLES.optional())
async def _tenants_create(s: BrokerService, b: dict):
    clusters = b.get("allowed_clusters")
    if clusters is None:
        clusters = [s.config.cluster_name]
    await s.resources.create_tenant(b["tenant"], clusters, b.get("admin_roles"))
    return {"ok": True}


@verb("tenants.update", tenant=TENANT, allowed_clusters=CLUSTERS, admin_roles=ROLES.optional())
async def _tenants_update(s: BrokerService, b: dict):
    await s.resources.update_tenant(b["tenant"], b["allowed_clusters"], b.get("admin_roles"))
    await _recheck_tenant(s, b["tenant"])
    return {"ok": True}


@verb("tenants.list")
async def _tenants_list(s: BrokerService, b: dict):
    return await s.resources.list_tenants()


@verb("tenants.get", tenant=TENANT)
async def _tenants_get(s: BrokerService, b: dict):
    return await s.resources.get_tenant(b["tenant"])


@verb("tenants.delete", tenant=TENANT)
async def _tenants_delete(s: BrokerService, b: dict):
    await s.resources.delete_tenant(b["tenant"])
    return {"ok": True}


# ---- namespaces ---------------------------------------------------------
@verb("namespaces.create", namespace=NAMESPACE)
async def _ns_create(s: BrokerService, b: dict):
    await s.resources.create_namespace(b["namespace"])
    return {"ok": True}


@verb("namespaces.list", tenant=TENANT)
async def _ns_list(s: BrokerService, b: dict):
    return await s.resources.list_namespaces(b["tenant"])


@verb("namespaces.policies", namespace=NAMESPACE)
async def _ns_policies(s: BrokerService, b: dict):
    return dataclasses.asdict(await s.resources.get_policies(b["namespace"]))


@verb("namespaces.delete", namespace=NAMESPACE)
async def _ns_delete(s: BrokerService, b: dict):
    ns = b["namespace"]
    if await s.list_topics(ns):
        from .errors import PreconditionFailed
        raise PreconditionFailed(f"namespace {ns} still has topics; delete them first")
    await s.resources.delete_namespace(ns)
    return {"ok": True}


async def _update_policies(s: BrokerService, namespace: str, **changes) -> dict:
    policies = await s.resources.get_policies(namespace)
    policies = dataclasses.replace(policies, **changes)
    await s.resources.set_policies(namespace, policies)
    await s.on_policies_changed(namespace, policies)
    return dataclasses.asdict(policies)


@verb("namespaces.set_deduplication", namespace=NAMESPACE, enabled=_BOOL)
async def _ns_dedup(s: BrokerService, b: dict):
    ns = b["namespace"]
    enabled = b["enabled"]
    result = await _update_policies(s, ns, deduplication_enabled=enabled)
    for topic in list(s.topics.values()):
        if topic.name.namespace == ns:
            await topic.set_dedup_enabled(enabled)
    return result


@verb("namespaces.set_clusters", namespace=NAMESPACE, clusters=CLUSTERS)
async def _ns_clusters(s: BrokerService, b: dict):
    ns = b["namespace"]
    clusters = b["clusters"]
    tenant = await s.resources.get_tenant(ns.split("/")[0])
    known = set(await s.resources.list_clusters())
    unknown = [c for c in clusters if c not in known]
    if unknown:
        raise NotFound(f"unknown cluster(s) {', '.join(unknown)}; register them first with: "
                       f"minipulsar-admin clusters create NAME --url minipulsar://HOST:PORT")
    check_clusters_for_tenant(clusters, ns.split("/")[0], tenant)    # Pulsar's validateClusterForTenant
    return await _update_policies(s, ns, replication_clusters=list(clusters))


@verb("namespaces.set_message_ttl", namespace=NAMESPACE, ttl_seconds=_INT)
async def _ns_ttl(s: BrokerService, b: dict):
    ttl = b["ttl_seconds"]
    if ttl < 0:
        raise InvalidArgument("ttl_seconds must be >= 0")
    return await _update_policies(s, b["namespace"], message_ttl_in_seconds=ttl)


@verb("namespaces.set_retention", namespace=NAMESPACE, retention_time_minutes=_INT, retention_size_mb=_INT)
async def _ns_retention(s: BrokerService, b: dict):
    t = b["retention_time_minutes"]
    size = b["retention_size_mb"]
    if t < -1 or size < -1:
        raise InvalidArgument("retention_time_minutes and retention_size_mb must be >= -1 (-1 = infinite, 0 = none)")
    result = await _update_policies(s, b["namespace"], retention_time_in_minutes=t, retention_size_in_mb=size)
    for topic in list(s.topics.values()):
        if topic.name.namespace == b["namespace"]:
            topic.ml.config.default_retention_time_in_minutes = t
            topic.ml.config.default_retention_size_in_mb = size
    return result


# ---- permissions (Pulsar's namespaces/topics grant-permission, AuthPolicies) ----------
async def _recheck(s: BrokerService, namespace: str) -> None:
    """After a permission change: end the streams of ``namespace`` whose role lost it."""
    security = getattr(s, "security", None)
    if security is not None:
        await security.recheck_namespace(s, namespace)


async def _recheck_tenant(s: BrokerService, tenant: str) -> None:
    security = getattr(s, "security", None)
    if security is not None:
        for namespace in {t.name.namespace for t in list(s.topics.values()) if t.name.tenant == tenant}:
            await security.recheck_namespace(s, namespace)


async def _set_auth(s: BrokerService, namespace: str, change: Callable[[dict], None]) -> dict:
    """Apply ``change`` to a copy of the namespace's ``auth_policies``, store it, re-check streams."""
    policies = await s.resources.get_policies(namespace)
    auth = json.loads(json.dumps(policies.auth_policies or {}))
    for key in ("namespace_auth", "destination_auth", "subscription_auth_roles"):
        auth.setdefault(key, {})
    change(auth)
    await _update_policies(s, namespace, auth_policies=auth)
    await _recheck(s, namespace)
    return auth


@verb("namespaces.grant_permission", namespace=NAMESPACE, role=ROLE, actions=ACTIONS)
async def _ns_grant(s: BrokerService, b: dict):
    """Grant ``actions`` (produce, consume; functions ignored) on a namespace to ``role``."""
    from broker.security.authorization import check_actions
    actions = check_actions(b["actions"])
    auth = await _set_auth(s, b["namespace"], lambda a: a["namespace_auth"].__setitem__(b["role"], actions))
    return auth["namespace_auth"]


@verb("namespaces.revoke_permission", namespace=NAMESPACE, role=ROLE)
async def _ns_revoke(s: BrokerService, b: dict):
    """Revoke every namespace-level action of ``role`` (its connected streams end)."""
    auth = await _set_auth(s, b["namespace"], lambda a: a["namespace_auth"].pop(b["role"], None))
    return auth["namespace_auth"]


@verb("namespaces.permissions", namespace=NAMESPACE)
async def _ns_permissions(s: BrokerService, b: dict):
    """``{role: [actions]}`` granted on the namespace."""
    return dict(((await s.resources.get_policies(b["namespace"])).auth_policies or {}).get("namespace_auth", {}))


@verb("namespaces.grant_subscription_permission", namespace=NAMESPACE, subscription=SUBSCRIPTION, roles=ROLES)
async def _ns_grant_sub(s: BrokerService, b: dict):
    """Reserve ``subscription`` of the namespace's topics to ``roles`` (added to those it has)."""
    def change(a: dict) -> None:
        a["subscription_auth_roles"][b["subscription"]] = sorted(
            set(a["subscription_auth_roles"].get(b["subscription"], [])) | set(b["roles"]))
    return (await _set_auth(s, b["namespace"], change))["subscription_auth_roles"]


@verb("namespaces.revoke_subscription_permission", namespace=NAMESPACE, subscription=SUBSCRIPTION, role=ROLE)
async def _ns_revoke_sub(s: BrokerService, b: dict):
    """Remove ``role`` from the roles of ``subscription`` (no roles left: open to any consume permission)."""
    def change(a: dict) -> None:
        roles = [r for r in a["subscription_auth_roles"].get(b["subscription"], []) if r != b["role"]]
        if roles:
            a["subscription_auth_roles"][b["subscription"]] = roles
        else:
            a["subscription_auth_roles"].pop(b["subscription"], None)
    return (await _set_auth(s, b["namespace"], change))["subscription_auth_roles"]


# ---- topics ---------------------------------------------------------------
def _topic(b: dict) -> TopicName:
    return TopicName.get(b["topic"])


@verb("topics.create", topic=TOPIC)
async def _topics_create(s: BrokerService, b: dict):
    tn = _topic(b)
    if await s.metadata.exists(f"/managed-ledgers/{tn.persistence_naming}"):
        from .errors import AlreadyExists
        raise AlreadyExists(f"topic {tn} already exists")
    await s.get_topic(tn, create=True)
    return {"ok": True}


@verb("topics.create_partitioned", topic=TOPIC, partitions=_INT)
async def _topics_create_partitioned(s: BrokerService, b: dict):
    tn = _topic(b)
    if tn.is_partition:
        raise InvalidArgument(f"{tn} names a partition; give the partitioned topic's name")
    await s.namespace_policies(tn.namespace)
    partitions = b["partitions"]
    if await s.metadata.exists(f"/managed-ledgers/{tn.persistence_naming}"):
        from .errors import AlreadyExists
        raise AlreadyExists(f"{tn} already exists as a non-partitioned topic; delete it first or use another name")
    await s.resources.create_partitioned_topic(tn.persistence_naming, partitions)
    return {"ok": True, "partitions": partitions}


@verb("topics.update_partitioned", topic=TOPIC, partitions=_INT)
async def _topics_update_partitioned(s: BrokerService, b: dict):
    """Pulsar's updatePartitionedTopic: more partitions, never fewer (a message
    stored in a removed partition would never be read again)."""
    tn = _topic(b)
    if tn.is_partition:
        raise InvalidArgument(f"{tn} names a partition; give the partitioned topic's name")
    path = s.resources.partitioned_path(tn.persistence_naming)
    got = await s.metadata.get(path)
    if got is None:
        raise NotFound(f"{tn} is not a partitioned topic; create it with: "
                       f"minipulsar-admin topics create-partitioned-topic {tn} -p N")
    current = int(json.loads(got.value)["partitions"])
    wanted = b["partitions"]
    if wanted < current:
        raise InvalidArgument(f"{tn} has {current} partitions: the number of partitions can only grow "
                              f"(asked for {wanted})")
    if wanted > current:
        await s.metadata.put(path, json.dumps({"partitions": wanted}).encode(), got.version)
    return {"ok": True, "partitions": wanted, "previous": current}


@verb("topics.partitioned_metadata", topic=TOPIC)
async def _topics_pmeta(s: BrokerService, b: dict):
    return {"partitions": await s.resources.get_partitions(_topic(b).persistence_naming)}


@verb("topics.list", namespace=NAMESPACE)
async def _topics_list(s: BrokerService, b: dict):
    return await s.list_topics(b["namespace"])


@verb("topics.list_partitioned", namespace=NAMESPACE)
async def _topics_list_partitioned(s: BrokerService, b: dict):
    ns = b["namespace"]
    return [f"persistent://{ns}/{n}" for n in await s.resources.list_partitioned_topics(ns)]


async def _existing(s: BrokerService, tn: TopicName):
    return await s.get_topic(tn, create=False)


@verb("topics.stats", topic=TOPIC)
async def _topics_stats(s: BrokerService, b: dict):
    tn = _topic(b)
    partitions = await s.resources.get_partitions(tn.persistence_naming)
    if partitions:
        parts = {str(tn.partition(i)): (await _existing(s, tn.partition(i))).stats() for i in range(partitions)
                 if await s.metadata.exists(f"/managed-ledgers/{tn.partition(i).persistence_naming}")}
        agg = {"partitions": parts,
               "msgInCounter": sum(p["msgInCounter"] for p in parts.values()),
               "msgRateIn": sum(p["msgRateIn"] for p in parts.values()),
               "storageSize": sum(p["storageSize"] for p in parts.values())}
        return agg
    stats = (await _existing(s, tn)).stats()
    stats["ownerBroker"] = s.service_url  # the broker serving the topic (Pulsar's topic stats ownerBroker)
    return stats


@verb("topics.internal_stats", topic=TOPIC)
async def _topics_internal_stats(s: BrokerService, b: dict):
    return (await _existing(s, _topic(b))).internal_stats()


@verb("topics.delete", topic=TOPIC, force=_BOOL.optional())
async def _topics_delete(s: BrokerService, b: dict):
    await s.delete_topic(b["topic"], force=b.get("force", False))
    return {"ok": True}


@verb("topics.unload", topic=TOPIC)
async def _topics_unload(s: BrokerService, b: dict):
    await s.unload_topic(b["topic"])
    return {"ok": True}


async def _topic_or_partitions(s: BrokerService, tn: TopicName) -> list:
    """The loaded topic, or every partition of a partitioned topic."""
    partitions = await s.resources.get_partitions(tn.persistence_naming)
    if partitions:
        return [await _existing(s, tn.partition(i)) for i in range(partitions)]
    return [await _existing(s, tn)]


@verb("topics.subscriptions", topic=TOPIC)
async def _topics_subs(s: BrokerService, b: dict):
    """Durable subscriptions; of a partitioned topic: those of any partition."""
    return sorted({name for topic in await _topic_or_partitions(s, _topic(b)) for name in topic.subscriptions})


@verb("topics.unsubscribe", topic=TOPIC, subscription=SUBSCRIPTION)
async def _topics_unsub(s: BrokerService, b: dict):
    """Delete a subscription; of a partitioned topic: on every partition that has it."""
    found = False
    for topic in await _topic_or_partitions(s, _topic(b)):
        sub = topic.subscriptions.get(b["subscription"])
        if sub is not None:
            await sub.unsubscribe()
            found = True
    if not found:
        raise NotFound(f"subscription {b['subscription']} does not exist on {_topic(b)}")
    return {"ok": True}


@verb("topics.create_subscription", topic=TOPIC, subscription=SUBSCRIPTION, message_id=_STR.optional(),
      is_excluded=_BOOL.optional())
async def _topics_create_sub(s: BrokerService, b: dict):
    """Pulsar's createSubscription: a durable subscription whose next message is
    ``message_id`` ("ledger:entry", "earliest" or "latest", the default), or the
    one after it with ``is_excluded``; of a partitioned topic: on every partition.
    AlreadyExists when a partition has it."""
    from .errors import AlreadyExists
    from .subscription import Subscription
    from .topic import INTERNAL_CURSOR_PREFIXES
    name = b["subscription"]
    if name.startswith(INTERNAL_CURSOR_PREFIXES):
        raise InvalidArgument(f"subscription names starting with 'pulsar.' are reserved: {name}")
    target = str(b.get("message_id", "latest")).strip().lower()
    position = None
    if target not in ("earliest", "latest"):
        try:
            position = Position.parse(target)
        except ValueError as exc:
            raise InvalidArgument(f"message_id: {exc}; give 'ledger:entry', 'earliest' or 'latest'") from None
    topics = await _topic_or_partitions(s, _topic(b))
    for topic in topics:
        if name in topic.subscriptions:
            raise AlreadyExists(f"subscription {name} already exists on {topic.name}")
    for topic in topics:
        initial = target
        if position is not None:   # the cursor's mark-delete position: the entry before the next one
            md = position if b.get("is_excluded") else Position(position.ledger_id, position.entry_id - 1)
            initial = (md.ledger_id, md.entry_id)
        cursor = await topic.ml.open_cursor(name, initial_position=initial)
        topic.subscriptions.setdefault(name, Subscription(topic, name, cursor))
    return {"ok": True}


@verb("topics.reset_cursor", topic=TOPIC, subscription=SUBSCRIPTION, message_id=_STR.optional(),
      timestamp_ms=_INT.optional(), is_excluded=_BOOL.optional())
async def _topics_reset(s: BrokerService, b: dict):
    """Pulsar's resetCursor: ``message_id`` is the next message delivered, or
    with ``is_excluded`` the one after it; or the first published at/after ``timestamp_ms``."""
    topic = await _existing(s, _topic(b))
    sub = topic.subscriptions.get(b["subscription"])
    if sub is None:
        raise NotFound(f"subscription {b['subscription']} does not exist on {topic.name}")
    if "message_id" in b:
        try:
            pos = Position.parse(str(b["message_id"]))
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if b.get("is_excluded"):
            pos = topic.ml.next_position(pos)
    elif "timestamp_ms" in b:
        from .seek import find_position_by_publish_time
        pos = await find_position_by_publish_time(topic.ml, b["timestamp_ms"])
    else:
        raise InvalidArgument("give message_id ('ledger:entry') or timestamp_ms")
    await sub.reset_cursor(pos)
    return {"ok": True, "position": str(pos)}


@verb("topics.skip", topic=TOPIC, subscription=SUBSCRIPTION, count=_INT.optional())
async def _topics_skip(s: BrokerService, b: dict):
    """Pulsar's skipMessages / clearBacklog (``count`` absent): acknowledge the next
    ``count`` unacknowledged entries of the subscription (a batch entry counts once,
    as Pulsar's ``skipEntries``), or every entry up to the last one. Returns
    ``{"skipped": entries, "markDeletePosition": "ledger:entry"}``; NotFound for an
    unknown subscription, InvalidArgument for a count below 1."""
    topic = await _existing(s, _topic(b))
    sub = topic.subscriptions.get(b["subscription"])
    if sub is None:
        raise NotFound(f"subscription {b['subscription']} does not exist on {topic.name}")
    count = b.get("count")
    if count is not None and count < 1:
        raise InvalidArgument(f"count must be >= 1 (got {count}); leave it out to skip the whole backlog")
    cursor, ml = sub.cursor, topic.ml
    last = ml.last_confirmed
    if count is None:
        before = cursor.number_of_entries_in_backlog()
        if last > cursor.mark_delete_position:
            await cursor.mark_delete(last)
        skipped = before
    else:
        positions, pos = [], ml.next_position(cursor.mark_delete_position)
        while pos <= last and len(positions) < count:   # bounded by the real backlog
            if not cursor.is_acknowledged(pos):
                positions.append(pos)
            pos = ml.next_position(pos)
            if len(positions) % 10_000 == 0:
                await asyncio.sleep(0)                   # a long backlog never stalls the loop
        if positions:
            await cursor.delete(positions)
        skipped = len(positions)
    sub.after_mark_delete_moved_by_update()              # consumers drop what they held of it
    return {"skipped": skipped, "markDeletePosition": str(cursor.mark_delete_position)}


@verb("topics.last_message_id", topic=TOPIC)
async def _topics_last_message_id(s: BrokerService, b: dict):
    """The last entry a consumer can receive (markers skipped), ``-1:-1`` fields when
    the topic is empty (Pulsar's getLastMessageId, MessageIdImpl's JSON):
    ``{"ledgerId", "entryId", "partitionIndex"}``. Loads the topic (TopicNotFound
    when it does not exist and cannot be created)."""
    tn = _topic(b)
    last = await (await s.get_topic(tn)).last_message_position()
    return {"ledgerId": last.ledger_id, "entryId": last.entry_id,
            "partitionIndex": tn.partition_index}


@verb("topics.set_replication_clusters", topic=TOPIC, clusters=CLUSTERS)
async def _topics_set_repl(s: BrokerService, b: dict):
    tn = _topic(b)
    clusters = b["clusters"]
    policies = await s.namespace_policies(tn.namespace)
    known = set(await s.resources.list_clusters())
    unknown = [c for c in clusters if c not in known]
    if unknown:
        raise NotFound(f"unknown cluster(s) {', '.join(unknown)}")
    # Pulsar's validateClusterForTenant, as the namespace verb: a tenant admin replicates only within its tenant
    check_clusters_for_tenant(clusters, tn.tenant, await s.resources.get_tenant(tn.tenant))
    base = tn.partitioned_topic_name.persistence_naming
    tp = await s.resources.get_topic_policies(base)
    tp["replication_clusters"] = clusters
    await s.resources.set_topic_policies(base, tp)
    await s.on_policies_changed(tn.namespace, policies)
    return tp


@verb("topics.grant_permission", topic=TOPIC, role=ROLE, actions=ACTIONS)
async def _topics_grant(s: BrokerService, b: dict):
    """Grant ``actions`` on one topic (of a partitioned topic: on all its partitions) to ``role``."""
    from broker.security.authorization import check_actions
    tn = _topic(b).partitioned_topic_name
    actions = check_actions(b["actions"])
    auth = await _set_auth(s, tn.namespace,
                           lambda a: a["destination_auth"].setdefault(str(tn), {}).__setitem__(b["role"], actions))
    return auth["destination_auth"].get(str(tn), {})


@verb("topics.revoke_permission", topic=TOPIC, role=ROLE)
async def _topics_revoke(s: BrokerService, b: dict):
    """Revoke ``role``'s topic-level actions on the topic (namespace grants stay)."""
    tn = _topic(b).partitioned_topic_name

    def change(a: dict) -> None:
        roles = a["destination_auth"].get(str(tn), {})
        roles.pop(b["role"], None)
        if not roles:
            a["destination_auth"].pop(str(tn), None)
    auth = await _set_auth(s, tn.namespace, change)
    return auth["destination_auth"].get(str(tn), {})


@verb("topics.permissions", topic=TOPIC)
async def _topics_permissions(s: BrokerService, b: dict):
    """``{role: [actions]}`` on the topic: the namespace's grants merged with the topic's (Pulsar)."""
    tn = _topic(b).partitioned_topic_name
    auth = (await s.resources.get_policies(tn.namespace)).auth_policies or {}
    merged = {role: set(actions) for role, actions in auth.get("namespace_auth", {}).items()}
    for role, actions in auth.get("destination_auth", {}).get(str(tn), {}).items():
        merged.setdefault(role, set()).update(actions)
    return {role: sorted(actions) for role, actions in merged.items()}


@verb("topics.inject_send_failure", topic=TOPIC, count=_INT)
async def _topics_inject(s: BrokerService, b: dict):
    """Refuse the next ``count`` sends to a topic (only with enable_fault_injection)."""
    if not s.config.enable_fault_injection:
        from .errors import PreconditionFailed
        raise PreconditionFailed("fault injection is off; start the broker with enable_fault_injection = true")
    if b["count"] < 0:
        raise InvalidArgument("count must be >= 0")
    topic = await s.get_topic(_topic(b), create=True)
    topic.fail_next_sends = b["count"]
    return {"ok": True}


@verb("brokers.health")
async def _health(s: BrokerService, b: dict):
    return {"ok": True, "cluster": s.config.cluster_name, "topics": len(s.topics)}


# ---- broker clusters: brokers, bundles, lookup (Pulsar's /admin/v2/brokers, namespaces/{ns}/bundles) ----

def _cluster_ns(s: BrokerService):
    ns = getattr(s, "namespace_service", None)
    if ns is None:
        raise NotAllowed("this broker is standalone (metadata store not shared): it owns every topic and has no "
                         "bundles to list, unload or split; start brokers with --metadata-store-url etcd://...")
    return ns


@verb("brokers.list")
async def _brokers_list(s: BrokerService, b: dict):
    """Live brokers with their load reports (Pulsar's ``brokers list`` + load report)."""
    ns = getattr(s, "namespace_service", None)
    if ns is None:
        return [{"service_url": s.service_url, "standalone": True, "topics": len(s.topics)}]
    leader = await ns.leader_url()
    return [{**r.to_json(), "leader": r.service_url == leader} for r in await ns.live_brokers()]


@verb("brokers.leader_broker")
async def _brokers_leader(s: BrokerService, b: dict):
    """The leader broker's service URL (Pulsar's ``brokers leader-broker``)."""
    ns = getattr(s, "namespace_service", None)
    if ns is None:
        return {"service_url": s.service_url}
    leader = await ns.leader_url()
    if leader is None:
        raise ServiceNotReady("no leader broker elected yet; retry")
    return {"service_url": leader}


@verb("topics.lookup", topic=TOPIC)
async def _topics_lookup(s: BrokerService, b: dict):
    """The broker serving a topic, assigning it when unowned (Pulsar's ``topics lookup``)."""
    ns = getattr(s, "namespace_service", None)
    if ns is None:
        return {"broker_url": s.service_url}
    return {"broker_url": await ns.find_owner(str(_topic(b))), "bundle": str(await ns.bundle_of(_topic(b)))}


@verb("namespaces.bundles", namespace=NAMESPACE)
async def _namespaces_bundles(s: BrokerService, b: dict):
    """Bundles of a namespace with their owners (Pulsar's ``namespaces bundles``)."""
    await s.resources.get_policies(b["namespace"])
    ns = _cluster_ns(s)
    bundles = await ns.bundles_of(b["namespace"])
    out = bundles.to_json()
    out["owners"] = {bundle.range: await ns.owner_of(bundle) for bundle in bundles.bundles}
    return out


@verb("namespaces.unload", namespace=NAMESPACE, bundle=_STR.optional(), _forwarded=_BOOL.optional())
async def _namespaces_unload(s: BrokerService, b: dict):
    """Unload every bundle of a namespace, or one (``bundle`` = ``0xLOWER_0xUPPER``), from
    whichever broker owns it (Pulsar's ``namespaces unload [--bundle]``): its topics close and
    move to the broker the next lookup picks. Returns ``{"unloaded": {range: topics closed}}``."""
    await s.resources.get_policies(b["namespace"])
    ns = _cluster_ns(s)
    bundles = await ns.bundles_of(b["namespace"])
    try:
        chosen = [bundles.get(b["bundle"])] if b.get("bundle") else bundles.bundles
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    unloaded = {}
    for bundle in chosen:
        owner = await ns.owner_of(bundle)
        if owner is None:
            continue
        if owner == s.service_url:
            unloaded[bundle.range] = await ns.unload_bundle(bundle)
        elif b.get("_forwarded"):
            continue
        else:
            answer = await ns.admin_call(owner, "namespaces.unload",
                                         {"namespace": b["namespace"], "bundle": bundle.range, "_forwarded": True})
            unloaded.update(answer.get("unloaded", {}))
    return {"unloaded": unloaded}


@verb("namespaces.split_bundle", namespace=NAMESPACE, bundle=_STR)
async def _namespaces_split(s: BrokerService, b: dict):
    """Split a bundle in two equal ranges (Pulsar's ``namespaces split-bundle``), on its owner.
    Returns ``{"bundles": [range, range]}``."""
    await s.resources.get_policies(b["namespace"])
    ns = _cluster_ns(s)
    try:
        bundle = (await ns.bundles_of(b["namespace"])).get(b["bundle"])
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    owner = await ns.owner_of(bundle)
    if owner is not None and owner != s.service_url:
        return await ns.admin_call(owner, "namespaces.split_bundle", {"namespace": b["namespace"],
                                                                        "bundle": b["bundle"]})
    try:
        halves = await ns.split_bundle(bundle)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    return {"bundles": [h.range for h in halves]}
