"""Tests of the embedded SQLite MetadataStore, on real SQLite files."""
from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.metadata import (
    BadVersion,
    GetResult,
    MetadataStore,
    MetadataStoreError,
    NotFound,
    Notification,
    NotificationType,
    SqliteMetadataStore,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def store(tmp_path):
    s = await SqliteMetadataStore.open(str(tmp_path / "meta.db"))
    yield s
    await s.close()


# ------------------------------------------------------------------ basics


async def test_is_a_metadata_store_in_wal_mode(store, tmp_path):
    assert isinstance(store, MetadataStore)
    assert (tmp_path / "meta.db").exists()
    assert (tmp_path / "meta.db-wal").exists()


async def test_open_creates_missing_directories(tmp_path):
    s = await SqliteMetadataStore.open(str(tmp_path / "a" / "b" / "meta.db"))
    await s.put("/x", b"1")
    await s.close()
    assert (tmp_path / "a" / "b" / "meta.db").exists()


async def test_get_missing_is_none(store):
    assert await store.get("/nope") is None
    assert not await store.exists("/nope")


async def test_put_get_and_versions(store):
    assert await store.put("/a", b"one") == 0
    assert await store.get("/a") == GetResult(b"one", 0)
    assert await store.put("/a", b"two") == 1
    assert await store.put("/a", b"three") == 2
    assert await store.get("/a") == GetResult(b"three", 2)
    assert await store.exists("/a")


async def test_values_are_bytes(store):
    await store.put("/bin", bytearray(b"\x00\xff\x00"))
    got = await store.get("/bin")
    assert type(got.value) is bytes and got.value == b"\x00\xff\x00"
    await store.put("/empty", b"")
    assert await store.get("/empty") == GetResult(b"", 0)
    with pytest.raises(TypeError):
        await store.put("/s", "not bytes")  # type: ignore[arg-type]


async def test_root_always_exists_and_is_read_only(store):
    assert await store.exists("/")
    assert await store.get("/") == GetResult(b"", 0)
    assert await store.get_children("/") == []
    with pytest.raises(ValueError):
        await store.put("/", b"x")
    with pytest.raises(ValueError):
        await store.delete("/")


# -------------------------------------------------------------------- CAS


async def test_create_only(store):
    assert await store.put("/c", b"x", expected_version=-1) == 0
    with pytest.raises(BadVersion):
        await store.put("/c", b"y", expected_version=-1)
    assert await store.get("/c") == GetResult(b"x", 0)


async def test_versioned_put(store):
    await store.put("/v", b"0")
    assert await store.put("/v", b"1", expected_version=0) == 1
    with pytest.raises(BadVersion):
        await store.put("/v", b"stale", expected_version=0)
    with pytest.raises(BadVersion):
        await store.put("/v", b"future", expected_version=5)
    assert await store.get("/v") == GetResult(b"1", 1)


async def test_versioned_put_on_missing_node_is_not_found(store):
    with pytest.raises(NotFound):
        await store.put("/missing", b"x", expected_version=0)
    assert not await store.exists("/missing")


async def test_bad_version_and_not_found_are_store_errors():
    assert issubclass(BadVersion, MetadataStoreError)
    assert issubclass(NotFound, MetadataStoreError)


async def test_invalid_expected_version(store):
    with pytest.raises(ValueError):
        await store.put("/a", b"x", expected_version=-2)
    with pytest.raises(ValueError):
        await store.delete("/a", expected_version=-1)


# ----------------------------------------------------------------- delete


async def test_delete(store):
    await store.put("/d", b"x")
    await store.delete("/d")
    assert await store.get("/d") is None
    with pytest.raises(NotFound):
        await store.delete("/d")


async def test_delete_missing_is_not_found(store):
    with pytest.raises(NotFound):
        await store.delete("/never")
    with pytest.raises(NotFound):
        await store.delete("/never", expected_version=0)


async def test_delete_with_version(store):
    await store.put("/d", b"x")
    await store.put("/d", b"y")
    with pytest.raises(BadVersion):
        await store.delete("/d", expected_version=0)
    assert await store.exists("/d")
    await store.delete("/d", expected_version=1)
    assert not await store.exists("/d")


async def test_recreated_node_restarts_at_version_zero(store):
    await store.put("/r", b"x")
    await store.put("/r", b"y")
    await store.delete("/r")
    assert await store.put("/r", b"z", expected_version=-1) == 0


async def test_delete_refuses_node_with_children(store):
    await store.put("/p/c", b"x")
    with pytest.raises(MetadataStoreError, match="children"):
        await store.delete("/p")
    await store.delete("/p/c")
    await store.delete("/p")
    assert not await store.exists("/p")


# --------------------------------------------------------------- children


async def test_children_direct_only_and_sorted(store):
    for name in ["zeta", "alpha", "Mid", "beta"]:
        await store.put(f"/ns/{name}", b"")
    await store.put("/ns/alpha/deep", b"")
    await store.put("/nsx/other", b"")
    assert await store.get_children("/ns") == ["Mid", "alpha", "beta", "zeta"]
    assert await store.get_children("/ns/alpha") == ["deep"]
    assert await store.get_children("/") == ["ns", "nsx"]
    assert await store.get_children("/ns/zeta") == []
    assert await store.get_children("/absent") == []


async def test_implicit_parents(store):
    await store.put("/managed-ledgers/public/default/persistent/t1", b"ledgers")
    assert await store.get_children("/managed-ledgers") == ["public"]
    assert await store.get_children("/managed-ledgers/public/default") == ["persistent"]
    assert await store.get_children("/managed-ledgers/public/default/persistent") == ["t1"]
    # Parents exist as empty nodes at version 0 (ZooKeeper's createParents).
    assert await store.get("/managed-ledgers/public") == GetResult(b"", 0)
    # A parent can be written afterwards like any node.
    assert await store.put("/managed-ledgers/public", b"tenant", expected_version=0) == 1


async def test_deleted_nodes_disappear_from_children(store):
    for name in ["a", "b", "c"]:
        await store.put(f"/list/{name}", b"")
    await store.delete("/list/b")
    assert await store.get_children("/list") == ["a", "c"]
    await store.delete("/list/a")
    await store.delete("/list/c")
    assert await store.get_children("/list") == []
    assert await store.exists("/list")  # the parent stays, as in ZooKeeper


async def test_children_with_unicode_names_sorted_like_python(store):
    names = ["é", "z", "a", "ß", "中", "Z", "~"]
    for name in names:
        await store.put(f"/u/{name}", b"")
    assert await store.get_children("/u") == sorted(names)


# --------------------------------------------------------------- counters


async def test_increment_counter_sequence(store):
    assert [await store.increment_counter("/counters/ledger-id") for _ in range(5)] == [1, 2, 3, 4, 5]
    got = await store.get("/counters/ledger-id")
    assert got == GetResult(struct.pack(">q", 5), 4)
    assert await store.increment_counter("/counters/other") == 1


async def test_increment_counter_concurrent(store):
    results = await asyncio.gather(*(store.increment_counter("/ctr") for _ in range(100)))
    assert sorted(results) == list(range(1, 101))


async def test_increment_counter_on_non_counter(store):
    await store.put("/text", b"hello")
    with pytest.raises(MetadataStoreError, match="counter"):
        await store.increment_counter("/text")


async def test_counter_survives_reopen(tmp_path):
    path = str(tmp_path / "m.db")
    s = await SqliteMetadataStore.open(path)
    for _ in range(3):
        await s.increment_counter("/id")
    await s.close()
    s = await SqliteMetadataStore.open(path)
    assert await s.increment_counter("/id") == 4
    await s.close()


# ------------------------------------------------------------- concurrency


async def test_concurrent_cas_writers_exactly_one_wins_per_version(store):
    await store.put("/cas", b"init")
    writers = 20
    rounds = 5
    wins: dict[int, list[int]] = {}

    async def writer(i: int) -> None:
        for _ in range(rounds):
            got = await store.get("/cas")
            try:
                new_version = await store.put("/cas", b"w%d" % i, expected_version=got.version)
            except BadVersion:
                continue
            wins.setdefault(new_version, []).append(i)

    await asyncio.gather(*(writer(i) for i in range(writers)))
    final = await store.get("/cas")
    # Every version 1..final.version was produced by exactly one writer.
    assert sorted(wins) == list(range(1, final.version + 1))
    assert all(len(w) == 1 for w in wins.values())
    assert final.value == b"w%d" % wins[final.version][0]


async def test_concurrent_create_only_one_wins(store):
    async def create(i: int):
        try:
            return await store.put("/leader", b"%d" % i, expected_version=-1)
        except BadVersion:
            return None

    results = await asyncio.gather(*(create(i) for i in range(50)))
    assert results.count(0) == 1
    assert results.count(None) == 49


async def test_cancelled_write_still_commits_and_notifies(store):
    seen = []
    store.watch(seen.append)
    task = asyncio.ensure_future(store.put("/cancel/me", b"x"))
    await asyncio.sleep(0)  # let the write start
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The store stays usable and consistent afterwards.
    assert await store.put("/after", b"y") == 0
    # The started write was carried through: committed and notified, in order.
    assert await store.get("/cancel/me") == GetResult(b"x", 0)
    assert [n.path for n in seen] == ["/cancel", "/cancel/me", "/after"]


# ---------------------------------------------------------------- watches


async def test_watch_created_modified_deleted(store):
    seen: list[Notification] = []
    store.watch(seen.append)
    await store.put("/w", b"1")
    await store.put("/w", b"2")
    await store.delete("/w")
    assert seen == [
        Notification(NotificationType.CREATED, "/w"),
        Notification(NotificationType.MODIFIED, "/w"),
        Notification(NotificationType.DELETED, "/w"),
    ]


async def test_watch_reports_created_parents_first(store):
    seen: list[Notification] = []
    store.watch(seen.append)
    await store.put("/a/b/c", b"")
    assert seen == [
        Notification(NotificationType.CREATED, "/a"),
        Notification(NotificationType.CREATED, "/a/b"),
        Notification(NotificationType.CREATED, "/a/b/c"),
    ]


async def test_watch_prefix_filtering(store):
    seen: list[Notification] = []
    store.watch(seen.append, prefix="/admin/clusters")
    await store.put("/admin/clusters/east", b"")
    await store.put("/admin/clustersX", b"")
    await store.put("/admin/policies/p/ns", b"")
    await store.put("/admin/clusters", b"x")
    assert [n.path for n in seen] == ["/admin/clusters", "/admin/clusters/east", "/admin/clusters"]
    assert [n.type for n in seen] == [
        NotificationType.CREATED,
        NotificationType.CREATED,
        NotificationType.MODIFIED,
    ]


async def test_watch_fires_after_commit(store, tmp_path):
    observed = []

    def callback(note: Notification) -> None:
        # A second connection sees the change: it is committed.
        import sqlite3

        con = sqlite3.connect(str(tmp_path / "meta.db"))
        try:
            row = con.execute("SELECT value FROM nodes WHERE path = ?", (note.path,)).fetchone()
        finally:
            con.close()
        observed.append(row)

    store.watch(callback, prefix="/committed")
    await store.put("/committed", b"v")
    assert observed == [(b"v",)]


async def test_failed_cas_does_not_notify(store):
    await store.put("/n", b"x")
    seen = []
    store.watch(seen.append)
    with pytest.raises(BadVersion):
        await store.put("/n", b"y", expected_version=7)
    with pytest.raises(NotFound):
        await store.delete("/other")
    assert seen == []


async def test_watch_cancel(store):
    seen = []
    cancel = store.watch(seen.append)
    await store.put("/x", b"")
    cancel()
    cancel()  # idempotent
    await store.put("/y", b"")
    assert [n.path for n in seen] == ["/x"]


async def test_async_watch_callback(store):
    seen = []
    done = asyncio.Event()

    async def callback(note: Notification) -> None:
        await asyncio.sleep(0)
        seen.append(note)
        if note.type == NotificationType.DELETED:
            done.set()

    store.watch(callback, prefix="/async")
    await store.put("/async/n", b"")
    await store.delete("/async/n")
    await asyncio.wait_for(done.wait(), 5)
    assert sorted((n.type, n.path) for n in seen) == [
        (NotificationType.CREATED, "/async"),
        (NotificationType.CREATED, "/async/n"),
        (NotificationType.DELETED, "/async/n"),
    ]


async def test_failing_watch_callback_does_not_break_writes(store, caplog):
    seen = []

    def bad(note):
        raise RuntimeError("boom")

    async def bad_async(note):
        raise RuntimeError("async boom")

    store.watch(bad)
    store.watch(bad_async)
    store.watch(seen.append)
    assert await store.put("/ok", b"") == 0
    await asyncio.sleep(0.01)
    assert [n.path for n in seen] == ["/ok"]
    assert "boom" in caplog.text


async def test_counter_notifications(store):
    seen = []
    store.watch(seen.append)
    await store.increment_counter("/ctr")
    await store.increment_counter("/ctr")
    assert seen == [
        Notification(NotificationType.CREATED, "/ctr"),
        Notification(NotificationType.MODIFIED, "/ctr"),
    ]


# ------------------------------------------------------------ persistence


async def test_persistence_across_reopen(tmp_path):
    path = str(tmp_path / "p.db")
    s = await SqliteMetadataStore.open(path)
    await s.put("/admin/clusters/east", b"east-url")
    await s.put("/admin/clusters/east", b"east-url-2")
    await s.put("/admin/clusters/west", b"west-url")
    await s.put("/gone", b"")
    await s.delete("/gone")
    await s.close()

    s = await SqliteMetadataStore.open(path)
    assert await s.get("/admin/clusters/east") == GetResult(b"east-url-2", 1)
    assert await s.get_children("/admin/clusters") == ["east", "west"]
    assert await s.get("/gone") is None
    assert await s.put("/admin/clusters/east", b"3", expected_version=1) == 2
    await s.close()


def test_put_survives_kill_9(tmp_path):
    """Once put returns, the change survives SIGKILL of the process."""
    path = str(tmp_path / "k.db")
    child = (
        "import asyncio, sys, time\n"
        "from broker.metadata import SqliteMetadataStore\n"
        "async def main():\n"
        "    s = await SqliteMetadataStore.open(sys.argv[1])\n"
        "    for i in range(20):\n"
        "        await s.put(f'/k/n{i}', b'v%d' % i)\n"
        "    await s.increment_counter('/k/ctr')\n"
        "    print('done', flush=True)\n"
        "    time.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child, path], cwd=str(ROOT), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "done"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()

    async def check():
        s = await SqliteMetadataStore.open(path)
        try:
            assert await s.get_children("/k") == sorted([f"n{i}" for i in range(20)] + ["ctr"])
            assert await s.get("/k/n19") == GetResult(b"v19", 0)
            assert await s.increment_counter("/k/ctr") == 2
        finally:
            await s.close()

    asyncio.run(check())


# ---------------------------------------------------------------- bad input


BAD_PATHS = ["", "a", "a/b", "/a/", "//", "/a//b", "/a/b/", "//a", "/a/./b", "/a/..", "/a\x00b"]


@pytest.mark.parametrize("bad", BAD_PATHS)
async def test_bad_paths_raise_value_error(store, bad):
    with pytest.raises(ValueError):
        await store.get(bad)
    with pytest.raises(ValueError):
        await store.put(bad, b"x")
    with pytest.raises(ValueError):
        await store.delete(bad)
    with pytest.raises(ValueError):
        await store.get_children(bad)
    with pytest.raises(ValueError):
        await store.exists(bad)
    with pytest.raises(ValueError):
        await store.increment_counter(bad)
    with pytest.raises(ValueError):
        store.watch(lambda n: None, prefix=bad)


async def test_non_string_path_raises_value_error(store):
    with pytest.raises(ValueError):
        await store.get(None)  # type: ignore[arg-type]


async def test_bad_path_error_message_is_clear(store):
    with pytest.raises(ValueError, match="must start with '/'"):
        await store.put("admin", b"")
    with pytest.raises(ValueError, match="empty segment"):
        await store.put("/a//b", b"")
    with pytest.raises(ValueError, match="must not end with '/'"):
        await store.put("/a/", b"")


async def test_closed_store_raises(tmp_path):
    s = await SqliteMetadataStore.open(str(tmp_path / "c.db"))
    await s.put("/a", b"")
    await s.close()
    await s.close()  # idempotent
    calls = [
        s.get("/a"),
        s.put("/a", b""),
        s.delete("/a"),
        s.get_children("/"),
        s.exists("/a"),
        s.increment_counter("/c"),
    ]
    for call in calls:
        with pytest.raises(MetadataStoreError, match="metadata store is closed"):
            await call
    with pytest.raises(MetadataStoreError, match="metadata store is closed"):
        s.watch(lambda n: None)


async def test_close_waits_for_running_write(tmp_path):
    s = await SqliteMetadataStore.open(str(tmp_path / "c.db"))
    write = asyncio.ensure_future(s.put("/w", b"x"))
    await asyncio.sleep(0)
    await s.close()
    # The write had started: close lets it finish.
    assert await write == 0
    s = await SqliteMetadataStore.open(str(tmp_path / "c.db"))
    assert await s.get("/w") == GetResult(b"x", 0)
    await s.close()


# ------------------------------------------------ model-based (hypothesis)

PATHS = ["/a", "/a/b", "/a/c", "/a/b/d", "/b", "/b/a"]


class StoreModel(RuleBasedStateMachine):
    """Random put/delete/counter/reopen sequences compared with a dict model
    that follows the same rules (implicit parents, ZooKeeper-style deletes)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory()
        self.db_path = os.path.join(self.tmp.name, "model.db")
        self.store = self.run(SqliteMetadataStore.open(self.db_path))
        self.model: dict[str, tuple[bytes, int]] = {}
        self.seen: list[Notification] = []
        self.cancel = self.store.watch(self.seen.append)
        self.expected_notes: list[Notification] = []

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.run(self.store.close())
        finally:
            self.loop.close()
            self.tmp.cleanup()

    def _children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted(p[len(prefix):] for p in self.model if p.startswith(prefix) and "/" not in p[len(prefix):])

    def _create_parents(self, path: str) -> None:
        parts = path.split("/")[1:-1]
        for i in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:i])
            if parent not in self.model:
                self.model[parent] = (b"", 0)
                self.expected_notes.append(Notification(NotificationType.CREATED, parent))

    @rule(
        path=st.sampled_from(PATHS),
        value=st.binary(max_size=8),
        expected=st.one_of(st.none(), st.integers(-1, 3), st.just("current")),
    )
    def put(self, path, value, expected):
        current = self.model.get(path)
        if expected == "current":
            expected = current[1] if current else 0
        try:
            version = self.run(self.store.put(path, value, expected_version=expected))
        except BadVersion:
            assert current is not None and (expected == -1 or expected != current[1])
            return
        except NotFound:
            assert current is None and expected is not None and expected >= 0
            return
        if current is None:
            assert expected is None or expected == -1
            self._create_parents(path)
            assert version == 0
            self.expected_notes.append(Notification(NotificationType.CREATED, path))
        else:
            assert expected is None or expected == current[1]
            assert version == current[1] + 1
            self.expected_notes.append(Notification(NotificationType.MODIFIED, path))
        self.model[path] = (value, version)

    @rule(path=st.sampled_from(PATHS), expected=st.one_of(st.none(), st.integers(0, 3)))
    def delete(self, path, expected):
        current = self.model.get(path)
        try:
            self.run(self.store.delete(path, expected_version=expected))
        except NotFound:
            assert current is None
            return
        except BadVersion:
            assert current is not None and expected != current[1]
            return
        except MetadataStoreError as e:
            assert "children" in str(e) and self._children(path)
            return
        assert current is not None and (expected is None or expected == current[1])
        assert not self._children(path)
        del self.model[path]
        self.expected_notes.append(Notification(NotificationType.DELETED, path))

    @rule(path=st.sampled_from(["/ctr", "/a/ctr"]))
    def increment(self, path):
        current = self.model.get(path)
        value = self.run(self.store.increment_counter(path))
        if current is None:
            self._create_parents(path)
            assert value == 1
            self.model[path] = (struct.pack(">q", 1), 0)
            self.expected_notes.append(Notification(NotificationType.CREATED, path))
        else:
            assert value == struct.unpack(">q", current[0])[0] + 1
            self.model[path] = (struct.pack(">q", value), current[1] + 1)
            self.expected_notes.append(Notification(NotificationType.MODIFIED, path))

    @rule()
    def reopen(self):
        self.cancel()
        self.run(self.store.close())
        self.store = self.run(SqliteMetadataStore.open(self.db_path))
        self.cancel = self.store.watch(self.seen.append)

    @rule(path=st.sampled_from(PATHS + ["/ctr", "/a/ctr", "/zzz"]))
    def get(self, path):
        got = self.run(self.store.get(path))
        expected = self.model.get(path)
        assert got == (None if expected is None else GetResult(*expected))
        assert self.run(self.store.exists(path)) == (expected is not None)

    @invariant()
    def children_match(self):
        for path in ["/", "/a", "/a/b", "/b"]:
            assert self.run(self.store.get_children(path)) == self._children(path)

    @invariant()
    def notifications_match(self):
        assert self.seen == self.expected_notes


StoreModel.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreModel = StoreModel.TestCase
