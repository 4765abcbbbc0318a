"""ReplicatedSubscriptionsController (PIP-33), one per topic with replication.

* Every ``replicated_subscriptions_snapshot_frequency_millis`` it starts a
  snapshot (writes SNAPSHOT_REQUEST) unless no data arrived since the last
  completed one, no subscription is replicated, or a replicator is
  disconnected (as Pulsar: snapshots stop while a cluster is unreachable).
* Beyond PIP-33, follow-up snapshots: when a remote's data snapshot request
  arrives, this cluster takes one snapshot at its next tick even without new
  data of its own. Without it, a standby copy of a subscription active here
  never catches up with data that reached the standby's cluster after this
  cluster's last snapshot (late replication after a failover: the other
  clusters' backlogs arrive at the restarted one while this one is idle). The
  follow-up request is flagged ``follow_up`` so that it triggers no follow-ups
  in turn: an idle system stays quiet.
  Snapshots pending longer than ``replicated_subscriptions_snapshot_timeout_seconds``
  are dropped and counted.
* A SNAPSHOT_REQUEST received from a remote (through replication) is answered
  with a SNAPSHOT_RESPONSE carrying this topic's last position, restricted to
  the requester. Responses feed the pending builder; when complete a SNAPSHOT
  marker restricted to the local cluster is written.
* When a replicated subscription's mark-delete position passes a cached
  snapshot, an UPDATE marker carries the remote clusters' positions; a remote
  receiving an UPDATE acknowledges cumulatively up to its own position,
  creating the subscription if missing. Beyond PIP-33, the UPDATE also carries
  the subscription's individually acknowledged messages above the mark-delete
  position, identified by origin (cluster, source position); the remote
  acknowledges the matching entries too, so a failover does not redeliver them.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Optional

from broker.ledger.position import Entry, Position
from proto.entry_format import peek_metadata
from proto.errors import CorruptedMessage

from . import markers
from .snapshot import SnapshotBuilder

if TYPE_CHECKING:
    from broker.service.subscription import Subscription
    from broker.service.topic import PersistentTopic

log = logging.getLogger(__name__)

MAX_INDIVIDUAL_ACKS_IN_UPDATE = 20000     # acknowledged origin ids looked at per UPDATE (ranges are sent)
# Origins of the most recent entries kept by the controller (count): UPDATE markers name the
# acknowledged entries after the last passed snapshot by origin, and the entry cache no longer
# holds entries behind the readers (it is evicted by read position and age).
ORIGIN_INDEX_MAX = 200_000
MAX_SCAN_FOR_INDIVIDUAL_ACKS = 50000      # entries the remote scans to match them


class ControllerStats:
    """Process-wide counters for the Prometheus collector."""

    pending = 0
    timed_out = 0
    completed = 0
    latencies_ms: list[float] = []


class ReplicatedSubscriptionsController:
    """Pulsar's ReplicatedSubscriptionsController for one topic (see the module docstring).

    ``config``: the broker config; uses replicated_subscriptions_snapshot_frequency_millis
    (tick, ms), replicated_subscriptions_snapshot_timeout_seconds (s) and
    replicated_subscriptions_update_interval_millis (ms, UPDATE rate limit; not in Pulsar).
    ``pending``: snapshot id -> SnapshotBuilder of the snapshots in progress.
    """

    def __init__(self, topic: "PersistentTopic", local_cluster: str, config):
        self.topic = topic
        self.update_interval_s = config.replicated_subscriptions_update_interval_millis / 1000.0
        self._apply_lock = asyncio.Lock()
        self.local_cluster = local_cluster
        self.frequency_s = config.replicated_subscriptions_snapshot_frequency_millis / 1000.0
        self.timeout_ms = config.replicated_subscriptions_snapshot_timeout_seconds * 1000
        self.pending: dict[str, SnapshotBuilder] = {}
        self.last_completed_start_ms = 0
        self.follow_up_due = False            # a remote took a data snapshot: take one at the next tick
        self._follow_up_sids: set[str] = set()  # pending snapshots of ours that are follow-ups
        self._remote_sids: dict[str, None] = {}  # remote data snapshots seen (ordered, bounded)
        self.follow_ups = 0
        self.last_update_applied_ms: dict[str, float] = {}
        self._task: Optional[asyncio.Task] = None
        self.log_prefix = f"[{topic.name}][{local_cluster}]"
        # (ledger, entry) -> (origin cluster, source ledger, source entry) of recent non-marker
        # entries, oldest first; plain int tuples (not GC-tracked), bounded by ORIGIN_INDEX_MAX.
        self._origins: dict[tuple[int, int], tuple[str, int, int]] = {}

    def start(self) -> None:
        """Start the snapshot tick task (one ``start_new_snapshot`` per frequency); idempotent."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        """Stop the tick task and drop the pending snapshots (no longer counted as pending)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        ControllerStats.pending -= len(self.pending)
        self.pending.clear()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.frequency_s)
            try:
                self.start_new_snapshot()
            except Exception:
                log.exception("%s snapshot attempt failed", self.log_prefix)

    # ---- requester side -------------------------------------------------
    def start_new_snapshot(self) -> Optional[str]:
        """Drop timed-out pending snapshots, then write a SNAPSHOT_REQUEST marker and return its
        snapshot id (uuid4 hex); None when skipped: no replicated subscription, no remote, a
        replicator disconnected, or no new data since the last completed snapshot and no
        follow-up due (Pulsar's startNewSnapshot)."""
        now_ms = int(time.time() * 1000)
        for sid, b in list(self.pending.items()):
            if b.timed_out(now_ms, self.timeout_ms):
                del self.pending[sid]
                self._follow_up_sids.discard(sid)
                ControllerStats.pending -= 1
                ControllerStats.timed_out += 1
                log.info("%s snapshot %s timed out (missing %s)", self.log_prefix, sid, sorted(b.missing))
        if not any(s.replicated for s in self.topic.subscriptions.values()):
            return None
        follow_up = self.topic.last_data_publish_ms < self.last_completed_start_ms
        if follow_up and not self.follow_up_due:
            return None   # no new data since the last snapshot, and no remote asked for a follow-up
        remotes = sorted(self.topic.replicators)
        if not remotes:
            return None
        if not all(getattr(r, "connected", False) for r in self.topic.replicators.values()):
            return None   # as Pulsar: no snapshot while a cluster is unreachable
        self.follow_up_due = False
        sid = uuid.uuid4().hex
        self.pending[sid] = SnapshotBuilder(sid, remotes, now_ms)
        ControllerStats.pending += 1
        if follow_up:
            self._follow_up_sids.add(sid)
            self.follow_ups += 1
        self.topic.write_marker(markers.snapshot_request(sid, self.local_cluster, follow_up))
        return sid

    # ---- markers arriving through replication -----------------------------
    def received_marker(self, from_cluster: str, entry: Entry, md) -> None:
        """A marker replicated from ``from_cluster`` (seen by that cluster's replicator)."""
        try:
            kind, msg = markers.parse(entry.data)
        except (ValueError, CorruptedMessage) as exc:
            log.warning("%s bad marker at %s: %s", self.log_prefix, entry.position, exc)
            return
        if kind == markers.SNAPSHOT_REQUEST:
            if msg.source_cluster and msg.source_cluster != self.local_cluster:
                last = self.topic.ml.last_confirmed
                self.topic.write_marker(markers.snapshot_response(msg.snapshot_id, msg.source_cluster,
                                                                  self.local_cluster, last))
                if not msg.follow_up and msg.snapshot_id not in self._remote_sids:
                    # the second round of the same snapshot asks for nothing more
                    self._remote_sids[msg.snapshot_id] = None
                    if len(self._remote_sids) > 256:
                        del self._remote_sids[next(iter(self._remote_sids))]
                    self.follow_up_due = True
        elif kind == markers.SNAPSHOT_RESPONSE:
            builder = self.pending.get(msg.snapshot_id)
            if builder is None:
                return
            action = builder.received_response(entry.position, msg.cluster.cluster,
                                               markers.position(msg.cluster.message_id))
            if action == "second_round":
                self.topic.write_marker(markers.snapshot_request(msg.snapshot_id, self.local_cluster,
                                                                 msg.snapshot_id in self._follow_up_sids))
            elif action == "complete":
                del self.pending[msg.snapshot_id]
                self._follow_up_sids.discard(msg.snapshot_id)
                ControllerStats.pending -= 1
                ControllerStats.completed += 1
                latency = time.time() * 1000 - builder.start_ms
                ControllerStats.latencies_ms = (ControllerStats.latencies_ms + [latency])[-1000:]
                self.last_completed_start_ms = builder.start_ms
                self.topic.write_marker(markers.snapshot(msg.snapshot_id, self.local_cluster, builder.local,
                                                         builder.responses))
        elif kind == markers.UPDATE:
            asyncio.ensure_future(self._apply_update_serialized(msg))

    # ---- subscription updates ---------------------------------------------
    def subscription_acked(self, subscription: "Subscription", snapshot=None) -> None:
        """A replicated subscription's acknowledgments changed. With a newly passed
        ``snapshot`` an UPDATE goes out now (PIP-33); otherwise, beyond PIP-33, an
        UPDATE based on the last passed snapshot plus the acknowledged origins
        goes out at most every ``update_interval_s`` (trailing call included), so
        a failover redelivers at most that much rather than a snapshot period."""
        if snapshot is not None:
            subscription.last_snapshot_used = snapshot
            self._send_update(subscription)
            return
        if subscription.last_snapshot_used is None:
            return
        loop = asyncio.get_running_loop()
        wait = subscription.last_update_sent + self.update_interval_s - loop.time()
        if wait <= 0 and subscription.update_timer is None:
            self._send_update(subscription)
        elif subscription.update_timer is None:
            subscription.update_timer = loop.call_later(max(0.0, wait), self._send_update, subscription)

    def _send_update(self, subscription: "Subscription") -> None:
        if subscription.update_timer is not None:
            subscription.update_timer.cancel()
            subscription.update_timer = None
        snap = subscription.last_snapshot_used
        if snap is None or self.topic.closed:
            return
        subscription.last_update_sent = asyncio.get_running_loop().time()
        clusters = {c.cluster: markers.position(c.message_id) for c in snap.clusters}
        origins = self._acked_origins(subscription, markers.position(snap.local_message_id))
        self.topic.write_marker(markers.update(subscription.name, clusters, origins))

    def note_entry(self, pos: Position, md) -> None:
        """Record the origin of the entry just stored at ``pos`` (``md``: its
        MessageMetadata): ``replicated_from`` and its source position, else this
        cluster and ``pos``; markers are skipped. Keeps the last ORIGIN_INDEX_MAX."""
        if markers.is_marker(md):
            return
        if md.HasField("replicated_from"):
            origin = (md.replicated_from, md.replicated_source_ledger_id, md.replicated_source_entry_id)
        else:
            origin = (self.local_cluster, pos.ledger_id, pos.entry_id)
        index = self._origins
        index[(pos.ledger_id, pos.entry_id)] = origin
        if len(index) > ORIGIN_INDEX_MAX:
            del index[next(iter(index))]

    def _acked_origins(self, subscription: "Subscription", after: Position) -> dict[str, list]:
        """Acknowledged entries after ``after`` (the passed snapshot's position), up to
        and beyond the mark-delete position, as origin ranges
        {origin cluster: [(first, last) source positions]}. Origins come from the
        controller's index of recent entries (``note_entry``), else the entry cache;
        entries in neither are left out (they may be redelivered: at-least-once)."""
        cursor = subscription.cursor
        ml = cursor.ml
        ids: list[tuple[str, Position]] = []

        def add(pos: Position) -> None:
            """Append the origin (cluster, source position) of the non-marker entry at ``pos``."""
            known = self._origins.get((pos.ledger_id, pos.entry_id))
            if known is not None:
                ids.append((known[0], Position(known[1], known[2])))
                return
            data = ml.cache.get(pos)
            if data is None:
                return
            try:
                md = peek_metadata(data)
            except CorruptedMessage:
                return
            if markers.is_marker(md):
                return
            if md.HasField("replicated_from"):
                ids.append((md.replicated_from, Position(md.replicated_source_ledger_id, md.replicated_source_entry_id)))
            else:
                ids.append((self.local_cluster, pos))

        pos = ml.next_position(after)
        md_pos = cursor.mark_delete_position
        while pos <= md_pos and len(ids) < MAX_INDIVIDUAL_ACKS_IN_UPDATE:
            add(pos)
            pos = ml.next_position(pos)
        for (lo_l, lo_e), (hi_l, hi_e) in cursor.individual_deleted.ranges():
            for e in range(lo_e, hi_e + 1):
                if len(ids) >= MAX_INDIVIDUAL_ACKS_IN_UPDATE:
                    break
                add(Position(lo_l, e))
        out: dict[str, list] = {}
        for origin, src in sorted(ids):
            ranges = out.setdefault(origin, [])
            if ranges and ranges[-1][1].ledger_id == src.ledger_id and ranges[-1][1].entry_id + 1 == src.entry_id:
                ranges[-1] = (ranges[-1][0], src)
            else:
                ranges.append((src, src))
        return out

    async def _apply_update_serialized(self, msg) -> None:
        async with self._apply_lock:
            await self._apply_update(msg)

    async def _apply_update(self, msg) -> None:
        mine = None
        for c in msg.clusters:
            if c.cluster == self.local_cluster:
                mine = markers.position(c.message_id)
        if mine is None:
            return
        topic = self.topic
        sub = topic.subscriptions.get(msg.subscription_name)
        if sub is None:
            sub = await topic.create_replicated_subscription(msg.subscription_name, min(mine, topic.ml.last_confirmed))
        target = min(mine, topic.ml.last_confirmed)
        if target > sub.cursor.mark_delete_position:
            try:
                sub.cursor.mark_delete_nowait(target)
                sub.after_mark_delete_moved_by_update()
            except Exception as exc:
                log.warning("%s applying update of %s failed: %s", self.log_prefix, sub.name, exc)
                return
        if msg.individually_acked:
            await self._apply_individual(sub, msg.individually_acked)
        self._ack_markers_below_acked(sub)
        self.last_update_applied_ms[sub.name] = time.time() * 1000

    def _ack_markers_below_acked(self, sub: "Subscription") -> None:
        """Markers are never delivered: acknowledge those between the mark-delete
        position and the highest acknowledged entry, so the mark-delete position
        follows the UPDATEs even with no consumer reading here."""
        cursor = sub.cursor
        md = cursor.mark_delete_position
        last_range = cursor.individual_deleted.last_range()
        if last_range is None:
            return
        highest = Position(*last_range[1])
        markers_between = self.topic.markers.between(md, highest)
        if markers_between:
            try:
                cursor.delete_nowait(markers_between)
                sub.after_mark_delete_moved_by_update()
            except Exception as exc:
                log.debug("%s acknowledging markers of %s: %s", self.log_prefix, sub.name, exc)

    async def _apply_individual(self, sub: "Subscription", acked) -> None:
        wanted: dict[str, set[Position]] = {}
        for car in acked:
            ids = wanted.setdefault(car.cluster, set())
            for lo, hi in zip(car.range_start, car.range_end):
                lo_p, hi_p = markers.position(lo), markers.position(hi)
                if lo_p.ledger_id == hi_p.ledger_id:
                    for e in range(lo_p.entry_id, hi_p.entry_id + 1):
                        ids.add(Position(lo_p.ledger_id, e))
        total = sum(len(v) for v in wanted.values())
        if not total:
            return
        local_own = wanted.get(self.local_cluster, set())
        positions = [p for p in local_own if p > sub.cursor.mark_delete_position and p <= self.topic.ml.last_confirmed]
        remaining = total - len(local_own)
        if remaining:
            # Find the replicated copies by scanning forward from the mark-delete position.
            reader = self.topic.ml.new_non_durable_cursor(sub.cursor.mark_delete_position, inclusive=False)
            scanned = 0
            while remaining and scanned < MAX_SCAN_FOR_INDIVIDUAL_ACKS:
                entries = await reader.read_entries(500)
                if not entries:
                    break
                scanned += len(entries)
                for e in entries:
                    try:
                        md = peek_metadata(e.data)
                    except CorruptedMessage:
                        continue
                    if not md.HasField("replicated_from"):
                        continue
                    src = Position(md.replicated_source_ledger_id, md.replicated_source_entry_id)
                    if src in wanted.get(md.replicated_from, ()):
                        positions.append(e.position)
                        remaining -= 1
        if positions:
            try:
                sub.cursor.delete_nowait(positions)
                sub.after_mark_delete_moved_by_update()
            except Exception as exc:
                log.warning("%s applying individual acks of %s failed: %s", self.log_prefix, sub.name, exc)
