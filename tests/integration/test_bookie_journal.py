"""The bookie's journal with real ``python -m bookie`` processes killed with SIGKILL
(BookKeeper's Journal + SyncThread/checkpoint + replay at start, see bookie.journal_file
and bookie.checkpoint).

* kill -9 during a stream of adds, with tiny journal files and a short flush interval (so
  kills land around checkpoints and journal rolls): every acknowledged add is readable
  after the restart, and what a restarted bookie serves is still there after another
  kill -9 and restart (replay is idempotent);
* the journal is what makes adds durable: entries lost from ledger storage (rows deleted
  from SQLite while the bookie was down: unsynced pages lost to a power failure) come
  back from the journal at start; fences and deletes replay in order with the adds;
* a torn journal tail (cut or garbled last record) ends replay of that file with a log
  line, never a crash;
* the journal may sit in its own directory; a full journal disk turns the bookie
  read-only (E_READ_ONLY, BookieInfo.read_only).
"""
from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
from pathlib import Path

import grpc
import pytest

from bookie import journal_file
from bookie import journal_format as jf
from proto import bookie_pb2 as pb
from proto import bookie_pb2_grpc as pbg

pytestmark = pytest.mark.timeout(180)

KEY = b"journal-key"
TINY = ("--journal-max-size-mb", "1", "--flush-interval-ms", "150", "--journal-pre-alloc-size-mb", "1")
NO_CHECKPOINT = ("--flush-interval-ms", "600000",)


def payload(ledger_id: int, entry_id: int, size: int = 300) -> bytes:
    unit = f"{ledger_id}:{entry_id};".encode()
    return (unit * (size // len(unit) + 1))[:size]


async def add(stub, ledger_id: int, entry_ids, size: int = 300) -> list:
    call = stub.AddEntry()
    await call.write(pb.AddEntriesRequest(adds=[
        pb.AddEntryRequest(ledger_id=ledger_id, entry_id=e, master_key=KEY, payload=payload(ledger_id, e, size),
                           last_add_confirmed=e - 1) for e in entry_ids]))
    await call.done_writing()
    return [r for resp in [x async for x in call] for r in resp.results]


async def read(stub, ledger_id: int, first: int, last: int) -> dict[int, bytes]:
    req = pb.ReadEntriesRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last)
    return {e.entry_id: e.payload async for resp in stub.ReadEntries(req) for e in resp.entries}


async def stored(stub, ledger_id: int) -> dict[int, bytes]:
    """Every entry of the ledger the bookie serves: {entry id: payload} ({} if unknown)."""
    try:
        lac = await stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=ledger_id, master_key=KEY))
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
        return {}
    if lac.last_entry_id < 0:
        return {}
    return await read(stub, ledger_id, 0, lac.last_entry_id)


def channel(proc):
    return grpc.aio.insecure_channel(proc.address)


async def test_kill9_during_adds_around_checkpoints_and_rolls_keeps_every_acknowledged_add(bookie_factory):
    proc = bookie_factory(extra_args=TINY)
    ledgers = [11, 12, 13]
    acked: dict[int, list] = {lid: [] for lid in ledgers}
    for round_ in range(3):
        async with channel(proc) as ch:
            stub = pbg.BookieStub(ch)
            stop = asyncio.Event()
            base = {lid: len(acked[lid]) for lid in ledgers}
            # continue each ledger where it is (a restarted bookie keeps what it had)
            tasks = []
            for lid in ledgers:
                have = await stored(stub, lid)
                assert set(acked[lid]) <= set(have), f"round {round_}: acknowledged adds of {lid} lost"
                acked[lid] = sorted(have)   # stored but unacknowledged adds are fine, if they stay
                tasks.append(asyncio.create_task(_writer_from(stub, lid, max(have, default=-1) + 1, acked[lid],
                                                              stop)))
            await asyncio.sleep(1.0 + 0.37 * round_)   # kill at different points of the checkpoint cycle
            proc.kill()
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert all(len(acked[lid]) > base[lid] for lid in ledgers), "no adds acknowledged in a round"
        proc = proc.restart()
    async with channel(proc) as ch:
        stub = pbg.BookieStub(ch)
        first = {lid: await stored(stub, lid) for lid in ledgers}
    for lid in ledgers:
        assert set(acked[lid]) <= set(first[lid])
        assert all(first[lid][e] == payload(lid, e) for e in first[lid])
    # restart twice more (kill -9 right after replay, then clean): nothing appears or disappears
    proc.kill()
    proc = proc.restart()
    proc.kill()
    proc = proc.restart()
    async with channel(proc) as ch:
        stub = pbg.BookieStub(ch)
        again = {lid: await stored(stub, lid) for lid in ledgers}
    assert again == first
    files = journal_file.list_journal_files(str(proc.data_dir / "journal"))
    assert 1 <= len(files) <= 3, f"journal files behind the mark were not deleted: {files}"


