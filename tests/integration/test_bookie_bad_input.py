"""Bad input to real bookie processes: a wrong master key on delete, wiped / swapped /
truncated data dirs, a flipped bit in a stored entry, a full disk, a garbage frame.

Promises (DESIGN.md): an acknowledged entry survives while Qa bookies of its write
set live -- bookies refuse wiped dirs (BookKeeper cookies), reads verify digests
and fall back to the next replica (DigestManager); servers keep serving: after
each bad input a normal add and read still work. Disk full follows BookKeeper's
LedgerDirsManager: a bookie over its disk-usage threshold turns read-only, adds
are refused at once (E_READ_ONLY: the writer changes its ensemble), deleted
ledgers' space comes back and the bookie is writable again below the low mark.
"""
from __future__ import annotations

from tests.procs import restart_bookie_same_port

import asyncio
import os
import sqlite3
import time

import grpc
import pytest

from bookie.client import BookKeeper
from bookie.errors import BKException, BookieUnavailableError, DigestMismatchError
from broker.metadata import SqliteMetadataStore
from proto import bookie_pb2 as pb
from proto import bookie_pb2_grpc as pbg
from proto import metadata_pb2
from tests.procs import start_bookie

pytestmark = pytest.mark.timeout(180)

State = metadata_pb2.LedgerMetadata.State
KEY = b"the-key"
OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]




restart_same_port = restart_bookie_same_port


def start_refused(proc, extra_args=()) -> str:
    """Start the bookie on its data dir; it must refuse (exit status 3). Returns its stderr."""
    with pytest.raises(RuntimeError) as info:
        start_bookie(proc.data_dir, proc.journal_sync, ("--port", str(proc.port), *extra_args), tracker=proc.tracker)
    assert "exited with 3 before ready" in str(info.value), info.value
    return str(info.value)


# gRPC shares a subchannel per address in a process: after a bookie restart it may still be
# in reconnect backoff for a moment, so the helpers wait for the channel to be ready.


async def add_one(stub, ledger_id, entry_id, payload, key=KEY, crc=None) -> pb.AddEntryResult:
    call = stub.AddEntry(wait_for_ready=True, timeout=30)
    req = pb.AddEntryRequest(ledger_id=ledger_id, entry_id=entry_id, master_key=key, payload=payload,
                             last_add_confirmed=entry_id - 1)
    if crc is not None:
        req.crc32c = crc
    await call.write(pb.AddEntriesRequest(adds=[req]))
    await call.done_writing()
    [resp] = [r async for r in call]
    return resp.results[0]


async def read_one(stub, ledger_id, entry_id) -> pb.Entry:
    req = pb.ReadEntriesRequest(ledger_id=ledger_id, first_entry_id=entry_id, last_entry_id=entry_id)
    [resp] = [r async for r in stub.ReadEntries(req, wait_for_ready=True, timeout=30)]
    return resp.entries[0]


_serving_ids = iter(range(900_000, 1_000_000))


async def assert_serving(address: str) -> None:
    """A normal add and read still work on the bookie at ``address``."""
    async with grpc.aio.insecure_channel(address, options=OPTIONS) as channel:
        stub = pbg.BookieStub(channel)
        ledger = next(_serving_ids)
        r = await add_one(stub, ledger, 0, b"still serving")
        assert r.status == pb.EOK, r
        assert (await read_one(stub, ledger, 0)).payload == b"still serving"


