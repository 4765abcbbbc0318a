"""Message deduplication state (Pulsar's ``MessageDeduplication``), pure logic.

Per producer name the broker keeps:

* ``highest_sequenced_pushed``: the highest sequence id handed to the managed
  ledger (persisted or still in flight);
* ``highest_sequenced_persisted``: the highest sequence id whose entry is stored.

For a send with ``(sequence_id, highest_sequence_id)``:

* ``sequence_id <= pushed`` and ``<= persisted``: **Dup** (answer with id -1:-1) when
  it is inside the id range of an entry stored (``stored_ranges``: the ranges stored
  since this broker loaded the topic, contiguous ones merged, the last
  ``MAX_STORED_RANGES``), older than those ranges (unknown: a duplicate, as in
  Pulsar), or from a replicator (whose rewinds resend stored entries by design);
* otherwise, an id in a gap between stored ranges of an application producer:
  **Behind** (ours; refused with a clear, non-retriable error): it was never stored,
  and a higher id was stored after it (sends that overtook it after a send timeout);
  answering -1:-1 would call a message stored that is stored nowhere;
* ``sequence_id <= pushed`` but ``> persisted``: **Unknown** (still in flight:
  answer an error so the client retries later);
* otherwise **NotDup** and ``pushed = highest_sequence_id``.

State is tracked for every producer; duplicates are *dropped* only when
deduplication is enabled (namespace policy or ``broker_deduplication_enabled``)
and always for replicator producers (``pulsar.repl.<cluster>``), whose
sequence ids encode the source position: that is minipulsar's exactly-once
geo-replication.

Snapshots of ``persisted`` go into the ``pulsar.dedup`` cursor's properties
every ``broker_deduplication_entries_interval`` entries; recovery loads the
snapshot and replays the entries after it (``replay``).
"""
from __future__ import annotations

import bisect
import collections
import enum
from typing import Iterable, Optional

from proto.common import REPLICATOR_CURSOR_PREFIX


class DedupStatus(enum.Enum):
    """Outcome of ``MessageDeduplication.check`` for one send (Pulsar's
    MessageDupStatus): NOT_DUP store it, DUP answer -1:-1 without storing,
    UNKNOWN still in flight (the send is refused as retriable)."""

    NOT_DUP = "NotDup"
    DUP = "Dup"
    UNKNOWN = "Unknown"
    BEHIND = "Behind"   # ours: below the last stored entry's ids (see the module doc)


REPLICATOR_PREFIX = REPLICATOR_CURSOR_PREFIX
# stored sequence-id ranges remembered per producer (a gap opens a new one; contiguous ids merge)
MAX_STORED_RANGES = 1024
MAX_SEQ = (1 << 63) - 1


