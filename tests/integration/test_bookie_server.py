"""Integration tests of the bookie server against real ``python -m bookie`` processes."""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from pathlib import Path

import grpc
import pytest

from proto import bookie_pb2 as pb
from proto import bookie_pb2_grpc as pbg
from tests.procs import BookieProcess, ProcessTracker, start_bookie

pytestmark = pytest.mark.timeout(60)

MAX_ENTRY = 64 * 1024  # the shared bookie runs with --max-entry-size-bytes 65536
KEY = b"master-key"
OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
_ledger_ids = itertools.count(100)


def new_ledger() -> int:
    return next(_ledger_ids)


def payload_of(ledger_id: int, entry_id: int, size: int = 1024) -> bytes:
    unit = f"{ledger_id}:{entry_id};".encode()
    return (unit * (size // len(unit) + 1))[:size]


def add_req(ledger_id, entry_id, payload=None, key=KEY, lac=-1, recovery=False) -> pb.AddEntryRequest:
    if payload is None:
        payload = payload_of(ledger_id, entry_id)
    return pb.AddEntryRequest(ledger_id=ledger_id, entry_id=entry_id, master_key=key, payload=payload,
                              last_add_confirmed=lac, recovery=recovery)


@pytest.fixture(scope="module")
def shared_bookie(tmp_path_factory):
    """One bookie for the tests that only need fresh ledger ids (saves process start-ups)."""
    tracker = ProcessTracker()
    proc = start_bookie(tmp_path_factory.mktemp("shared-bookie"),
                        extra_args=("--max-entry-size-bytes", str(MAX_ENTRY)), tracker=tracker)
    yield proc
    tracker.kill_all()


@pytest.fixture
async def stub(shared_bookie):
    async with grpc.aio.insecure_channel(shared_bookie.address, options=OPTIONS) as channel:
        yield pbg.BookieStub(channel)


async def add_all(stub, adds) -> list[pb.AddEntryResult]:
    """Send one request message with ``adds`` on a new stream; return its results."""
    call = stub.AddEntry()
    await call.write(pb.AddEntriesRequest(adds=adds))
    await call.done_writing()
    responses = [r async for r in call]
    assert len(responses) == 1
    return list(responses[0].results)


async def read_all(stub, ledger_id, first, last) -> list[pb.ReadEntriesResponse]:
    req = pb.ReadEntriesRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last)
    return [r async for r in stub.ReadEntries(req)]


async def assert_rpc_error(coro_or_gen, code: grpc.StatusCode, text: str):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if hasattr(coro_or_gen, "__aiter__"):
            async for _ in coro_or_gen:
                pass
        else:
            await coro_or_gen
    assert info.value.code() == code, info.value
    assert text in info.value.details(), info.value.details()


async def assert_serving(stub):
    """A valid add + read still works (the server survived the previous bad input)."""
    ledger = new_ledger()
    results = await add_all(stub, [add_req(ledger, 0)])
    assert results[0].status == pb.EOK
    [resp] = await read_all(stub, ledger, 0, 0)
    assert resp.entries[0].payload == payload_of(ledger, 0)


# ---------------------------------------------------------------------- happy path


async def test_pipelined_adds_and_streamed_reads(stub):
    ledger_a, ledger_b = new_ledger(), new_ledger()
    n_msgs, per_msg = 60, 50
    call = stub.AddEntry()

    async def writer():
        for m in range(n_msgs):  # all written without waiting for any response
            adds = []
            for i in range(per_msg):
                e = m * per_msg + i
                adds.append(add_req(ledger_a, e, lac=e - 1))
                if i % 10 == 0:
                    adds.append(add_req(ledger_b, e // 10, lac=e // 10 - 1))
            await call.write(pb.AddEntriesRequest(adds=adds))
        await call.done_writing()

    w = asyncio.create_task(writer())
    responses = [r async for r in call]
    await w
    assert len(responses) == n_msgs  # one response message per request message
    acked = {(r.ledger_id, r.entry_id) for resp in responses for r in resp.results if r.status == pb.EOK}
    assert all(r.status == pb.EOK for resp in responses for r in resp.results)
    total_a = n_msgs * per_msg
    assert acked == {(ledger_a, e) for e in range(total_a)} | {(ledger_b, e) for e in range(total_a // 10)}

    msgs = await read_all(stub, ledger_a, 0, total_a - 1)
    assert len(msgs) >= 3  # 3 MB of entries -> several ~1 MB messages
    assert all(len(m.entries) > 1 for m in msgs[:-1])
    assert all(sum(len(e.payload) for e in m.entries) <= 1024 * 1024 for m in msgs)
    entries = [e for m in msgs for e in m.entries]
    assert [e.entry_id for e in entries] == list(range(total_a))
    assert all(e.ledger_id == ledger_a and e.payload == payload_of(ledger_a, e.entry_id) for e in entries)

    sub = [e for m in await read_all(stub, ledger_b, 10, 20) for e in m.entries]
    assert [(e.entry_id, e.payload) for e in sub] == [(e, payload_of(ledger_b, e)) for e in range(10, 21)]


async def test_concurrent_writers_of_same_entries(stub):
    """Retries racing on several streams: same bytes are all EOK, different bytes exactly one wins."""
    same, racy = new_ledger(), new_ledger()

    async def writer(tag: bytes):
        call = stub.AddEntry()
        for m in range(10):
            await call.write(pb.AddEntriesRequest(adds=[
                *(add_req(same, m * 10 + i) for i in range(10)),
                *(add_req(racy, m * 10 + i, payload=tag) for i in range(10)),
            ]))
        await call.done_writing()
        return [r async for resp in call for r in resp.results]

    outcomes = await asyncio.gather(*(writer(b"writer-%d" % w) for w in range(4)))
    by_entry: dict[tuple[int, int], list[int]] = {}
    for results in outcomes:
        for r in results:
            by_entry.setdefault((r.ledger_id, r.entry_id), []).append(r.status)
    for e in range(100):
        assert by_entry[(same, e)] == [pb.EOK] * 4
        assert sorted(by_entry[(racy, e)]) == [pb.EOK] + [pb.E_DUPLICATE_ENTRY] * 3
    entries = [e for m in await read_all(stub, racy, 0, 99) for e in m.entries]
    assert len(entries) == 100 and all(e.payload.startswith(b"writer-") for e in entries)


async def test_lac_tracking(stub):
    ledger = new_ledger()
    # striped ensemble: this bookie stores entries 0, 2, 4 only; the writer's LAC rides along
    for entry_id, lac in [(0, -1), (2, 1), (4, 3)]:
        assert (await add_all(stub, [add_req(ledger, entry_id, lac=lac)]))[0].status == pb.EOK
    resp = await stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=ledger))
    assert (resp.last_add_confirmed, resp.last_entry_id) == (3, 4)
    # a lower piggy-backed LAC (e.g. a late retry) never moves it back
    assert (await add_all(stub, [add_req(ledger, 1, lac=0)]))[0].status == pb.EOK
    resp = await stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=ledger))
    assert (resp.last_add_confirmed, resp.last_entry_id) == (3, 4)
    # an idempotent re-add still carries a newer LAC
    assert (await add_all(stub, [add_req(ledger, 4, lac=4)]))[0].status == pb.EOK
    resp = await stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=ledger))
    assert (resp.last_add_confirmed, resp.last_entry_id) == (4, 4)


