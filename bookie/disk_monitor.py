"""A bookie's disk monitor (BookKeeper's ``LedgerDirsMonitor``): read-only at
``disk_usage_threshold``, writable again below ``disk_usage_lwm_threshold``.

:class:`DiskMonitor` measures :meth:`bookie.storage.LedgerStorage.disk_usage` every
``disk_check_interval_s`` seconds (:meth:`DiskMonitor.run`) and sets the storage's
read-only state with hysteresis (:func:`next_read_only`). Between two checks, the add
path calls :meth:`DiskMonitor.quick_check` (one ``statvfs``, at most every
``QUICK_DISK_CHECK_S``): a fast writer would otherwise fill a small disk before the
monitor looks, and the commit would fail with SQLITE_FULL. Leaving read-only is only
the periodic check's job.
"""
from __future__ import annotations

import asyncio
import logging
import time

__all__ = ["DiskMonitor", "next_read_only", "QUICK_DISK_CHECK_S"]

log = logging.getLogger("bookie.server")

# Seconds between two quick disk checks on the add path.
QUICK_DISK_CHECK_S = 0.002


def next_read_only(read_only: bool, usage: float, threshold: float, lwm_threshold: float) -> bool:
    """Read-only state after measuring ``usage`` (LedgerDirsMonitor's hysteresis):
    writable -> read-only at ``usage >= threshold``, read-only -> writable at
    ``usage < lwm_threshold``; otherwise unchanged."""
    if read_only:
        return usage >= lwm_threshold
    return usage >= threshold


class DiskMonitor:
    """The disk monitor of one bookie: ``storage`` (a ``LedgerStorage``), ``config`` (a
    ``BookieConfig``: disk_usage_threshold, disk_usage_lwm_threshold, disk_check_interval_s,
    data_dir). ``usage`` holds the last measured share (0..1), reported by GetBookieInfo."""

    def __init__(self, storage, config) -> None:
        self.storage = storage
        self.config = config
        self.usage = 0.0
        self._last_quick = 0.0

    def _read_only_reason(self, what: str) -> str:
        cfg = self.config
        return (f"{what}, at or over disk_usage_threshold={cfg.disk_usage_threshold}; adds are refused until it is "
                f"below disk_usage_lwm_threshold={cfg.disk_usage_lwm_threshold} (delete ledgers or add space)")

    async def check(self) -> None:
        """Measure the disk usage once and update the read-only state. Raises OSError /
        sqlite3.Error from the measurement."""
        cfg = self.config
        usage, what = await self.storage.disk_usage()
        self.usage = usage
        ro = self.storage.read_only
        new_ro = next_read_only(ro, usage, cfg.disk_usage_threshold, cfg.disk_usage_lwm_threshold)
        if new_ro and not ro:
            self.storage.set_read_only(True, self._read_only_reason(what))
        elif ro and not new_ro:
            self.storage.set_read_only(False, f"{what}, below disk_usage_lwm_threshold={cfg.disk_usage_lwm_threshold}")

    def quick_check(self) -> None:
        """On the add path (writable storage only), at most every QUICK_DISK_CHECK_S: turn
        read-only at once when the filesystem reaches disk_usage_threshold. Never raises."""
        now = time.monotonic()
        if now - self._last_quick < QUICK_DISK_CHECK_S:
            return
        self._last_quick = now
        try:
            usage = self.storage.quick_usage()
        except OSError:
            return
        if usage >= self.config.disk_usage_threshold:
            self.usage = usage
            self.storage.set_read_only(True, self._read_only_reason(
                f"filesystem of {self.config.data_dir} is {usage:.1%} full"))

    async def run(self) -> None:
        """Check every disk_check_interval_s until cancelled; a failing check is logged and
        does not stop the monitor."""
        while True:
            await asyncio.sleep(self.config.disk_check_interval_s)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("disk usage check of %s failed: %r", self.config.data_dir, exc)
