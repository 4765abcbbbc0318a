"""Message deduplication state (Pulsar's ``MessageDeduplication``), pure logic.

Per producer name the broker keeps:

* ``highest_sequenced_pushed``: the highest sequence id handed to the managed
  ledger (persisted or still in flight);
* ``highest_sequenced_persisted``: the highest sequence id whose entry is stored.

For a send with ``(sequence_id, highest_sequence_id)``:

* ``sequence_id <= pushed`` and ``<= persisted``: **Dup** (answer with id -1:-1);
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


REPLICATOR_PREFIX = REPLICATOR_CURSOR_PREFIX


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
        self.entries_since_snapshot = 0

    def check(self, producer_name: str, sequence_id: int, highest_sequence_id: Optional[int] = None) -> DedupStatus:
        """Classify a send and, when NotDup, record it as pushed (``highest_sequence_id``
        defaults to ``sequence_id``)."""
        highest = sequence_id if not highest_sequence_id or highest_sequence_id < sequence_id else highest_sequence_id
        pushed = self.highest_sequenced_pushed.get(producer_name)
        if pushed is not None and sequence_id <= pushed and self.drops_duplicates_of(producer_name):
            persisted = self.highest_sequenced_persisted.get(producer_name, -1)
            return DedupStatus.DUP if sequence_id <= persisted else DedupStatus.UNKNOWN
        self.highest_sequenced_pushed[producer_name] = highest
        return DedupStatus.NOT_DUP

    def record_persisted(self, producer_name: str, highest_sequence_id: int) -> bool:
        """Note a stored entry; returns True when a snapshot is due."""
        if highest_sequence_id > self.highest_sequenced_persisted.get(producer_name, -1):
            self.highest_sequenced_persisted[producer_name] = highest_sequence_id
        self.entries_since_snapshot += 1
        return self.entries_since_snapshot >= self.snapshot_interval

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