async def test_fencing_cuts_off_writer_but_not_recovery(stub):
    ledger = new_ledger()
    results = await add_all(stub, [add_req(ledger, e, lac=e - 1) for e in range(5)])
    assert [r.status for r in results] == [pb.EOK] * 5

    resp = await stub.Fence(pb.LedgerRequest(ledger_id=ledger, master_key=KEY))
    assert (resp.last_add_confirmed, resp.last_entry_id) == (3, 4)

    [r] = await add_all(stub, [add_req(ledger, 5, lac=4)])
    assert r.status == pb.E_LEDGER_FENCED and "fenced" in r.message
    [r] = await add_all(stub, [add_req(ledger, 5, key=b"other", recovery=True)])
    assert r.status == pb.E_UNAUTHORIZED_ACCESS and "master key" in r.message
    [r] = await add_all(stub, [add_req(ledger, 5, lac=4, recovery=True)])
    assert r.status == pb.EOK

    resp = await stub.Fence(pb.LedgerRequest(ledger_id=ledger, master_key=KEY))  # idempotent
    assert (resp.last_add_confirmed, resp.last_entry_id) == (4, 5)
    entries = [e for m in await read_all(stub, ledger, 0, 5) for e in m.entries]
    assert [e.entry_id for e in entries] == list(range(6))

    # fencing a ledger this bookie never saw creates a fenced record
    unseen = new_ledger()
    resp = await stub.Fence(pb.LedgerRequest(ledger_id=unseen, master_key=KEY))
    assert (resp.last_add_confirmed, resp.last_entry_id) == (-1, -1)
    [r] = await add_all(stub, [add_req(unseen, 0)])
    assert r.status == pb.E_LEDGER_FENCED
    [r] = await add_all(stub, [add_req(unseen, 0, recovery=True)])
    assert r.status == pb.EOK


