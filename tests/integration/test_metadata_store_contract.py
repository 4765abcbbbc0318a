"""The MetadataStore contract (broker/metadata/store.py), run on both backends: the embedded
SQLite store (a file in tmp_path) and the etcd store (a real ``etcd`` server). Then what
only etcd has: sessions shared with other processes (lease expiry, SESSION_LOST /
SESSION_REESTABLISHED), etcd restarts, unreachable etcd at open, several endpoints.

The contract tests share one etcd per module (its keys are wiped before each test); the
tests that pause, kill or restart etcd start their own (the ``etcd`` fixture)."""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sqlite3
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.metadata import (
    BadVersion,
    EtcdMetadataStore,
    GetResult,
    MetadataStore,
    MetadataStoreError,
    MetadataStoreUnavailable,
    NotFound,
    Notification,
    NotificationType,
    SessionEvent,
    SqliteMetadataStore,
    open_metadata_store,
    parse_metadata_store_url,
)
from broker.metadata import etcd_store
from tests.procs import REPO_ROOT, ProcessTracker, free_port, start_etcd

BACKENDS = ["sqlite", "etcd"]
SESSION_MS = 1000  # etcd grants at least 2 s


@pytest.fixture(scope="module")
def shared_etcd(tmp_path_factory):
    tracker = ProcessTracker()
    proc = start_etcd(tmp_path_factory.mktemp("etcd"), tracker=tracker)
    try:
        yield proc
    finally:
        tracker.kill_all()


async def _wipe(etcd_proc) -> None:
    import aetcd
    from aetcd import rpc

    async with aetcd.Client(host="127.0.0.1", port=etcd_proc.client_port) as client:
        await client.kvstub.DeleteRange(rpc.DeleteRangeRequest(key=b"\0", range_end=b"\0"), timeout=5)


@pytest.fixture(params=BACKENDS)
async def open_store(request, tmp_path):
    """``await open_store()`` -> a new store object of the test's backend; for etcd every call
    is another client of the same etcd (another session), for sqlite the same file."""
    opened: list[MetadataStore] = []
    if request.param == "etcd":
        proc = request.getfixturevalue("shared_etcd")
        await _wipe(proc)

        async def factory() -> MetadataStore:
            store = await EtcdMetadataStore.open(proc.url, session_timeout_ms=SESSION_MS, connect_timeout_s=10)
            opened.append(store)
            return store
    else:
        async def factory() -> MetadataStore:
            store = await SqliteMetadataStore.open(str(tmp_path / "meta.db"))
            opened.append(store)
            return store
    factory.backend = request.param
    yield factory
    for store in opened:
        await store.close()


@pytest.fixture
async def store(open_store):
    return await open_store()


