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
* Beyond PIP-33 (issue 15): acknowledgments travel by origin id. Every data
  entry's origin (cluster + source position, ``replicated_from`` in copies) is
  kept in an ``OriginIndex``; when a replicated subscription's acknowledgments
  change, an UPDATE carries its whole acknowledged state as origin-id sets
  (``origin_acks.acked_origins``: per origin cluster an ``acked_through``
  position plus compacted intervals and batch indexes), at most every
  ``replicated_subscriptions_update_interval_millis``, with or without
  snapshots. A cluster receiving it acknowledges the matching local copies at
  once, and keeps the ids whose entries have not arrived (a third cluster's, in
  flight) pending (``origin_acks.RemoteAcks``): they are acknowledged as the
  entries arrive (``note_entry``). The pending part is persisted in the
  subscription's cursor properties (``PENDING_PROPERTY_PREFIX`` + sender, in
  ManagedCursorInfo in the metadata store, written only when it changes) so a
  broker restart loses nothing; the backlog is scanned once to rebuild the
  index: at topic load when the topic has a replicated subscription, else when
  an UPDATE first creates one (a plain replicated topic reads nothing more). A subscription missing here is created by the first
  UPDATE just before the first entry the sender did not acknowledge.
* PIP-33 snapshots stay: the UPDATE still carries the positions of the last
  snapshot the subscription passed (Pulsar-compatible cumulative positions), and
  they bound where a subscription created by an UPDATE may start.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import time
import uuid
from typing import TYPE_CHECKING, Optional

from broker.ledger.position import Entry, Position
from proto import pulsar_api_pb2 as api
from proto.common import REPLICATOR_CURSOR_PREFIX
from proto.entry_format import peek_metadata
from proto.errors import CorruptedMessage

from . import markers
from .origin_acks import MAX_UPDATE_BATCHES, MAX_UPDATE_RANGES, RemoteAcks, acked_origins, creation_position
from .origin_index import OriginIndex
from .snapshot import SnapshotBuilder

if TYPE_CHECKING:
    from broker.service.subscription import Subscription
    from broker.service.topic import PersistentTopic

log = logging.getLogger(__name__)

#: Entries / bytes read at most when a topic is loaded to rebuild its origin index.
ORIGIN_SCAN_MAX_ENTRIES = 50_000
ORIGIN_SCAN_MAX_BYTES = 256 * 1024 * 1024
#: Cursor property (ManagedCursorInfo.cursorProperties) holding, per sender cluster, the
#: acknowledgments received from it whose entries have not arrived yet (base64 of a
#: ReplicatedSubscriptionsUpdate).
PENDING_PROPERTY_PREFIX = "pulsar.replicated.pending."