async def _writer_from(stub, ledger_id: int, start: int, acked: list, stop: asyncio.Event) -> None:
    e = start
    while not stop.is_set():
        n = 1 + e % 5
        try:
            results = await add(stub, ledger_id, range(e, e + n))
        except grpc.aio.AioRpcError:
            return
        for r in results:
            assert r.status == pb.EOK, r
            acked.append(r.entry_id)
        e += n


def _lose_storage(data_dir: Path) -> None:
    """What a power failure may do to unsynced SQLite pages: the entries and ledger rows
    are gone (the bookie is down)."""
    db = sqlite3.connect(data_dir / "ledgers.db")
    db.execute("DELETE FROM entries")
    db.execute("DELETE FROM ledgers")
    db.commit()
    db.close()


async def test_entries_lost_from_storage_come_back_from_the_journal_with_fences_and_deletes(bookie_factory):
    proc = bookie_factory(extra_args=NO_CHECKPOINT)
    async with channel(proc) as ch:
        stub = pbg.BookieStub(ch)
        assert all(r.status == pb.EOK for r in await add(stub, 1, range(50)))
        assert all(r.status == pb.EOK for r in await add(stub, 2, range(10)))
        assert all(r.status == pb.EOK for r in await add(stub, 3, range(5)))
        await stub.Fence(pb.LedgerRequest(ledger_id=2, master_key=KEY))
        await stub.DeleteLedger(pb.LedgerRequest(ledger_id=3, master_key=KEY))
    proc.kill()
    _lose_storage(proc.data_dir)
    proc = proc.restart()
    async with channel(proc) as ch:
        stub = pbg.BookieStub(ch)
        assert await stored(stub, 1) == {e: payload(1, e) for e in range(50)}
        assert await stored(stub, 2) == {e: payload(2, e) for e in range(10)}
        assert await stored(stub, 3) == {}
        fenced = await add(stub, 2, [10])
        assert fenced[0].status == pb.E_LEDGER_FENCED, "the fence was not replayed"
    assert "journal replay from mark" in proc.stderr_tail(20000)


def _last_journal_file(journal_dir: Path) -> Path:
    return journal_dir / jf.file_name(journal_file.list_journal_files(str(journal_dir))[-1])


def _data_end(path: Path) -> int:
    buf = path.read_bytes()
    result: list = []
    for _ in jf.scan_records(buf, jf.parse_header(buf).length, result):
        pass
    return result[0].end


