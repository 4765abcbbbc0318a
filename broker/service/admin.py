"""Admin verbs (Pulsar's admin REST resources: Clusters, Tenants, Namespaces,
PersistentTopics) as ``method -> handler(service, body) -> JSON-able result``.

Each broker keeps its own cluster's metadata: a call changes only the broker
it is sent to. The geo demo configures every cluster by calling each one.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Awaitable, Callable

from broker.ledger.position import Position
from client.topic_name import TopicName

from .broker_service import BrokerService
from .errors import InvalidArgument, NotFound

Handler = Callable[[BrokerService, dict], Awaitable[Any]]
HANDLERS: dict[str, Handler] = {}


def verb(name: str):
    def register(fn: Handler) -> Handler:
        HANDLERS[name] = fn
        return fn
    return register


def need(body: dict, key: str, kind: type = str):
    if key not in body:
        raise InvalidArgument(f"missing field {key!r}")
    value = body[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise InvalidArgument(f"field {key!r} must be {kind.__name__}, got {value!r}")
    return value


async def dispatch(service: BrokerService, method: str, body_json: str) -> str:
    """Run one admin verb; returns the JSON answer. Raises InvalidArgument for an
    unknown verb or malformed JSON, and the handler's errors."""
    handler = HANDLERS.get(method)
    if handler is None:
        raise InvalidArgument(f"unknown admin method {method!r}; known: {', '.join(sorted(HANDLERS))}")
    try:
        body = json.loads(body_json) if body_json else {}
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"admin request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidArgument("admin request body must be a JSON object")
    result = await handler(service, body)
    return json.dumps(result, sort_keys=True, default=str)


# ---- clusters -----------------------------------------------------------
@verb("clusters.create")
async def _clusters_create(s: BrokerService, b: dict):
    await s.resources.create_cluster(need(b, "name"), need(b, "service_url"))
    return {"ok": True}


@verb("clusters.update")
async def _clusters_update(s: BrokerService, b: dict):
    await s.resources.update_cluster(need(b, "name"), need(b, "service_url"))
    return {"ok": True}


@verb("clusters.list")
async def _clusters_list(s: BrokerService, b: dict):
    return await s.resources.list_clusters()


@verb("clusters.get")
async def _clusters_get(s: BrokerService, b: dict):
    return await s.resources.get_cluster(need(b, "name"))


@verb("clusters.delete")
async def _clusters_delete(s: BrokerService, b: dict):
    name = need(b, "name")
    await s.resources.delete_cluster(name)
    await s.on_cluster_deleted(name)
    return {"ok": True}


# ---- tenants ------------------------------------------------------------
@verb("tenants.create")
async def _tenants_create(s: BrokerService, b: dict):
    clusters = b.get("allowed_clusters")
    if clusters is None:
        clusters = [s.config.cluster_name]
    await s.resources.create_tenant(need(b, "tenant"), clusters)
    return {"ok": True}


@verb("tenants.update")
async def _tenants_update(s: BrokerService, b: dict):
    await s.resources.update_tenant(need(b, "tenant"), need(b, "allowed_clusters", list))
    return {"ok": True}


@verb("tenants.list")
async def _tenants_list(s: BrokerService, b: dict):
    return await s.resources.list_tenants()


@verb("tenants.get")
async def _tenants_get(s: BrokerService, b: dict):
    return await s.resources.get_tenant(need(b, "tenant"))


@verb("tenants.delete")
async def _tenants_delete(s: BrokerService, b: dict):
    await s.resources.delete_tenant(need(b, "tenant"))
    return {"ok": True}


# ---- namespaces ---------------------------------------------------------
@verb("namespaces.create")
async def _ns_create(s: BrokerService, b: dict):
    await s.resources.create_namespace(need(b, "namespace"))
    return {"ok": True}


@verb("namespaces.list")
async def _ns_list(s: BrokerService, b: dict):
    return await s.resources.list_namespaces(need(b, "tenant"))


@verb("namespaces.policies")
async def _ns_policies(s: BrokerService, b: dict):
    return dataclasses.asdict(await s.resources.get_policies(need(b, "namespace")))


@verb("namespaces.delete")
async def _ns_delete(s: BrokerService, b: dict):
    ns = need(b, "namespace")
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


@verb("namespaces.set_deduplication")
async def _ns_dedup(s: BrokerService, b: dict):
    ns = need(b, "namespace")
    enabled = need(b, "enabled", bool)
    result = await _update_policies(s, ns, deduplication_enabled=enabled)
    for topic in list(s.topics.values()):
        if topic.name.namespace == ns:
            await topic.set_dedup_enabled(enabled)
    return result


@verb("namespaces.set_clusters")
async def _ns_clusters(s: BrokerService, b: dict):
    ns = need(b, "namespace")
    clusters = need(b, "clusters", list)
    tenant = await s.resources.get_tenant(ns.split("/")[0])
    known = set(await s.resources.list_clusters())
    unknown = [c for c in clusters if c not in known]
    if unknown:
        raise NotFound(f"unknown cluster(s) {', '.join(unknown)}; register them first with: "
                       f"minipulsar-admin clusters create NAME --url minipulsar://HOST:PORT")
    not_allowed = [c for c in clusters if c not in tenant.get("allowed_clusters", [])]
    if not_allowed:
        raise InvalidArgument(f"cluster(s) {', '.join(not_allowed)} are not allowed for tenant {ns.split('/')[0]} "
                              f"(allowed: {', '.join(tenant.get('allowed_clusters', []))}); "
                              f"update it with: minipulsar-admin tenants update")
    return await _update_policies(s, ns, replication_clusters=list(clusters))