async def eventually(predicate, timeout: float = 5.0, what: str = "condition"):
    """Poll ``predicate`` (sync or async) until truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------ contract


async def test_put_get_versions(store):
    assert isinstance(store, MetadataStore)
    assert await store.get("/a") is None
    assert not await store.exists("/a")
    assert await store.put("/a", b"v0") == 0
    assert await store.get("/a") == GetResult(b"v0", 0)
    assert await store.put("/a", b"v1") == 1
    assert await store.put("/a", bytearray(b"v2")) == 2
    assert await store.get("/a") == GetResult(b"v2", 2)
    assert await store.exists("/a")


async def test_compare_and_set(store):
    assert await store.put("/n", b"x", expected_version=-1) == 0
    with pytest.raises(BadVersion):
        await store.put("/n", b"y", expected_version=-1)
    assert await store.put("/n", b"y", expected_version=0) == 1
    with pytest.raises(BadVersion):
        await store.put("/n", b"z", expected_version=0)
    with pytest.raises(NotFound):
        await store.put("/missing", b"z", expected_version=3)
    assert await store.get("/missing") is None
    assert await store.get("/n") == GetResult(b"y", 1)


async def test_parents_materialized_and_delete_refuses_children(store):
    await store.put("/a/b/c", b"leaf")
    assert await store.get("/a") == GetResult(b"", 0)
    assert await store.get("/a/b") == GetResult(b"", 0)
    with pytest.raises(MetadataStoreError, match="children"):
        await store.delete("/a/b")
    await store.delete("/a/b/c")
    assert await store.exists("/a/b")  # parents stay
    await store.delete("/a/b")
    await store.delete("/a")
    assert not await store.exists("/a")


async def test_delete_cas_and_recreate_starts_at_version_zero(store):
    await store.put("/d", b"1")
    await store.put("/d", b"2")
    with pytest.raises(NotFound):
        await store.delete("/nope")
    with pytest.raises(BadVersion):
        await store.delete("/d", expected_version=0)
    await store.delete("/d", expected_version=1)
    assert await store.get("/d") is None
    with pytest.raises(NotFound):
        await store.delete("/d")
    assert await store.put("/d", b"again") == 0


async def test_root_and_bad_paths(store):
    assert await store.exists("/")
    assert (await store.get("/")).version == 0
    for bad in ("", "a", "/a/", "//a", "/a//b", "/a/./b", "/a/../b", "/a\x00b", None):
        with pytest.raises(ValueError):
            await store.get(bad)
    with pytest.raises(ValueError):
        await store.put("/", b"x")
    with pytest.raises(ValueError):
        await store.delete("/")
    with pytest.raises(ValueError):
        await store.put("/x", b"v", expected_version=-2)
    with pytest.raises(TypeError):
        await store.put("/x", "not bytes")


async def test_children_sorted_direct_names(store):
    for path in ("/p/b", "/p/a/deep/er", "/p/a-x", "/p/c", "/p/ä", "/pq/z", "/p/a"):
        await store.put(path, b"")
    assert await store.get_children("/p") == ["a", "a-x", "b", "c", "ä"]
    assert await store.get_children("/p/a") == ["deep"]
    assert await store.get_children("/p/c") == []
    assert await store.get_children("/nothing") == []
    assert await store.get_children("/") == ["p", "pq"]


async def test_children_paged(open_store, monkeypatch):
    """etcd lists children a page of keys at a time, jumping over each child's subtree."""
    monkeypatch.setattr(etcd_store, "_CHILDREN_PAGE", 3)
    store = await open_store()
    names = ["a", "a-1", "b", "c", "d"]
    for name in names:
        await store.put(f"/t/{name}", b"")
        for i in range(4):
            await store.put(f"/t/{name}/g{i}/x", b"")
    assert await store.get_children("/t") == names
    assert await store.get_children("/t/a") == ["g0", "g1", "g2", "g3"]


async def test_increment_counter(store):
    assert [await store.increment_counter("/ctr") for _ in range(3)] == [1, 2, 3]
    assert (await store.get("/ctr")) == GetResult(struct.pack(">q", 3), 2)
    results = await asyncio.gather(*(store.increment_counter("/ctr") for _ in range(20)))
    assert sorted(results) == list(range(4, 24))
    await store.put("/not-a-counter", b"xyz")
    with pytest.raises(MetadataStoreError):
        await store.increment_counter("/not-a-counter")


async def test_concurrent_counters_of_two_stores(open_store):
    a, b = await open_store(), await open_store()
    results = await asyncio.gather(*(s.increment_counter("/ids") for s in (a, b) for _ in range(10)))
    assert sorted(results) == list(range(1, 21))


async def test_watch_fires_for_matching_changes(store):
    seen: list[Notification] = []
    cancel = store.watch(seen.append, "/w")
    await store.put("/w/a", b"1")  # creates /w too
    await store.put("/w/a", b"2")
    await store.put("/wx", b"not under /w")
    await store.delete("/w/a")
    expected = [Notification(NotificationType.CREATED, "/w"), Notification(NotificationType.CREATED, "/w/a"),
                Notification(NotificationType.MODIFIED, "/w/a"), Notification(NotificationType.DELETED, "/w/a")]
    await eventually(lambda: len(seen) >= 4, what="4 notifications")
    assert seen == expected
    cancel()
    cancel()  # idempotent
    await store.put("/w/b", b"after cancel")
    await asyncio.sleep(0.3)
    assert seen == expected