async def retry_while_unavailable(make_call, timeout_s: float = 30.0):
    """``await make_call()`` until it does not raise BookieUnavailableError (a bookie that
    just came back may still be in gRPC's reconnect backoff for a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await make_call()
        except BookieUnavailableError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)


async def write_ledger(bk: BookKeeper, n: int, payload_of, ensemble=2, qw=2, qa=2):
    lh = await bk.create_ledger(ensemble, qw, qa)
    payloads = [payload_of(i) for i in range(n)]
    assert await asyncio.gather(*(lh.add_entry_nowait(p) for p in payloads)) == list(range(n))
    return lh, payloads


# --------------------------------------------------------------------- 1. DeleteLedger needs the master key


async def test_delete_ledger_with_a_wrong_key_deletes_nothing(bookie_factory, meta):
    bookies = [bookie_factory() for _ in range(2)]
    bk = BookKeeper(meta, [b.address for b in bookies])
    try:
        lh, payloads = await write_ledger(bk, 20, lambda i: b"message-%d" % i)
        for b in bookies:
            async with grpc.aio.insecure_channel(b.address) as channel:
                stub = pbg.BookieStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.DeleteLedger(pb.LedgerRequest(ledger_id=lh.ledger_id, master_key=b"not-the-key"))
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, info.value
                assert "master key" in info.value.details()
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.DeleteLedger(pb.LedgerRequest(ledger_id=lh.ledger_id))  # no key at all
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
        # every acknowledged entry is still on every bookie
        for b in bookies:
            assert await bk.connection(b.address).read_entries(lh.ledger_id, 0, 19) == payloads
        await lh.close()
        # the ledger's owner (it has the key in the ledger metadata) deletes it for real
        await bk.delete_ledger(lh.ledger_id)
        for b in bookies:
            async with grpc.aio.insecure_channel(b.address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await read_one(pbg.BookieStub(channel), lh.ledger_id, 0)
                assert info.value.code() == grpc.StatusCode.NOT_FOUND
            await assert_serving(b.address)
    finally:
        await bk.close()


# --------------------------------------------------------------------- 2. cookies: wiped / swapped data dirs


async def bookie_info(address: str) -> pb.BookieInfo:
    async with grpc.aio.insecure_channel(address) as channel:
        return await pbg.BookieStub(channel).GetBookieInfo(pb.BookieInfoRequest(), wait_for_ready=True, timeout=30)


async def test_restart_keeps_the_cookie_and_the_instance_id(bookie_factory):
    b = bookie_factory()
    first = await bookie_info(b.address)
    assert len(first.instance_id) == 32 and first.cookie_address == b.address
    assert (b.data_dir / "COOKIE").exists()
    b.terminate()
    b = restart_same_port(b)
    assert (await bookie_info(b.address)).instance_id == first.instance_id
    b.kill()  # kill -9: the WAL stays; the next start still matches
    b = restart_same_port(b)
    assert (await bookie_info(b.address)).instance_id == first.instance_id
    await assert_serving(b.address)


@pytest.mark.parametrize("damage", ["db deleted", "cookie deleted", "db of another bookie", "db truncated",
                                    "db emptied", "db not sqlite"])
async def test_a_bookie_refuses_a_damaged_data_dir(bookie_factory, meta, damage):
    bookies = [bookie_factory() for _ in range(2)]
    bk = BookKeeper(meta, [b.address for b in bookies])
    try:
        lh, payloads = await write_ledger(bk, 200, lambda i: os.urandom(2000))
    finally:
        await bk.close()
    victim, other = bookies
    victim.terminate()
    db = victim.data_dir / "ledgers.db"
    if damage == "db deleted":
        db.unlink()
    elif damage == "cookie deleted":
        (victim.data_dir / "COOKIE").unlink()
    elif damage == "db of another bookie":
        other.terminate()
        db.write_bytes((other.data_dir / "ledgers.db").read_bytes())
    elif damage == "db truncated":
        size = db.stat().st_size
        with open(db, "r+b") as f:
            f.truncate(size // 2)
    elif damage == "db emptied":
        db.write_bytes(b"")
    else:
        db.write_bytes(b"this is not a database" * 100)
    stderr = start_refused(victim)
    assert "--format" in stderr, stderr
    assert not db.exists() or damage != "db deleted"  # the refusal created nothing in its place
    # deliberate re-initialization: --format wipes the dir and stamps a new cookie
    fresh = restart_same_port(victim, ("--format",))
    await assert_serving(fresh.address)
    async with grpc.aio.insecure_channel(fresh.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await read_one(pbg.BookieStub(channel), lh.ledger_id, 0)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    fresh.terminate()
    assert (await bookie_info(restart_same_port(fresh).address)).instance_id  # normal starts work again


async def test_a_wiped_bookie_does_not_make_recovery_drop_acknowledged_entries(bookie_factory, meta):
    """Both bookies of an E=Qw=Qa=2 ledger stop; one comes back with its database deleted
    while the other stays down. Before cookies it came back empty and ledger recovery
    (one "no such entry" is enough with Qw=Qa) closed the ledger EMPTY: 20 acknowledged
    entries gone. Now it refuses to start, the recovery cannot decide and waits, and once
    the intact bookie is back it recovers all 20."""
    a, b = bookie_factory(), bookie_factory()
    writer = BookKeeper(meta, [a.address, b.address])
    try:
        lh, payloads = await write_ledger(writer, 20, lambda i: b"acked-%d" % i)
    finally:
        await writer.close()  # the writer dies: the ledger stays OPEN, recovery decides its end
    a.kill()
    b.kill()
    (a.data_dir / "ledgers.db").unlink()
    for suffix in ("-wal", "-shm"):
        (a.data_dir / f"ledgers.db{suffix}").unlink(missing_ok=True)
    start_refused(a)
    recoverer = BookKeeper(meta, [a.address, b.address], rpc_timeout_s=2)
    try:
        with pytest.raises(BookieUnavailableError):
            await asyncio.wait_for(recoverer.open_ledger(lh.ledger_id, recovery=True), 60)
        md, _ = await recoverer.get_metadata(lh.ledger_id)
        assert md.state == State.IN_RECOVERY
    finally:
        await recoverer.close()
    b = restart_same_port(b)
    a = restart_same_port(a, ("--format",))  # the operator re-initializes the wiped bookie
    later = BookKeeper(meta, [a.address, b.address])
    try:
        ro = await retry_while_unavailable(lambda: later.open_ledger(lh.ledger_id, recovery=True))
        assert ro.last_add_confirmed == 19
        assert await ro.read_entries(0, 19) == payloads
    finally:
        await later.close()


async def test_the_client_distrusts_no_such_entry_from_a_bookie_that_changed_instance(bookie_factory, meta):
    a, b = bookie_factory(), bookie_factory()
    bk = BookKeeper(meta, [a.address, b.address])
    try:
        lh, payloads = await write_ledger(bk, 5, lambda i: b"e%d" % i)
        first = (await bk.connection(a.address).get_bookie_info()).instance_id
        a.terminate()
        a = restart_same_port(a, ("--format",))  # wiped and re-initialized under the same address
        info = await retry_while_unavailable(bk.connection(a.address).get_bookie_info)
        assert info.instance_id != first
        assert bk.connection(a.address).instance_changed
        with pytest.raises(BookieUnavailableError, match="not trusted"):
            await bk.connection(a.address).read_entries(lh.ledger_id, 0, 0)
        assert await lh.read_entries(0, 4) == payloads  # the other replica serves the reads
    finally:
        await bk.close()


# --------------------------------------------------------------------- 3. digests on read


def flip_bit_in_file(path, marker: bytes) -> None:
    """Flip one bit of the byte after each occurrence of ``marker`` in the file (SQLite may
    keep a stale copy of a cell in a page's unused space: flip that one too)."""
    data = bytearray(path.read_bytes())
    assert marker in data, f"marker {marker!r} not in {path}"
    pos = data.find(marker)
    while pos >= 0:
        data[pos + len(marker)] ^= 0x10
        pos = data.find(marker, pos + 1)
    path.write_bytes(bytes(data))


def payload_of(i: int) -> bytes:
    # Not Pulsar's headersAndPayload (like a cursor ledger's PositionInfo); some even start
    # with Pulsar's CRC32C magic 0x0e01 without a valid checksum: none may be rejected.
    head = b"\x0e\x01" if i % 3 == 0 else b"\x08\x01"
    return head + b"<entry-%03d>" % i + os.urandom(300)


async def test_a_flipped_bit_on_one_replica_is_detected_and_read_from_the_other(bookie_factory, meta):
    a, b = bookie_factory(), bookie_factory()
    bk = BookKeeper(meta, [a.address, b.address])
    try:
        lh, payloads = await write_ledger(bk, 100, payload_of)
        await lh.close()
    finally:
        await bk.close()
    a.terminate()
    b.terminate()  # clean stops: every entry is in the main database file (WAL checkpointed)
    flip_bit_in_file(a.data_dir / "ledgers.db", b"<entry-050>")
    flip_bit_in_file(a.data_dir / "ledgers.db", b"<entry-060>")
    flip_bit_in_file(b.data_dir / "ledgers.db", b"<entry-060>")  # entry 60: both replicas corrupt
    a, b = restart_same_port(a), restart_same_port(b)
    reader = BookKeeper(meta, [a.address, b.address])
    try:
        for x in (a, b):  # both reachable before counting (gRPC reconnect backoff after the restart)
            conn = reader.connection(x.address)
            await retry_while_unavailable(lambda: conn.read_entries(lh.ledger_id, 99, 99))
        ro = await reader.open_ledger(lh.ledger_id)
        for _ in range(4):  # reads rotate over the ensemble: each bookie is asked first in turn
            assert await ro.read_entries(0, 59) == payloads[:60]
            assert await ro.read_entries(61, 99) == payloads[61:]
            assert await ro.read_entries(50, 50) == [payloads[50]]
        with pytest.raises(DigestMismatchError, match="50 is corrupt"):
            await reader.connection(a.address).read_entries(lh.ledger_id, 45, 55)
        assert await reader.connection(b.address).read_entries(lh.ledger_id, 45, 55) == payloads[45:56]
        # no intact replica: an error, never wrong bytes
        with pytest.raises(BKException):
            await ro.read_entries(60, 60)
        assert reader.corrupt_replicas[a.address] >= 5 and reader.corrupt_replicas[b.address] >= 1
    finally:
        await reader.close()
    await assert_serving(a.address)
    await assert_serving(b.address)


# --------------------------------------------------------------------- 4. disk full -> read-only


async def test_over_the_disk_usage_threshold_adds_are_refused_at_once(bookie_factory):
    """Filesystem usage above disk_usage_threshold (a threshold below what the test disk
    uses): read-only from the start; adds refused at once, reads/fences/deletes work."""
    b = bookie_factory(extra_args=("--disk-usage-threshold", "0.000001", "--disk-usage-lwm-threshold",
                                   "0.0000005"))
    info = await bookie_info(b.address)
    assert info.read_only and "disk_usage_threshold" in info.read_only_reason
    async with grpc.aio.insecure_channel(b.address) as channel:
        stub = pbg.BookieStub(channel)
        t0 = time.monotonic()
        r = await add_one(stub, 1, 0, b"x")
        assert r.status == pb.E_READ_ONLY and "read-only" in r.message, r
        assert time.monotonic() - t0 < 2
        # recovery adds and fences still work (BookKeeper: high-priority writes)
        await stub.Fence(pb.LedgerRequest(ledger_id=2, master_key=KEY))
        call = stub.AddEntry()
        await call.write(pb.AddEntriesRequest(adds=[pb.AddEntryRequest(
            ledger_id=2, entry_id=0, master_key=KEY, payload=b"recovered", last_add_confirmed=-1, recovery=True)]))
        await call.done_writing()
        [resp] = [m async for m in call]
        assert resp.results[0].status == pb.EOK
        assert (await read_one(stub, 2, 0)).payload == b"recovered"
        await stub.DeleteLedger(pb.LedgerRequest(ledger_id=2, master_key=KEY))


def db_pages(path) -> tuple[int, int]:
    """(page_count, freelist_count) of a live bookie's database (read-only connection)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("PRAGMA page_count").fetchone()[0], db.execute("PRAGMA freelist_count").fetchone()[0]
    finally:
        db.close()


async def test_a_full_bookie_turns_read_only_the_writer_changes_ensemble_and_deletes_free_space(
        bookie_factory, meta):
    """A bookie whose database reaches max_db_size_bytes (a small disk) refuses adds with
    E_READ_ONLY at once; the writer replaces it (no add waits for a timeout); deleting
    the ledgers frees its space (incremental vacuum) and makes it writable again."""
    max_db = 8 * 1024 * 1024
    full = bookie_factory(extra_args=("--max-db-size-bytes", str(max_db), "--disk-check-interval-s", "0.1"))
    others = [bookie_factory() for _ in range(2)]
    bk = BookKeeper(meta, [full.address] + [o.address for o in others], add_entry_timeout_s=60)
    ledgers = []
    try:
        lh = None
        while lh is None or full.address not in lh.ensemble:
            lh = await bk.create_ledger(2, 2, 2)
            ledgers.append(lh)
        payload = os.urandom(8000)
        t0 = time.monotonic()
        n = 0
        while full.address in lh.ensemble or n < 1200:  # ~9.6 MB: more than the full bookie holds
            assert n < 3000, "the full bookie was never replaced"
            ids = await asyncio.wait_for(asyncio.gather(*(lh.add_entry_nowait(payload) for _ in range(40))), 30)
            assert ids == list(range(n, n + 40))
            n += 40
        elapsed = time.monotonic() - t0
        assert elapsed < 30, f"adds took {elapsed:.1f} s: the full bookie was not refused at once"
        assert lh.ensemble_changes == 1
        info = await bookie_info(full.address)
        assert info.read_only and info.disk_usage >= 0.9, info
        async with grpc.aio.insecure_channel(full.address) as channel:
            r = await add_one(pbg.BookieStub(channel), 777_777, 0, b"x")
            assert r.status == pb.E_READ_ONLY and "read-only" in r.message, r
        assert await lh.read_entries(0, n - 1) == [payload] * n
        await lh.close()
        pages_full, _ = db_pages(full.data_dir / "ledgers.db")
        assert pages_full * 16384 > max_db * 0.9
        # deleting the topic's ledgers frees the space: writable again below the low mark
        for h in ledgers:
            if h.writable:
                await h.close()
            await bk.delete_ledger(h.ledger_id)
        deadline = time.monotonic() + 15
        while (await bookie_info(full.address)).read_only:
            assert time.monotonic() < deadline, "the bookie stayed read-only after its ledgers were deleted"
            await asyncio.sleep(0.1)
        await assert_serving(full.address)
        deadline = time.monotonic() + 15
        while True:  # the freed pages go back to the filesystem (incremental vacuum)
            pages, free = db_pages(full.data_dir / "ledgers.db")
            if free == 0 and pages < pages_full // 4 and (full.data_dir / "ledgers.db").stat().st_size < max_db // 4:
                break
            assert time.monotonic() < deadline, (pages_full, pages, free)
            await asyncio.sleep(0.1)
        full.terminate()
        assert (full.data_dir / "ledgers.db").stat().st_size < max_db // 4
    finally:
        await bk.close()


# --------------------------------------------------------------------- 14a. garbage AddEntry frame


async def test_a_garbage_add_frame_gets_invalid_argument_after_the_valid_adds_before_it(bookie_factory):
    b = bookie_factory()
    async with grpc.aio.insecure_channel(b.address) as channel:
        call = channel.stream_stream("/minipulsar.bookie.Bookie/AddEntry", request_serializer=None,
                                     response_deserializer=pb.AddEntriesResponse.FromString)()
        good = pb.AddEntriesRequest(adds=[pb.AddEntryRequest(ledger_id=5, entry_id=0, master_key=KEY,
                                                             payload=b"ok", last_add_confirmed=-1)])
        await call.write(good.SerializeToString())
        await call.write(b"\xff\xff\xff\xff not an AddEntriesRequest")
        await call.done_writing()
        responses = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for r in call:
                responses.append(r)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
        assert "AddEntriesRequest" in info.value.details()
        assert [(r.entry_id, r.status) for m in responses for r in m.results] == [(0, pb.EOK)]
        assert (await read_one(pbg.BookieStub(channel), 5, 0)).payload == b"ok"
    await assert_serving(b.address)
