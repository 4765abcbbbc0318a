"""BrokerService with geo-replication (Pulsar's PersistentTopic.checkReplication /
startReplicator / removeReplicator, BrokerService.checkReplicationPolicies).

The replication clusters of a topic are the topic-level policy if set, else its
namespace's ``replication_clusters``. Policy changes take effect without a
restart: a metadata watch on ``/admin`` plus a periodic check
(``replication_policy_check_duration_seconds``) start replicators for new
remote clusters and stop removed ones. A topic whose namespace no longer lists
the local cluster is deleted, with a log line saying why. On start, topics of
replicated namespaces are loaded so their backlog replicates without waiting
for a client.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Optional

import grpc

from broker.service.broker_service import BrokerService
from broker.service.errors import NotFound
from broker.service.resources import Policies
from broker.service.topic import PersistentTopic
from broker.tls_security import remote_service_url, security_for_url
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.channels import ChannelSecurity, open_channel

from .controller import ReplicatedSubscriptionsController
from .replicator import GRPC_OPTIONS, Replicator, target

log = logging.getLogger(__name__)


class GeoBrokerService(BrokerService):
    """BrokerService that runs replicators for its topics: one
    ``Replicator`` per remote cluster of a topic's replication clusters
    (Pulsar's PersistentReplicator), and a PIP-33
    ReplicatedSubscriptionsController per replicated topic when
    ``enable_replicated_subscriptions`` is set (Pulsar's
    enableReplicatedSubscriptions)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._policy_task: Optional[asyncio.Task] = None
        self._unwatch = None
        self._check_pending: Optional[asyncio.Task] = None
        self._check_locks: dict[str, asyncio.Lock] = {}

    async def start(self) -> None:
        """Start the BrokerService, then the ``/admin`` metadata watch, the periodic policy
        check (every replication_policy_check_duration_seconds) and, in the background, the
        loading of the topics of replicated namespaces."""
        await super().start()
        self._unwatch = self.metadata.watch(self._on_metadata_change, prefix="/admin")
        self._policy_task = asyncio.create_task(self._policy_loop())
        asyncio.create_task(self._load_replicated_topics())

    async def close(self) -> None:
        """Stop the metadata watch and the periodic policy check, then close the BrokerService
        (which closes the topics and their replicators)."""
        if self._unwatch is not None:
            self._unwatch()
        if self._policy_task is not None:
            self._policy_task.cancel()
        await super().close()

    def extra_metrics(self):
        """PIP-33 metrics: pending / timed-out snapshots, snapshot latency, and the
        age of the last applied UPDATE per topic and subscription."""
        import time as _time

        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        from .controller import ControllerStats

        cluster = self.config.cluster_name
        pending = GaugeMetricFamily("pulsar_replicated_subscriptions_pending_snapshots",
                                    "Snapshots in progress", labels=["cluster"])
        pending.add_metric([cluster], ControllerStats.pending)
        timed_out = CounterMetricFamily("pulsar_replicated_subscriptions_timedout_snapshots",
                                        "Snapshots that timed out", labels=["cluster"])
        timed_out.add_metric([cluster], ControllerStats.timed_out)
        lat = list(ControllerStats.latencies_ms)
        latency = SummaryMetricFamily("pulsar_replicated_subscriptions_snapshot_latency_ms",
                                      "Snapshot completion latency (ms)", labels=["cluster"])
        latency.add_metric([cluster], count_value=len(lat), sum_value=sum(lat))
        age = GaugeMetricFamily("pulsar_replicated_subscription_last_update_age_seconds",
                                "Seconds since the last UPDATE applied to this subscription",
                                labels=["cluster", "topic", "subscription"])
        now = _time.time() * 1000
        for topic in list(self.topics.values()):
            ctl = topic.controller
            if ctl is None:
                continue
            for sub, t in list(ctl.last_update_applied_ms.items()):
                age.add_metric([cluster, str(topic.name), sub], (now - t) / 1000.0)
        updates = CounterMetricFamily("pulsar_replicated_subscriptions_update_markers",
                                      "UPDATE markers written (acknowledged state by origin id)", labels=["cluster"])
        updates.add_metric([cluster], ControllerStats.update_markers)
        update_bytes = CounterMetricFamily("pulsar_replicated_subscriptions_update_marker_bytes",
                                           "Bytes of the UPDATE markers written", labels=["cluster"])
        update_bytes.add_metric([cluster], ControllerStats.update_marker_bytes)
        arrived = CounterMetricFamily("pulsar_replicated_subscriptions_acked_on_arrival",
                                      "Entries acknowledged when they arrived, from pending acknowledgments "
                                      "received by origin id", labels=["cluster"])
        arrived.add_metric([cluster], ControllerStats.acked_on_arrival)
        restored = CounterMetricFamily("pulsar_replicated_subscriptions_pending_restored",
                                       "Pending acknowledgments restored from cursor properties at topic load",
                                       labels=["cluster"])
        restored.add_metric([cluster], ControllerStats.pending_restored)
        ctls = [t.controller for t in list(self.topics.values()) if t.controller is not None]
        pend = GaugeMetricFamily("pulsar_replicated_subscriptions_pending_acks",
                                 "Acknowledgments received by origin id whose entries have not arrived",
                                 labels=["cluster"])
        pend.add_metric([cluster], sum(c.pending_count() for c in ctls))
        pend_bytes = GaugeMetricFamily("pulsar_replicated_subscriptions_received_acks_bytes",
                                       "Estimated memory of the acknowledgments received by origin id "
                                       "(pending included)", labels=["cluster"])
        pend_bytes.add_metric([cluster], sum(c.pending_memory_bytes() for c in ctls))
        index_bytes = GaugeMetricFamily("pulsar_replicated_subscriptions_origin_index_bytes",
                                        "Estimated memory of the origin indexes", labels=["cluster"])
        index_bytes.add_metric([cluster], sum(c.index.memory_bytes() for c in ctls))
        index_runs = GaugeMetricFamily("pulsar_replicated_subscriptions_origin_index_runs",
                                       "Runs held by the origin indexes", labels=["cluster"])
        index_runs.add_metric([cluster], sum(len(c.index) for c in ctls))
        return [pending, timed_out, latency, age, updates, update_bytes, arrived, restored, pend, pend_bytes,
                index_bytes, index_runs]

    # ---- policy plumbing --------------------------------------------------
    def _on_metadata_change(self, notification) -> None:
        if self._check_pending is None or self._check_pending.done():
            self._check_pending = asyncio.create_task(self._check_all_soon())

    async def _check_all_soon(self) -> None:
        await asyncio.sleep(0.05)  # coalesce bursts of admin writes
        await self.check_all_topics()

    async def _policy_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.replication_policy_check_duration_seconds)
            await self.check_all_topics()

    async def check_all_topics(self) -> None:
        """``check_replication`` of every loaded topic (Pulsar's
        BrokerService.checkReplicationPolicies); a topic's failure is logged, never raised."""
        for topic in list(self.topics.values()):
            try:
                await self.check_replication(topic)
            except Exception as exc:
                log.warning("[%s] replication check failed: %s", topic.name, exc)

    async def on_policies_changed(self, namespace: str, policies: Policies) -> None:
        """Admin hook after ``namespace``'s (or one of its topics') policies were written:
        ``check_replication`` of its loaded topics with ``policies``; errors propagate to the
        admin call."""
        for topic in list(self.topics.values()):
            if topic.name.namespace == namespace:
                await self.check_replication(topic, policies)

    async def on_cluster_deleted(self, name: str) -> None:
        """Close the replicators to a deleted cluster (Pulsar's handleDeleteCluster)."""
        for topic in list(self.topics.values()):
            rep = topic.replicators.pop(name, None)
            if rep is not None:
                await rep.close()

    async def on_cluster_credentials_changed(self, name: str) -> None:
        """The credentials of cluster ``name`` changed (``clusters update ... --auth-token``):
        its replicators reconnect with them (their cursors stay: nothing is re-sent twice)."""
        for topic in list(self.topics.values()):
            rep = topic.replicators.pop(name, None)
            if rep is not None:
                await rep.close()
                await self.check_replication(topic, allow_delete=False)

    async def on_topic_loaded(self, topic: PersistentTopic, policies: Policies) -> None:
        """BrokerService hook: start the new topic's replicators (Pulsar's checkReplication
        on topic load). A topic is only deleted on a policy change, not when loaded: each
        cluster keeps its own policies, and a remote's replicator may arrive first."""
        await self.check_replication(topic, policies, allow_delete=False)

    async def replication_clusters(self, topic: PersistentTopic, policies: Optional[Policies] = None) -> list[str]:
        """Cluster names the topic replicates to (local included): the topic policy's
        ``replication_clusters`` if set, else the namespace's (``policies``, read when None).
        Also refreshes ``topic.message_ttl_seconds``. Raises NotFound for a missing namespace."""
        policies = policies or await self.resources.get_policies(topic.name.namespace)
        tp = await self.resources.get_topic_policies(topic.name.partitioned_topic_name.persistence_naming)
        topic.message_ttl_seconds = policies.message_ttl_in_seconds
        return list(tp.get("replication_clusters") or policies.replication_clusters)

    async def check_replication(self, topic: PersistentTopic, policies: Optional[Policies] = None,
                                allow_delete: bool = True) -> None:
        """Start/stop replicators so they match the topic's replication clusters
        (serialized per topic: a load and a policy watch may run at once)."""
        lock = self._check_locks.setdefault(str(topic.name), asyncio.Lock())
        async with lock:
            await self._check_replication(topic, policies, allow_delete)

    async def _check_replication(self, topic: PersistentTopic, policies: Optional[Policies],
                                 allow_delete: bool) -> None:
        if topic.closed:
            return
        try:
            clusters = await self.replication_clusters(topic, policies)
        except NotFound:
            return
        local = self.config.cluster_name
        if clusters and local not in clusters:
            if not allow_delete:
                log.warning("[%s] the local cluster %s is not in the replication clusters %s of %s",
                            topic.name, local, clusters, topic.name.namespace)
                return
            log.warning("[%s] deleting topic: its replication clusters %s no longer include the local cluster %s",
                        topic.name, clusters, local)
            self.topics.pop(str(topic.name), None)
            await topic.delete()
            return
        remotes = [c for c in clusters if c != local]
        for remote in remotes:
            try:
                cluster_data = await self.resources.get_cluster(remote)
                security = self.remote_cluster_security(remote, cluster_data)
                url = remote_service_url(cluster_data, bool(security is not None and security.tls))
                security = security_for_url(security, url, self.config)  # the URL's scheme decides TLS
            except NotFound:
                log.warning("[%s] replication cluster %s is not registered here; skipping", topic.name, remote)
                continue
            rep = topic.replicators.get(remote)
            if rep is not None and rep.remote_url == url:
                continue
            if rep is not None:
                await rep.close()
            if topic.name.is_partition:
                await self._ensure_remote_partitions(topic, url, security)
            rep = Replicator(topic, local, remote, url, self.config.replication_producer_queue_size,
                             mark_delete_rate_limit=self.config.replicator_mark_delete_rate_limit,
                             security=security)
            topic.replicators[remote] = rep
            await rep.start()
        for remote in [r for r in topic.replicators if r not in remotes]:
            rep = topic.replicators.pop(remote)
            log.info("[%s][%s -> %s] stopping replicator: cluster removed from the policy", topic.name, local, remote)
            await rep.close(delete_cursor=True)
        if topic.replicators and self.config.enable_replicated_subscriptions and topic.controller is None:
            topic.controller = ReplicatedSubscriptionsController(topic, local, self.config)
            topic.controller.start()
        elif not topic.replicators and topic.controller is not None:
            await topic.controller.close()
            topic.controller = None

    def remote_cluster_security(self, cluster: str, cluster_data: dict) -> Optional[ChannelSecurity]:
        """The ``proto.channels.ChannelSecurity`` of this broker's links to remote
        ``cluster`` (its registered ``cluster_data``: ``/admin/clusters/<name>``):
        the broker's own client security (Pulsar's ``brokerClientTlsEnabled`` /
        ``brokerClientAuthenticationPlugin``); None: plaintext, no credentials.
        The cluster's own credentials (``authentication_parameters`` of its
        cluster data, ``clusters create ... --auth-token``; Pulsar's
        ClusterData.authenticationParameters) replace the broker's."""
        security = self.broker_client_security
        params = (cluster_data or {}).get("authentication_parameters")
        if params:
            import dataclasses

            from proto.authentication import authentication_from_params
            from proto.errors import InvalidConfiguration
            try:
                auth = authentication_from_params(cluster_data.get("authentication_plugin"), params)
            except InvalidConfiguration as exc:
                log.warning("cluster %s: unusable authentication_parameters (%s); using the broker's own",
                            cluster, exc)
                return security
            security = dataclasses.replace(security or ChannelSecurity(), authentication=auth)
        return security

    async def _ensure_remote_partitions(self, topic: PersistentTopic, url: str,
                                        security: Optional[ChannelSecurity] = None) -> None:
        """Create the partitioned topic on the remote with the same partition count
        (createTopicToRemoteClusterForReplication)."""
        parent = topic.name.partitioned_topic_name
        partitions = await self.resources.get_partitions(parent.persistence_naming)
        if partitions <= 0:
            return
        async with open_channel(target(url), GRPC_OPTIONS, security) as channel:
            stub = broker_pb2_grpc.PulsarBrokerStub(channel)
            try:
                await stub.Admin(pb.AdminRequest(method="topics.create_partitioned",
                                                 body_json=json.dumps({"topic": str(parent), "partitions": partitions})),
                                 timeout=10)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                    log.warning("[%s] creating the partitioned topic on %s failed: %s", parent, url, exc.details())

    async def _load_if_served(self, topic: str) -> None:
        """Load ``topic`` for replication; in a broker cluster only on its owner (a lookup
        assigns its bundle when nobody owns it)."""
        ns = self.namespace_service
        if ns is not None:
            from proto.topic_name import TopicName
            served, _ = await ns.is_served_here(TopicName.get(topic))
            if not served and await ns.find_owner(topic) != self.service_url:
                return
        await self.get_topic(topic, create=False)

    async def on_bundle_owned(self, bundle) -> None:
        """A bundle was taken (broker cluster): load its topics of replicated namespaces so
        that their replicators run here now (they ran on the previous owner)."""
        try:
            policies = await self.resources.get_policies(bundle.namespace)
        except Exception:  # noqa: BLE001 - namespace gone
            return
        if not [c for c in policies.replication_clusters if c != self.config.cluster_name]:
            return
        for name in await self.metadata.get_children(f"/managed-ledgers/{bundle.namespace}/persistent"):
            topic = f"persistent://{bundle.namespace}/{name}"
            if bundle.contains(topic):
                try:
                    await self.get_topic(topic, create=False)
                except Exception as exc:  # noqa: BLE001
                    log.warning("loading %s for replication after taking its bundle: %s", topic, exc)

    async def _load_replicated_topics(self) -> None:
        """Load every topic of namespaces replicated to other clusters."""
        try:
            for tenant in await self.resources.list_tenants():
                for ns in await self.resources.list_namespaces(tenant):
                    policies = await self.resources.get_policies(ns)
                    if not [c for c in policies.replication_clusters if c != self.config.cluster_name]:
                        continue
                    for name in await self.metadata.get_children(f"/managed-ledgers/{ns}/persistent"):
                        try:
                            await self._load_if_served(f"persistent://{ns}/{name}")
                        except Exception as exc:
                            log.warning("loading %s/%s for replication failed: %s", ns, name, exc)
        except Exception as exc:
            log.warning("loading replicated topics failed: %s", exc)