async def test_delete_ledger(stub):
    ledger = new_ledger()
    await add_all(stub, [add_req(ledger, e) for e in range(3)])
    await stub.DeleteLedger(pb.LedgerRequest(ledger_id=ledger, master_key=KEY))  # the ledger's key
    await assert_rpc_error(read_all(stub, ledger, 0, 0), grpc.StatusCode.NOT_FOUND, f"ledger {ledger}")
    await assert_rpc_error(stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=ledger)),
                           grpc.StatusCode.NOT_FOUND, "not found")
    await stub.DeleteLedger(pb.LedgerRequest(ledger_id=ledger, master_key=KEY))  # idempotent
    await stub.DeleteLedger(pb.LedgerRequest(ledger_id=new_ledger(), master_key=KEY))  # unknown: OK
    # the id is free again: a new writer with another key may create it
    [r] = await add_all(stub, [add_req(ledger, 0, payload=b"new", key=b"new-key")])
    assert r.status == pb.EOK
    [m] = await read_all(stub, ledger, 0, 0)
    assert m.entries[0].payload == b"new"


# ---------------------------------------------------------------------- bad input


async def test_bad_adds_get_specific_status_and_do_not_block_valid_ones(stub):
    ledger = new_ledger()
    assert (await add_all(stub, [add_req(ledger, 0)]))[0].status == pb.EOK
    cases = [
        (add_req(ledger, 1), pb.EOK, ""),
        (add_req(-1, 0), pb.E_INVALID_REQUEST, ">= 0"),
        (add_req(ledger, -5), pb.E_INVALID_REQUEST, ">= 0"),
        (add_req(ledger, 2, key=b""), pb.E_INVALID_REQUEST, "empty master_key"),
        (add_req(ledger, 2, lac=-7), pb.E_INVALID_REQUEST, "last_add_confirmed"),
        (add_req(ledger, 2, payload=b"x" * (MAX_ENTRY + 1)), pb.E_ENTRY_TOO_LARGE, "max_entry_size_bytes"),
        (add_req(ledger, 2, key=b"intruder"), pb.E_UNAUTHORIZED_ACCESS, "master key"),
        (add_req(ledger, 0, payload=b"different"), pb.E_DUPLICATE_ENTRY, "different content"),
        (add_req(ledger, 0), pb.EOK, ""),  # same bytes again: idempotent
        (add_req(ledger, 1, payload=b"changed"), pb.E_DUPLICATE_ENTRY, "different content"),  # same message
        (add_req(ledger, 2, payload=b"x" * MAX_ENTRY), pb.EOK, ""),  # exactly at the limit
    ]
    results = await add_all(stub, [c[0] for c in cases])
    assert len(results) == len(cases)
    for (req, status, text), r in zip(cases, results):
        assert (r.ledger_id, r.entry_id) == (req.ledger_id, req.entry_id)
        assert r.status == status, (req.entry_id, r)
        assert text in r.message
    entries = [e for m in await read_all(stub, ledger, 0, 2) for e in m.entries]
    assert [e.payload for e in entries] == [payload_of(ledger, 0), payload_of(ledger, 1), b"x" * MAX_ENTRY]
    # an all-invalid message and an empty message still get their response
    [r] = await add_all(stub, [add_req(-3, -3)])
    assert r.status == pb.E_INVALID_REQUEST
    assert await add_all(stub, []) == []
    await assert_serving(stub)