class ControllerStats:
    """Process-wide counters for the Prometheus collector."""

    pending = 0
    timed_out = 0
    completed = 0
    latencies_ms: list[float] = []
    update_markers = 0          # UPDATE markers written
    update_marker_bytes = 0     # their bytes (entry: metadata + payload)
    acked_on_arrival = 0        # entries acknowledged as they arrived (pending origin ids)
    pending_restored = 0        # pending acknowledgments restored from cursor properties (pieces)


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
        # Data entries after `complete_after` -> origin ids (issue 15); entries stored before
        # this controller started are added by the backlog scan (`start`).
        self.index = OriginIndex(complete_after=topic.ml.last_confirmed)
        self.index_ready = asyncio.Event()     # set once the backlog scan is done: UPDATEs wait for it
        self._scan_end = topic.ml.last_confirmed
        self._scan_task: Optional[asyncio.Task] = None
        self._lazy_scan_end: Optional[Position] = None   # entries up to here not scanned yet (no subscription)
        self.remote: dict[str, RemoteAcks] = {}    # subscription -> acknowledgments received by origin id
        self._restored: dict[tuple[str, str], list] = {}
        self._props_wanted: dict[str, dict] = {}
        self._props_tasks: dict[str, asyncio.Task] = {}
        self._last_prune = 0.0
        self._updates_seen: dict[Position, None] = {}   # UPDATE markers applied (recent, ordered, bounded)
        self.acked_on_arrival = 0       # entries acknowledged when they arrived (pending ids)
        self.updates_applied = 0
        self.pending_persists = 0

    def start(self) -> None:
        """Start the snapshot tick task (one ``start_new_snapshot`` per frequency), restore the
        pending acknowledgments persisted in the cursors and start the backlog scan that
        completes the origin index; idempotent."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop())
            self._restore_pending()
            if any(s.replicated for s in self.topic.subscriptions.values()):
                self._scan_task = asyncio.create_task(self._scan_backlog(self._scan_end),
                                                      name=f"origin-scan {self.topic.name}")
            else:
                # nothing to compute or match yet: the backlog is scanned only if an UPDATE
                # creates a subscription here (a plain replicated topic reads nothing at load)
                self._lazy_scan_end = self._scan_end
                self.index_ready.set()

    async def close(self) -> None:
        """Write the UPDATEs held back by the rate limit (the topic is closing: they
        replicate once it is loaded again), stop the tick task and drop the pending
        snapshots (no longer counted as pending)."""
        flushes = []
        for sub in list(self.topic.subscriptions.values()):
            if sub.update_timer is not None:
                try:
                    fut = self._send_update(sub, closing=True)
                except Exception as exc:   # noqa: BLE001 - e.g. the ledger is fenced: nothing to flush to
                    log.info("%s last UPDATE of %s not written: %s", self.log_prefix, sub.name, exc)
                    continue
                if fut is not None:
                    flushes.append(fut)
        if flushes:
            await asyncio.wait(flushes, timeout=5)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._scan_task is not None and not self._scan_task.done():
            self._scan_task.cancel()
        writes = [t for t in self._props_tasks.values() if not t.done()]
        if writes:   # pending acknowledgments being persisted: let them land
            await asyncio.wait(writes, timeout=5)
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
            if entry.position in self._updates_seen:
                return     # applied when it was stored; the replicator reads it again
            self._updates_seen[entry.position] = None
            if len(self._updates_seen) > 4096:
                del self._updates_seen[next(iter(self._updates_seen))]
            asyncio.ensure_future(self._apply_update_serialized(from_cluster, msg))

    # ---- the origin index (issue 15) -----------------------------------------
    def note_entry(self, pos: Position, md, data: Optional[bytes] = None) -> None:
        """An entry was just stored at ``pos`` (``md``: its MessageMetadata, ``data``: its
        bytes). A data entry goes into the origin index (origin: ``replicated_from``
        and its source position, else this cluster and ``pos``; scope:
        ``replicate_to``), and is acknowledged at once in the replicated
        subscriptions whose pending acknowledgments from other clusters name it. An
        UPDATE from another cluster is applied as it is stored (the entries it
        names that came in the same replication stream are stored before it),
        not when this cluster's replicator reads it back. Other markers are skipped."""
        if markers.is_marker(md):
            if data is not None and md.marker_type == markers.UPDATE and md.HasField("replicated_from"):
                self.received_marker(md.replicated_from, Entry(pos, data), md)
            return
        if md.HasField("replicated_from"):
            origin = md.replicated_from
            opos = Position(md.replicated_source_ledger_id, md.replicated_source_entry_id)
        else:
            origin, opos = self.local_cluster, pos
        scope = frozenset(md.replicate_to) if md.replicate_to else None
        self.index.add(pos, origin, opos, scope)
        if not self.remote:
            return
        for name, remote in self.remote.items():
            whole, partial = remote.match(origin, opos, scope)
            if not whole and partial is None:
                continue
            sub = self.topic.subscriptions.get(name)
            if sub is None:
                continue
            try:
                if whole:
                    sub.cursor.delete_nowait([pos])
                else:
                    n = md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 1
                    indexes = [i for i in partial[1] if i < n]
                    if indexes:
                        sub.cursor.delete_batch_index_nowait(pos, n, indexes)
            except Exception as exc:   # noqa: BLE001 - an ack lost here is a redelivery, not a failure
                log.warning("%s acknowledging arrived %s of %s failed: %s", self.log_prefix, pos, name, exc)
                continue
            self.acked_on_arrival += 1
            ControllerStats.acked_on_arrival += 1
            self._ack_markers_below_acked(sub)
            sub.after_mark_delete_moved_by_update()

    def _origin_of_entry(self, pos: Position, data: bytes):
        try:
            md = peek_metadata(data)
        except CorruptedMessage:
            return None
        if markers.is_marker(md):
            return None
        if md.HasField("replicated_from"):
            origin = md.replicated_from
            opos = Position(md.replicated_source_ledger_id, md.replicated_source_entry_id)
        else:
            origin, opos = self.local_cluster, pos
        return origin, opos, (frozenset(md.replicate_to) if md.replicate_to else None)

    async def _scan_backlog(self, end: Position) -> None:
        """Index the entries stored before this controller started (a topic load after
        a restart): from the slowest replicated subscription's mark-delete position
        (else the first entry), at most ORIGIN_SCAN_MAX_ENTRIES / _BYTES back from
        ``end``, up to ``end``; then apply the pending acknowledgments restored from
        the cursors and let UPDATEs through. A scan that cannot finish leaves the
        index starting at ``end`` (older entries are not matched: redelivered)."""
        ml = self.topic.ml
        try:
            if end.entry_id >= 0 or ml.number_of_entries > 0:
                first = ml.first_position()
                start = Position(first.ledger_id, first.entry_id - 1)
                subs = [s.cursor.mark_delete_position for s in self.topic.subscriptions.values() if s.replicated]
                if subs:
                    start = max(start, min(subs))
                total = ml.number_of_entries
                if ml.count_entries_between(start, end) > ORIGIN_SCAN_MAX_ENTRIES and total > ORIGIN_SCAN_MAX_ENTRIES:
                    start = ml.previous_position(ml.position_at_index(total - ORIGIN_SCAN_MAX_ENTRIES))
                older = OriginIndex(self.index.max_runs, complete_after=start)
                reader = ml.new_non_durable_cursor(start, name=f"pulsar.origin-scan-{id(self)}", inclusive=False)
                nbytes = scanned = 0
                done = start >= end
                while not done and nbytes < ORIGIN_SCAN_MAX_BYTES and not self.topic.closed:
                    entries = await reader.read_entries(1000)
                    if not entries:
                        break
                    for e in entries:
                        if e.position > end:
                            done = True
                            break
                        found = self._origin_of_entry(e.position, e.data)
                        if found is not None:
                            older.add(e.position, *found)
                        nbytes += len(e.data)
                        scanned += 1
                    if entries[-1].position >= end:
                        done = True
                if done:
                    self.index.prepend(older)
                    log.info("%s origin index: %d entries scanned from %s, %d runs", self.log_prefix, scanned,
                             start, len(self.index))
                else:
                    log.warning("%s origin scan stopped after %d entries / %d bytes: entries up to %s are not "
                                "matched by origin", self.log_prefix, scanned, nbytes, end)
        except Exception as exc:   # noqa: BLE001 - the index then starts at `end`
            log.warning("%s origin scan failed: %r", self.log_prefix, exc)
        finally:
            self.index_ready.set()
        for (name, sender), pieces in list(self._restored.items()):
            sub = self.topic.subscriptions.get(name)
            if sub is not None and pieces:
                self._ack_pieces(sub, sender, pieces)
        self._restored.clear()

    def _restore_pending(self) -> None:
        """Load the pending acknowledgments persisted in the replicated subscriptions'
        cursor properties (PENDING_PROPERTY_PREFIX + sender): they are matched against
        arriving entries at once, against stored ones after the backlog scan."""
        for name, sub in self.topic.subscriptions.items():
            for key, value in sub.cursor.cursor_properties.items():
                if not key.startswith(PENDING_PROPERTY_PREFIX):
                    continue
                sender = key[len(PENDING_PROPERTY_PREFIX):]
                try:
                    msg = api.ReplicatedSubscriptionsUpdate()
                    msg.ParseFromString(base64.b64decode(value))
                    state = markers.parse_origin_acks(msg.individually_acked)
                except Exception as exc:   # noqa: BLE001
                    log.warning("%s bad pending acknowledgments of %s from %s: %s", self.log_prefix, name, sender, exc)
                    continue
                pieces = self._remote_of(name).apply(sender, state)
                self._restored[(name, sender)] = pieces
                ControllerStats.pending_restored += len(pieces)
                log.info("%s %s: %d pending acknowledgments from %s restored", self.log_prefix, name,
                         len(pieces), sender)

    def _remote_of(self, name: str) -> RemoteAcks:
        remote = self.remote.get(name)
        if remote is None:
            remote = self.remote[name] = RemoteAcks()
        return remote

    def high(self, origin: str) -> Optional[Position]:
        """Origin position of the newest entry of ``origin`` stored here: from the
        index, else the replicator producer's deduplication state (its sequence id is
        the source position), else None (unknown)."""
        if origin == self.local_cluster:
            return self.topic.ml.last_confirmed
        h = self.index.high(origin)
        if h is not None:
            return h
        seq = self.topic.dedup.last_sequence_id(REPLICATOR_CURSOR_PREFIX + origin)
        return Position(seq >> 32, seq & 0xFFFFFFFF) if seq >= 0 else None

    def _prune_index(self) -> None:
        now = time.monotonic()
        if now - self._last_prune < 1.0:
            return
        self._last_prune = now
        mds = [s.cursor.mark_delete_position for s in self.topic.subscriptions.values() if s.replicated]
        if mds and self.index_ready.is_set():
            self.index.prune(min(mds))

    # ---- subscription updates ---------------------------------------------
    def subscription_acked(self, subscription: "Subscription", snapshot=None) -> None:
        """A replicated subscription's acknowledgments changed. With a newly passed
        ``snapshot`` an UPDATE goes out now (PIP-33); otherwise, beyond PIP-33, an
        UPDATE with the acknowledged state by origin id goes out at most every
        ``update_interval_s`` (trailing call included), with or without snapshots,
        so a failover redelivers at most what was acknowledged within the last
        interval plus the replication lag."""
        if snapshot is not None:
            subscription.last_snapshot_used = snapshot
            self._send_update(subscription)
            return
        loop = asyncio.get_running_loop()
        wait = subscription.last_update_sent + self.update_interval_s - loop.time()
        if wait <= 0 and subscription.update_timer is None:
            self._send_update(subscription)
        elif subscription.update_timer is None:
            subscription.update_timer = loop.call_later(max(0.0, wait), self._send_update, subscription)

    def _send_update(self, subscription: "Subscription", closing: bool = False) -> Optional[asyncio.Future]:
        """Write an UPDATE marker for ``subscription`` now; returns the write's future
        (None when nothing was written: topic closed, nothing acknowledged)."""
        if subscription.update_timer is not None:
            subscription.update_timer.cancel()
            subscription.update_timer = None
        if self.topic.closed and not closing:
            return None
        subscription.last_update_sent = asyncio.get_running_loop().time()
        snap = subscription.last_snapshot_used
        clusters = {c.cluster: markers.position(c.message_id) for c in snap.clusters} if snap is not None else {}
        origins = self.acked_origins(subscription)
        if not clusters and not origins:
            return None
        data = markers.update(subscription.name, clusters, origins)
        ControllerStats.update_markers += 1
        ControllerStats.update_marker_bytes += len(data)
        fut = self.topic.write_marker(data)
        self._prune_index()
        return fut

    def acked_origins(self, subscription: "Subscription") -> dict:
        """The subscription's acknowledged state as {origin cluster: OriginAcks}
        (``origin_acks.acked_origins`` over the cursor: mark-delete position,
        individually acknowledged ranges, partially acknowledged batches)."""
        cursor = subscription.cursor
        partial = []
        for pos in cursor.batch_deleted.positions()[:MAX_UPDATE_BATCHES]:
            size = cursor.batch_deleted.batch_size(pos)
            unacked = cursor.batch_deleted.unacked_indexes(pos)
            if size is None or unacked is None:
                continue
            left = set(unacked)
            partial.append((pos, size, [i for i in range(size) if i not in left]))
        ranges = itertools.islice(cursor.individual_deleted.ranges(), 4 * MAX_UPDATE_RANGES)
        return acked_origins(self.index, cursor.mark_delete_position, ranges, partial)

    async def _apply_update_serialized(self, sender: str, msg) -> None:
        async with self._apply_lock:
            await self.index_ready.wait()
            try:
                await self._apply_update(sender, msg)
            except Exception:   # noqa: BLE001
                log.exception("%s applying an UPDATE from %s failed", self.log_prefix, sender)

    async def _apply_update(self, sender: str, msg) -> None:
        """Apply an UPDATE from ``sender``: the PIP-33 position for this cluster
        (cumulative), then the sender's state by origin id: acknowledge the local
        copies of newly acknowledged origin ids, keep the rest pending (persisted).
        A missing subscription is created first, positioned after everything here
        that the update acknowledges (and at or after the PIP-33 position)."""
        topic = self.topic
        mine = None
        for c in msg.clusters:
            if c.cluster == self.local_cluster:
                mine = min(markers.position(c.message_id), topic.ml.last_confirmed)
        state = markers.parse_origin_acks(msg.individually_acked)
        if mine is None and not state:
            return
        name = msg.subscription_name
        sub = topic.subscriptions.get(name)
        if sub is None:
            # created anew (again, after an unsubscribe here): nothing applied yet
            self.remote[name] = RemoteAcks()
        remote = self._remote_of(name)
        pieces = remote.apply(sender, state) if state else []
        if sub is None:
            if self._lazy_scan_end is not None:
                end, self._lazy_scan_end = self._lazy_scan_end, None
                await self._scan_backlog(end)
            start = self._creation_position(sender, remote, mine)
            sub = await topic.create_replicated_subscription(name, start)
            log.info("%s subscription %s created by an UPDATE from %s at %s", self.log_prefix, name, sender, start)
        if mine is not None and mine > sub.cursor.mark_delete_position:
            try:
                sub.cursor.mark_delete_nowait(mine)
            except Exception as exc:   # noqa: BLE001
                log.warning("%s applying the snapshot position of %s failed: %s", self.log_prefix, name, exc)
        if pieces:
            self._ack_pieces(sub, sender, pieces)
        self._ack_markers_below_acked(sub)
        sub.after_mark_delete_moved_by_update()
        self.last_update_applied_ms[name] = time.time() * 1000
        self.updates_applied += 1
        self._persist_pending(sub)
        self._prune_index()

    def _creation_position(self, sender: str, remote: RemoteAcks, mine: Optional[Position]) -> Position:
        """Where a subscription created by an UPDATE from ``sender`` starts
        (``origin_acks.creation_position``), at or after the PIP-33 position ``mine``."""
        ml = self.topic.ml
        pos = creation_position(self.index, remote, sender, ml.first_position(), ml.last_confirmed,
                                ml.previous_position)
        if mine is not None and mine > pos:
            pos = mine
        return pos

    def _ack_pieces(self, sub: "Subscription", sender: str, pieces: list) -> None:
        """Acknowledge in ``sub`` the local copies of ``pieces`` (origin_acks.Piece) that
        are stored here; entries of runs ``sender`` could not have are skipped."""
        cursor = sub.cursor
        md = cursor.mark_delete_position
        positions: list[Position] = []
        batch: list[tuple[Position, int, frozenset]] = []
        for piece in pieces:
            for run, f, l in self.index.local_ranges(piece.origin, piece.lo, piece.hi, acker=sender):
                ledger = run.local_ledger
                a, b = run.local_first + f, run.local_first + l
                if (ledger, b) <= md:
                    continue
                if ledger == md.ledger_id and a <= md.entry_id:
                    a = md.entry_id + 1
                if piece.indexes is None:
                    positions.extend(Position(ledger, e) for e in range(a, b + 1))
                else:
                    batch.append((Position(ledger, a), piece.batch_size, piece.indexes))
        try:
            if positions:
                cursor.delete_nowait(positions)
            for pos, size, indexes in batch:
                cursor.delete_batch_index_nowait(pos, size, sorted(indexes))
        except Exception as exc:   # noqa: BLE001 - a lost ack is a redelivery
            log.warning("%s acknowledging origin ids in %s failed: %s", self.log_prefix, sub.name, exc)

    def _persist_pending(self, sub: "Subscription") -> None:
        """Store the pending acknowledgments of ``sub`` (whose entries have not arrived)
        in its cursor properties when they changed: one ManagedCursorInfo write,
        coalesced (one in flight per subscription)."""
        remote = self.remote.get(sub.name)
        if remote is None:
            return
        pending = remote.pending(self.high)
        props = dict(sub.cursor.cursor_properties)
        for key in [k for k in props if k.startswith(PENDING_PROPERTY_PREFIX)]:
            if key[len(PENDING_PROPERTY_PREFIX):] not in pending:
                del props[key]
        for sender, state in pending.items():
            msg = api.ReplicatedSubscriptionsUpdate(subscription_name=sub.name)
            markers.add_origin_acks(msg.individually_acked, state)
            props[PENDING_PROPERTY_PREFIX + sender] = base64.b64encode(msg.SerializeToString()).decode()
        if props == sub.cursor.cursor_properties:
            return
        self._props_wanted[sub.name] = props
        task = self._props_tasks.get(sub.name)
        if task is None or task.done():
            self._props_tasks[sub.name] = asyncio.ensure_future(self._write_props(sub))

    async def _write_props(self, sub: "Subscription") -> None:
        while sub.name in self._props_wanted:
            props = self._props_wanted.pop(sub.name)
            try:
                await sub.cursor.set_cursor_properties(props)
                self.pending_persists += 1
            except Exception as exc:   # noqa: BLE001 - retried with the next change
                log.warning("%s persisting pending acknowledgments of %s failed: %s", self.log_prefix, sub.name, exc)

    def pending_count(self) -> int:
        """Pending acknowledgment items over the topic's subscriptions (see RemoteAcks.pending_count)."""
        return sum(r.pending_count(self.high) for r in self.remote.values())

    def pending_memory_bytes(self) -> int:
        """Estimated bytes of the received-acknowledgment state (RemoteAcks.memory_bytes)."""
        return sum(r.memory_bytes() for r in self.remote.values())

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
            except Exception as exc:
                log.debug("%s acknowledging markers of %s: %s", self.log_prefix, sub.name, exc)
