"""BrokerService (Pulsar's ``BrokerService``): the topics this broker owns,
topic loading and auto-creation, namespace policy lookups and periodic stats."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Optional

from bookie.client import BookKeeper
from broker.config import BrokerConfig
from broker.ledger.factory import ManagedLedgerFactory
from broker.metadata import MetadataStore
from proto.errors import NotAllowed, TopicNotFound
from proto.topic_name import TopicName

from .errors import NotFound, ServiceNotReady
from .resources import Policies, Resources
from .topic import PersistentTopic

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LookupAnswer:
    """Answer of a topic lookup (Pulsar's ``LookupResult``): ``broker_service_url``
    (``minipulsar://host:port``) owns the topic (``redirect`` False) or must be asked
    again (``redirect`` True, ``authoritative`` then set); ``proxy_through_service_url``:
    the URL the client already uses reaches the owner (a standalone broker)."""

    broker_service_url: str
    redirect: bool = False
    authoritative: bool = False
    proxy_through_service_url: bool = False


class BrokerService:
    """Owns every topic of this broker; transport-neutral (the gRPC servicer and a
    future Pulsar-protocol listener both call it)."""

    def __init__(self, config: BrokerConfig, metadata: MetadataStore, bk: BookKeeper):
        self.config = config
        # proto.channels.ChannelSecurity of this broker's own links to other brokers (set by BrokerServer)
        self.broker_client_security = None
        # broker.security.broker_security.BrokerSecurity (set by BrokerServer); None: no checks
        self.security = None
        self.metadata = metadata
        self.bk = bk
        self.resources = Resources(metadata)
        self.ml_factory = ManagedLedgerFactory(metadata, bk, config.managed_ledger_config())
        self.topics: dict[str, PersistentTopic] = {}
        self._loading: dict[str, asyncio.Task] = {}
        # Topics being closed (unload, fenced ledger) or deleted: no load meanwhile, so a
        # lookup never opens a managed ledger that is still closing or being deleted.
        self._closing: set[str] = set()
        self.rates: dict[str, dict] = {}
        self._stats_task: Optional[asyncio.Task] = None
        self._last_counters: dict[str, tuple] = {}
        self._last_stats_time = time.monotonic()
        self.started_at = time.time()
        self.service_url = ""  # minipulsar://host:port, set by BrokerServer once the port is bound
        self.web_service_url = ""  # http(s)://host:port of its REST admin (broker.http), set by BrokerServer
        # bundle ownership and lookup of a broker cluster (set by BrokerServer when the metadata
        # store is shared); None: a standalone broker serves every topic
        self.namespace_service = None

    async def start(self) -> None:
        """Start the periodic stats task (``update_rates`` every 2 s); topics are
        loaded on first use, not here."""
        self._stats_task = asyncio.create_task(self._stats_loop())

    async def close(self) -> None:
        """Stop the stats task, close every loaded topic (a failure is logged, not
        raised) and the managed ledger factory (Pulsar's BrokerService.close)."""
        if self._stats_task is not None:
            self._stats_task.cancel()
        for topic in list(self.topics.values()):
            try:
                await topic.close()
            except Exception as exc:
                log.warning("closing %s: %s", topic.name, exc)
        self.topics.clear()
        if self.namespace_service is not None:
            try:
                await self.namespace_service.close()
            except Exception as exc:  # noqa: BLE001 - the session's end releases the rest
                log.warning("releasing bundle ownership: %s", exc)
        await self.ml_factory.close()

    # ---- policies -------------------------------------------------------
    async def namespace_policies(self, namespace: str) -> Policies:
        """Policies of an existing namespace; TopicNotFound when it does not exist."""
        try:
            return await self.resources.get_policies(namespace)
        except NotFound:
            raise TopicNotFound(f"namespace {namespace} does not exist; create it with: "
                                f"minipulsar-admin namespaces create {namespace}") from None

    def dedup_enabled(self, policies: Policies) -> bool:
        """Whether a namespace's topics drop duplicates: its ``deduplication_enabled``
        policy when set, else ``broker_deduplication_enabled`` (Pulsar's brokerDeduplicationEnabled)."""
        if policies.deduplication_enabled is not None:
            return policies.deduplication_enabled
        return self.config.broker_deduplication_enabled

    # ---- lookup ---------------------------------------------------------
    async def lookup(self, topic: str, authoritative: bool = False) -> LookupAnswer:
        """Who serves ``topic``: in a broker cluster, the owner of its bundle (assigned by the
        leader when unowned; ``NamespaceService.lookup``). A standalone broker (metadata store
        not shared) owns every topic, so the answer is itself, reachable through the client's
        service URL (Pulsar standalone)."""
        if self.namespace_service is not None:
            return await self.namespace_service.lookup(topic, authoritative)
        return LookupAnswer(broker_service_url=self.service_url,
                            proxy_through_service_url=True)

    # ---- topics ---------------------------------------------------------
    async def get_topic(self, topic: str | TopicName, create: bool = True) -> PersistentTopic:
        """The loaded topic, loading or auto-creating it (allow_auto_topic_creation).
        Raises InvalidTopicName, TopicNotFound (no namespace, or not existing and
        create is False), NotAllowed (the parent of a partitioned topic)."""
        tn = topic if isinstance(topic, TopicName) else TopicName.get(topic)
        key = str(tn)
        if self.namespace_service is not None:
            await self.namespace_service.check_serving(tn, verify=key not in self.topics)
        loaded = self.topics.get(key)
        if loaded is not None and not loaded.closed:
            return loaded
        if key in self._closing:
            raise ServiceNotReady(f"topic {tn} is being unloaded or deleted on this broker; retry")
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.create_task(self._load_topic(tn, create))
        try:
            topic = await asyncio.shield(task)
        finally:
            if task.done():
                self._loading.pop(key, None)
        if topic.closed:  # unloaded while this caller waited for the load: never hand it out
            raise ServiceNotReady(f"topic {tn} was unloaded on this broker while loading; retry")
        return topic

    async def _load_topic(self, tn: TopicName, create: bool) -> PersistentTopic:
        policies = await self.namespace_policies(tn.namespace)
        if await self.resources.get_partitions(tn.persistence_naming) > 0:
            raise NotAllowed(f"{tn} is a partitioned topic: produce/consume on its partitions "
                             f"({tn}-partition-N); the client does this for you")
        exists = await self.metadata.exists(f"/managed-ledgers/{tn.persistence_naming}")
        parent_partitions = await self.resources.get_partitions(tn.partitioned_topic_name.persistence_naming) \
            if tn.is_partition else 0
        in_range = tn.is_partition and tn.partition_index < parent_partitions
        if parent_partitions > 0 and not in_range and (create or not exists):
            # Pulsar's BrokerService.getTopic: a partition beyond the partitioned topic's count would
            # store messages that no partitioned producer or consumer ever sees. Only an admin call on
            # such a topic that already exists (stats, delete: create=False) may still load it.
            raise NotAllowed(f"Illegal topic partition name {tn}: {tn.partitioned_topic_name} has "
                             f"{parent_partitions} partitions (indexes 0..{parent_partitions - 1}); use the "
                             f"partitioned topic's name, or one of its partitions")
        if not exists:
            if not in_range and (not create or not self.config.allow_auto_topic_creation):
                raise TopicNotFound(f"topic {tn} does not exist and auto-creation is "
                                    f"{'off' if not self.config.allow_auto_topic_creation else 'not asked'}; "
                                    f"create it with: minipulsar-admin topics create {tn}")
        bundle = await self.namespace_service.bundle_of(tn) if self.namespace_service is not None else None
        ml = await self.ml_factory.open(tn.persistence_naming)
        self._apply_retention(ml, policies)
        topic = PersistentTopic(self, tn, ml, self.dedup_enabled(policies))
        # a fenced managed ledger (taken over by another owner, or this broker lost the bundle or
        # its session) closes the topic; the next lookup loads it again from the store
        ml.add_fenced_listener(topic._add_failed)
        await topic.initialize()
        if bundle is not None and not self.namespace_service.serves_bundle(bundle):
            # the bundle was unloaded (or lost) while the topic loaded: an unload only closes
            # the topics it finds registered, so this one must not stay open here
            await topic.close()
            raise ServiceNotReady(f"topic {tn}: its bundle {bundle} moved while the topic was loading on "
                                  f"this broker; look it up again")
        self.topics[str(tn)] = topic
        log.info("loaded topic %s (instance %x)", tn, id(topic))
        await self.on_topic_loaded(topic, policies)
        return topic

    def _apply_retention(self, ml, policies: Policies) -> None:
        if policies.retention_time_in_minutes is not None:
            ml.config = ml.config.__class__(**{**ml.config.__dict__,
                                               "default_retention_time_in_minutes": policies.retention_time_in_minutes,
                                               "default_retention_size_in_mb": policies.retention_size_in_mb or 0})

    async def on_topic_loaded(self, topic: PersistentTopic, policies: Policies) -> None:
        """Hook for geo-replication (starts replicators)."""

    async def on_policies_changed(self, namespace: str, policies: Policies) -> None:
        """Hook for geo-replication (re-checks replicators of the namespace's topics)."""

    async def on_cluster_credentials_changed(self, name: str) -> None:
        """Hook for geo-replication (replicators to ``name`` reconnect with its new credentials)."""

    async def on_cluster_deleted(self, name: str) -> None:
        """Hook for geo-replication (closes replicators to the deleted cluster)."""

    async def unload_topic(self, topic: str) -> None:
        """Close a loaded topic (PersistentTopic.close): producers and consumers are
        disconnected and look it up again. Raises NotFound when it is not loaded."""
        tn = TopicName.get(topic)
        loaded = self.topics.get(str(tn))
        if loaded is None:
            raise NotFound(f"topic {tn} is not loaded on this broker")
        log.info("unloading topic %s (instance %x)", tn, id(loaded))
        await self._close_topic(loaded, loaded.close)

    async def _close_topic(self, topic: PersistentTopic, how) -> None:
        key = str(topic.name)
        self._closing.add(key)
        try:
            await how()
        finally:
            if self.topics.get(key) is topic:
                del self.topics[key]
            self._closing.discard(key)

    async def close_fenced_topic(self, topic: PersistentTopic) -> None:
        """Unload a topic whose managed ledger was fenced by another owner; the next
        lookup loads it again (and recovers its ledgers)."""
        try:
            await self._close_topic(topic, topic.close)
        except Exception as exc:  # noqa: BLE001 - the ledger is unusable anyway
            log.warning("closing fenced topic %s: %s", topic.name, exc)

    async def delete_topic(self, topic: str, force: bool = False) -> None:
        """Delete a topic's data (Pulsar's BrokerService.deleteTopic); for a partitioned topic
        each partition (missing ones skipped), then its partition metadata. Raises NotFound (no
        such topic), PreconditionFailed (producers or consumers connected and not ``force``;
        ``force`` disconnects them), ServiceNotReady (the topic is being unloaded)."""
        tn = TopicName.get(topic)
        partitions = await self.resources.get_partitions(tn.persistence_naming)
        if partitions > 0:
            for i in range(partitions):
                await self._delete_one(tn.partition(i), force, missing_ok=True)
            await self.resources.delete_partitioned_topic(tn.persistence_naming)
            return
        await self._delete_one(tn, force, missing_ok=False)

    async def _delete_one(self, tn: TopicName, force: bool, missing_ok: bool) -> None:
        if not await self.metadata.exists(f"/managed-ledgers/{tn.persistence_naming}"):
            if missing_ok:
                return
            raise NotFound(f"topic {tn} does not exist")
        topic = await self.get_topic(tn, create=False)
        if not force and (topic.producers or any(s.consumers for s in topic.subscriptions.values())):
            from .errors import PreconditionFailed
            raise PreconditionFailed(f"topic {tn} has connected producers or consumers; use --force")
        await self._close_topic(topic, topic.delete)

    async def list_topics(self, namespace: str) -> list[str]:
        """Every persistent topic of a namespace (partitions listed individually)."""
        await self.namespace_policies(namespace)
        names = await self.metadata.get_children(f"/managed-ledgers/{namespace}/persistent")
        return sorted(f"persistent://{namespace}/{n}" for n in names)

    async def partitions_of(self, topic: str) -> int:
        """Partition count of ``topic`` from the metadata store, 0 when it is not a
        partitioned topic (Pulsar's PartitionedTopicMetadata). Raises InvalidTopicName."""
        tn = TopicName.get(topic)
        return await self.resources.get_partitions(tn.persistence_naming)

    # ---- stats ----------------------------------------------------------
    async def _stats_loop(self, interval_s: float = 2.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.update_rates()
            except Exception:
                log.exception("stats update failed")

    def update_rates(self) -> None:
        """Rates (per second) over the last interval, as Pulsar's stats updater."""
        now = time.monotonic()
        elapsed = max(1e-3, now - self._last_stats_time)
        self._last_stats_time = now
        rates: dict[str, dict] = {}
        for name, topic in self.topics.items():
            prev = self._last_counters.get(name, (topic.msg_in_counter, topic.bytes_in_counter, {}))
            t_rates = {"msgRateIn": (topic.msg_in_counter - prev[0]) / elapsed,
                       "msgThroughputIn": (topic.bytes_in_counter - prev[1]) / elapsed, "subs": {}}
            sub_counters = {}
            for sname, sub in topic.subscriptions.items():
                out = sum(c.msg_out_counter for c in sub.consumers)
                out_b = sum(c.bytes_out_counter for c in sub.consumers)
                red = sum(c.msg_redeliver_counter for c in sub.consumers)
                p = prev[2].get(sname, (out, out_b, red))
                t_rates["subs"][sname] = {"msgRateOut": max(0, out - p[0]) / elapsed,
                                          "msgThroughputOut": max(0, out_b - p[1]) / elapsed,
                                          "msgRateRedeliver": max(0, red - p[2]) / elapsed}
                sub_counters[sname] = (out, out_b, red)
            rates[name] = t_rates
            topic.prune_marker_positions()
            self._last_counters[name] = (topic.msg_in_counter, topic.bytes_in_counter, sub_counters)
        self.rates = rates
