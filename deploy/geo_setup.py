"""Register a topology's clusters and create its tenants, namespaces and
topics through the brokers' admin verbs. Idempotent: running it again
converges to the topology (service URLs updated, allowed clusters and
policies re-applied, existing topics kept).

With a configuration store (``[configuration_store]``, Pulsar's
``configurationMetadataStoreUrl``) the clusters share the cluster list,
tenants, namespace policies and partitioned topics: everything is written
ONCE, through any broker of the first cluster, and every cluster sees it.
Without one, each cluster keeps its own and every cluster is configured.

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

__all__ = ["wait_for_brokers", "register_clusters", "configure_cluster", "setup_topology", "run_setup"]


async def wait_for_brokers(topology: Topology, timeout_s: float = 60.0, log: Callable[[str], None] | None = None,
                           progress_every_s: float = 5.0) -> None:
    """Wait until every broker of every cluster answers ``brokers.health`` (each asked on
    its own address); TimeoutError naming the brokers that did not. ``log``: a progress
    line every ``progress_every_s`` seconds while waiting."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    pending = {(c.name, i): topology.broker_url(c.name, i) for c in topology.clusters for i in range(len(c.brokers))}
    last_error: dict[tuple, str] = {}
    next_progress = t0 + progress_every_s
    while pending:
        for key, url in sorted(pending.items()):
            admin = AdminClient(url, operation_timeout_seconds=5, **topology.client_tls_options())
            try:
                health = await asyncio.wait_for(admin.health(), 5)
                if health.get("ok"):
                    del pending[key]
            except (PulsarException, asyncio.TimeoutError, OSError) as exc:
                last_error[key] = f"{type(exc).__name__}: {exc}"
            finally:
                await admin.close()
        if not pending:
            return
        now = time.monotonic()
        if now > deadline:
            detail = "; ".join(f"{pending[k]}: {last_error.get(k, 'no answer')}" for k in sorted(pending))
            raise TimeoutError(f"{len(pending)} broker(s) not healthy after {timeout_s:g}s ({detail})")
        if log is not None and now >= next_progress:
            log(f"    ... waiting for broker(s) {', '.join(pending[k] for k in sorted(pending))} to answer "
                f"({now - t0:.0f}s of {timeout_s:g}s)")
            next_progress = now + progress_every_s
        await asyncio.sleep(0.5)


async def register_clusters(topology: Topology, admin: AdminClient, clusters: list[str]) -> list[str]:
    """Register ``clusters`` through ``admin`` with their multi-host service URLs (create, or
    update a different URL). Returns what it changed, one line each."""
    done: list[str] = []
    for other in clusters:
        url = topology.service_url(other)
        url_tls = url if topology.tls_dir else None  # Pulsar's brokerServiceUrlTls, for the replicators
        try:
            await admin.create_cluster(other, url, url_tls)
            done.append(f"cluster {other} -> {url}")
        except AlreadyExists:
            current = await admin.get_cluster(other)
            if current.get("service_url") != url or current.get("service_url_tls") != url_tls:
                await admin.update_cluster(other, url, url_tls)
                done.append(f"cluster {other} -> {url}")
    return done


async def configure_cluster(topology: Topology, name: str, admin: AdminClient, shared: bool = False) -> list[str]:
    """Configure through ``admin`` (a broker of cluster ``name``): register the clusters
    (``shared``: every cluster, the store is the configuration store all of them read;
    otherwise the others, each cluster registers itself), then tenants, namespaces
    (replication clusters, deduplication, retention) and topics. Returns what it
    changed, one line each."""
    clusters = topology.names if shared else [c for c in topology.names if c != name]
    done = await register_clusters(topology, admin, clusters)
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
        if not shared and name not in ns.clusters:
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


async def setup_topology(topology: Topology, timeout_s: float = 60.0,
                         log: Callable[[str], None] | None = None) -> dict[str, list[str]]:
    """Wait for every broker, then configure: once through the first cluster when the
    topology has a configuration store, else each cluster. Returns {cluster: changes}
    (with a configuration store one entry, ``configuration-store (via <cluster>)``)."""
    await wait_for_brokers(topology, timeout_s, log)
    shared = topology.configuration_store is not None
    targets = topology.names[:1] if shared else topology.names
    changes = {}
    for name in targets:
        admin = AdminClient(topology.service_url(name), operation_timeout_seconds=15,
                            **topology.client_tls_options())
        try:
            key = f"configuration store (through {name})" if shared else name
            changes[key] = await configure_cluster(topology, name, admin, shared)
        finally:
            await admin.close()
        if log:
            log(f"  {key}: " + (", ".join(changes[key]) if changes[key] else "already configured"))
    return changes


def run_setup(topology: Topology, timeout_s: float = 120.0) -> int:
    """``minipulsar geo setup``: configure the clusters (see :func:`setup_topology`); exit status."""
    print(f"geo setup: configuring {', '.join(topology.names)} from {topology.source}", flush=True)
    try:
        asyncio.run(setup_topology(topology, timeout_s=timeout_s, log=lambda line: print(line, flush=True)))
    except (TimeoutError, PulsarException) as exc:
        print(f"geo setup: failed: {exc}", file=sys.stderr)
        return 1
    print("geo setup: done", flush=True)
    return 0
