"""Admin calls and topic reads sent to any broker of a cluster, answered by the topic's
owner (Pulsar's admin REST API redirects to the owner with a 307; here the broker that
received the call forwards it, so every client and tool can use any broker).

Topic-scoped admin verbs go to the owner of the topic's bundle; on a partitioned topic
the per-partition verbs (stats, subscriptions, unsubscribe, unload) fan out to each
partition's owner and the answers are merged as a standalone broker merges them.
Everything else (clusters, tenants, namespaces, partitioned metadata) is answered by
the broker that received it, from the shared metadata store.
"""
from __future__ import annotations

import json
from typing import Awaitable, Callable

from proto.errors import NotFound
from proto.topic_name import TopicName

__all__ = ["route_admin"]

# topic verbs any broker answers from the metadata store
_ANY_BROKER = frozenset({"topics.create", "topics.create_partitioned", "topics.update_partitioned",
                         "topics.partitioned_metadata", "topics.lookup"})
_FAN_OUT = frozenset({"topics.stats", "topics.subscriptions", "topics.unsubscribe", "topics.unload"})

Dispatch = Callable[[str, str], Awaitable[str]]


def _merge(method: str, topic: str, parts: dict) -> object:
    if method == "topics.stats":
        return {"partitions": parts,
                "msgInCounter": sum(p.get("msgInCounter", 0) for p in parts.values()),
                "msgRateIn": sum(p.get("msgRateIn", 0) for p in parts.values()),
                "storageSize": sum(p.get("storageSize", 0) for p in parts.values())}
    if method == "topics.subscriptions":
        return sorted({name for names in parts.values() for name in names})
    if method == "topics.unsubscribe" and not parts:
        raise NotFound(f"subscription not found on any partition of {topic}")
    return {"ok": True}


async def route_admin(service, method: str, body_json: str, dispatch: Dispatch) -> str:
    """Answer admin ``method`` (JSON ``body_json``) on the broker that should: this one
    through ``dispatch(method, body_json)``, or the topic's owner (``NamespaceService.admin_call``).
    Returns the JSON answer; raises what the answering broker raised."""
    ns = getattr(service, "namespace_service", None)
    if ns is None or not isinstance(method, str) or not method.startswith("topics.") or method in _ANY_BROKER:
        return await dispatch(method, body_json)
    try:
        body = json.loads(body_json) if body_json else {}
        tn = TopicName.get(body["topic"])
    except Exception:  # noqa: BLE001 - let the local dispatch report the bad request
        return await dispatch(method, body_json)
    partitions = await service.resources.get_partitions(tn.persistence_naming)
    if partitions:
        if method not in _FAN_OUT:
            return await dispatch(method, body_json)
        parts = {}
        for i in range(partitions):
            name = str(tn.partition(i))
            if method == "topics.stats" and not await service.metadata.exists(
                    f"/managed-ledgers/{tn.partition(i).persistence_naming}"):
                continue
            try:
                parts[name] = json.loads(await route_admin(service, method, json.dumps({**body, "topic": name}),
                                                           dispatch))
            except NotFound:
                if method not in ("topics.unsubscribe", "topics.unload"):
                    raise
        return json.dumps(_merge(method, str(tn), parts), sort_keys=True, default=str)
    served, _ = await ns.is_served_here(tn)
    if served:
        return await dispatch(method, body_json)
    owner = await ns.find_owner(str(tn))
    if owner == service.service_url:
        return await dispatch(method, body_json)
    return json.dumps(await ns.admin_call(owner, method, body), sort_keys=True, default=str)