async def test_watch_coroutine_callbacks_and_failing_callback(store, caplog):
    got = asyncio.Queue()

    async def coro_callback(note):
        await got.put(note)

    def failing(note):
        raise RuntimeError("callback bug")

    store.watch(failing, "/")
    store.watch(coro_callback, "/c")
    with caplog.at_level(logging.ERROR):
        await store.put("/c", b"1")
        note = await asyncio.wait_for(got.get(), 5)
    assert note == Notification(NotificationType.CREATED, "/c")
    assert "callback bug" in caplog.text or "failed" in caplog.text
    assert await store.get("/c") == GetResult(b"1", 0)


async def test_ephemeral_nodes_deleted_on_close(open_store):
    owner = await open_store()
    assert await owner.put_ephemeral("/owners/b1", b"me") == 0
    with pytest.raises(BadVersion):
        await owner.put_ephemeral("/owners/b1", b"again")
    await owner.put("/owners/persistent", b"stays")
    assert await owner.put("/owners/b1", b"update") == 1  # still ephemeral afterwards
    await owner.close()
    other = await open_store()
    assert await other.get("/owners/b1") is None
    assert await other.get("/owners/persistent") == GetResult(b"stays", 0)
    assert await other.exists("/owners")


async def test_calls_after_close_raise(store):
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(MetadataStoreError, match="closed"):
        await store.get("/a")
    with pytest.raises(MetadataStoreError, match="closed"):
        await store.put("/a", b"")
    with pytest.raises(MetadataStoreError, match="closed"):
        store.watch(lambda n: None)


async def test_shared_flag(store, open_store):
    assert store.shared is (open_store.backend == "etcd")


# ------------------------------------------------------------------ etcd: other clients


async def test_etcd_watch_sees_other_stores_and_plain_etcd_clients(shared_etcd):
    await _wipe(shared_etcd)
    import aetcd

    watcher = await EtcdMetadataStore.open(shared_etcd.url, session_timeout_ms=SESSION_MS)
    writer = await EtcdMetadataStore.open(shared_etcd.url, session_timeout_ms=SESSION_MS)
    try:
        seen: list[Notification] = []
        watcher.watch(seen.append, "/ledgers")
        await writer.put("/ledgers/L1", b"md")
        await writer.put_ephemeral("/ledgers/available/10.0.0.1:3181", b"")
        async with aetcd.Client(host="127.0.0.1", port=shared_etcd.client_port) as raw:
            await raw.put(b"/ledgers/available/10.0.0.2:3181", b"")
        await writer.close()  # revokes its lease: the ephemeral node is deleted
        await eventually(lambda: Notification(NotificationType.DELETED, "/ledgers/available/10.0.0.1:3181") in seen,
                         what="DELETED of the closed store's ephemeral node")
        assert seen[:4] == [Notification(NotificationType.CREATED, p) for p in (
            "/ledgers", "/ledgers/L1", "/ledgers/available", "/ledgers/available/10.0.0.1:3181")]
        assert Notification(NotificationType.CREATED, "/ledgers/available/10.0.0.2:3181") in seen
        assert await watcher.get_children("/ledgers/available") == ["10.0.0.2:3181"]
    finally:
        await watcher.close()
        await writer.close()