@verb("namespaces.set_message_ttl")
async def _ns_ttl(s: BrokerService, b: dict):
    ttl = need(b, "ttl_seconds", int)
    if ttl < 0:
        raise InvalidArgument("ttl_seconds must be >= 0")
    return await _update_policies(s, need(b, "namespace"), message_ttl_in_seconds=ttl)


@verb("namespaces.set_retention")
async def _ns_retention(s: BrokerService, b: dict):
    t = need(b, "retention_time_minutes", int)
    size = need(b, "retention_size_mb", int)
    result = await _update_policies(s, need(b, "namespace"), retention_time_in_minutes=t, retention_size_in_mb=size)
    for topic in list(s.topics.values()):
        if topic.name.namespace == b["namespace"]:
            topic.ml.config.default_retention_time_in_minutes = t
            topic.ml.config.default_retention_size_in_mb = size
    return result


# ---- topics ---------------------------------------------------------------
def _topic(b: dict) -> TopicName:
    return TopicName.get(need(b, "topic"))


@verb("topics.create")
async def _topics_create(s: BrokerService, b: dict):
    tn = _topic(b)
    if await s.metadata.exists(f"/managed-ledgers/{tn.persistence_naming}"):
        from .errors import AlreadyExists
        raise AlreadyExists(f"topic {tn} already exists")
    await s.get_topic(tn, create=True)
    return {"ok": True}


@verb("topics.create_partitioned")
async def _topics_create_partitioned(s: BrokerService, b: dict):
    tn = _topic(b)
    if tn.is_partition:
        raise InvalidArgument(f"{tn} names a partition; give the partitioned topic's name")
    await s.namespace_policies(tn.namespace)
    partitions = need(b, "partitions", int)
    await s.resources.create_partitioned_topic(tn.persistence_naming, partitions)
    return {"ok": True, "partitions": partitions}


@verb("topics.partitioned_metadata")
async def _topics_pmeta(s: BrokerService, b: dict):
    return {"partitions": await s.resources.get_partitions(_topic(b).persistence_naming)}


@verb("topics.list")
async def _topics_list(s: BrokerService, b: dict):
    return await s.list_topics(need(b, "namespace"))


@verb("topics.list_partitioned")
async def _topics_list_partitioned(s: BrokerService, b: dict):
    ns = need(b, "namespace")
    return [f"persistent://{ns}/{n}" for n in await s.resources.list_partitioned_topics(ns)]


async def _existing(s: BrokerService, tn: TopicName):
    return await s.get_topic(tn, create=False)


@verb("topics.stats")
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
    return (await _existing(s, tn)).stats()


@verb("topics.internal_stats")
async def _topics_internal_stats(s: BrokerService, b: dict):
    return (await _existing(s, _topic(b))).internal_stats()


@verb("topics.delete")
async def _topics_delete(s: BrokerService, b: dict):
    await s.delete_topic(need(b, "topic"), force=bool(b.get("force", False)))
    return {"ok": True}


@verb("topics.unload")
async def _topics_unload(s: BrokerService, b: dict):
    await s.unload_topic(need(b, "topic"))
    return {"ok": True}


@verb("topics.subscriptions")
async def _topics_subs(s: BrokerService, b: dict):
    return sorted((await _existing(s, _topic(b))).subscriptions)


@verb("topics.unsubscribe")
async def _topics_unsub(s: BrokerService, b: dict):
    topic = await _existing(s, _topic(b))
    sub = topic.subscriptions.get(need(b, "subscription"))
    if sub is None:
        raise NotFound(f"subscription {b['subscription']} does not exist on {topic.name}")
    await sub.unsubscribe()
    return {"ok": True}


@verb("topics.reset_cursor")
async def _topics_reset(s: BrokerService, b: dict):
    topic = await _existing(s, _topic(b))
    sub = topic.subscriptions.get(need(b, "subscription"))
    if sub is None:
        raise NotFound(f"subscription {b['subscription']} does not exist on {topic.name}")
    if "message_id" in b:
        try:
            pos = Position.parse(str(b["message_id"]))
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
    elif "timestamp_ms" in b:
        from .seek import find_position_by_publish_time
        pos = await find_position_by_publish_time(topic.ml, need(b, "timestamp_ms", int))
    else:
        raise InvalidArgument("give message_id ('ledger:entry') or timestamp_ms")
    await sub.reset_cursor(pos)
    return {"ok": True, "position": str(pos)}


@verb("topics.set_replication_clusters")
async def _topics_set_repl(s: BrokerService, b: dict):
    tn = _topic(b)
    clusters = need(b, "clusters", list)
    policies = await s.namespace_policies(tn.namespace)
    known = set(await s.resources.list_clusters())
    unknown = [c for c in clusters if c not in known]
    if unknown:
        raise NotFound(f"unknown cluster(s) {', '.join(unknown)}")
    base = tn.partitioned_topic_name.persistence_naming
    tp = await s.resources.get_topic_policies(base)
    tp["replication_clusters"] = clusters
    await s.resources.set_topic_policies(base, tp)
    await s.on_policies_changed(tn.namespace, policies)
    return tp


@verb("topics.inject_send_failure")
async def _topics_inject(s: BrokerService, b: dict):
    """Refuse the next ``count`` sends to a topic (only with enable_fault_injection)."""
    if not s.config.enable_fault_injection:
        from .errors import PreconditionFailed
        raise PreconditionFailed("fault injection is off; start the broker with enable_fault_injection = true")
    topic = await s.get_topic(_topic(b), create=True)
    topic.fail_next_sends = need(b, "count", int)
    return {"ok": True}


@verb("brokers.health")
async def _health(s: BrokerService, b: dict):
    return {"ok": True, "cluster": s.config.cluster_name, "topics": len(s.topics)}
