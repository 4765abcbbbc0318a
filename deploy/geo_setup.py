"""Register a topology's clusters with each other and create its tenants,
namespaces and topics, through each broker's admin verbs (each cluster keeps
its own metadata, so every cluster is configured). Idempotent: running it
again converges to the topology (service URLs updated, allowed clusters and
policies re-applied, existing topics kept).

Used by ``minipulsar geo up`` (local processes) and by the one-shot
``geo-setup`` service of docker-compose (``minipulsar geo setup --compose``).
"""
from __future__ import annotations

import asyncio
import sys
import time
from typing import Callable

from client.admin import AdminClient
from client.errors import AlreadyExists, PulsarException

from deploy.topology import Topology

__all__ = ["wait_for_brokers", "configure_cluster", "setup_topology", "run_setup"]


async def wait_for_brokers(topology: Topology, admins: dict[str, AdminClient], timeout_s: float = 60.0) -> None:
    """Wait until every broker answers ``brokers.health``; TimeoutError naming
    the clusters that did not."""
    deadline = time.monotonic() + timeout_s
    pending = set(topology.names)
    last_error: dict[str, str] = {}
    while pending:
        for name in sorted(pending):
            try:
                health = await asyncio.wait_for(admins[name].health(), 5)
                if health.get("ok"):
                    pending.discard(name)
            except (PulsarException, asyncio.TimeoutError, OSError) as exc:
                last_error[name] = f"{type(exc).__name__}: {exc}"
        if not pending:
            return
        if time.monotonic() > deadline:
            detail = "; ".join(f"{n}: {last_error.get(n, 'no answer')}" for n in sorted(pending))
            raise TimeoutError(f"broker(s) of {', '.join(sorted(pending))} not healthy after {timeout_s:g}s ({detail})")
        await asyncio.sleep(0.5)


async def configure_cluster(topology: Topology, name: str, admin: AdminClient, compose: bool = False) -> list[str]:
    """Configure cluster ``name`` through ``admin``: register every other
    cluster, then tenants, namespaces (replication clusters, deduplication,
    retention) and topics. Returns what it changed, one line each."""
    done: list[str] = []
    for other in topology.names:
        url = topology.service_url(other, compose)
        if other == name:
            continue
        try:
            await admin.create_cluster(other, url)
            done.append(f"cluster {other} -> {url}")
        except AlreadyExists:
            current = await admin.get_cluster(other)
            if current.get("service_url") != url:
                await admin.update_cluster(other, url)
                done.append(f"cluster {other} updated -> {url}")
    for tenant in topology.tenants:
        try:
            await admin.create_tenant(tenant.name, list(tenant.allowed_clusters))
            done.append(f"tenant {tenant.name}")
        except AlreadyExists:
            await admin.update_tenant(tenant.name, list(tenant.allowed_clusters))
    for ns in topology.namespaces:
        try:
            await admin.create_namespace(ns.name)
            done.append(f"namespace {ns.name}")
        except AlreadyExists:
            pass
        await admin.set_namespace_clusters(ns.name, list(ns.clusters))
        await admin.set_deduplication(ns.name, ns.deduplication)
        if ns.retention_time_minutes is not None:
            await admin.set_retention(ns.name, ns.retention_time_minutes, ns.retention_size_mb)
    for topic in topology.topics:
        ns = next(n for n in topology.namespaces if n.name == topic.namespace)
        if name not in ns.clusters:
            continue
        try:
            if topic.partitions > 0:
                await admin.create_partitioned_topic(topic.name, topic.partitions)
            else:
                await admin.create_topic(topic.name)
            done.append(f"topic {topic.name}" + (f" ({topic.partitions} partitions)" if topic.partitions else ""))
        except AlreadyExists:
            pass
    return done


async def setup_topology(topology: Topology, compose: bool = False, external: bool = False,
                         timeout_s: float = 60.0, log: Callable[[str], None] | None = None) -> dict[str, list[str]]:
    """Wait for every broker, then ``configure_cluster`` each one. The admin
    calls go to the service URLs (``compose``: service names, unless
    ``external``: the ports published on 127.0.0.1); the URLs registered are the
    ones brokers use to reach each other. Returns {cluster: changes}."""
    admins = {}
    for name in topology.names:
        url = topology.service_url(name, compose and not external)
        if external:
            url = f"minipulsar://127.0.0.1:{topology.cluster(name).broker_port}"
        admins[name] = AdminClient(url, operation_timeout_seconds=15)
    try:
        await wait_for_brokers(topology, admins, timeout_s)
        changes = {}
        for name in topology.names:
            changes[name] = await configure_cluster(topology, name, admins[name], compose)
            if log:
                log(f"  {name}: " + (", ".join(changes[name]) if changes[name] else "already configured"))
        return changes
    finally:
        for a in admins.values():
            await a.close()


def run_setup(topology: Topology, compose: bool = False, timeout_s: float = 120.0) -> int:
    """``minipulsar geo setup``: configure every cluster; exit status."""
    print(f"geo setup: configuring {', '.join(topology.names)} from {topology.source}", flush=True)
    try:
        asyncio.run(setup_topology(topology, compose=compose, timeout_s=timeout_s,
                                   log=lambda line: print(line, flush=True)))
    except (TimeoutError, PulsarException) as exc:
        print(f"geo setup: failed: {exc}", file=sys.stderr)
        return 1
    print("geo setup: done", flush=True)
    return 0