async def test_etcd_children_listed_without_materialized_parent(shared_etcd):
    await _wipe(shared_etcd)
    import aetcd

    async with aetcd.Client(host="127.0.0.1", port=shared_etcd.client_port) as raw:
        await raw.put(b"/ledgers/available/127.0.0.1:3181", b"")
        await raw.put(b"/ledgers/available/127.0.0.1:3182/readonly", b"")
    store = await EtcdMetadataStore.open(shared_etcd.url)
    try:
        assert await store.get_children("/ledgers/available") == ["127.0.0.1:3181", "127.0.0.1:3182"]
        assert await store.get_children("/ledgers") == ["available"]
        assert await store.get("/ledgers/available/127.0.0.1:3181") == GetResult(b"", 0)
    finally:
        await store.close()


_HOLDER = """
import asyncio, sys
from broker.metadata import EtcdMetadataStore

async def main():
    store = await EtcdMetadataStore.open(sys.argv[1], session_timeout_ms=1000)
    await store.put_ephemeral("/brokers/holder", b"alive")
    print("READY", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_etcd_ephemeral_node_vanishes_when_its_process_is_killed(shared_etcd):
    await _wipe(shared_etcd)
    store = await EtcdMetadataStore.open(shared_etcd.url, session_timeout_ms=SESSION_MS)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, shared_etcd.url], cwd=str(REPO_ROOT),
                              stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    try:
        line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), 20)
        assert line.strip() == b"READY"
        deleted = asyncio.Event()
        store.watch(lambda n: n.type == NotificationType.DELETED and deleted.set(), "/brokers/holder")
        assert await store.get("/brokers/holder") == GetResult(b"alive", 0)
        await asyncio.sleep(3)  # well past the lease TTL: the holder keeps it alive
        assert await store.exists("/brokers/holder")
        holder.kill()  # kill -9: no revoke, the lease expires (TTL 2 s)
        started = time.monotonic()
        await asyncio.wait_for(deleted.wait(), 10)
        assert time.monotonic() - started < 6
        assert not await store.exists("/brokers/holder")
        assert await store.exists("/brokers")  # the parent is persistent
    finally:
        holder.kill()
        holder.wait()
        await store.close()


async def test_etcd_session_lost_when_etcd_reports_the_lease_gone(shared_etcd):
    """The lease expired while this process could not keep it alive (e.g. its event loop was
    blocked longer than the TTL): the next keep-alive learns it, SESSION_LOST, new lease."""
    await _wipe(shared_etcd)
    import aetcd

    store = await EtcdMetadataStore.open(shared_etcd.url, session_timeout_ms=SESSION_MS)
    try:
        events: list[str] = []
        store.add_session_listener(events.append)
        await store.put_ephemeral("/mine", b"1")
        old = store.session_lease_id
        async with aetcd.Client(host="127.0.0.1", port=shared_etcd.client_port) as raw:
            await raw.revoke_lease(old)
        await eventually(lambda: SessionEvent.SESSION_REESTABLISHED in events, what="SESSION_REESTABLISHED")
        assert events == [SessionEvent.SESSION_LOST, SessionEvent.SESSION_REESTABLISHED]
        assert store.session_lease_id not in (None, old)
        assert await store.put_ephemeral("/mine", b"2") == 0
    finally:
        await store.close()


# ------------------------------------------------------------------ etcd: faults


async def test_etcd_session_lost_and_reestablished_when_etcd_pauses(etcd):
    store = await EtcdMetadataStore.open(etcd.url, session_timeout_ms=SESSION_MS)
    observer = None
    try:
        events: list[str] = []
        async_events: list[str] = []

        async def coro_listener(event):
            async_events.append(event)

        store.add_session_listener(events.append)
        store.add_session_listener(coro_listener)
        await store.put_ephemeral("/owner", b"1")
        etcd.pause()
        try:
            await eventually(lambda: SessionEvent.SESSION_LOST in events, timeout=5, what="SESSION_LOST")
            assert events[:2] == [SessionEvent.CONNECTION_LOST, SessionEvent.SESSION_LOST]
            with pytest.raises(MetadataStoreUnavailable):
                await store.put_ephemeral("/owner2", b"no session")
        finally:
            etcd.resume()
        await eventually(lambda: SessionEvent.SESSION_REESTABLISHED in events, timeout=10,
                         what="SESSION_REESTABLISHED")
        assert events == [SessionEvent.CONNECTION_LOST, SessionEvent.SESSION_LOST, SessionEvent.SESSION_REESTABLISHED]
        await eventually(lambda: len(async_events) == 3, what="coroutine listener")
        # the old session's node is gone (its lease revoked before SESSION_REESTABLISHED),
        # so a listener can claim it again at once
        assert not await store.exists("/owner")
        await store.put_ephemeral("/owner", b"2")
        observer = await EtcdMetadataStore.open(etcd.url)
        assert await observer.get("/owner") == GetResult(b"2", 0)
    finally:
        await store.close()
        if observer is not None:
            await observer.close()


async def test_etcd_connection_lost_then_reconnected_within_session_timeout(etcd):
    store = await EtcdMetadataStore.open(etcd.url, session_timeout_ms=4000)
    try:
        events: list[str] = []
        store.add_session_listener(events.append)
        await store.put_ephemeral("/kept", b"1")
        etcd.pause()
        try:
            await eventually(lambda: events, timeout=5, what="CONNECTION_LOST")
        finally:
            etcd.resume()
        await eventually(lambda: SessionEvent.RECONNECTED in events, timeout=5, what="RECONNECTED")
        assert events == [SessionEvent.CONNECTION_LOST, SessionEvent.RECONNECTED]
        assert await store.get("/kept") == GetResult(b"1", 0)
    finally:
        await store.close()


async def test_etcd_killed_and_restarted_while_a_store_is_open(etcd):
    store = await EtcdMetadataStore.open(etcd.url, session_timeout_ms=5000, operation_timeout_s=2)
    try:
        seen: list[Notification] = []
        store.watch(seen.append, "/data")
        for i in range(5):
            await store.put(f"/data/{i}", str(i).encode())
        await eventually(lambda: len(seen) == 6, what="6 notifications")
        etcd.kill()
        started = time.monotonic()
        with pytest.raises(MetadataStoreUnavailable, match="etcd at 127.0.0.1"):
            await store.get("/data/1")
        with pytest.raises(MetadataStoreUnavailable):
            await store.put("/data/x", b"")
        assert time.monotonic() - started < 5
        etcd.restart()
        got = await eventually(lambda: _get_or_none(store, "/data/3"), timeout=10, what="a read after restart")
        assert got == GetResult(b"3", 0)
        assert await store.get_children("/data") == ["0", "1", "2", "3", "4"]
        await store.put("/data/5", b"5")
        await eventually(lambda: Notification(NotificationType.CREATED, "/data/5") in seen, timeout=10,
                         what="watch re-established")
        assert await store.increment_counter("/ctr") == 1
    finally:
        await store.close()


async def _get_or_none(store, path):
    try:
        return await store.get(path)
    except MetadataStoreUnavailable:
        return None


async def test_etcd_unreachable_at_open_fails_clearly_after_connect_timeout(caplog):
    port = free_port()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        with pytest.raises(MetadataStoreError, match=rf"cannot reach etcd at etcd://127.0.0.1:{port} after 1.5 s: "
                                                     r"start etcd or fix metadata_store_url"):
            await EtcdMetadataStore.open(f"etcd://127.0.0.1:{port}", connect_timeout_s=1.5)
    elapsed = time.monotonic() - started
    assert 1.4 <= elapsed < 4
    assert "cannot reach etcd at" in caplog.text and "retrying" in caplog.text


async def test_etcd_several_endpoints_uses_the_one_that_answers(shared_etcd):
    await _wipe(shared_etcd)
    url = f"etcd://127.0.0.1:{free_port()},{shared_etcd.address}"
    store = await EtcdMetadataStore.open(url, connect_timeout_s=5)
    try:
        await store.put("/x", b"1")
        assert await store.get("/x") == GetResult(b"1", 0)
    finally:
        await store.close()


# ------------------------------------------------------------------ sqlite specifics


_SQLITE_HOLDER = """
import asyncio, sys
from broker.metadata import SqliteMetadataStore