async def test_bad_rpcs_get_specific_status_and_server_keeps_serving(stub):
    ledger = new_ledger()
    await add_all(stub, [add_req(ledger, e) for e in (0, 1, 3)])
    unknown = new_ledger()
    bad_calls = [
        (read_all(stub, unknown, 0, 0), grpc.StatusCode.NOT_FOUND, "not found"),
        (read_all(stub, ledger, 3, 1), grpc.StatusCode.INVALID_ARGUMENT, "first_entry_id 3 > last_entry_id 1"),
        (read_all(stub, ledger, -1, 1), grpc.StatusCode.INVALID_ARGUMENT, ">= 0"),
        (read_all(stub, -1, 0, 1), grpc.StatusCode.INVALID_ARGUMENT, ">= 0"),
        (read_all(stub, ledger, 0, 3), grpc.StatusCode.OUT_OF_RANGE, "3 of entries 0..3"),
        (read_all(stub, ledger, 2, 2), grpc.StatusCode.OUT_OF_RANGE, "only 0 of entries 2..2"),
        (read_all(stub, ledger, 0, 100), grpc.StatusCode.OUT_OF_RANGE, "of entries 0..100"),
        (stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=unknown)), grpc.StatusCode.NOT_FOUND, "not found"),
        (stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=-2)), grpc.StatusCode.INVALID_ARGUMENT, ">= 0"),
        (stub.Fence(pb.LedgerRequest(ledger_id=ledger, master_key=b"wrong")),
         grpc.StatusCode.PERMISSION_DENIED, "master key"),
        (stub.Fence(pb.LedgerRequest(ledger_id=ledger)), grpc.StatusCode.INVALID_ARGUMENT, "master_key"),
        (stub.Fence(pb.LedgerRequest(ledger_id=-1, master_key=KEY)), grpc.StatusCode.INVALID_ARGUMENT, ">= 0"),
        (stub.DeleteLedger(pb.LedgerRequest(ledger_id=-1)), grpc.StatusCode.INVALID_ARGUMENT, ">= 0"),
    ]
    for call, code, text in bad_calls:
        await assert_rpc_error(call, code, text)
        await assert_serving(stub)
    # the failed Fence calls did not fence the ledger
    [r] = await add_all(stub, [add_req(ledger, 4)])
    assert r.status == pb.EOK


async def test_cancelled_stream_does_not_hurt_the_server(stub):
    ledger = new_ledger()
    call = stub.AddEntry()
    for m in range(20):
        await call.write(pb.AddEntriesRequest(adds=[add_req(ledger, m * 10 + i) for i in range(10)]))
    call.cancel()
    await asyncio.sleep(0.1)
    await assert_serving(stub)


# ---------------------------------------------------------------------- process lifecycle


async def test_sigkill_loses_no_acknowledged_add(bookie_factory):
    bookie = bookie_factory()
    ledger, fenced_ledger = 7, 8
    acked: set[int] = set()
    async with grpc.aio.insecure_channel(bookie.address, options=OPTIONS) as channel:
        stub = pbg.BookieStub(channel)
        await add_all(stub, [add_req(fenced_ledger, 0)])
        await stub.Fence(pb.LedgerRequest(ledger_id=fenced_ledger, master_key=KEY))
        call = stub.AddEntry()
        window = asyncio.Semaphore(64)  # many request messages in flight

        async def writer():
            for m in range(100_000):
                await window.acquire()
                await call.write(pb.AddEntriesRequest(
                    adds=[add_req(ledger, m * 20 + i, lac=m * 20 + i - 1) for i in range(20)]))

        w = asyncio.create_task(writer())
        with pytest.raises(grpc.aio.AioRpcError):
            async for resp in call:
                window.release()
                acked.update(r.entry_id for r in resp.results if r.status == pb.EOK)
                if len(acked) >= 4000 and bookie.is_running():
                    bookie.kill()  # kill -9 with adds still in flight
        w.cancel()
        await asyncio.gather(w, return_exceptions=True)
    assert bookie.returncode == -9

    bookie = bookie.restart()
    async with grpc.aio.insecure_channel(bookie.address, options=OPTIONS) as channel:
        stub = pbg.BookieStub(channel)
        ids = sorted(acked)
        runs = [list(g) for _, g in itertools.groupby(ids, key=lambda e, c=itertools.count(): e - next(c))]
        for run in runs:  # read back every acknowledged entry, contiguous runs at a time
            entries = [e for m in await read_all(stub, ledger, run[0], run[-1]) for e in m.entries]
            assert [e.entry_id for e in entries] == run
            assert all(e.payload == payload_of(ledger, e.entry_id) for e in entries)
        lac = await stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=ledger))
        assert lac.last_entry_id >= ids[-1]
        [r] = await add_all(stub, [add_req(fenced_ledger, 1)])
        assert r.status == pb.E_LEDGER_FENCED  # the fence survived too


