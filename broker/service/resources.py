"""Cluster, tenant, namespace and partitioned-topic metadata (Pulsar's
``PulsarResources``: ClusterResources, TenantResources, NamespaceResources,
NamespaceResources.PartitionedTopicResources), stored as JSON in the metadata
store under Pulsar's paths:

* ``/admin/clusters/<cluster>``                     {"service_url": ...}
* ``/admin/policies/<tenant>``                      {"allowed_clusters": [...]}
* ``/admin/policies/<tenant>/<ns>``                 namespace Policies
* ``/admin/partitioned-topics/<tenant>/<ns>/persistent/<topic>``  {"partitions": N}
* ``/admin/topic-policies/<tenant>/<ns>/persistent/<topic>``  topic-level policies
  (of the partitioned topic; Pulsar keeps these in a system topic instead)

A ``persistence_name`` argument is ``TopicName.persistence_naming``:
``tenant/ns/persistent/topic``. Errors are ``broker.service.errors`` classes
(gRPC status by name); the metadata store's own BadVersion can surface from a
create racing another create of the same path.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Optional

from broker.metadata import MetadataStore

from .errors import AlreadyExists, InvalidArgument, NotFound, PreconditionFailed

_NAME = re.compile(r"[-=:.\w]+")


def check_name(kind: str, name: str) -> str:
    """Validate a tenant/namespace/cluster name (a metadata path segment: not
    empty, not '.' or '..', no '/' or control characters); InvalidArgument otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidArgument(f"invalid {kind} name {name!r}: use letters, digits, '-', '_', '=', ':' or '.' "
                              f"(and not only dots)")
    return name


def check_subscription_name(name: str) -> str:
    """Validate a subscription name: a non-empty str without control characters,
    valid UTF-8, and without '.' or '..' as the whole name or as a '/'-separated
    part (path tricks); InvalidArgument otherwise. '/' is allowed: the cursor's
    metadata path segment is the URL-encoded name (broker.metadata.names), as in Pulsar."""
    ok = isinstance(name, str) and bool(name) and not any(ord(c) < 32 or ord(c) == 127 for c in name)
    if ok:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            ok = False
    if not ok or any(part in (".", "..") for part in name.split("/")):
        raise InvalidArgument(f"invalid subscription name {name!r}: give a non-empty name without control "
                              f"characters and without '.' or '..' parts")
    return name


