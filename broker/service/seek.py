"""Seek by publish time (Pulsar's ``PersistentMessageFinder``): binary search
over the managed ledger's entries by the publish_time of their metadata."""
from __future__ import annotations

from broker.ledger.managed_ledger import ManagedLedger
from broker.ledger.position import Position
from proto.entry_format import peek_metadata
from proto.errors import CorruptedMessage


async def find_position_by_publish_time(ml: ManagedLedger, timestamp_ms: int) -> Position:
    """The first position whose publish_time >= ``timestamp_ms`` (ms since epoch);
    the position after the last entry when every entry is older. O(log n) reads."""
    total = ml.number_of_entries

    async def publish_time(index: int) -> int:
        entries = await ml.read_entries(ml.position_at_index(index), 1)
        try:
            return peek_metadata(entries[0].data).publish_time
        except (CorruptedMessage, IndexError):
            return 0

    lo, hi = 0, total
    while lo < hi:
        mid = (lo + hi) // 2
        if await publish_time(mid) < timestamp_ms:
            lo = mid + 1
        else:
            hi = mid
    if lo >= total:
        return ml.next_position(ml.last_confirmed)
    return ml.position_at_index(lo)