class MessageDeduplication:
    """Dedup state of one topic. ``enabled`` may change at run time (namespace policy)."""

    CURSOR_NAME = "pulsar.dedup"

    def drops_duplicates_of(self, producer_name: str) -> bool:
        """Whether sends of this producer are checked (enabled, or a replicator)."""
        return self.enabled or producer_name.startswith(REPLICATOR_PREFIX)

    def __init__(self, enabled: bool, snapshot_interval: int = 1000):
        self.enabled = enabled
        self.snapshot_interval = snapshot_interval
        self.highest_sequenced_pushed: dict[str, int] = {}
        self.highest_sequenced_persisted: dict[str, int] = {}
        # per producer, the sequence id ranges [first, highest] stored since the topic was loaded
        # (after a recovery only the highest is known), contiguous ranges merged, oldest dropped
        self.stored_ranges: dict[str, collections.deque] = {}
        self.entries_since_snapshot = 0

    def check(self, producer_name: str, sequence_id: int, highest_sequence_id: Optional[int] = None) -> DedupStatus:
        """Classify a send and, when NotDup, record it as pushed (``highest_sequence_id``
        defaults to ``sequence_id``)."""
        highest = sequence_id if not highest_sequence_id or highest_sequence_id < sequence_id else highest_sequence_id
        pushed = self.highest_sequenced_pushed.get(producer_name)
        if pushed is not None and sequence_id <= pushed and self.drops_duplicates_of(producer_name):
            persisted = self.highest_sequenced_persisted.get(producer_name, -1)
            if sequence_id > persisted:
                return DedupStatus.UNKNOWN
            if producer_name.startswith(REPLICATOR_PREFIX) or self._stored(producer_name, sequence_id):
                return DedupStatus.DUP
            return DedupStatus.BEHIND
        self.highest_sequenced_pushed[producer_name] = highest
        return DedupStatus.NOT_DUP

    def record_persisted(self, producer_name: str, highest_sequence_id: int,
                         sequence_id: Optional[int] = None) -> bool:
        """Note a stored entry (ids ``sequence_id`` .. ``highest_sequence_id``; ``sequence_id``
        defaults to the highest); returns True when a snapshot is due."""
        if highest_sequence_id > self.highest_sequenced_persisted.get(producer_name, -1):
            self.highest_sequenced_persisted[producer_name] = highest_sequence_id
            first = highest_sequence_id if sequence_id is None else min(sequence_id, highest_sequence_id)
            ranges = self.stored_ranges.setdefault(producer_name, collections.deque(maxlen=MAX_STORED_RANGES))
            if ranges and first <= ranges[-1][1] + 1:
                ranges[-1] = (min(ranges[-1][0], first), highest_sequence_id)
            else:
                ranges.append((first, highest_sequence_id))
        self.entries_since_snapshot += 1
        return self.entries_since_snapshot >= self.snapshot_interval

    def _stored(self, producer_name: str, sequence_id: int) -> bool:
        """Whether ``sequence_id`` (at most the highest persisted) counts as stored: inside a
        stored range, or older than every range known (cannot tell: a duplicate, as Pulsar)."""
        ranges = self.stored_ranges.get(producer_name)
        if not ranges or sequence_id < ranges[0][0]:
            return True
        i = bisect.bisect_right(ranges, (sequence_id, MAX_SEQ)) - 1
        return i >= 0 and ranges[i][0] <= sequence_id <= ranges[i][1]

    def reset_highest_sequence_id_pushed(self) -> None:
        """Forget in-flight pushes: ``pushed = persisted`` for every producer, so the
        clients' resends of failed adds are accepted (Pulsar's
        ``resetHighestSequenceIdPushed``). Call it only once no add is pending on
        the topic (the topic is fenced until then, ``PersistentTopic.addFailed``):
        rewinding while later adds are in flight would let a resend in twice, or
        drop one as a duplicate of a later sequence id."""
        self.highest_sequenced_pushed = dict(self.highest_sequenced_persisted)

    def last_sequence_id(self, producer_name: str) -> int:
        """Last persisted sequence id of a producer name, -1 if none (sent to producers)."""
        return self.highest_sequenced_persisted.get(producer_name, -1)

    def snapshot(self) -> dict[str, int]:
        """Properties to store with the dedup cursor's mark-delete."""
        self.entries_since_snapshot = 0
        return dict(self.highest_sequenced_persisted)

    def load(self, snapshot: dict[str, int], replayed: Iterable[tuple[str, int]] = ()) -> None:
        """Restore from a snapshot plus ``(producer_name, highest_sequence_id)`` of each
        entry stored after it."""
        self.highest_sequenced_persisted = dict(snapshot)
        for name, seq in replayed:
            if seq > self.highest_sequenced_persisted.get(name, -1):
                self.highest_sequenced_persisted[name] = seq
        self.highest_sequenced_pushed = dict(self.highest_sequenced_persisted)
        self.stored_ranges = {name: collections.deque([(seq, seq)], maxlen=MAX_STORED_RANGES)
                              for name, seq in self.highest_sequenced_persisted.items()}
