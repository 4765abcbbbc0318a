"""Entry cache for tailing reads (Pulsar's EntryCacheManager / RangeEntryCacheImpl).

Each managed ledger has an ``EntryCache`` holding recently added entries by
position; one ``EntryCacheManager`` bounds the bytes of all caches together
(``managed_ledger_cache_size_mb``) and evicts the oldest entries of the
largest cache first when over budget.
"""
from __future__ import annotations

import collections
from typing import Iterable, Optional

from .position import Position


class EntryCache:
    """Insertion-ordered position -> bytes map with a byte count."""

    def __init__(self, manager: "EntryCacheManager", name: str):
        self.manager = manager
        self.name = name
        self._entries: "collections.OrderedDict[Position, bytes]" = collections.OrderedDict()
        self.size = 0

    def insert(self, position: Position, data: bytes) -> None:
        if position in self._entries:
            return
        self._entries[position] = data
        self.size += len(data)
        self.manager._grew(len(data))

    def get(self, position: Position) -> Optional[bytes]:
        return self._entries.get(position)

    def evict_oldest(self, nbytes: int) -> int:
        """Drop oldest entries until ``nbytes`` bytes were freed; returns bytes freed."""
        freed = 0
        while self._entries and freed < nbytes:
            _, data = self._entries.popitem(last=False)
            freed += len(data)
        self.size -= freed
        self.manager.total -= freed
        return freed

    def invalidate_up_to(self, position: Position) -> None:
        """Drop every cached entry at or before ``position`` (all readers passed it)."""
        freed = 0
        while self._entries:
            first = next(iter(self._entries))
            if first > position:
                break
            freed += len(self._entries.pop(first))
        self.size -= freed
        self.manager.total -= freed

    def invalidate_ledgers(self, ledger_ids: Iterable[int]) -> None:
        ids = set(ledger_ids)
        for pos in [p for p in self._entries if p.ledger_id in ids]:
            data = self._entries.pop(pos)
            self.size -= len(data)
            self.manager.total -= len(data)

    def clear(self) -> None:
        self.manager.total -= self.size
        self._entries.clear()
        self.size = 0
        self.manager._caches.discard(self)

    def __len__(self) -> int:
        return len(self._entries)


class EntryCacheManager:
    """Shares one byte budget (``max_size_bytes``) among all entry caches."""

    def __init__(self, max_size_bytes: int):
        self.max_size_bytes = max_size_bytes
        self.total = 0
        self._caches: set[EntryCache] = set()

    def new_cache(self, name: str) -> EntryCache:
        cache = EntryCache(self, name)
        self._caches.add(cache)
        return cache

    def _grew(self, nbytes: int) -> None:
        self.total += nbytes
        if self.total > self.max_size_bytes:
            # Evict down to 90% of the budget, biggest cache first.
            target = self.total - int(self.max_size_bytes * 0.9)
            for cache in sorted(self._caches, key=lambda c: c.size, reverse=True):
                target -= cache.evict_oldest(target)
                if target <= 0:
                    break