@pytest.mark.parametrize("damage", ["cut", "garble"])
async def test_a_torn_journal_tail_ends_replay_with_a_log_line(bookie_factory, damage):
    proc = bookie_factory(extra_args=NO_CHECKPOINT)
    async with channel(proc) as ch:
        stub = pbg.BookieStub(ch)
        for e in range(20):
            assert (await add(stub, 5, [e]))[0].status == pb.EOK
    proc.kill()
    path = _last_journal_file(proc.data_dir / "journal")
    end = _data_end(path)
    last_len = len(jf.encode_add(5, 19, payload(5, 19), None))
    with open(path, "r+b") as f:
        if damage == "cut":   # the last write was cut half-way: its tail reads as zeros
            f.seek(end - last_len // 2)
            f.write(bytes(last_len // 2))
        else:                 # a flipped byte in the last record
            f.seek(end - 3)
            b = f.read(1)
            f.seek(end - 3)
            f.write(bytes([b[0] ^ 0xFF]))
    _lose_storage(proc.data_dir)
    proc = proc.restart()
    async with channel(proc) as ch:
        stub = pbg.BookieStub(ch)
        got = await stored(stub, 5)
    assert got == {e: payload(5, e) for e in range(19)}, "records before the torn one must replay"
    assert "tail is torn" in proc.stderr_tail(20000)


async def test_journal_in_its_own_directory(bookie_factory, tmp_path):
    jdir = tmp_path / "separate-journal"
    proc = bookie_factory(extra_args=NO_CHECKPOINT + ("--journal-directory", str(jdir)))
    async with channel(proc) as ch:
        stub = pbg.BookieStub(ch)
        assert all(r.status == pb.EOK for r in await add(stub, 8, range(30)))
    proc.kill()
    assert journal_file.list_journal_files(str(jdir)), "no journal file in --journal-directory"
    assert not journal_file.list_journal_files(str(proc.data_dir / "journal"))
    _lose_storage(proc.data_dir)
    proc = proc.restart()
    async with channel(proc) as ch:
        stub = pbg.BookieStub(ch)
        assert await stored(stub, 8) == {e: payload(8, e) for e in range(30)}


async def test_full_journal_disk_turns_the_bookie_read_only_and_writable_again(bookie_factory, tmp_path):
    """The journal's own disk (a 4 MiB tmpfs) is filled by another file: adds get E_READ_ONLY,
    the bookie reports read-only (the disk monitor measures the journal's filesystem too);
    with the space back it is writable again. Every acknowledged add stays readable."""
    jdir = tmp_path / "small-journal-disk"
    jdir.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(jdir)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")
    try:
        proc = bookie_factory(extra_args=("--journal-directory", str(jdir), "--disk-check-interval-s", "0.2"))
        async with channel(proc) as ch:
            stub = pbg.BookieStub(ch)
            assert (await add(stub, 9, [0]))[0].status == pb.EOK
            filler = jdir / "filler"
            free = os.statvfs(jdir).f_bavail * os.statvfs(jdir).f_frsize
            with open(filler, "wb") as f:           # leave about 256 KiB
                f.write(bytes(max(0, free - 256 * 1024)))
            statuses = [pb.EOK]
            for i in range(1, 200):   # 200 x 16 KiB: far more than what is left
                res = await add(stub, 9, [i], size=16 * 1024)
                statuses.append(res[0].status)
                if res[0].status != pb.EOK:
                    break
            assert statuses[-1] == pb.E_READ_ONLY, statuses[-5:]
            acked = [i for i, st in enumerate(statuses) if st == pb.EOK]
            info = await stub.GetBookieInfo(pb.BookieInfoRequest())
            assert info.read_only, info
            got = await read(stub, 9, 0, acked[-1])
            assert sorted(got) == acked
            filler.unlink()
            for _ in range(50):
                info = await stub.GetBookieInfo(pb.BookieInfoRequest())
                if not info.read_only:
                    break
                await asyncio.sleep(0.2)
            assert not info.read_only, info
            assert (await add(stub, 9, [len(statuses)], size=1024))[0].status == pb.EOK
        proc.kill()
    finally:
        subprocess.run(["umount", "-l", str(jdir)], capture_output=True)


async def test_group_wait_and_buffered_threshold_shape_the_groups(tmp_path):
    """journal_max_group_wait_ms: adds arriving within the wait after a group form ONE next
    group (one journal write), written no sooner than the wait; journal_buffered_writes_threshold:
    enough queued bytes are written at once. (LedgerStorage in this process, real files.)"""
    from bookie.storage import LedgerStorage

    s = LedgerStorage(str(tmp_path / "d"), journal_max_group_wait_ms=80, journal_buffered_writes_threshold=10_000)
    await s.open("127.0.0.1:1")
    loop = asyncio.get_running_loop()
    try:
        assert await s.add_entries([(1, 0, KEY, b"x" * 100, -1, False)]) == {}   # a lone add: at once
        t0, appends0 = loop.time(), s._writer.syncs
        futs = [s.add_entries([(1, e, KEY, b"x" * 100, e - 1, False)]) for e in range(1, 11)]
        assert await asyncio.gather(*futs) == [{}] * 10
        assert loop.time() - t0 >= 0.06, "the group did not wait journal_max_group_wait_ms"
        assert s._writer.syncs - appends0 == 1, "adds within the wait were not one group"
        await asyncio.sleep(0.01)
        t0 = loop.time()
        futs = [s.add_entries([(2, e, KEY, b"y" * 2000, e - 1, False)]) for e in range(6)]   # 12 KB >= 10 KB
        assert await asyncio.gather(*futs) == [{}] * 6
        assert loop.time() - t0 < 0.06, "the buffered-bytes threshold did not start the group at once"
    finally:
        await s.close()