@dataclasses.dataclass
class Policies:
    """Namespace policies (Pulsar's org.apache.pulsar.common.policies.data.Policies):
    ``replication_clusters`` (cluster names it is geo-replicated to),
    ``deduplication_enabled`` (None: the broker's broker_deduplication_enabled),
    ``message_ttl_in_seconds`` (s, 0 = none), ``retention_time_in_minutes``
    (minutes) and ``retention_size_in_mb`` (MB; None: broker defaults,
    -1 infinite, 0 none)."""

    replication_clusters: list[str] = dataclasses.field(default_factory=list)
    deduplication_enabled: Optional[bool] = None          # None: broker default
    message_ttl_in_seconds: int = 0                       # 0: no TTL
    retention_time_in_minutes: Optional[int] = None       # None: broker default
    retention_size_in_mb: Optional[int] = None
    # Pulsar's AuthPolicies: {"namespace_auth": {role: [actions]}, "destination_auth": {topic: {role: [actions]}},
    # "subscription_auth_roles": {subscription: [roles]}} (broker.security.authorization reads them)
    auth_policies: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, data: bytes) -> "Policies":
        """Parse the namespace node's JSON (``bytes``) written by :meth:`to_json`;
        unknown keys are ignored and missing ones take their defaults (Pulsar's
        Policies read from ``/admin/policies/<tenant>/<ns>``). Raises
        json.JSONDecodeError on bytes that are not JSON (AttributeError when the
        JSON is not an object)."""
        raw = json.loads(data)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def to_json(self) -> bytes:
        """The policies as UTF-8 JSON bytes with sorted keys (the value stored at
        ``/admin/policies/<tenant>/<ns>``)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()


class Resources:
    """Typed access to the admin metadata on ``store`` (any
    broker.metadata.MetadataStore; Pulsar's PulsarResources with its
    ClusterResources, TenantResources, NamespaceResources and
    PartitionedTopicResources). Raises NotFound / AlreadyExists /
    InvalidArgument / PreconditionFailed as each method says."""

    def __init__(self, store: MetadataStore):
        self.store = store

    async def _get_json(self, path: str) -> Optional[tuple[Any, int]]:
        res = await self.store.get(path)
        if res is None:
            return None
        return json.loads(res.value), res.version

    # ---- clusters -------------------------------------------------------
    async def create_cluster(self, name: str, service_url: str, service_url_tls: Optional[str] = None,
                             extra: Optional[dict] = None) -> None:
        """Register cluster ``name`` with its ``service_url`` (``minipulsar://host:port``)
        at ``/admin/clusters/<name>`` (Pulsar's ClusterResources.createCluster /
        ``pulsar-admin clusters create``); ``service_url_tls``: its TLS URL
        (``minipulsar+ssl://``, Pulsar's brokerServiceUrlTls, used by brokers whose
        ``broker_client_tls_enabled``). Raises InvalidArgument (bad name or URL),
        AlreadyExists (registered already); a concurrent create of the same name may
        surface as the metadata store's BadVersion."""
        check_name("cluster", name)
        data = _cluster_data(service_url, service_url_tls)
        if await self.store.exists(f"/admin/clusters/{name}"):
            raise AlreadyExists(f"cluster {name} already exists")
        data = {**(extra or {}), **data}   # extra: authentication_plugin / _parameters
        await self.store.put(f"/admin/clusters/{name}", json.dumps(data).encode(), -1)

    async def update_cluster(self, name: str, service_url: str, service_url_tls: Optional[str] = None,
                             extra: Optional[dict] = None) -> None:
        """Replace the ``service_url`` (``minipulsar://host:port``) of an existing
        cluster (ClusterResources.updateCluster), its ``service_url_tls`` when given,
        and the keys of ``extra`` (``authentication_plugin`` /
        ``authentication_parameters``); its other keys are kept. Raises NotFound (no
        such cluster), InvalidArgument (bad name or URL)."""
        current = await self.get_cluster(name)
        data = {k: v for k, v in current.items() if k != "name"}
        data.update(extra or {})
        data.update(_cluster_data(service_url, service_url_tls))
        await self.store.put(f"/admin/clusters/{name}", json.dumps(data).encode())

    async def get_cluster(self, name: str) -> dict:
        """``{"name": name, "service_url": ...}`` of a registered cluster
        (ClusterResources.getCluster). Raises InvalidArgument (bad name), NotFound."""
        got = await self._get_json(f"/admin/clusters/{check_name('cluster', name)}")
        if got is None:
            raise NotFound(f"cluster {name} does not exist; create it with: minipulsar-admin clusters create")
        return {"name": name, **got[0]}

    async def list_clusters(self) -> list[str]:
        """Names of the registered clusters, sorted (children of ``/admin/clusters``;
        empty when none)."""
        return await self.store.get_children("/admin/clusters")

    async def delete_cluster(self, name: str) -> None:
        """Remove a registered cluster's node (ClusterResources.deleteCluster); the
        admin verb then closes replicators to it. Raises InvalidArgument (bad name),
        NotFound."""
        await self.get_cluster(name)
        await self.store.delete(f"/admin/clusters/{name}")

    # ---- tenants --------------------------------------------------------
    async def create_tenant(self, tenant: str, allowed_clusters: list[str],
                            admin_roles: Optional[list[str]] = None) -> None:
        """Create ``tenant`` with TenantInfo ``{"allowed_clusters": [...]}`` at
        ``/admin/policies/<tenant>`` (Pulsar's TenantResources.createTenant). Raises
        InvalidArgument (bad name, ``allowed_clusters`` not a list of str),
        AlreadyExists, NotFound (an allowed cluster is not registered)."""
        check_name("tenant", tenant)
        if await self.store.exists(f"/admin/policies/{tenant}"):
            raise AlreadyExists(f"tenant {tenant} already exists")
        await self._check_clusters_exist(allowed_clusters)
        info: dict = {"allowed_clusters": list(allowed_clusters)}
        if admin_roles:                                    # TenantInfo.adminRoles
            info["admin_roles"] = list(admin_roles)
        await self.store.put(f"/admin/policies/{tenant}", json.dumps(info).encode(), -1)

    async def update_tenant(self, tenant: str, allowed_clusters: list[str],
                            admin_roles: Optional[list[str]] = None) -> None:
        """Replace an existing tenant's ``allowed_clusters`` and, when given, its
        ``admin_roles`` (TenantResources.updateTenant; else they are kept).
        Raises InvalidArgument, NotFound (no such tenant, or an unregistered cluster)."""
        current = await self.get_tenant(tenant)
        await self._check_clusters_exist(allowed_clusters)
        info: dict = {**current, "allowed_clusters": list(allowed_clusters)}
        if admin_roles is not None:
            info["admin_roles"] = list(admin_roles)
        await self.store.put(f"/admin/policies/{tenant}", json.dumps(info).encode())

    async def get_tenant(self, tenant: str) -> dict:
        """The tenant's TenantInfo dict (``{"allowed_clusters": [...]}``;
        TenantResources.getTenant). Raises InvalidArgument (bad name), NotFound."""
        got = await self._get_json(f"/admin/policies/{check_name('tenant', tenant)}")
        if got is None:
            raise NotFound(f"tenant {tenant} does not exist; create it with: minipulsar-admin tenants create {tenant}")
        return got[0]

    async def list_tenants(self) -> list[str]:
        """Tenant names, sorted (children of ``/admin/policies``; empty when none)."""
        return await self.store.get_children("/admin/policies")

    async def delete_tenant(self, tenant: str) -> None:
        """Delete an empty tenant (TenantResources.deleteTenant). Raises
        InvalidArgument (bad name), NotFound, PreconditionFailed (it still has
        namespaces)."""
        await self.get_tenant(tenant)
        if await self.store.get_children(f"/admin/policies/{tenant}"):
            raise PreconditionFailed(f"tenant {tenant} still has namespaces; delete them first")
        await self.store.delete(f"/admin/policies/{tenant}")

    async def _check_clusters_exist(self, clusters: list[str]) -> None:
        if not isinstance(clusters, list) or not all(isinstance(c, str) for c in clusters):
            raise InvalidArgument(f"clusters must be a list of names, got {clusters!r}")
        known = set(await self.list_clusters())
        missing = [c for c in clusters if c not in known]
        if missing:
            raise NotFound(f"unknown cluster(s) {', '.join(missing)}; register them with: "
                           f"minipulsar-admin clusters create NAME --url minipulsar://HOST:PORT")

    # ---- namespaces -----------------------------------------------------
    @staticmethod
    def _split_ns(namespace: str) -> tuple[str, str]:
        parts = namespace.split("/") if isinstance(namespace, str) else []
        if len(parts) != 2:
            raise InvalidArgument(f"invalid namespace {namespace!r}: use tenant/namespace")
        return check_name("tenant", parts[0]), check_name("namespace", parts[1])

    async def create_namespace(self, namespace: str, policies: Optional[Policies] = None) -> None:
        """Create ``"tenant/ns"`` with ``policies`` (default :class:`Policies`) at
        ``/admin/policies/<tenant>/<ns>`` (Pulsar's NamespaceResources.createPolicies).
        Raises InvalidArgument (not ``tenant/namespace``, bad names), NotFound (no such
        tenant), AlreadyExists."""
        tenant, ns = self._split_ns(namespace)
        await self.get_tenant(tenant)
        path = f"/admin/policies/{tenant}/{ns}"
        if await self.store.exists(path):
            raise AlreadyExists(f"namespace {namespace} already exists")
        await self.store.put(path, (policies or Policies()).to_json(), -1)

    async def get_policies(self, namespace: str) -> Policies:
        """The :class:`Policies` of ``"tenant/ns"`` (NamespaceResources.getPolicies).
        Raises InvalidArgument (malformed name), NotFound (no such namespace)."""
        tenant, ns = self._split_ns(namespace)
        res = await self.store.get(f"/admin/policies/{tenant}/{ns}")
        if res is None:
            raise NotFound(f"namespace {namespace} does not exist; create it with: "
                           f"minipulsar-admin namespaces create {namespace}")
        return Policies.from_json(res.value)

    async def set_policies(self, namespace: str, policies: Policies) -> None:
        """Overwrite the policies of an existing ``"tenant/ns"`` (no version check;
        NamespaceResources.setPolicies). Raises InvalidArgument, NotFound."""
        tenant, ns = self._split_ns(namespace)
        await self.get_policies(namespace)
        await self.store.put(f"/admin/policies/{tenant}/{ns}", policies.to_json())

    async def list_namespaces(self, tenant: str) -> list[str]:
        """The tenant's namespaces as ``"tenant/ns"`` names, sorted
        (NamespaceResources.listNamespacesAsync). Raises InvalidArgument, NotFound
        (no such tenant)."""
        await self.get_tenant(tenant)
        return [f"{tenant}/{ns}" for ns in await self.store.get_children(f"/admin/policies/{tenant}")]

    async def delete_namespace(self, namespace: str) -> None:
        """Delete the namespace's policies node (NamespaceResources.deletePolicies);
        the admin verb checks first that it has no topics. Raises InvalidArgument,
        NotFound."""
        tenant, ns = self._split_ns(namespace)
        await self.get_policies(namespace)
        await self.store.delete(f"/admin/policies/{tenant}/{ns}")

    # ---- partitioned topics -------------------------------------------------
    @staticmethod
    def partitioned_path(persistence_name: str) -> str:
        """Metadata path of a partitioned topic's metadata: ``/admin/partitioned-topics/``
        + ``persistence_name`` (``tenant/ns/persistent/topic``, TopicName.persistence_naming;
        Pulsar's PartitionedTopicResources path). No validation."""
        return f"/admin/partitioned-topics/{persistence_name}"

    async def get_partitions(self, persistence_name: str) -> int:
        """The partition count of a partitioned topic, 0 when ``persistence_name``
        (``tenant/ns/persistent/topic``) is not one (Pulsar's PartitionedTopicMetadata
        with partitions = 0 for a non-partitioned topic). Never raises NotFound."""
        got = await self._get_json(self.partitioned_path(persistence_name))
        return 0 if got is None else int(got[0]["partitions"])

    async def create_partitioned_topic(self, persistence_name: str, partitions: int) -> None:
        """Store ``{"partitions": N}`` for ``persistence_name`` (``tenant/ns/persistent/topic``;
        PartitionedTopicResources.createPartitionedTopic). Raises InvalidArgument
        (``partitions`` not an int >= 1), AlreadyExists. Does not check that the
        namespace exists (the admin verb does)."""
        if not isinstance(partitions, int) or partitions < 1:
            raise InvalidArgument(f"partitions must be an integer >= 1, got {partitions!r}")
        path = self.partitioned_path(persistence_name)
        if await self.store.exists(path):
            raise AlreadyExists(f"partitioned topic {persistence_name} already exists")
        await self.store.put(path, json.dumps({"partitions": partitions}).encode(), -1)

    async def delete_partitioned_topic(self, persistence_name: str) -> None:
        """Delete the partitioned-topic metadata if present (no error when absent;
        PartitionedTopicResources.deletePartitionedTopic). The partitions' managed
        ledgers are deleted by BrokerService.delete_topic."""
        path = self.partitioned_path(persistence_name)
        if await self.store.exists(path):
            await self.store.delete(path)

    async def list_partitioned_topics(self, namespace: str) -> list[str]:
        """Local names (``topic``, no ``persistent://`` prefix) of the partitioned topics
        of ``"tenant/ns"``, sorted; empty when none or when the namespace does not
        exist. Raises InvalidArgument on a malformed namespace name."""
        tenant, ns = self._split_ns(namespace)
        return await self.store.get_children(f"/admin/partitioned-topics/{tenant}/{ns}/persistent")

    # ---- topic-level policies -------------------------------------------
    async def get_topic_policies(self, persistence_name: str) -> dict:
        """Topic-level policies of ``persistence_name`` (``tenant/ns/persistent/topic``
        of the partitioned topic, e.g. ``{"replication_clusters": [...]}``); ``{}``
        when none are set. Pulsar keeps these in the ``__change_events`` system topic
        (TopicPoliciesService); here they are a metadata node."""
        got = await self._get_json(f"/admin/topic-policies/{persistence_name}")
        return {} if got is None else got[0]

    async def set_topic_policies(self, persistence_name: str, policies: dict) -> None:
        """Overwrite the topic-level policies of ``persistence_name`` (any JSON-able
        dict, stored with sorted keys; no validation, no version check)."""
        await self.store.put(f"/admin/topic-policies/{persistence_name}", json.dumps(policies, sort_keys=True).encode())


def _cluster_data(service_url: str, service_url_tls: Optional[str]) -> dict:
    """``{"service_url": ..., ["service_url_tls": ...]}`` of a cluster; InvalidArgument
    unless ``service_url`` is ``minipulsar://`` or ``minipulsar+ssl://`` and
    ``service_url_tls`` (when given) ``minipulsar+ssl://``."""
    if not isinstance(service_url, str) or not service_url.startswith(("minipulsar://", "minipulsar+ssl://")):
        raise InvalidArgument(f"invalid service URL {service_url!r}: use minipulsar://host:port")
    data = {"service_url": service_url}
    if service_url_tls:
        if not isinstance(service_url_tls, str) or not service_url_tls.startswith("minipulsar+ssl://"):
            raise InvalidArgument(f"invalid TLS service URL {service_url_tls!r}: use minipulsar+ssl://host:port")
        data["service_url_tls"] = service_url_tls
    return data