async def test_sigterm_exits_cleanly_and_keeps_data(bookie_factory):
    bookie = bookie_factory(journal_sync=False)
    ledger = 9
    async with grpc.aio.insecure_channel(bookie.address, options=OPTIONS) as channel:
        stub = pbg.BookieStub(channel)
        results = await add_all(stub, [add_req(ledger, e, lac=e - 1) for e in range(100)])
        assert all(r.status == pb.EOK for r in results)
        idle = stub.AddEntry()  # a writer's stream left open must not block shutdown
        await idle.write(pb.AddEntriesRequest(adds=[add_req(ledger + 1, 0)]))
        assert (await idle.read()).results[0].status == pb.EOK
        assert await asyncio.to_thread(bookie.terminate) == 0
        idle.cancel()
    assert "stopped" in bookie.stderr_log.read_text()

    bookie = bookie.restart()
    async with grpc.aio.insecure_channel(bookie.address, options=OPTIONS) as channel:
        stub = pbg.BookieStub(channel)
        entries = [e for m in await read_all(stub, ledger, 0, 99) for e in m.entries]
        assert [e.entry_id for e in entries] == list(range(100))
        lac = await stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=ledger))
        assert (lac.last_add_confirmed, lac.last_entry_id) == (98, 99)
    assert bookie.terminate() == 0


class CliBookieProcess(BookieProcess):
    """The bookie started through the ``minipulsar bookie`` CLI (deploy.cli)."""

    def __init__(self, data_dir, launcher: list[str], extra_args=(), tracker=None):
        super().__init__(data_dir, extra_args=extra_args, tracker=tracker)
        self.launcher = launcher

    def command(self) -> list[str]:
        return [*self.launcher, "bookie", "--port", "0", "--data-dir", str(self.data_dir), *self.extra_args]


def _console_script() -> list[str]:
    script = Path(sys.executable).parent / "minipulsar"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from deploy.cli import main; sys.exit(main())"]


@pytest.mark.parametrize("launcher", ["module", "console_script"])
async def test_cli_bookie_subcommand(tmp_path, process_tracker, launcher):
    config = tmp_path / "bookie.toml"
    config.write_text("max_entry_size_bytes = 100\njournal_sync = true\nport = 3181\n"
                      "max_inflight_requests_per_stream = 2\n")
    cmd = [sys.executable, "-m", "deploy.cli"] if launcher == "module" else _console_script()
    # --port 0 on the command line overrides the file's port
    bookie = CliBookieProcess(tmp_path / "data", cmd, extra_args=("--config", str(config), "--no-journal-sync"),
                              tracker=process_tracker).start()
    assert bookie.port != 3181 and bookie.pid == bookie.popen.pid
    ready_lines = [ln for ln in bookie.stdout_log.read_text().splitlines() if ln.startswith("BOOKIE_READY")]
    assert ready_lines == [f"BOOKIE_READY port={bookie.port} pid={bookie.pid}"]
    async with grpc.aio.insecure_channel(bookie.address, options=OPTIONS) as channel:
        stub = pbg.BookieStub(channel)
        results = await add_all(stub, [add_req(1, 0, payload=b"x" * 100), add_req(1, 1, payload=b"x" * 101)])
        assert [r.status for r in results] == [pb.EOK, pb.E_ENTRY_TOO_LARGE]
        # with only 2 requests in flight per stream, a pipelined stream is throttled, not broken
        call = stub.AddEntry()
        for m in range(20):
            await call.write(pb.AddEntriesRequest(adds=[add_req(2, m * 5 + i, payload=b"y") for i in range(5)]))
        await call.done_writing()
        statuses = [r.status async for resp in call for r in resp.results]
        assert statuses == [pb.EOK] * 100
    assert bookie.terminate() == 0
    assert "journal_sync=False" in bookie.stderr_log.read_text()


def test_cli_rejects_bad_config(tmp_path):
    import subprocess

    config = tmp_path / "bad.toml"
    config.write_text("no_such_key = 1\n")
    proc = subprocess.run([sys.executable, "-m", "bookie", "--config", str(config), "--port", "0"],
                          capture_output=True, text=True, timeout=30, cwd=str(Path(__file__).parents[2]),
                          env=dict(os.environ))
    assert proc.returncode == 2
    assert "no_such_key" in proc.stderr
