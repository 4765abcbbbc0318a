"""Broker lookups of the Spark source's driver side (blocking).

``BrokerLookup`` answers what ``partitions()`` / ``latestOffset()`` need:
which topic partitions exist (without auto-creating anything: the admin verb
``topics.internal_stats``, Pulsar's PersistentTopicInternalStats, which also
gives the ledgers), and each one's last message id (GetLastMessageId: like
Pulsar's since apache/pulsar#22572 it should be the last *dispatchable* entry,
not a trailing marker, which a Reader never receives).  Errors become ``SourceError``s that
name the option to fix.

It owns an event-loop thread and an ``AdminClient``; it is not picklable state:
the source drops it when Spark pickles a reader (``__getstate__``) and opens a
new one lazily.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Iterable, NamedTuple

from client.errors import ConnectError, NotFound, PulsarException, Timeout, TopicNotFound
from client.spark.offsets import EARLIEST, LedgerInfo, Position, TopicPartition, partition_topic_name
from client.spark.options import SourceError, SourceOptions

__all__ = ["PartitionState", "BrokerLookup", "parse_stats_position"]

log = logging.getLogger(__name__)


class PartitionState(NamedTuple):
    """A partition's managed-ledger view: ``last`` entry (``EARLIEST`` when it
    holds none) and its ledgers, oldest first."""

    last: Position
    ledgers: tuple[LedgerInfo, ...]


def parse_stats_position(text: str) -> Position:
    """``"ledger:entry"`` from internal stats -> ``Position``; no entry yet
    (``"L:-1"``, ``"-1:-1"``) -> ``EARLIEST``."""
    ledger, _, entry = str(text).partition(":")
    pos = Position(int(ledger), int(entry))
    return EARLIEST if pos.entry_id < 0 or pos.ledger_id < 0 else pos


def unreachable(options: SourceOptions, exc: Exception) -> SourceError:
    """The error for a broker that cannot be reached."""
    return SourceError(f"option 'service_url': cannot reach the broker at {options.service_url} within "
                       f"{options.operation_timeout_ms / 1000:g}s ({exc}); check the URL and that the broker "
                       f"is running (option 'operationTimeoutMs' sets the wait)")


class BrokerLookup:
    """Blocking lookups against the broker at ``options.service_url``.

    Methods raise ``SourceError`` (unknown topic -> option ``topics``,
    unreachable broker -> option ``service_url``).  ``close()`` when done.
    """

    def __init__(self, options: SourceOptions):
        from client.admin import AdminClient
        from client.sync import LoopThread
        self.options = options
        self._lt = LoopThread("minipulsar-spark-lookup")
        self._admin = AdminClient(options.service_url, options.operation_timeout_ms / 1000)
        self._client = None   # AsyncClient, created on the loop thread
        self._subscription_lock: asyncio.Lock | None = None   # created on the loop thread

    def _run(self, coro):
        try:
            return self._lt.run(coro)
        except (ConnectError, Timeout) as exc:
            raise unreachable(self.options, exc) from None

    # -- topics ---------------------------------------------------------------------
    def discover(self) -> list[TopicPartition]:
        """The partitions to read: every partition of each topic of option
        ``topics`` (``-1`` for a non-partitioned topic), or of the topics matching
        ``topicsPattern``.  Raises ``SourceError`` for a topic that does not exist."""
        return self._run(self._discover())

    async def _discover(self) -> list[TopicPartition]:
        if self.options.topics:
            found = await asyncio.gather(*(self._topic_partitions(t) for t in self.options.topics))
            return [tp for group in found for tp in group]
        return await self._pattern_partitions()

    async def _topic_partitions(self, topic: str) -> list[TopicPartition]:
        try:
            n = await self._admin.get_partitioned_topic_metadata(topic)
            if n > 0:
                return [TopicPartition(topic, i) for i in range(n)]
            await self._admin.get_internal_stats(topic)  # exists? (never auto-creates)
        except (TopicNotFound, NotFound) as exc:
            raise SourceError(f"option 'topics': topic {topic} does not exist ({exc})") from None
        except (ConnectError, Timeout):
            raise
        except PulsarException as exc:
            raise SourceError(f"option 'topics': cannot look up {topic}: {exc}") from None
        return [TopicPartition(topic, -1)]

    async def _pattern_partitions(self) -> list[TopicPartition]:
        ns, regex = self.options.pattern_namespace, self.options.pattern_regex
        try:
            partitioned = await self._admin.list_partitioned_topics(ns)
            listed = await self._admin.list_topics(ns)
        except (ConnectError, Timeout):
            raise
        except PulsarException as exc:
            raise SourceError(f"option 'topicsPattern': cannot list the topics of namespace {ns}: {exc}") from None
        out: list[TopicPartition] = []
        for topic in sorted(partitioned):
            if regex.fullmatch(topic):
                n = await self._admin.get_partitioned_topic_metadata(topic)
                out.extend(TopicPartition(topic, i) for i in range(n))
        parents = set(partitioned)
        for topic in sorted(listed):
            base, sep, idx = topic.rpartition("-partition-")
            if sep and idx.isdigit() and base in parents:
                continue
            if regex.fullmatch(topic):
                out.append(TopicPartition(topic, -1))
        return out

    # -- partition state ------------------------------------------------------------------
    def states(self, partitions: Iterable[TopicPartition], missing_ok: bool = False
               ) -> dict[TopicPartition, PartitionState]:
        """Last message id and ledgers of each partition (concurrent lookups).  A
        partition that no longer exists raises ``TopicNotFound`` or, with
        ``missing_ok``, is left out of the answer."""
        return self._run(self._states(list(partitions), missing_ok))

    async def _states(self, partitions: list[TopicPartition], missing_ok: bool):
        if self._client is None:
            from client.client import AsyncClient
            self._client = AsyncClient(self.options.service_url,
                                       operation_timeout_seconds=self.options.operation_timeout_ms / 1000)

        async def one(tp: TopicPartition):
            name = partition_topic_name(tp)
            try:
                # internal stats first: they never auto-create a deleted topic
                stats = await self._admin.get_internal_stats(name)
                last_id = await self._client.get_last_message_id(name)
            except (TopicNotFound, NotFound):
                if missing_ok:
                    return tp, None
                raise
            ledgers = tuple(LedgerInfo(int(li["ledgerId"]), int(li["entries"])) for li in stats.get("ledgers", ()))
            last = EARLIEST if last_id.entry_id < 0 else Position(last_id.ledger_id, last_id.entry_id)
            return tp, PartitionState(last, ledgers)
        results = await asyncio.gather(*(one(tp) for tp in partitions))
        return {tp: state for tp, state in results if state is not None}

    # -- durable subscriptions (option durableSubscription) ---------------------------------
    def create_subscription(self, tp: TopicPartition, name: str, after: Position) -> bool:
        """Create the durable subscription ``name`` on ``tp`` with everything after
        entry ``after`` unacknowledged (``EARLIEST``: everything).  False when it
        exists already (left by an earlier run): it is then moved to ``after``."""
        from client.errors import AlreadyExists
        topic = partition_topic_name(tp)
        try:
            if after == EARLIEST:
                self._run(self._serialized(self._admin.create_subscription(topic, name, "earliest")))
            else:
                self._run(self._serialized(self._admin.create_subscription(topic, name, str(after),
                                                                           is_excluded=True)))
            return True
        except AlreadyExists:
            self.move_subscription(tp, name, after)
            return False

    def move_subscription(self, tp: TopicPartition, name: str, after: Position) -> None:
        """Move subscription ``name`` of ``tp`` so that entries up to ``after`` are
        acknowledged (Pulsar's resetCursor with isExcluded)."""
        if after == EARLIEST:
            return
        self._run(self._serialized(self._admin.reset_cursor(partition_topic_name(tp), name, message_id=str(after),
                                                            is_excluded=True)))

    def remove_subscription(self, tp: TopicPartition, name: str) -> None:
        """Delete subscription ``name`` of ``tp``; a missing one is fine."""
        try:
            self._run(self._serialized(self._admin.unsubscribe(partition_topic_name(tp), name)))
        except (TopicNotFound, NotFound):
            pass

    async def _serialized(self, coro):
        """Run the subscription operation ``coro`` after the ones before it
        finished.  A call abandoned by its blocking caller (SIGTERM raised
        ``SystemExit`` in the wait, see ``stream._stop_on_sigterm``) still runs
        on the loop thread: without this, the ``remove_subscription`` that
        follows could reach the broker before an abandoned create, and the
        subscription would outlive the query."""
        if self._subscription_lock is None:
            self._subscription_lock = asyncio.Lock()
        async with self._subscription_lock:
            return await coro

    def local_cluster(self) -> str:
        """The broker's cluster name (admin ``brokers.health``)."""
        return str(self._run(self._admin.health()).get("cluster", ""))

    def close(self) -> None:
        """Close the admin client and stop the thread.  Idempotent."""
        if self._lt.running:
            for closeable in (self._admin, self._client):
                if closeable is None:
                    continue
                try:
                    self._lt.run(closeable.close())
                except Exception:  # noqa: BLE001 - closing anyway
                    pass
            self._lt.stop()

    def __enter__(self) -> "BrokerLookup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