async def main():
    store = await SqliteMetadataStore.open(sys.argv[1])
    await store.put_ephemeral("/brokers/holder", b"alive")
    await store.put("/brokers/persistent", b"stays")
    print("READY", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_sqlite_ephemeral_nodes_of_a_killed_process_removed_at_next_open(tmp_path):
    db = str(tmp_path / "meta.db")
    holder = subprocess.Popen([sys.executable, "-c", _SQLITE_HOLDER, db], cwd=str(REPO_ROOT),
                              stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    try:
        line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), 20)
        assert line.strip() == b"READY"
    finally:
        holder.kill()
        holder.wait()
    store = await SqliteMetadataStore.open(db)
    try:
        assert await store.get("/brokers/holder") is None
        assert await store.get("/brokers/persistent") == GetResult(b"stays", 0)
        assert await store.get_children("/brokers") == ["persistent"]
    finally:
        await store.close()


async def test_sqlite_schema_1_file_still_opens(tmp_path):
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.executescript("""
        CREATE TABLE nodes (path TEXT PRIMARY KEY, parent TEXT NOT NULL, name TEXT NOT NULL,
                            value BLOB NOT NULL, version INTEGER NOT NULL) WITHOUT ROWID;
        CREATE INDEX nodes_by_parent ON nodes(parent, name);
        INSERT INTO nodes VALUES ('/', '', '', x'', 0);
        INSERT INTO nodes VALUES ('/old', '/', 'old', x'6869', 4);
        PRAGMA user_version = 1;
    """)
    con.close()
    store = await SqliteMetadataStore.open(str(db))
    try:
        assert await store.get("/old") == GetResult(b"hi", 4)
        await store.put_ephemeral("/e", b"")
    finally:
        await store.close()
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM ephemeral").fetchone()[0] == 0
    con.close()


