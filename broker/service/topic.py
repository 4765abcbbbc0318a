"""A persistent topic (Pulsar's ``PersistentTopic``): its managed ledger,
producers, deduplication, subscriptions and stats."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Optional

from broker.ledger.errors import ManagedLedgerError, ManagedLedgerFencedError
from broker.ledger.managed_ledger import ManagedLedger
from broker.ledger.position import Position
from broker.replication.markers import MarkerIndex, is_marker
from broker.security.replication_rules import check_entry_origin
from proto.entry_format import peek_metadata, verify_checksum
from proto.errors import CorruptedMessage, MessageTooBig, ProducerBusy
from proto.topic_name import TopicName
from proto import broker_pb2 as pb

from .consumer import Consumer
from .dedup import REPLICATOR_PREFIX, DedupStatus, MessageDeduplication
from .errors import InvalidArgument, NotFound, PreconditionFailed, ServiceNotReady
from .subscription import Subscription

if TYPE_CHECKING:
    from .broker_service import BrokerService

log = logging.getLogger(__name__)

DUP_POSITION = Position(-1, -1)
INTERNAL_CURSOR_PREFIXES = ("pulsar.dedup", "pulsar.repl.")
# Bounds of the scan for pre-restart markers in backlogs on topic load (entries, bytes).
MARKER_SCAN_MAX_ENTRIES = 50_000
MARKER_SCAN_MAX_BYTES = 256 * 1024 * 1024


def dedup_key(md) -> Optional[tuple[str, int]]:
    """(producer name, highest sequence id) under which an entry was deduplicated
    when stored: a replicated entry was sent by ``pulsar.repl.<origin>`` with its
    source position as sequence id; local markers are not deduplicated."""
    if md.HasField("replicated_from"):
        if not md.HasField("replicated_source_ledger_id"):
            return None
        return (REPLICATOR_PREFIX + md.replicated_from,
                (md.replicated_source_ledger_id << 32) | md.replicated_source_entry_id)
    if is_marker(md):
        return None
    if md.HasField("num_chunks_from_msg") and md.chunk_id != md.num_chunks_from_msg - 1:
        return None   # dedup state advances on the last chunk only, live and on replay (Pulsar #20948)
    return md.producer_name, max(md.sequence_id, md.highest_sequence_id)


# Largest sequence id a producer may use: Pulsar's are Java longs (signed 64-bit).
MAX_SEQUENCE_ID = 2**63 - 1

class BrokerProducer:
    """A producer connected to a topic (Pulsar's broker-side ``Producer``)."""

    def __init__(self, topic: "PersistentTopic", name: str, is_replicator: bool):
        self.topic = topic
        self.name = name
        self.is_replicator = is_replicator
        self.msg_in_counter = 0
        self.bytes_in_counter = 0
        self.connected_since_ms = int(time.time() * 1000)
        self.closed = False
        # set by edge_commands.open_producer (issue 32): replicated_from reserved to replicators (auth on),
        # the tenant's allowed clusters bounding replicate_to (None: unchecked)
        self.origin_checked = False
        self.allowed_clusters: Optional[frozenset] = None
        self.failed = False    # a stream stores nothing more after a send failed with a retriable error
        # Set by the transport: ends the producer's stream after its in-flight sends
        # are answered (Pulsar's Producer.disconnect), so the client looks up again.
        self.on_disconnect = None

    def disconnect(self, reason: BaseException) -> None:
        """Close this producer and end its stream with ``reason`` (retriable)."""
        self.closed = True
        if self.on_disconnect is not None:
            self.on_disconnect(reason)


class PersistentTopic:
    """Create through ``BrokerService.get_topic``."""

    def __init__(self, service: "BrokerService", name: TopicName, ml: ManagedLedger, dedup_enabled: bool):
        self.service = service
        self.config = service.config
        self.name = name
        self.ml = ml
        self.producers: dict[str, BrokerProducer] = {}
        self.subscriptions: dict[str, Subscription] = {}
        # Readers' non-durable subscriptions, only for stats (Pulsar lists them too); an
        # entry disappears with its Subscription, and stats() skips closed ones.
        self.non_durable_subscriptions: "weakref.WeakValueDictionary[str, Subscription]" = \
            weakref.WeakValueDictionary()
        self.dedup = MessageDeduplication(dedup_enabled, self.config.broker_deduplication_entries_interval)
        self._dedup_cursor = None
        self._dedup_last_position: Optional[Position] = None
        self.msg_in_counter = 0
        self.bytes_in_counter = 0
        self.markers = MarkerIndex()                     # markers not passed by every cursor (backlog figures)
        self.closed = False
        self.replicators: dict[str, object] = {}        # remote cluster -> replicator (geo-replication)
        self.message_ttl_seconds = 0                     # namespace policy; replicators skip expired entries
        self.fail_next_sends = 0                         # fault injection (enable_fault_injection)
        self.last_data_publish_ms = 0                    # last non-marker entry stored (snapshot controller)
        self.controller = None                           # ReplicatedSubscriptionsController (PIP-33)
        self._marker_scan: Optional[asyncio.Task] = None  # finds pre-restart markers in backlogs
        # PersistentTopic.addFailed: after a failed add the topic refuses sends until
        # every pending add completed, then rewinds deduplication and resumes.
        self.pending_write_ops = 0
        self.write_fenced = False

    @property
    def full_name(self) -> str:
        """The topic's full name, ``persistent://tenant/ns/topic`` (``-partition-N`` for a
        partition): the key of ``BrokerService.topics`` and of the rates."""
        return str(self.name)

    async def initialize(self) -> None:
        """Recover durable subscriptions and deduplication state, and start
        finding the markers in the subscriptions' backlogs (in the background)."""
        for cursor_name, cursor in self.ml.cursors.items():
            if cursor_name.startswith(INTERNAL_CURSOR_PREFIXES):
                continue
            self.subscriptions[cursor_name] = Subscription(self, cursor_name, cursor)
        await self.set_dedup_enabled(self.dedup.enabled, force=True)
        if self.subscriptions and self.ml.last_confirmed.entry_id >= 0:
            self._marker_scan = asyncio.create_task(self._recover_marker_positions(),
                                                    name=f"marker-scan {self.name}")

    async def _recover_marker_positions(self, max_entries: int = MARKER_SCAN_MAX_ENTRIES,
                                        max_bytes: int = MARKER_SCAN_MAX_BYTES) -> int:
        """Find the markers written before this broker loaded the topic (a restart)
        in the subscriptions' backlogs, so backlog figures keep excluding them.

        Reads at most ``max_entries`` entries (count) and about ``max_bytes``
        bytes from the slowest
        subscription's mark-delete position up to the last entry at the start
        (metadata only is parsed); markers past that limit count in backlogs
        until a consumer passes them. Returns the number of markers found.
        Read failures end the scan (logged), never the topic."""
        start = min(s.cursor.mark_delete_position for s in self.subscriptions.values())
        end = self.ml.last_confirmed
        reader = self.ml.new_non_durable_cursor(start, name=f"pulsar.marker-scan-{id(self)}", inclusive=False)
        found: list[Position] = []
        scanned = nbytes = 0
        try:
            while scanned < max_entries and nbytes < max_bytes and not self.closed:
                entries = await reader.read_entries(min(1000, max_entries - scanned))
                if not entries:
                    break
                for e in entries:
                    if e.position > end:
                        break
                    try:
                        if is_marker(peek_metadata(e.data)):
                            found.append(e.position)
                    except CorruptedMessage:
                        continue
                scanned += len(entries)
                nbytes += sum(len(e.data) for e in entries)
                if entries[-1].position >= end:
                    break
        except Exception as exc:   # noqa: BLE001 - backlog figures only
            log.warning("[%s] scanning the backlog for markers stopped after %d entries: %r", self.name, scanned, exc)
        if found:
            self.markers.merge(found)
            log.info("[%s] %d markers found in the backlog (%d entries scanned)", self.name, len(found), scanned)
        if scanned >= max_entries or nbytes >= max_bytes:
            log.info("[%s] backlog marker scan stopped at %d entries: markers after %s count in backlogs "
                     "until consumed", self.name, scanned, reader.read_position)
        return len(found)

    # ---- deduplication ----------------------------------------------------
    async def set_dedup_enabled(self, enabled: bool, force: bool = False) -> None:
        """Drop duplicates of normal producers or not. The state (and the
        ``pulsar.dedup`` cursor holding its snapshots) is kept either way, since
        replicator producers are always deduplicated (exactly-once replication)."""
        self.dedup.enabled = enabled
        if self._dedup_cursor is not None and not force:
            return
        name = MessageDeduplication.CURSOR_NAME
        cursor = await self.ml.open_cursor(name, initial_position="latest")
        self._dedup_cursor = cursor
        replayed = []
        reader = self.ml.new_non_durable_cursor(cursor.mark_delete_position, inclusive=False)
        while True:
            entries = await reader.read_entries(1000)
            if not entries:
                break
            for e in entries:
                try:
                    md = peek_metadata(e.data)
                except CorruptedMessage:
                    continue
                key = dedup_key(md)
                if key is not None:
                    replayed.append(key)
        self.dedup.load({k: v for k, v in cursor.properties.items()}, replayed)
        if replayed:
            log.info("[%s] deduplication state: %d producers known, %d entries replayed",
                     self.name, len(self.dedup.highest_sequenced_persisted), len(replayed))

    def _dedup_snapshot(self, position: Position) -> None:
        cursor = self._dedup_cursor
        if cursor is None:
            return
        try:
            fut = cursor.mark_delete_nowait(position, properties=self.dedup.snapshot())
            fut.add_done_callback(lambda f: f.exception())
        except Exception as exc:
            log.warning("[%s] dedup snapshot failed: %s", self.name, exc)

    # ---- producers ------------------------------------------------------
    def _check_open(self) -> None:
        """Raise ServiceNotReady (retriable: the client looks the topic up again) when
        this instance was closed (unloaded, deleted): nothing may attach to it."""
        if self.closed:
            raise ServiceNotReady(f"topic {self.name} was unloaded or deleted on this broker; look it up again")

    def add_producer(self, name: Optional[str], is_replicator: bool = False) -> BrokerProducer:
        """Register a producer; a generated name when ``name`` is empty. Raises
        ProducerBusy when the name is already connected, ServiceNotReady when the
        topic instance is closed."""
        self._check_open()
        if not name:
            name = f"{self.service.config.cluster_name}-{uuid.uuid4().hex[:12]}"
        if name in self.producers:
            raise ProducerBusy(f"producer {name} is already connected to {self.name}; "
                               f"use another producer_name or close the other one")
        producer = BrokerProducer(self, name, is_replicator)
        self.producers[name] = producer
        return producer

    def remove_producer(self, producer: BrokerProducer) -> None:
        """Detach a producer (its stream ended): mark it closed and unregister its name if it
        still holds it (Pulsar's AbstractTopic.removeProducer)."""
        producer.closed = True
        if self.producers.get(producer.name) is producer:
            del self.producers[producer.name]

    def last_sequence_id(self, producer_name: str) -> int:
        """Last persisted sequence id of ``producer_name``, -1 if none: ProducerSuccess's
        ``last_sequence_id`` (Pulsar's getLastPublishedSequenceId)."""
        return self.dedup.last_sequence_id(producer_name)

    def publish(self, producer: BrokerProducer, send: pb.Send) -> "asyncio.Future[Position]":
        """Store one Send (one entry); returns a future of its Position, or
        DUP_POSITION (-1:-1) for a duplicate. Raises MessageTooBig,
        CorruptedMessage, ServiceNotReady (dedup state unknown: retry)."""
        data = send.headers_and_payload
        if self.fail_next_sends > 0:
            self.fail_next_sends -= 1
            raise ServiceNotReady(f"{self.name}: injected send failure (enable_fault_injection)")
        if len(data) > self.config.max_message_size:
            raise MessageTooBig(f"message of {len(data)} bytes exceeds max_message_size="
                                f"{self.config.max_message_size} on {self.name}; enable chunking or send smaller")
        if self.closed:
            raise ServiceNotReady(f"topic {self.name} is closing on this broker; look it up again")
        if send.sequence_id > MAX_SEQUENCE_ID or send.highest_sequence_id > MAX_SEQUENCE_ID:
            # Pulsar's sequence ids are Java longs; one stored beyond would make every later
            # CreateProducer of this name fail (ProducerSuccess.last_sequence_id is int64).
            raise InvalidArgument(f"sequence id {max(send.sequence_id, send.highest_sequence_id)} of producer "
                                  f"{producer.name} is above {MAX_SEQUENCE_ID} (a signed 64-bit sequence id)")
        if self.write_fenced:
            raise ServiceNotReady(f"{self.name}: a write failed; waiting for {self.pending_write_ops} pending "
                                  f"writes before accepting sends again; retry")
        verify_checksum(data)
        md = peek_metadata(data)
        check_entry_origin(md, producer.name, producer.is_replicator, producer.origin_checked,
                           producer.allowed_clusters)   # markers, replicated_from, replicate_to (issue 32)
        highest = max(send.sequence_id, send.highest_sequence_id)
        # A chunked message is deduplicated on its last chunk (Pulsar #20948); a replicator's
        # sends always per entry, chunks included (its sequence id is the source position).
        check_dedup = producer.is_replicator or not md.HasField("num_chunks_from_msg") \
            or md.chunk_id == md.num_chunks_from_msg - 1
        if check_dedup:
            status = self.dedup.check(producer.name, send.sequence_id, highest)
            if status is DedupStatus.DUP:
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(DUP_POSITION)
                return fut
            if status is DedupStatus.UNKNOWN:
                raise ServiceNotReady(f"cannot tell yet whether sequence id {send.sequence_id} of {producer.name} "
                                      f"is a duplicate (still being persisted); retry")
            if status is DedupStatus.BEHIND:
                raise PreconditionFailed(
                    f"sequence id {send.sequence_id} of producer {producer.name} on {self.name} is below the last "
                    f"stored one ({self.dedup.last_sequence_id(producer.name)}): not stored now. It was either stored "
                    f"before or overtaken by later sends after a send timeout; deduplication cannot tell which, "
                    f"so it is refused rather than acknowledged as a duplicate (-1:-1)")
        n = max(1, send.num_messages)
        try:
            ml_future = self.ml.add_entry_nowait(data)
        except ManagedLedgerError as exc:
            self._add_failed(exc)
            raise ServiceNotReady(f"{self.name}: cannot store the message now ({exc}); retry") from None
        self.pending_write_ops += 1
        result = asyncio.get_running_loop().create_future()

        def done(f: asyncio.Future) -> None:
            self.pending_write_ops -= 1
            exc = f.exception()
            if exc is not None:
                producer.failed = True       # nothing more stored from this stream (see the servicer)
                self._add_failed(exc)
                result.set_exception(ServiceNotReady(f"{self.name}: storing failed ({exc}); retry"))
                return
            pos = f.result()
            self.msg_in_counter += n
            self.bytes_in_counter += len(data)
            producer.msg_in_counter += n
            producer.bytes_in_counter += len(data)
            if is_marker(md):
                self.markers.add(pos)
            else:
                self.last_data_publish_ms = int(time.time() * 1000)
            if self.controller is not None:
                self.controller.note_entry(pos, md, data)
            if check_dedup and self.dedup.record_persisted(producer.name, highest, send.sequence_id):
                self._dedup_snapshot(pos)
            if self.write_fenced:
                self._maybe_unfence()   # after recording it persisted: the rewind keeps it
            result.set_result(pos)

        ml_future.add_done_callback(done)
        return result

    def _add_failed(self, exc: BaseException) -> None:
        """PersistentTopic.addFailed: a fenced managed ledger (another owner) closes
        the topic; any other failure fences the topic until the pending adds drain."""
        if isinstance(exc, ManagedLedgerFencedError):
            if not self.closed:
                log.error("[%s] managed ledger fenced (%s): closing the topic", self.name, exc)
                asyncio.ensure_future(self.service.close_fenced_topic(self))
            return
        if not self.write_fenced:
            log.warning("[%s] a write failed (%s): refusing sends until %d pending writes complete",
                        self.name, exc, self.pending_write_ops)
            self.write_fenced = True
        self._maybe_unfence()

    def _maybe_unfence(self) -> None:
        if self.write_fenced and self.pending_write_ops == 0:
            self.dedup.reset_highest_sequence_id_pushed()
            self.write_fenced = False
            log.info("[%s] pending writes drained: deduplication rewound, accepting sends again", self.name)

    def on_replicated_marker(self, replicator, entry, metadata) -> bool:
        """Whether a local marker entry goes to ``replicator``'s remote; markers
        follow replicate_to like any entry."""
        return True

    def received_replicated_marker(self, from_cluster: str, entry, metadata) -> None:
        """A marker that came from ``from_cluster`` (seen by its replicator here)."""
        if self.controller is not None:
            self.controller.received_marker(from_cluster, entry, metadata)

    def write_marker(self, data: bytes) -> "asyncio.Future":
        """Append a marker entry (server-only; no producer, no deduplication)."""
        fut = self.ml.add_entry_nowait(data)

        def done(f):
            if f.exception() is None:
                self.markers.add(f.result())
            else:
                log.warning("[%s] writing a marker failed: %s", self.name, f.exception())

        fut.add_done_callback(done)
        return fut

    async def create_replicated_subscription(self, name: str, mark_delete: Optional[Position] = None) -> Subscription:
        """Create a replicated subscription for an UPDATE about a subscription this
        cluster does not have yet: at the update's position (Pulsar uses Latest,
        which would skip everything after that position)."""
        sub = self.subscriptions.get(name)
        if sub is None:
            cursor = await self.ml.open_cursor(name, initial_position=mark_delete or "latest")
            sub = self.subscriptions.get(name) or Subscription(self, name, cursor)
            self.subscriptions[name] = sub
        await sub.set_replicated(True)
        return sub

    async def last_message_position(self, max_markers: int = 10000) -> Position:
        """The last entry a consumer can receive: the last confirmed entry, skipping
        trailing markers (as Pulsar since apache/pulsar#22572), so a Reader's
        has_message_available() is False when only markers are left. (-1, -1)
        when there is no message."""
        ml = self.ml
        pos = ml.last_confirmed
        for _ in range(max_markers):
            if pos.entry_id < 0:
                pos = ml.previous_position(pos)
                if pos.entry_id < 0:
                    return Position(-1, -1)
                continue
            entries = await ml.read_entries(pos, 1)
            if not entries or entries[0].position != pos:
                return pos
            try:
                if not is_marker(peek_metadata(entries[0].data)):
                    return pos
            except CorruptedMessage:
                return pos
            pos = ml.previous_position(pos)
            if pos.entry_id < 0:
                return Position(-1, -1)
        return pos

    def prune_marker_positions(self) -> None:
        """Forget markers every cursor has passed (bounded memory)."""
        self.markers.prune(min((c.mark_delete_position for c in self.ml.cursors.values()),
                               default=self.ml.last_confirmed))

    # ---- subscriptions --------------------------------------------------
    async def subscribe(self, sub: pb.Subscribe, consumer: Consumer) -> Subscription:
        """Create or recover the subscription and attach ``consumer``."""
        if sub.durable:
            subscription = self.subscriptions.get(sub.subscription)
            if subscription is None:
                if sub.subscription.startswith(INTERNAL_CURSOR_PREFIXES):
                    raise InvalidArgument(f"subscription names starting with 'pulsar.' are reserved: {sub.subscription}")
                initial = "earliest" if sub.initial_position == pb.Earliest else "latest"
                cursor = await self.ml.open_cursor(sub.subscription, initial_position=initial)
                subscription = self.subscriptions.get(sub.subscription) or Subscription(self, sub.subscription, cursor)
                self.subscriptions[sub.subscription] = subscription
            if sub.replicate_subscription_state and self.config.enable_replicated_subscriptions:
                await subscription.set_replicated(True)
        else:
            start = Position(sub.start_message_id.ledger_id, sub.start_message_id.entry_id) \
                if sub.HasField("start_message_id") else Position(2**63 - 1, 2**63 - 1)
            if not sub.HasField("start_message_id") and sub.initial_position == pb.Earliest:
                start = Position(-1, -1)
            cursor = self.ml.new_non_durable_cursor(start, name=sub.subscription,
                                                    inclusive=sub.start_message_id_inclusive)
            subscription = Subscription(self, sub.subscription, cursor, durable=False)
            self.non_durable_subscriptions[sub.subscription] = subscription
        # The topic may have been unloaded while the cursor opened: a consumer attached to
        # the closed instance would never be disconnected (its acks would go nowhere).
        self._check_open()
        subscription.add_consumer(consumer, sub.sub_type)
        return subscription

    async def remove_subscription(self, name: str) -> None:
        """Delete a durable subscription: close it (dispatcher stopped, consumers disconnected),
        then delete its cursor (cursor ledger and metadata). Raises NotFound when there is no
        such subscription (Pulsar's PersistentTopic.unsubscribe)."""
        subscription = self.subscriptions.pop(name, None)
        if subscription is None:
            raise NotFound(f"subscription {name} does not exist on {self.name}")
        await subscription.close()
        await self.ml.delete_cursor(name)

    def markers_in_backlog(self, cursor) -> int:
        """Markers after ``cursor``'s mark-delete position not yet acknowledged by it
        (so user-visible backlogs exclude them, unlike Pulsar issue #22926)."""
        return self.markers.in_backlog(cursor)

    # ---- figures --------------------------------------------------------
    def stats(self) -> dict:
        """Topic stats with Pulsar's field names (TopicStats). ``subscriptions``
        lists the durable subscriptions and, as Pulsar does, the connected
        Readers' non-durable ones (``isDurable`` false); ``backlogSize`` counts
        the durable ones only."""
        rates = self.service.rates.get(self.full_name, {})
        subs = {}
        readers = [(n, s) for n, s in list(self.non_durable_subscriptions.items())
                   if s.consumers and n not in self.subscriptions]
        for name, s in [*self.subscriptions.items(), *readers]:
            srates = rates.get("subs", {}).get(name, {})
            subs[name] = {
                "msgBacklog": s.backlog(),
                "unackedMessages": s.unacked_messages(),
                "type": {0: "Exclusive", 1: "Shared", 2: "Failover", 3: "Key_Shared"}.get(s.sub_type, "None"),
                "msgRateOut": srates.get("msgRateOut", 0.0),
                "msgThroughputOut": srates.get("msgThroughputOut", 0.0),
                "msgRateRedeliver": srates.get("msgRateRedeliver", 0.0),
                "isReplicated": s.replicated,
                "isDurable": s.durable,
                "markDeletePosition": str(s.cursor.mark_delete_position),
                "readPosition": str(s.cursor.read_position),
                # ours: what the subscription's dispatcher is doing (dispatchers.DISPATCHER_STATES)
                "dispatcherState": s.dispatcher.state if s.dispatcher is not None else "none",
                "consumers": [{"consumerName": c.name, "availablePermits": c.permits,
                               "unackedMessages": c.unacked_messages, "msgOutCounter": c.msg_out_counter,
                               "isActive": c.is_active,
                               # the consumer stream's outgoing side (ours, not Pulsar's): frames
                               # queued and not yet written, their bytes, and frames written
                               "outboundQueuedFrames": c.writer.queue.qsize() if c.writer else 0,
                               "outboundQueuedBytes": c.writer.buffered_bytes if c.writer else 0,
                               "outboundFramesWritten": c.frames_written}
                              for c in s.consumers],
            }
        return {
            "msgRateIn": rates.get("msgRateIn", 0.0),
            "msgThroughputIn": rates.get("msgThroughputIn", 0.0),
            "msgRateOut": sum(v["msgRateOut"] for v in subs.values()),
            "msgThroughputOut": sum(v["msgThroughputOut"] for v in subs.values()),
            "msgInCounter": self.msg_in_counter,
            "bytesInCounter": self.bytes_in_counter,
            "storageSize": self.ml.total_size,
            "backlogSize": max((v["msgBacklog"] for v in subs.values() if v["isDurable"]), default=0),
            "publishers": [{"producerName": p.name, "msgInCounter": p.msg_in_counter,
                            "isReplicator": p.is_replicator} for p in self.producers.values()],
            "subscriptions": subs,
            "replication": {name: r.stats() for name, r in self.replicators.items() if hasattr(r, "stats")},
            "deduplicationEnabled": self.dedup.enabled,
        }

    def internal_stats(self) -> dict:
        """Managed-ledger level view (PersistentTopicInternalStats)."""
        return {
            "entriesAddedCounter": self.ml.entries_added_total,
            "numberOfEntries": self.ml.number_of_entries,
            "totalSize": self.ml.total_size,
            "currentLedgerEntries": self.ml.ledger_entries(self.ml.current.ledger_id) if self.ml.current else 0,
            "lastConfirmedEntry": str(self.ml.last_confirmed),
            "ledgers": [{"ledgerId": lid, "entries": entries, "size": size}
                        for lid, entries, size in self.ml.ledgers_info()],
            "cursors": {name: {"markDeletePosition": str(c.mark_delete_position),
                               "readPosition": str(c.read_position),
                               "individuallyDeletedMessages": c.individual_deleted.size(),
                               "properties": c.properties,
                               "cursorProperties": c.cursor_properties,
                               **self._read_ops(name)}
                        for name, c in self.ml.cursors.items()},
        }

    def _read_ops(self, cursor_name: str) -> dict:
        """Pulsar's cursor ``waitingReadOp`` (its dispatcher waits for a new entry at the read
        position) and ``pendingReadOps`` (reads in flight: 0 or 1 here, one dispatch loop)."""
        sub = self.subscriptions.get(cursor_name)
        state = sub.dispatcher.state if sub is not None and sub.dispatcher is not None else "none"
        return {"waitingReadOp": state == "waiting for entries", "pendingReadOps": int(state == "reading")}

    # ---- lifecycle ------------------------------------------------------
    async def _fence_and_disconnect(self, reason: str) -> None:
        """PersistentTopic.close/delete, first half: refuse new sends, stop the
        controller and replicators, disconnect producers (after answering their
        in-flight sends) and consumers; the managed ledger's close then waits for
        the adds still in flight."""
        self.closed = True
        if self._marker_scan is not None:
            self._marker_scan.cancel()
        if self.controller is not None:
            await self.controller.close()
        for r in list(self.replicators.values()):
            await r.close()
        error = ServiceNotReady(f"topic {self.name} {reason} on this broker; look it up again")
        for p in list(self.producers.values()):
            p.disconnect(error)
        for s in list(self.subscriptions.values()):
            await s.close()
        # Readers too (Pulsar's close disconnects every subscription's consumers): a Reader
        # left on the closed instance would get nothing more and its dispatcher would keep
        # reading a closed managed ledger.
        for s in list(self.non_durable_subscriptions.values()):
            await s.close()

    async def close(self) -> None:
        """Disconnect everything and close the managed ledger (topic unload)."""
        if self.closed:
            return
        await self._fence_and_disconnect("was unloaded")
        await self.ml.close()

    async def delete(self) -> None:
        """Fence the topic (as close), then delete its data: cursors, ledgers and
        metadata. Raises what the metadata store raises (nothing is swallowed)."""
        await self._fence_and_disconnect("was deleted")
        await self.ml.delete()
