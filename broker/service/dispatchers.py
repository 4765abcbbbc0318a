"""Dispatchers: push a subscription's entries to its consumers within permits.

One class per subscription type, as Pulsar's broker:

* ``SingleActiveConsumerDispatcher`` (Exclusive, Failover;
  PersistentDispatcherSingleActiveConsumer): every entry to the active consumer;
  Failover picks the active one by priority level, then name (for partition N of
  a partitioned topic: the N-th modulo the count), and on a change the cursor
  rewinds to the mark-delete position so the new one gets everything unacked.
  A redelivery is always a redeliver-all (rewind), asked only by the active
  consumer; it carries the client's new consumer epoch (PIP-84), which the
  consumer puts on every frame it pushes afterwards, so the client can drop
  the frames pushed before the rewind.
* ``MultipleConsumersDispatcher`` (Shared; PersistentDispatcherMultipleConsumers):
  round robin over consumers with permits; redeliveries (messagesToRedeliver)
  go first.
* ``KeySharedDispatcher`` (Key_Shared, AUTO_SPLIT hash ranges;
  PersistentStickyKeyDispatcherMultipleConsumers): Murmur3 hash of the entry's
  sticky key (ordering key, else partition key) modulo 65536 picks the consumer
  owning that range; a consumer that just joined receives nothing beyond the
  read position at its join until everything before it is acknowledged
  (recentlyJoinedConsumers), so each key stays in order. When nothing of the
  replay set can go out (its keys' consumers have no permits) but another
  consumer has permits, the next read goes on past the replay set
  (isDispatcherStuckOnReplays), holding new entries of keys still waiting there.

Common loop: replayed positions first, then the cursor; entries that are
markers are acknowledged and never delivered; entries already acknowledged are
skipped by the cursor; entries with ``deliver_at_time`` in the future wait in
a delayed-delivery heap (Shared and Key_Shared only, as in Pulsar).

Bounds: the replay set (messagesToRedeliver) is a :class:`ReplaySet`, kept in
position order (O(log n) per add and per position taken), and only ever holds
positions that were pending for a consumer; consumers that are not writable
(outgoing queue over its high-water mark) get no permits, and a read asks for
about READ_BYTES at most, so a writable consumer's queue grows by about one
high-water mark per read.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import time
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

from broker.ledger.batch_index import MAX_BATCH_SIZE
from broker.ledger.position import Entry, Position
from broker.replication.markers import is_marker
from proto.entry_format import peek_metadata
from proto.errors import CorruptedMessage

from .consumer import Consumer, DispatchItem

if TYPE_CHECKING:
    from .subscription import Subscription

log = logging.getLogger(__name__)

HASH_RANGE_SIZE = 65536
#: Bytes one cursor read asks for at most (entries beyond the first), so a read adds
#: about that much to a writable consumer's queue (high-water mark 2 MiB: a second
#: frame can wait while one is written). Sizing reads by the room left in the queue
#: instead made one-entry reads and cut throughput 2-4x; with 1 MiB the broker's CPU
#: per message is what it was without the bound (~15 us for 1 KB entries, ~120 us for
#: 100 KB ones on the 2-core test machine).
READ_BYTES = 1024 * 1024
#: Entry size assumed before the first read (bytes): the first read asks for at most
#: READ_BYTES / this entries.
INITIAL_AVG_ENTRY_BYTES = 64 * 1024
#: What a dispatcher's loop can be doing (``Dispatcher.state``; subscription stats
#: ``dispatcherState``, ours): waiting for a new entry at the read position is Pulsar's
#: cursor ``waitingReadOp``, a read in flight its ``pendingReadOps``.
DISPATCHER_STATES = ("idle", "waiting for consumers", "waiting for permits", "reading", "waiting for entries",
                     "waiting for a change", "read failure backoff", "stopped")


def batch_size_of(metadata, data: bytes) -> int:
    """Messages in an entry: ``num_messages_in_batch`` of its MessageMetadata (1
    when absent), bounded by the entry's size in bytes and by MAX_BATCH_SIZE (a
    producer's claim cannot make a batch bigger than its bytes; every message
    takes at least one). Always >= 1. This is the *real* batch size that
    batch-index acknowledgments are checked against."""
    n = metadata.num_messages_in_batch if metadata.HasField("num_messages_in_batch") else 1
    return max(1, min(n, len(data), MAX_BATCH_SIZE))


class ReplaySet:
    """Positions to redeliver (Pulsar's ``MessageRedeliveryController`` /
    messagesToRedeliver), kept in position order.

    A set plus a binary heap with lazy deletion: ``add`` O(log n), ``discard``
    O(1), ``take(n)`` returns the ``n`` lowest positions in ascending order in
    O(n log size); stale heap items are compacted when they outnumber live ones.
    Never sorts the whole set per read (what made 100k redelivered positions
    wedge the broker). Positions are ``Position`` (any ordered, hashable pair).
    """

    __slots__ = ("_members", "_heap")

    def __init__(self, positions: Iterable[Position] = ()):
        self._members: set[Position] = set()
        self._heap: list[Position] = []
        self.update(positions)

    def add(self, position: Position) -> None:
        """Queue ``position`` (O(log n)); no-op when already queued."""
        if position not in self._members:
            self._members.add(position)
            heapq.heappush(self._heap, position)

    def update(self, positions: Iterable[Position]) -> None:
        """``add`` each of ``positions``."""
        for position in positions:
            self.add(position)

    def discard(self, position: Position) -> None:
        """Unqueue ``position`` if queued (O(1): its heap item goes stale; the heap is
        rebuilt once over 64 items and more than twice the live positions)."""
        self._members.discard(position)
        if len(self._heap) > 64 and len(self._heap) > 2 * len(self._members):
            self._heap = list(self._members)
            heapq.heapify(self._heap)

    def take(self, n: int) -> list[Position]:
        """Remove and return the ``n`` lowest positions, ascending."""
        out: list[Position] = []
        heap, members = self._heap, self._members
        while heap and len(out) < n:
            position = heapq.heappop(heap)
            if position in members:
                members.discard(position)
                out.append(position)
        return out

    def clear(self) -> None:
        """Forget every queued position."""
        self._members.clear()
        self._heap.clear()

    def __contains__(self, position: object) -> bool:
        return position in self._members

    def __len__(self) -> int:
        return len(self._members)

    def __bool__(self) -> bool:
        return bool(self._members)

    def __iter__(self) -> Iterator[Position]:
        """Ascending order (a sorted copy: for stats and tests, not the dispatch path)."""
        return iter(sorted(self._members))


class Dispatcher:
    """Shared machinery; subclasses decide which consumer gets which entry."""

    uses_delayed_delivery = False

    def __init__(self, subscription: "Subscription"):
        self.subscription = subscription
        self.cursor = subscription.cursor
        self.consumers: list[Consumer] = []
        self.replay = ReplaySet()                    # messagesToRedeliver, in position order
        self._delayed: list[tuple[int, Position]] = []
        self._wakeup = asyncio.Event()
        self._wake_future: Optional[asyncio.Future] = None  # what _wait awaits
        self._epoch = 0
        self._closed = False
        self._task: Optional[asyncio.Task] = None
        self.max_read_batch = subscription.topic.config.dispatcher_max_read_batch_size
        self._avg_messages_per_entry = 1.0
        self._avg_entry_bytes = float(INITIAL_AVG_ENTRY_BYTES)   # sizes reads to the consumers' room
        self._dispatched = 0
        self._reading_replay = False                 # the read being dispatched came from the replay set
        self._read_failures = 0  # reads failed in a row (read failure backoff)
        self.paused = False     # during a seek, until its answer went out
        # What the loop is doing now (for stats, to tell where a subscription waits): one of
        # DISPATCHER_STATES, or "failed: <error>" once the loop ended on an unexpected error.
        self.state = "idle"

    # ---- lifecycle --------------------------------------------------------
    def start(self) -> None:
        """Start the dispatch loop (one task, Pulsar's readMoreEntries loop); no-op
        when already started."""
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        """Stop the dispatch loop (cancel its task and wait for it); consumers and the
        cursor are left as they are."""
        self._closed = True
        self.wake()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    def wake(self) -> None:
        """Make the loop look again (permits, replay set, new entries): sets its event and
        resolves the future it awaits. Never blocks."""
        self._wakeup.set()
        wake = self._wake_future
        if wake is not None and not wake.done():
            wake.set_result(None)

    # ---- consumers ------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer`` and wake the loop (Pulsar's
        PersistentDispatcherMultipleConsumers.addConsumer)."""
        self.consumers.append(consumer)
        self.wake()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; its pending positions not yet acknowledged go to the replay set,
        each counted as a redelivery (Pulsar's removeConsumer -> messagesToRedeliver)."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        pending = consumer.take_pending()
        self.redeliver(pending, count=True)

    def redeliver(self, positions, count: bool = True) -> None:
        """Queue positions for redelivery (incrementing their redelivery count)."""
        for pos in positions:
            if not self.cursor.is_acknowledged(pos):
                self.replay.add(pos)
                if count:
                    self.subscription.redelivery_counts[pos] = self.subscription.redelivery_counts.get(pos, 0) + 1
        self.wake()

    def accepts_redeliver_all(self, consumer: Consumer) -> bool:
        """Whether ``consumer`` may ask for everything unacknowledged again."""
        return True

    def reset(self) -> None:
        """Forget in-flight state after a seek/reset: new epoch, empty replay."""
        self._epoch += 1
        self.replay.clear()
        self._delayed.clear()
        for c in self.consumers:
            c.take_pending()
        self.wake()

    def total_permits(self) -> int:
        """Messages the consumers can take: the sum of their available permits, 0 while
        paused (Pulsar's totalAvailablePermits)."""
        if self.paused:
            return 0
        return sum(c.available_permits() for c in self.consumers)

    # ---- loop -----------------------------------------------------------
    async def _run(self) -> None:
        try:
            while not self._closed:
                self._wakeup.clear()
                self._release_delayed()
                permits = self.total_permits()
                if permits <= 0 or not self.consumers:
                    self.state = "waiting for permits" if self.consumers else "waiting for consumers"
                    await self._wait(None)
                    continue
                epoch = self._epoch
                # Entries wanted: within the permits (messages) and about READ_BYTES (the managed
                # ledger returns a whole run of uncached entries whatever max_bytes says).
                n_entries = max(1, min(self.max_read_batch, int(permits / max(1.0, self._avg_messages_per_entry)),
                                       int(READ_BYTES / max(1.0, self._avg_entry_bytes))))
                from_replay = bool(self.replay) and not self._read_past_replay()
                self._reading_replay = from_replay
                self.state = "reading"
                try:
                    if from_replay:
                        entries = await self._read_replay(n_entries, READ_BYTES)
                    else:
                        entries = await self.cursor.read_entries(n_entries, READ_BYTES)
                except Exception as exc:  # noqa: BLE001 - Pulsar's readEntriesFailed: back off, read again
                    await self._read_failed(exc)
                    continue
                self._read_failures = 0
                if not from_replay and not entries:
                    self.state = "waiting for entries"
                    await self._wait(self.cursor.read_position)
                    continue
                if epoch != self._epoch:
                    continue
                items = self._prepare(entries)
                sent_before = self._dispatched
                if items:
                    self._dispatch(items)
                if from_replay and entries and self._dispatched == sent_before:
                    if self._stuck_on_replay():
                        continue                 # read on past the replay set (Key_Shared)
                    # Nothing could go out (held keys, no permits): wait for a change.
                    self.state = "waiting for a change"
                    await self._wait(None)
            self.state = "stopped"
        except asyncio.CancelledError:
            self.state = "stopped"
        except Exception as exc:
            self.state = f"failed: {exc!r}"
            log.exception("[%s][%s] dispatcher failed", self.subscription.topic.name, self.subscription.name)

    async def _wait(self, read_position: Optional[Position]) -> None:
        """Until ``wake()``, a new entry at/after ``read_position`` (if given) or the
        next delayed message is due. One plain future, no tasks: this runs once
        per entry when consumers keep up."""
        if self._wakeup.is_set():
            return
        loop = asyncio.get_running_loop()
        if read_position is not None:
            # The managed ledger's own per-waiter future: the add resolves it directly
            # (no chained callback, one event-loop turn less per dispatched entry), and
            # so can wake() below.
            wake = self.cursor.ml.position_future(read_position)
            if wake is None:
                return
        else:
            wake = loop.create_future()
        self._wake_future = wake
        timer = None
        if self._delayed:
            delay = max(0.0, self._delayed[0][0] / 1000.0 - time.time())
            timer = loop.call_later(delay, lambda: wake.done() or wake.set_result(None))
        try:
            await wake
        finally:
            self._wake_future = None
            if timer is not None:
                timer.cancel()
            if not wake.done():
                wake.cancel()

    async def _read_failed(self, exc: BaseException) -> None:
        """Pulsar's ``readEntriesFailed``: a read that failed (bookies unavailable, a ledger
        that cannot be opened yet) is tried again after a backoff,
        ``dispatcher_read_failure_backoff_initial_time_in_ms`` doubling up to
        ``dispatcher_read_failure_backoff_max_time_in_ms``, or as soon as the loop is woken (a
        flow, a consumer change). The dispatch loop never ends on a read error: before, it
        did, and the subscription got nothing more until its consumer reconnected. The read
        position did not move and replay positions went back to the replay set, so the
        retry reads the same entries."""
        conf = self.subscription.topic.config
        initial_s = getattr(conf, "dispatcher_read_failure_backoff_initial_time_in_ms", 15000) / 1000.0
        max_s = getattr(conf, "dispatcher_read_failure_backoff_max_time_in_ms", 60000) / 1000.0
        delay = min(max_s, initial_s * (2 ** min(self._read_failures, 16)))
        self._read_failures += 1
        self.state = "read failure backoff"
        log.warning("[%s][%s] error reading entries: %s; reading again in %.1f s", self.subscription.topic.name,
                    self.subscription.name, exc, delay)
        if self._closed:
            return
        self._wakeup.clear()       # only what happens from now on ends the wait early
        wake = asyncio.get_running_loop().create_future()
        self._wake_future = wake
        timer = asyncio.get_running_loop().call_later(delay, lambda: wake.done() or wake.set_result(None))
        try:
            await wake
        finally:
            self._wake_future = None
            timer.cancel()
            if not wake.done():
                wake.cancel()

    async def _read_replay(self, max_entries: int, max_bytes: int = READ_BYTES) -> list[Entry]:
        """Read up to ``max_entries`` of the lowest replay positions (about
        ``max_bytes`` at most: what is not read goes back to the replay set). A failed
        read puts every taken position back into the replay set and raises."""
        positions = self.replay.take(max_entries)
        ml = self.cursor.ml
        out: list[Entry] = []
        size = 0
        i = 0
        while i < len(positions):
            if size >= max_bytes:
                self.replay.update(positions[i:])
                break
            # Read runs of consecutive positions in one call.
            j = i
            while j + 1 < len(positions) and positions[j + 1] == Position(positions[j].ledger_id, positions[j].entry_id + 1):
                j += 1
            if not self.cursor.is_acknowledged(positions[i]) or j > i:
                try:
                    entries = await ml.read_entries(positions[i], j - i + 1)
                except Exception:
                    # not read: nothing taken may be dropped (it would never be redelivered)
                    self.replay.update([*positions[i:], *(e.position for e in out)])
                    raise
                wanted = set(positions[i:j + 1])
                for e in entries:
                    if e.position in wanted and not self.cursor.is_acknowledged(e.position):
                        out.append(e)
                        size += len(e.data)
            i = j + 1
        return out

    def _prepare(self, entries: list[Entry]) -> list[DispatchItem]:
        """Peek metadata: skip (and acknowledge) markers, hold delayed entries."""
        items: list[DispatchItem] = []
        to_ack: list[Position] = []
        now_ms = int(time.time() * 1000)
        total_msgs = 0
        if entries:
            mean = sum(len(e.data) for e in entries) / len(entries)
            self._avg_entry_bytes = 0.5 * self._avg_entry_bytes + 0.5 * mean
        for entry in entries:
            try:
                md = peek_metadata(entry.data)
            except CorruptedMessage as exc:
                log.error("[%s][%s] skipping corrupt entry %s: %s", self.subscription.topic.name,
                          self.subscription.name, entry.position, exc)
                to_ack.append(entry.position)
                continue
            if is_marker(md):
                self.subscription.on_marker(entry, md)
                to_ack.append(entry.position)
                continue
            if self.uses_delayed_delivery and md.HasField("deliver_at_time") and md.deliver_at_time > now_ms:
                heapq.heappush(self._delayed, (md.deliver_at_time, entry.position))
                continue
            n = batch_size_of(md, entry.data)
            key = md.ordering_key if md.HasField("ordering_key") else (
                md.partition_key.encode() if md.HasField("partition_key") else b"")
            items.append(DispatchItem(entry.position, entry.data, n, key))
            total_msgs += n
        if items:
            self._avg_messages_per_entry = 0.8 * self._avg_messages_per_entry + 0.2 * (total_msgs / len(items))
        if to_ack:
            self.subscription.acknowledge_server_side(to_ack)
        return items

    def _release_delayed(self) -> None:
        now_ms = int(time.time() * 1000)
        while self._delayed and self._delayed[0][0] <= now_ms:
            _, pos = heapq.heappop(self._delayed)
            self.replay.add(pos)

    def _send(self, consumer: Consumer, items: list[DispatchItem]) -> None:
        self._dispatched += len(items)
        sub = self.subscription
        consumer.send_entries(items, sub.redelivery_counts, sub.ack_set_for)

    def _dispatch(self, items: list[DispatchItem]) -> None:
        raise NotImplementedError

    def _stuck_on_replay(self) -> bool:
        """Called when a read of the replay set dispatched nothing: True to read new entries
        next instead of waiting for a change (Key_Shared's isDispatcherStuckOnReplays)."""
        return False

    def _read_past_replay(self) -> bool:
        """True to read new entries from the cursor this round although the replay set is
        not empty (set by :meth:`_stuck_on_replay`); consumed by the call."""
        return False


class SingleActiveConsumerDispatcher(Dispatcher):
    """Exclusive and Failover: one active consumer receives everything."""

    def __init__(self, subscription: "Subscription", partition_index: int = -1):
        super().__init__(subscription)
        self.partition_index = partition_index
        self.active: Optional[Consumer] = None

    def _pick_active(self) -> Optional[Consumer]:
        if not self.consumers:
            return None
        ordered = sorted(self.consumers, key=lambda c: (c.priority_level, c.name, c.consumer_id))
        if self.partition_index >= 0:
            top = [c for c in ordered if c.priority_level == ordered[0].priority_level]
            return top[self.partition_index % len(top)]
        return ordered[0]

    def _update_active(self) -> None:
        new = self._pick_active()
        if new is not self.active:
            old = self.active
            self.active = new
            if old is not None and old in self.consumers:
                # The previous active consumer's unacked messages go to the new one.
                old.take_pending()
            self.replay.clear()
            self.cursor.rewind()
            self._epoch += 1
        for c in self.consumers:
            c.notify_active(c is self.active)
        self.wake()

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer`` and pick the active one again (priority level, then name; on partition
        N the N-th, modulo): a change rewinds the cursor to the mark-delete position; every consumer
        is then told whether it is active (Pulsar's PersistentDispatcherSingleActiveConsumer)."""
        self.consumers.append(consumer)
        self._update_active()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer`` (its pending positions dropped, not counted as redeliveries)
        and pick the active one again; if it was active the cursor rewinds, so the new
        active consumer receives everything unacknowledged."""
        was_active = consumer is self.active
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        consumer.take_pending()
        if was_active:
            self.active = None
        self._update_active()

    def accepts_redeliver_all(self, consumer: Consumer) -> bool:
        """True only for the active consumer."""
        # Pulsar ignores reDeliverUnAcknowledgedMessages of an inactive consumer: its
        # rewind would resend the active consumer's messages behind that one's back.
        return consumer is self.active

    def total_permits(self) -> int:
        """The active consumer's available permits (messages); 0 with no active consumer
        or while paused."""
        if self.paused or self.active is None:
            return 0
        return self.active.available_permits()

    def redeliver(self, positions, count: bool = True) -> None:
        """Redeliver-all whatever ``positions`` says: count a redelivery for each unacknowledged
        one (if ``count``), drop the active consumer's pending, rewind the cursor to the
        mark-delete position and start a new epoch, so everything unacked is re-read in order."""
        # Keep order for the single active consumer: rewind and re-read.
        for pos in positions:
            if count and not self.cursor.is_acknowledged(pos):
                self.subscription.redelivery_counts[pos] = self.subscription.redelivery_counts.get(pos, 0) + 1
        if self.active is not None:
            self.active.take_pending()
        self.cursor.rewind()
        self._epoch += 1
        self.wake()

    def _dispatch(self, items: list[DispatchItem]) -> None:
        consumer = self.active
        if consumer is None:
            self.cursor.rewind()
            return
        self._send(consumer, items)


class MultipleConsumersDispatcher(Dispatcher):
    """Shared: round robin within permits."""

    uses_delayed_delivery = True

    def __init__(self, subscription: "Subscription"):
        super().__init__(subscription)
        self._next = 0

    def _dispatch(self, items: list[DispatchItem]) -> None:
        n = len(self.consumers)
        i = 0
        while i < len(items):
            consumer = None
            for k in range(n):
                c = self.consumers[(self._next + k) % n]
                if c.available_permits() > 0:
                    consumer = c
                    self._next = (self._next + k + 1) % n
                    break
            if consumer is None:
                self.replay.update(item.position for item in items[i:])
                return
            chunk = []
            permits = consumer.available_permits()
            # Give this consumer a share: up to its permits, at most an equal split.
            share = max(1, (len(items) - i + n - 1) // n)
            while i < len(items) and permits > 0 and len(chunk) < share:
                chunk.append(items[i])
                permits -= items[i].num_messages
                i += 1
            self._send(consumer, chunk)
