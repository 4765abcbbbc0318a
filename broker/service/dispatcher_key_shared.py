"""Key_Shared dispatch (Pulsar's PersistentStickyKeyDispatcherMultipleConsumers with
the AUTO_SPLIT HashRangeAutoSplitStickyKeyConsumerSelector): the Murmur3 hash of an entry's
sticky key (ordering key, else partition key) modulo 65536 picks the consumer owning that
hash range; a consumer that just joined gets nothing at/after the read position at its join
until everything before it is acknowledged (recentlyJoinedConsumers); when nothing of the
replay set can go out while another consumer has permits, the next read goes on past it
(isDispatcherStuckOnReplays), holding new entries of keys still waiting there. Pure
dispatch logic over :class:`broker.service.dispatchers.Dispatcher`'s loop."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from proto.hashing import murmur3_32_hash

from .consumer import Consumer, DispatchItem
from .dispatchers import HASH_RANGE_SIZE, Dispatcher
from broker.ledger.position import Position

if TYPE_CHECKING:
    from .subscription import Subscription

__all__ = ["KeySharedDispatcher", "KEY_SHARED_LOOK_AHEAD_LIMIT"]

# Positions a Key_Shared subscription may hold in its replay set and still read on past them
# (Pulsar's keySharedLookAheadMsgInReplayThresholdPerSubscription, default 20000).
KEY_SHARED_LOOK_AHEAD_LIMIT = 20000


class KeySharedDispatcher(Dispatcher):
    """Key_Shared with auto-split hash ranges [0, 65536)."""

    uses_delayed_delivery = True

    def __init__(self, subscription: "Subscription"):
        super().__init__(subscription)
        self.ranges: list[tuple[int, int, Consumer]] = []   # (start, end inclusive, consumer)
        self.recently_joined: dict[Consumer, Position] = {}
        self._held: set[Position] = set()
        self._held_hashes: dict[Position, int] = {}   # sticky-key hash of each held position
        self._stuck = False

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer``: the first owns [0, 65535]; a later one takes the upper half of
        the widest range and gets nothing at/after the current read position until all before
        it is acknowledged (Pulsar's HashRangeAutoSplitStickyKeyConsumerSelector, recentlyJoinedConsumers)."""
        if not self.ranges:
            self.ranges = [(0, HASH_RANGE_SIZE - 1, consumer)]
        else:
            idx = max(range(len(self.ranges)), key=lambda k: self.ranges[k][1] - self.ranges[k][0])
            start, end, owner = self.ranges[idx]
            mid = (start + end) // 2
            self.ranges[idx:idx + 1] = [(start, mid, owner), (mid + 1, end, consumer)]
            self.recently_joined[consumer] = self.cursor.read_position
        self.consumers.append(consumer)
        self.wake()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``: each of its hash ranges goes to the owner of the range before
        it (the one after, for the first range); its pending positions are redelivered as in
        ``Dispatcher.remove_consumer``."""
        new_ranges: list[tuple[int, int, Consumer]] = []
        for start, end, owner in self.ranges:
            if owner is consumer:
                if new_ranges:
                    s, _, o = new_ranges[-1]
                    new_ranges[-1] = (s, end, o)
                else:
                    new_ranges.append((start, end, None))  # fixed below
            else:
                if new_ranges and new_ranges[-1][2] is None:
                    new_ranges[-1] = (new_ranges[-1][0], end, owner)
                else:
                    new_ranges.append((start, end, owner))
        self.ranges = [r for r in new_ranges if r[2] is not None]
        self.recently_joined.pop(consumer, None)
        super().remove_consumer(consumer)

    def consumer_for(self, key: bytes) -> Optional[Consumer]:
        """The owner of the hash range holding ``murmur3_32(key) % 65536``, None when there is
        no consumer (Pulsar's StickyKeyConsumerSelector.select)."""
        return self._owner_of_hash(murmur3_32_hash(key) % HASH_RANGE_SIZE)

    def _owner_of_hash(self, h: int) -> Optional[Consumer]:
        for start, end, owner in self.ranges:
            if start <= h <= end:
                return owner
        return None

    def _release_held(self) -> None:
        """Release the recently joined consumers whose join position is at or before the
        position after the mark-delete position, ledger boundaries included (Pulsar's
        removeConsumersFromRecentJoinedConsumers with ManagedLedgerImpl.getNextValidPosition:
        a consumer that joined at entry 0 of a new ledger is released once everything of the
        previous ledger is acknowledged), and all of them when one consumer is left; then move
        the held positions back to the replay set."""
        if self.recently_joined:
            if len(self.consumers) <= 1:
                self.recently_joined.clear()
            else:
                next_to_ack = self.cursor.ml.next_position(self.cursor.mark_delete_position)
                for consumer, join_pos in list(self.recently_joined.items()):
                    if join_pos <= next_to_ack:
                        del self.recently_joined[consumer]
        if self._held:
            self.replay.update(self._held)
            self._held.clear()

    def total_permits(self) -> int:
        """``Dispatcher.total_permits``, after releasing recently joined consumers whose join
        position is reached by the mark-delete position and moving held positions back to the replay set."""
        self._release_held()
        return super().total_permits()

    def _hold(self, item: DispatchItem, key_hash: int) -> None:
        self._held.add(item.position)
        self._held_hashes[item.position] = key_hash

    def _older_pending_hashes(self) -> set[int]:
        """Sticky-key hashes of the held / replay positions (entries older than what a read
        past the replay set returns); forgets the hashes of positions no longer pending."""
        pending = {p: h for p, h in self._held_hashes.items() if p in self.replay or p in self._held}
        self._held_hashes = pending
        return set(pending.values())

    def _dispatch(self, items: list[DispatchItem]) -> None:
        per_consumer: dict[Consumer, list[DispatchItem]] = {}
        permits: dict[Consumer, int] = {}
        blocked_keys: set[Consumer] = set()
        # New entries read past the replay set: a key with an older entry still waiting there
        # waits behind it (Pulsar: redeliveryMessages.containsStickyKeyHashes -> not sent).
        older = self._older_pending_hashes() if not self._reading_replay and (self.replay or self._held) else ()
        for item in items:
            key_hash = murmur3_32_hash(item.sticky_key) % HASH_RANGE_SIZE
            consumer = self._owner_of_hash(key_hash)
            if consumer is None or key_hash in older:
                self._hold(item, key_hash)
                continue
            join_pos = self.recently_joined.get(consumer)
            if join_pos is not None and item.position >= join_pos:
                self._hold(item, key_hash)
                continue
            if consumer not in permits:
                permits[consumer] = consumer.available_permits()
            if permits[consumer] <= 0 or consumer in blocked_keys:
                # Keep later entries of this consumer behind the held one: order per key.
                blocked_keys.add(consumer)
                self._hold(item, key_hash)
                continue
            per_consumer.setdefault(consumer, []).append(item)
            permits[consumer] -= item.num_messages
            self._held_hashes.pop(item.position, None)
        for consumer, chunk in per_consumer.items():
            self._send(consumer, chunk)

    def _stuck_on_replay(self) -> bool:
        """Pulsar's isDispatcherStuckOnReplays: nothing of the replay set could go out (its
        keys' consumers have no permits) while another consumer has permits, no consumer is
        recently joined, every replay position's key is known (so newer entries of those keys
        can be held behind them) and the replay set is below
        :data:`KEY_SHARED_LOOK_AHEAD_LIMIT`: read new entries next, so one consumer that stops
        receiving does not stall the others' keys."""
        if self.recently_joined or len(self.replay) + len(self._held) >= KEY_SHARED_LOOK_AHEAD_LIMIT:
            return False
        if not any(c.available_permits() > 0 for c in self.consumers):
            return False
        if any(p not in self._held_hashes for p in self.replay):
            return False
        self._stuck = True
        return True

    def _read_past_replay(self) -> bool:
        stuck, self._stuck = self._stuck, False
        return stuck

    def reset(self) -> None:
        """``Dispatcher.reset``, forgetting the held positions and their keys too."""
        self._held.clear()
        self._held_hashes.clear()
        self._stuck = False
        super().reset()
