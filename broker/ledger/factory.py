"""``ManagedLedgerFactory`` (Pulsar's ``ManagedLedgerFactoryImpl``): opens
managed ledgers by name, recovering each one's cursors, and shares the bookie
client and the entry cache manager between them."""
from __future__ import annotations

import asyncio
from typing import Optional

from bookie.client import BookKeeper
from broker.metadata.names import decode_path_segment, ml_path

from .entry_cache import EntryCacheManager
from .managed_cursor import ManagedCursor
from .managed_ledger import ManagedLedger
from .ml_config import ManagedLedgerConfig

__all__ = ["ManagedLedgerFactory"]


class ManagedLedgerFactory:
    """Opens managed ledgers by name and shares the bookie client and entry cache
    (Pulsar's ManagedLedgerFactoryImpl)."""

    def __init__(self, metadata, bk: BookKeeper, config: Optional[ManagedLedgerConfig] = None):
        self.metadata = metadata
        self.bk = bk
        self.config = config or ManagedLedgerConfig()
        c = self.config
        self.cache_manager = EntryCacheManager(c.managed_ledger_cache_size_mb * 1024 * 1024,
                                               c.managed_ledger_cache_eviction_watermark,
                                               c.managed_ledger_cache_eviction_interval_ms,
                                               c.managed_ledger_cache_eviction_time_threshold_millis)
        self._ledgers: dict[str, ManagedLedger] = {}
        # ``async guard(ml_name) -> None | str``: a reason why this broker may not write the managed
        # ledger's metadata now (session lost, bundle not owned); None: no check (standalone broker)
        self.metadata_write_guard = None
        self._opening: dict[str, asyncio.Task] = {}

    async def open(self, name: str) -> ManagedLedger:
        """Open (recovering) or create the managed ledger ``name``; concurrent opens share one."""
        ml = self._ledgers.get(name)
        if ml is not None:
            return ml
        task = self._opening.get(name)
        if task is None:
            task = self._opening[name] = asyncio.create_task(self._do_open(name))
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._opening.pop(name, None)

    async def _do_open(self, name: str) -> ManagedLedger:
        ml = ManagedLedger(self, name)
        await ml._open()
        for segment in await self.metadata.get_children(ml_path(name)):   # URL-encoded cursor names
            cursor = await ManagedCursor.recover(ml, decode_path_segment(segment), path_segment=segment)
            ml.cursors[cursor.name] = cursor
        self._ledgers[name] = ml
        return ml

    def _forget(self, ml: ManagedLedger) -> None:
        if self._ledgers.get(ml.name) is ml:
            del self._ledgers[ml.name]

    async def close(self) -> None:
        """Close every open managed ledger, then stop the entry cache manager."""
        for ml in list(self._ledgers.values()):
            await ml.close()
        await self.cache_manager.close()
