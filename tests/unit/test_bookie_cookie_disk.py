"""Bookie storage rules without processes: cookie checks (BookKeeper Cookie), the
read-only hysteresis (LedgerDirsMonitor), SQLITE_FULL handling, delete with the
master key, per-entry checksums, and the upgrade of an older database."""

from __future__ import annotations

import asyncio
import collections
import os
import sqlite3

import pytest

from bookie import cookie as cookies
from bookie import storage as st
from bookie.server import next_read_only
from proto import bookie_pb2 as pb

pytestmark = pytest.mark.timeout(60)

KEY = b"key"


def op(ledger_id, entry_id, payload=None, key=KEY, lac=-1, recovery=False, crc=None):
    return (ledger_id, entry_id, key, payload if payload is not None else b"%d:%d" % (ledger_id, entry_id),
            lac, recovery, crc)


async def opened(path, **kw) -> st.LedgerStorage:
    s = st.LedgerStorage(str(path), **kw)
    await s.open(kw.pop("address", "127.0.0.1:3181"))
    return s


@pytest.mark.parametrize("ro, usage, expected", [
    (False, 0.50, False), (False, 0.95, True), (False, 0.99, True),
    (True, 0.94, True), (True, 0.90, True), (True, 0.8999, False),
])
def test_read_only_hysteresis(ro, usage, expected):
    assert next_read_only(ro, usage, 0.95, 0.90) is expected


async def test_cookie_is_stamped_once_and_checked_on_every_open(tmp_path):
    s = await opened(tmp_path / "bk")
    iid = s.instance_id
    assert cookies.read_cookie(str(tmp_path / "bk")).instance_id == iid
    assert await s.add_entries([op(1, 0)]) == {}
    with pytest.raises(st.DataDirInUse):  # one process (one storage) per data dir
        await opened(tmp_path / "bk")
    await s.close()
    s = await opened(tmp_path / "bk")
    assert s.instance_id == iid
    await s.close()
    os.unlink(tmp_path / "bk" / "COOKIE")
    with pytest.raises(cookies.InvalidCookieError, match="no cookie"):
        await opened(tmp_path / "bk")
    # the refusal released the lock; the operator adopts the database explicitly
    s = st.LedgerStorage(str(tmp_path / "bk"))
    await s.open("127.0.0.1:3181", create_cookie=True)
    assert s.instance_id == iid and [e async for c in s.read_entries(1, 0, 0) for e in c] == [(0, b"1:0")]
    await s.close()
    s = st.LedgerStorage(str(tmp_path / "bk"))
    await s.open("127.0.0.1:3181", format=True)
    assert s.instance_id != iid
    with pytest.raises(st.LedgerNotFound):
        await s.read_lac(1)
    await s.close()


async def test_an_empty_database_without_cookie_finishes_the_first_start(tmp_path):
    """A first start that died between creating the database and writing the cookie:
    nothing can be lost, so the next start completes it (with the same id)."""
    s = await opened(tmp_path / "bk")
    iid = s.instance_id
    await s.close()
    os.unlink(tmp_path / "bk" / "COOKIE")
    s = await opened(tmp_path / "bk")
    assert s.instance_id == iid
    await s.close()


def test_check_db_file_detects_truncation(tmp_path):
    path = tmp_path / "x.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (b BLOB)")
    db.executemany("INSERT INTO t VALUES (?)", [(os.urandom(3000),) for _ in range(50)])
    db.commit()
    db.close()
    cookies.check_db_file(str(path))
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 4096)
    with pytest.raises(cookies.InvalidCookieError, match="truncated"):
        cookies.check_db_file(str(path))
    with open(path, "r+b") as f:
        f.truncate(50)
    with pytest.raises(cookies.InvalidCookieError, match="header"):
        cookies.check_db_file(str(path))


async def test_a_database_of_an_older_version_is_upgraded_once_adopted(tmp_path):
    d = tmp_path / "bk"
    d.mkdir()
    db = sqlite3.connect(d / "ledgers.db")
    db.executescript("""
        CREATE TABLE entries (ledger_id INTEGER NOT NULL, entry_id INTEGER NOT NULL, payload BLOB NOT NULL,
                              PRIMARY KEY (ledger_id, entry_id)) WITHOUT ROWID;
        CREATE TABLE ledgers (ledger_id INTEGER PRIMARY KEY, master_key BLOB NOT NULL,
                              fenced INTEGER NOT NULL DEFAULT 0, lac INTEGER NOT NULL DEFAULT -1,
                              last_entry_id INTEGER NOT NULL DEFAULT -1);
        INSERT INTO ledgers VALUES (7, X'6b6579', 0, -1, 0);
        INSERT INTO entries VALUES (7, 0, X'6f6c64');
    """)
    db.commit()
    db.close()
    with pytest.raises(cookies.InvalidCookieError, match="--create-cookie"):
        await opened(d)
    s = st.LedgerStorage(str(d))
    await s.open("127.0.0.1:3181", create_cookie=True)
    try:
        assert [e async for c in s.read_entries(7, 0, 0, with_checksums=True) for e in c] == [(0, b"old", None)]
        assert await s.add_entries([op(7, 1, b"new", lac=0, crc=1234)]) == {}
        assert [e async for c in s.read_entries(7, 1, 1, with_checksums=True) for e in c] == [(1, b"new", 1234)]
        assert s._incremental_vacuum
    finally:
        await s.close()


async def test_delete_with_another_key_deletes_nothing(tmp_path):
    s = await opened(tmp_path / "bk")
    try:
        assert await s.add_entries([op(3, 0), op(3, 1, lac=0)]) == {}
        with pytest.raises(st.UnauthorizedAccess):
            await s.delete_ledger(3, b"not-the-key")
        assert await s.read_lac(3) == (0, 1)
        assert await s.delete_ledger(3, KEY) is True
        assert await s.delete_ledger(3, b"any key: it is gone") is False
    finally:
        await s.close()


async def test_disk_full_turns_read_only_and_a_delete_in_the_failed_group_still_runs(tmp_path, monkeypatch):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(st.shutil, "disk_usage", lambda path: usage(100, 10, 90))  # the filesystem: 10% used
    s = await opened(tmp_path / "bk", max_db_size_bytes=1024 * 1024)
    try:
        payload = os.urandom(8000)
        assert await s.add_entries([op(1, i, payload) for i in range(20)]) == {}
        # one group: adds that do not fit, and a delete that frees space
        adds = s.add_entries([op(2, i, payload) for i in range(200)])
        delete = asyncio.ensure_future(s.delete_ledger(1, KEY))
        errors = await adds
        assert len(errors) == 200 and {e[0] for e in errors.values()} == {pb.E_READ_ONLY}
        assert await delete is True
        assert s.read_only and "full" in s.read_only_reason
        # read-only: normal adds refused, recovery adds accepted
        res = await s.add_entries([op(3, 0), op(4, 0, recovery=True)])
        assert list(res) == [0] and res[0][0] == pb.E_READ_ONLY
        used, what = await s.disk_usage()
        assert used < 0.9, what
        s.set_read_only(next_read_only(True, used, 0.95, 0.90), what)
        assert not s.read_only, what
        assert await s.add_entries([op(5, 0)]) == {}
    finally:
        await s.close()
