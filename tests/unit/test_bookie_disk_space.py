"""Pure rules of a bookie's disk space (bookie.disk_space): usage as the disk monitor counts it,
the reserve's size, the WAL size on small filesystems; and the reserve file itself."""
from __future__ import annotations

import os

from bookie import disk_space

MiB = 1024 * 1024


def test_free_pages_inside_the_database_count_as_free():
    # 24 MiB filesystem, 1 MiB free, 11 MiB of freelist pages in the database: 50 % in use
    assert disk_space.usage(24 * MiB, 1 * MiB, 11 * MiB, 0, False) == 0.5
    assert disk_space.usage(24 * MiB, 0, 0, 0, False) == 1.0


def test_a_released_reserve_still_counts_as_used():
    held = disk_space.usage(24 * MiB, 2 * MiB, 0, 1 * MiB, True)
    released = disk_space.usage(24 * MiB, 3 * MiB, 0, 1 * MiB, False)   # the file's 1 MiB is free now
    assert held == released == 1 - 2 / 24


def test_reserve_and_wal_sizes_follow_the_filesystem():
    assert disk_space.reserve_size_for(24 * MiB) == 1 * MiB
    assert disk_space.reserve_size_for(10 * 1024 * MiB) == 4 * MiB
    assert disk_space.reserve_size_for(100) == 5            # never over 5 % of a tiny filesystem
    assert disk_space.wal_pages_for(24 * MiB, 16384, 1000) == 30   # 2 % of 24 MiB in 16 KiB pages
    assert disk_space.wal_pages_for(100 * 1024 * MiB, 16384, 1000) == 1000
    assert disk_space.wal_pages_for(1 * MiB, 16384, 1000) == 16


def test_reserve_file_is_held_and_released(tmp_path):
    r = disk_space.DiskReserve(str(tmp_path), size=64 * 1024)
    assert not r.held and r.hold() and r.held
    assert os.path.getsize(tmp_path / disk_space.RESERVE_FILE_NAME) == 64 * 1024
    r.release()
    assert not r.held and not (tmp_path / disk_space.RESERVE_FILE_NAME).exists()
    assert not disk_space.DiskReserve(str(tmp_path), size=0).hold()