# ------------------------------------------------------------------ URLs


def test_parse_metadata_store_url():
    assert parse_metadata_store_url("") == ("sqlite", None)
    assert parse_metadata_store_url(None) == ("sqlite", None)
    assert parse_metadata_store_url("sqlite:/var/m.db") == ("sqlite", "/var/m.db")
    assert parse_metadata_store_url("etcd://h1:1,h2") == ("etcd", "h1:1,h2:2379")
    assert parse_metadata_store_url("etcd:http://h1:1,http://h2:2") == ("etcd", "h1:1,h2:2")
    for bad in ("zk:localhost:2181", "rocksdb:/x", "etcd://", "etcd://h:99999", "sqlite:", "etcd://a b:1"):
        with pytest.raises(ValueError):
            parse_metadata_store_url(bad)
    with pytest.raises(ValueError, match="sqlite:PATH"):
        parse_metadata_store_url("zk:localhost:2181")


async def test_open_metadata_store_forms(tmp_path, shared_etcd):
    default = await open_metadata_store("", default_sqlite_path=str(tmp_path / "default.db"))
    named = await open_metadata_store(f"sqlite:{tmp_path / 'named.db'}", default_sqlite_path="unused.db")
    etcd = await open_metadata_store(shared_etcd.url, default_sqlite_path="unused.db", session_timeout_ms=2000)
    try:
        assert isinstance(default, SqliteMetadataStore) and (tmp_path / "default.db").exists()
        assert isinstance(named, SqliteMetadataStore) and (tmp_path / "named.db").exists()
        assert isinstance(etcd, EtcdMetadataStore) and etcd.shared
        assert not Path("unused.db").exists()
    finally:
        for s in (default, named, etcd):
            await s.close()
    with pytest.raises(ValueError, match="etcd://host:port"):
        await open_metadata_store("zk:h:2181", default_sqlite_path=str(tmp_path / "x.db"))
