"""BookKeeper client used by brokers: ledgers striped over an ensemble of bookies.

Follows BookKeeper's client (``BookKeeper``, ``LedgerHandle``, ``PendingAddOp``,
``LedgerRecoveryOp``, ``EnsembleUtils``):

* A ledger is written to an ensemble of E bookies; entry ``e`` goes to the
  write set ``ensemble[(e + i) % E] for i in range(Qw)`` (round-robin
  distribution schedule) and is acknowledged to the caller once Qa bookies of
  its write set stored it *and* every earlier entry was acknowledged: the
  LastAddConfirmed (LAC) only advances over contiguously acknowledged entries.
* Ledger metadata (``proto.metadata_pb2.LedgerMetadata``: ensemble fragments,
  Qw, Qa, state, last entry) lives in the metadata store at ``/ledgers/L<id>``;
  ledger ids come from a counter in the same store.
* When a bookie fails during writes and a spare bookie is available, the
  ledger continues on a new ensemble from the first unacknowledged entry on (a
  new fragment) and pending entries are re-sent (ensemble change).
* ``open_ledger(id, recovery=True)`` fences the ledger on its last ensemble,
  reads forward from the highest LAC the bookies report, writes every
  still-readable entry back to its write set and closes the ledger there
  (ledger recovery). The previous writer then gets ``LedgerFencedError``.

The bookie client does not import the broker: the metadata store is passed in
and only needs the ``MetadataAccess`` methods below.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import time
from typing import Callable, Optional, Protocol

import grpc

from proto import bookie_pb2 as pb
from proto import bookie_pb2_grpc
from proto import metadata_pb2
from proto.wire import encode_varint

from .errors import (
    BKException,
    BookieProtocolError,
    BookieUnavailableError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedAccessError,
)

log = logging.getLogger(__name__)

LEDGER_ID_COUNTER_PATH = "/counters/ledger-id"
LedgerState = metadata_pb2.LedgerMetadata.State

# Several adds per stream message, entries up to 5 MiB: allow large frames.
GRPC_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
# Upper bound of one AddEntriesRequest stream message (bytes of payload).
MAX_ADD_FRAME_BYTES = 8 * 1024 * 1024
# Status passed to add callbacks when the bookie could not be reached.
STATUS_UNAVAILABLE = -1
# Ledger recovery reads and writes back entries above the LAC in chunks of about
# this many payload bytes (first chunk: a fixed count, later ones sized by the
# average entry seen), at most RECOVERY_MAX_CHUNK_ENTRIES entries each.
RECOVERY_CHUNK_BYTES = 4 * 1024 * 1024
RECOVERY_FIRST_CHUNK_ENTRIES = 64
RECOVERY_MAX_CHUNK_ENTRIES = 2048


def ledger_path(ledger_id: int) -> str:
    """Metadata-store path of a ledger's metadata, as BookKeeper's ``/ledgers/L<id>``."""
    return f"/ledgers/L{ledger_id:012d}"


class MetadataAccess(Protocol):
    """What the bookie client needs of a metadata store (``broker.metadata.MetadataStore`` fits)."""

    async def get(self, path: str): ...

    async def put(self, path: str, value: bytes, expected_version: Optional[int] = None) -> int: ...

    async def delete(self, path: str, expected_version: Optional[int] = None) -> None: ...

    async def increment_counter(self, path: str) -> int: ...


AddCallback = Callable[[int, str], None]


# Tag of AddEntriesRequest.adds (field 1, length-delimited).
_ADDS_TAG = b"\x0a"


def _framed_add(serialized_add: bytes) -> bytes:
    """One serialized AddEntryRequest as an ``adds`` element of an AddEntriesRequest.

    Concatenated framed adds ARE a serialized AddEntriesRequest (a repeated
    field is encoded as one tag + length + message per element), so the writer
    only joins bytes: one add is serialized once, whatever its write set size.
    """
    return _ADDS_TAG + encode_varint(len(serialized_add)) + serialized_add


def _call_plain(callback: AddCallback, address: str, status: int, message: str) -> None:
    callback(status, message)


class BookieConnection:
    """One gRPC channel to one bookie, with a long-lived, pipelined AddEntry stream.

    ``add(request, callback)`` queues an add; a writer task coalesces everything
    queued into one ``AddEntriesRequest`` (up to ``MAX_ADD_FRAME_BYTES``) and a
    reader task calls ``callback(status, message)`` per result, ``status`` being
    a ``bookie_pb2.AddStatus`` value or ``STATUS_UNAVAILABLE`` when the stream
    broke. A broken stream is re-opened by the next add.

    Internally an add is ``(framed bytes, ledger_id, entry_id, fn, arg)``: adds
    are serialized once by the caller (``LedgerHandle`` shares one serialization
    among its write set), written as pre-serialized frames, and results call
    ``fn(arg, address, status, message)``. Written adds wait in a deque in
    write order; the bookie answers in (almost always) that order, so matching a
    result is a look at the deque's head.
    """

    def __init__(self, address: str, rpc_timeout_s: float = 10.0):
        self.address = address
        self.rpc_timeout_s = rpc_timeout_s
        self._channel = grpc.aio.insecure_channel(address, options=GRPC_CHANNEL_OPTIONS)
        self.stub = bookie_pb2_grpc.BookieStub(self._channel)
        # AddEntry with pre-serialized request frames (bytes pass through unchanged).
        self._add_stream = self._channel.stream_stream(
            "/minipulsar.bookie.Bookie/AddEntry",
            request_serializer=None,
            response_deserializer=pb.AddEntriesResponse.FromString)
        self._queue: list[tuple] = []
        self._in_flight: collections.deque[tuple] = collections.deque()
        self._wakeup: Optional[asyncio.Event] = None
        self._call = None
        self._tasks: list[asyncio.Task] = []
        self._closed = False

    # ---- adds ---------------------------------------------------------
    def add(self, request: pb.AddEntryRequest, callback: AddCallback) -> None:
        """Queue one add; ``callback(status, message)`` is called exactly once."""
        self._enqueue(_framed_add(request.SerializeToString()), request.ledger_id, request.entry_id,
                      _call_plain, callback)

    def _enqueue(self, framed: bytes, ledger_id: int, entry_id: int, fn, arg) -> None:
        """Queue one pre-serialized add; ``fn(arg, address, status, message)`` is called once."""
        if self._closed:
            fn(arg, self.address, STATUS_UNAVAILABLE, "bookie connection closed")
            return
        self._queue.append((framed, ledger_id, entry_id, fn, arg))
        if self._call is None:
            self._open_stream()
        self._wakeup.set()

    def _open_stream(self) -> None:
        self._wakeup = asyncio.Event()
        self._call = self._add_stream()
        call = self._call
        self._tasks = [asyncio.create_task(self._writer(call)), asyncio.create_task(self._reader(call))]

    async def _writer(self, call) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._queue:
                    queued, self._queue = self._queue, []
                    # In flight before the first write: a broken stream fails them all.
                    self._in_flight.extend(queued)
                    parts, size = [], 0
                    for item in queued:
                        framed = item[0]
                        if parts and size + len(framed) > MAX_ADD_FRAME_BYTES:
                            await call.write(b"".join(parts))
                            parts, size = [], 0
                        parts.append(framed)
                        size += len(framed)
                    await call.write(parts[0] if len(parts) == 1 else b"".join(parts))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # stream broken
            self._fail_stream(call, f"write to bookie {self.address} failed: {exc}")

    def _take(self, ledger_id: int, entry_id: int) -> Optional[tuple]:
        """Remove and return the oldest in-flight add of (ledger_id, entry_id), if any."""
        in_flight = self._in_flight
        for i, item in enumerate(in_flight):
            if item[2] == entry_id and item[1] == ledger_id:
                del in_flight[i]
                return item
        return None

    async def _reader(self, call) -> None:
        address = self.address
        try:
            async for response in call:
                for result in response.results:
                    ledger_id = result.ledger_id
                    entry_id = result.entry_id
                    in_flight = self._in_flight
                    if in_flight and in_flight[0][2] == entry_id and in_flight[0][1] == ledger_id:
                        item = in_flight.popleft()
                    else:
                        item = self._take(ledger_id, entry_id)
                        if item is None:
                            continue
                    status = result.status
                    item[3](item[4], address, status, result.message if status else "")
            self._fail_stream(call, f"bookie {self.address} closed the add stream")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail_stream(call, f"bookie {self.address} unavailable: {exc}")

    def _fail_stream(self, call, reason: str) -> None:
        if self._call is not call:
            return
        log.warning("%s", reason)
        self._call = None
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self._tasks = []
        call.cancel()
        failed = list(self._in_flight)
        failed += self._queue
        self._in_flight = collections.deque()
        self._queue = []
        for item in failed:
            item[3](item[4], self.address, STATUS_UNAVAILABLE, reason)

    # ---- unary / read RPCs ----------------------------------------------
    async def read_entries(self, ledger_id: int, first: int, last: int) -> list[bytes]:
        """Entries ``first..last`` (inclusive) of a ledger from this bookie.
        Raises NoSuchEntryError / NoSuchLedgerError / BookieUnavailableError."""
        out: list[bytes] = []
        try:
            call = self.stub.ReadEntries(
                pb.ReadEntriesRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last),
                timeout=self.rpc_timeout_s)
            async for response in call:
                out.extend(e.payload for e in response.entries)
        except grpc.aio.AioRpcError as exc:
            raise _map_rpc_error(exc, self.address) from None
        if len(out) != last - first + 1:
            raise NoSuchEntryError(f"bookie {self.address} returned {len(out)} of {last - first + 1} entries")
        return out

    async def read_last_add_confirmed(self, ledger_id: int) -> pb.ReadLastAddConfirmedResponse:
        try:
            return await self.stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=ledger_id), timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _map_rpc_error(exc, self.address) from None

    async def fence(self, ledger_id: int, master_key: bytes) -> pb.FenceResponse:
        try:
            return await self.stub.Fence(pb.LedgerRequest(ledger_id=ledger_id, master_key=master_key),
                                         timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _map_rpc_error(exc, self.address) from None

    async def delete_ledger(self, ledger_id: int) -> None:
        try:
            await self.stub.DeleteLedger(pb.LedgerRequest(ledger_id=ledger_id), timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _map_rpc_error(exc, self.address) from None

    async def close(self) -> None:
        self._closed = True
        if self._call is not None:
            self._fail_stream(self._call, f"connection to bookie {self.address} closed")
        await self._channel.close()


def _map_rpc_error(exc: grpc.aio.AioRpcError, address: str) -> BKException:
    code = exc.code()
    detail = f"bookie {address}: {exc.details()}"
    if code == grpc.StatusCode.NOT_FOUND:
        return NoSuchLedgerError(detail)
    if code == grpc.StatusCode.OUT_OF_RANGE:
        return NoSuchEntryError(detail)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return UnauthorizedAccessError(detail)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return BookieProtocolError(detail)
    return BookieUnavailableError(detail)


def _status_error(status: int, message: str, ledger_id: int) -> BKException:
    if status == pb.E_LEDGER_FENCED:
        return LedgerFencedError(f"ledger {ledger_id} was fenced by a recovery: {message}")
    if status == pb.E_UNAUTHORIZED_ACCESS:
        return UnauthorizedAccessError(f"ledger {ledger_id}: {message}")
    if status == pb.E_ENTRY_TOO_LARGE:
        return EntryTooLargeError(f"ledger {ledger_id}: {message}")
    return BookieProtocolError(f"ledger {ledger_id}: status {pb.AddStatus.Name(status) if status in pb.AddStatus.values() else status}: {message}")


class _PendingAdd:
    """One add in flight: completes ``future`` or, for internal callers, calls
    ``callback(ctx, entry_id, error)`` (no future, no extra loop round trip)."""

    __slots__ = ("entry_id", "payload", "future", "acked", "done", "callback", "ctx")

    def __init__(self, entry_id: int, payload: bytes, future: Optional[asyncio.Future],
                 callback: Optional[Callable] = None, ctx=None):
        self.entry_id = entry_id
        self.payload = payload
        self.future = future
        self.acked: set[str] = set()   # bookie addresses that stored it
        self.done = False
        self.callback = callback
        self.ctx = ctx

    def succeed(self) -> None:
        if self.callback is not None:
            self.callback(self.ctx, self.entry_id, None)
        elif not self.future.done():
            self.future.set_result(self.entry_id)

    def fail(self, error: BaseException) -> None:
        if self.callback is not None:
            self.callback(self.ctx, None, error)
        elif not self.future.done():
            self.future.set_exception(error)


class LedgerHandle:
    """An open ledger: the writer's handle (``add_entry``) or a read-only one.

    Attributes: ``ledger_id``; ``last_add_confirmed`` (entry id, -1 when empty);
    ``length`` (bytes acknowledged by this writer); ``metadata`` (LedgerMetadata).
    """

    def __init__(self, bk: "BookKeeper", ledger_id: int, metadata: metadata_pb2.LedgerMetadata,
                 version: int, writable: bool):
        self.bk = bk
        self.ledger_id = ledger_id
        self.metadata = metadata
        self._version = version
        self.writable = writable
        if writable:
            self.last_add_confirmed = -1
        else:
            self.last_add_confirmed = metadata.last_entry_id
        self.last_add_pushed = self.last_add_confirmed
        self.length = metadata.length if not writable else 0
        self._pending: collections.deque[_PendingAdd] = collections.deque()
        self._error: Optional[BKException] = None
        self._ensemble_lock = asyncio.Lock()
        self._closing = False
        self._read_rotation = 0
        self._drained: Optional[asyncio.Future] = None  # set when _pending empties (close)
        # Write path cache (current fragment): per entry_id % E, the write set as
        # (address, connection) pairs; rebuilt when the metadata object changes.
        self._ws_metadata = None
        self._ws_sets: list[tuple[tuple[str, BookieConnection], ...]] = []
        self._add_prefix = b""
        self._on_result_cb = self._on_result

    # ---- geometry -----------------------------------------------------
    @property
    def ensemble(self) -> list[str]:
        """The current (last fragment's) ensemble: bookie addresses."""
        return list(self.metadata.fragments[-1].ensemble)

    def _fragment_for(self, entry_id: int):
        frags = self.metadata.fragments
        for frag in reversed(frags):
            if frag.first_entry_id <= entry_id:
                return frag
        return frags[0]

    def write_set(self, entry_id: int) -> list[str]:
        """Bookies storing ``entry_id``: ensemble[(e + i) % E] for i < Qw, in its fragment."""
        ens = self._fragment_for(entry_id).ensemble
        e = len(ens)
        return [ens[(entry_id + i) % e] for i in range(self.metadata.write_quorum_size)]

    # ---- writes -------------------------------------------------------
    def add_entry_nowait(self, payload: bytes) -> asyncio.Future:
        """Start adding ``payload`` (bytes); returns a future of its entry id (int).

        Entry ids are assigned in call order and futures complete in that order.
        Raises LedgerClosedError (closed/read-only handle), EntryTooLargeError,
        or the error that broke the handle (LedgerFencedError, NotEnoughBookiesError).
        """
        future = asyncio.get_running_loop().create_future()
        self._start_add(payload, future, None, None)
        return future

    def _add_entry_cb(self, payload: bytes, callback: Callable, ctx) -> None:
        """Internal ``add_entry_nowait`` for the managed ledger: instead of a future,
        ``callback(ctx, entry_id, None)`` on success or ``callback(ctx, None, error)``
        on failure, called in entry order. Raises like ``add_entry_nowait``."""
        self._start_add(payload, None, callback, ctx)

    def _start_add(self, payload: bytes, future, callback, ctx) -> None:
        if not self.writable or self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed or read-only")
        if self._error is not None:
            raise self._error
        if len(payload) > self.bk.max_entry_size_bytes:
            raise EntryTooLargeError(
                f"entry of {len(payload)} bytes exceeds max_entry_size_bytes={self.bk.max_entry_size_bytes}")
        self.last_add_pushed += 1
        entry_id = self.last_add_pushed
        op = _PendingAdd(entry_id, payload, future, callback, ctx)
        self._pending.append(op)
        if self._ws_metadata is not self.metadata:
            self._build_write_sets()
        write_set = self._ws_sets[entry_id % len(self._ws_sets)]
        # One serialization shared by the whole write set.
        framed = _framed_add(self._add_prefix + pb.AddEntryRequest(
            entry_id=entry_id, payload=payload, last_add_confirmed=self.last_add_confirmed).SerializeToString())
        ledger_id = self.ledger_id
        on_result = self._on_result_cb
        for address, conn in write_set:
            if conn._closed:  # the client's connections were closed and re-created since
                conn = self.bk.connection(address)
            conn._enqueue(framed, ledger_id, entry_id, on_result, op)

    def _build_write_sets(self) -> None:
        md = self.metadata
        ens = list(md.fragments[-1].ensemble)
        e, qw = len(ens), md.write_quorum_size
        conns = {a: self.bk.connection(a) for a in ens}
        self._ws_sets = [tuple((ens[(i + j) % e], conns[ens[(i + j) % e]]) for j in range(qw)) for i in range(e)]
        # ledger_id and master_key never change: serialized once, prepended to every add.
        self._add_prefix = pb.AddEntryRequest(ledger_id=self.ledger_id, master_key=md.password).SerializeToString()
        self._ws_metadata = md

    async def add_entry(self, payload: bytes) -> int:
        """Add one entry and wait until Qa bookies stored it; returns its entry id."""
        return await self.add_entry_nowait(payload)

    def _send(self, op: _PendingAdd, address: str, recovery: bool = False) -> None:
        request = pb.AddEntryRequest(
            ledger_id=self.ledger_id, entry_id=op.entry_id, master_key=self.metadata.password,
            payload=op.payload, last_add_confirmed=self.last_add_confirmed, recovery=recovery)
        self.bk.connection(address)._enqueue(_framed_add(request.SerializeToString()), self.ledger_id, op.entry_id,
                                             self._on_result_cb, op)

    def _on_result(self, op: _PendingAdd, address: str, status: int, message: str) -> None:
        if op.done:
            return
        if status == pb.EOK:
            op.acked.add(address)
            if len(op.acked) >= self.metadata.ack_quorum_size and op is self._pending[0]:
                self._complete_in_order()
            return
        if status == STATUS_UNAVAILABLE:
            self.bk.mark_failed(address)
            asyncio.ensure_future(self._handle_bookie_failure(address))
            return
        self._fail_all(_status_error(status, message, self.ledger_id))

    def _complete_in_order(self) -> None:
        qa = self.metadata.ack_quorum_size
        pending = self._pending
        while pending and len(pending[0].acked) >= qa:
            op = pending.popleft()
            op.done = True
            self.last_add_confirmed = op.entry_id
            self.length += len(op.payload)
            op.succeed()
        if not pending:
            self._set_drained()

    def _set_drained(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _fail_all(self, error: BKException) -> None:
        if self._error is None:
            self._error = error
            log.warning("ledger %d: failing %d pending adds: %s", self.ledger_id, len(self._pending), error)
        while self._pending:
            op = self._pending.popleft()
            op.done = True
            op.fail(error)
        self._set_drained()

    async def _handle_bookie_failure(self, failed: str) -> None:
        """Ensemble change: replace ``failed`` by a spare bookie from the LAC+1 on."""
        async with self._ensemble_lock:
            if self._error is not None or not self._pending:
                return
            ensemble = self.ensemble
            if failed in ensemble:
                spare = self.bk.pick_spare(exclude=ensemble)
                if spare is None:
                    self._fail_all(NotEnoughBookiesError(
                        f"ledger {self.ledger_id}: bookie {failed} failed and no spare bookie is available "
                        f"(ensemble {ensemble}, known bookies {self.bk.bookies})"))
                    return
                new_ensemble = [spare if b == failed else b for b in ensemble]
                first = self.last_add_confirmed + 1
                md = metadata_pb2.LedgerMetadata()
                md.CopyFrom(self.metadata)
                if md.fragments[-1].first_entry_id >= first:
                    del md.fragments[-1].ensemble[:]
                    md.fragments[-1].ensemble.extend(new_ensemble)
                else:
                    md.fragments.add(first_entry_id=first, ensemble=new_ensemble)
                try:
                    self._version = await self.bk.metadata.put(ledger_path(self.ledger_id), md.SerializeToString(),
                                                               expected_version=self._version)
                except Exception as exc:  # BadVersion: a recovery took the ledger over
                    self._fail_all(LedgerFencedError(
                        f"ledger {self.ledger_id}: metadata changed under the writer during ensemble change ({exc})"))
                    return
                self.metadata = md
                log.info("ledger %d: ensemble change from entry %d: %s replaced by %s",
                         self.ledger_id, first, failed, spare)
            # Re-send every pending entry to the members of its write set that have not acked.
            for op in list(self._pending):
                for address in self.write_set(op.entry_id):
                    if address not in op.acked:
                        self._send(op, address)

    async def close(self) -> None:
        """Wait for pending adds, then mark the ledger CLOSED at its LAC in metadata.
        Idempotent; read-only handles just drop their state."""
        if not self.writable or self._closing:
            return
        self._closing = True
        if self._pending:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)
        if isinstance(self._error, LedgerFencedError):
            self.writable = False
            return
        md = metadata_pb2.LedgerMetadata()
        md.CopyFrom(self.metadata)
        md.state = LedgerState.CLOSED
        md.last_entry_id = self.last_add_confirmed
        md.length = self.length
        try:
            self._version = await self.bk.metadata.put(ledger_path(self.ledger_id), md.SerializeToString(),
                                                       expected_version=self._version)
            self.metadata = md
        except Exception as exc:
            raise LedgerFencedError(f"ledger {self.ledger_id} could not be closed: metadata changed ({exc})") from None
        finally:
            self.writable = False

    # ---- reads --------------------------------------------------------
    async def read_entries(self, first: int, last: int) -> list[bytes]:
        """Entries ``first..last`` inclusive (bytes each), up to the LAC / last entry.

        Each entry is read from a bookie of its write set, falling back to the next
        bookie when one fails. Raises NoSuchEntryError for ids outside 0..LAC.
        """
        if first < 0 or last < first:
            raise NoSuchEntryError(f"ledger {self.ledger_id}: invalid range {first}..{last}")
        if last > self.last_add_confirmed:
            raise NoSuchEntryError(
                f"ledger {self.ledger_id}: entry {last} is beyond LastAddConfirmed {self.last_add_confirmed}")
        return await self._read_range(first, last)

    async def _read_range(self, first: int, last: int) -> list[bytes]:
        """``read_entries`` without the LAC check (ledger recovery reads beyond it)."""
        out: list[bytes] = []
        entry = first
        frags = list(self.metadata.fragments)
        while entry <= last:
            frag = self._fragment_for(entry)
            idx = frags.index(frag)
            frag_last = frags[idx + 1].first_entry_id - 1 if idx + 1 < len(frags) else last
            end = min(last, frag_last)
            out.extend(await self._read_fragment_range(frag, entry, end))
            entry = end + 1
        return out

    async def _read_fragment_range(self, frag, first: int, last: int) -> list[bytes]:
        ens = list(frag.ensemble)
        if len(ens) == self.metadata.write_quorum_size:
            # Every bookie of the ensemble holds every entry: one range read, with fallback.
            self._read_rotation += 1
            order = ens[self._read_rotation % len(ens):] + ens[:self._read_rotation % len(ens)]
            order.sort(key=lambda a: self.bk.is_failed(a))
            return await self._read_with_fallback(order, first, last)
        # Striped ensemble: entries e..e+Qw-1 all live on ens[(e+Qw-1) % E] (the
        # round-robin write sets overlap there), so read blocks of Qw entries, one
        # range read each, concurrently; a block that fails is read entry by entry.
        qw = self.metadata.write_quorum_size
        results = await asyncio.gather(*(
            self._read_striped_block(ens, s, min(last, s + qw - 1)) for s in range(first, last + 1, qw)))
        return [payload for block in results for payload in block]

    async def _read_striped_block(self, ens: list[str], first: int, last: int) -> list[bytes]:
        if last > first:
            holder = ens[last % len(ens)]  # holds every entry of first..last (last - first < Qw)
            if not self.bk.is_failed(holder):
                try:
                    return await self.bk.connection(holder).read_entries(self.ledger_id, first, last)
                except BKException as exc:
                    if isinstance(exc, BookieUnavailableError):
                        self.bk.mark_failed(holder)
        results = await asyncio.gather(*(
            self._read_with_fallback(sorted(self.write_set(e), key=self.bk.is_failed), e, e)
            for e in range(first, last + 1)))
        return [r[0] for r in results]

    async def _read_with_fallback(self, bookies: list[str], first: int, last: int) -> list[bytes]:
        errors = []
        for address in bookies:
            try:
                return await self.bk.connection(address).read_entries(self.ledger_id, first, last)
            except BKException as exc:
                if isinstance(exc, BookieUnavailableError):
                    self.bk.mark_failed(address)
                errors.append(str(exc))
        raise NoSuchEntryError(f"ledger {self.ledger_id}: entries {first}..{last} not readable: {'; '.join(errors)}")


class BookKeeper:
    """Entry point of the bookie client (BookKeeper's ``BookKeeper`` class).

    ``bookies``: addresses ``host:port`` of every bookie the client may use;
    ensembles are chosen among them, the others are spares for ensemble changes.
    ``max_entry_size_bytes``: client-side limit checked before an add (default 5 MiB).
    """

    def __init__(self, metadata: MetadataAccess, bookies: list[str], *,
                 max_entry_size_bytes: int = 5 * 1024 * 1024, rpc_timeout_s: float = 10.0,
                 failed_bookie_quarantine_s: float = 30.0):
        if not bookies:
            raise ValueError("BookKeeper client needs at least one bookie address")
        self.metadata = metadata
        self.bookies = list(bookies)
        self.max_entry_size_bytes = max_entry_size_bytes
        self.rpc_timeout_s = rpc_timeout_s
        self.quarantine_s = failed_bookie_quarantine_s
        self._connections: dict[str, BookieConnection] = {}
        self._failed_at: dict[str, float] = {}

    def connection(self, address: str) -> BookieConnection:
        conn = self._connections.get(address)
        if conn is None:
            conn = self._connections[address] = BookieConnection(address, self.rpc_timeout_s)
        return conn

    def mark_failed(self, address: str) -> None:
        self._failed_at[address] = time.monotonic()

    def is_failed(self, address: str) -> bool:
        t = self._failed_at.get(address)
        return t is not None and time.monotonic() - t < self.quarantine_s

    def pick_spare(self, exclude: list[str]) -> Optional[str]:
        candidates = [b for b in self.bookies if b not in exclude and not self.is_failed(b)]
        return random.choice(candidates) if candidates else None

    async def create_ledger(self, ensemble_size: int, write_quorum: int, ack_quorum: int) -> LedgerHandle:
        """Create a ledger on ``ensemble_size`` healthy bookies; returns the writer's handle.

        Requires ensemble_size >= write_quorum >= ack_quorum >= 1 (ValueError otherwise);
        raises NotEnoughBookiesError when fewer healthy bookies are known.
        """
        if not (ensemble_size >= write_quorum >= ack_quorum >= 1):
            raise ValueError(f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                             f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}")
        healthy = [b for b in self.bookies if not self.is_failed(b)]
        if len(healthy) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} bookies for a new ledger, {len(healthy)} healthy of {len(self.bookies)}")
        ledger_id = await self.metadata.increment_counter(LEDGER_ID_COUNTER_PATH)
        start = ledger_id % len(healthy)
        ensemble = (healthy[start:] + healthy[:start])[:ensemble_size]
        md = metadata_pb2.LedgerMetadata(
            ensemble_size=ensemble_size, write_quorum_size=write_quorum, ack_quorum_size=ack_quorum,
            state=LedgerState.OPEN, last_entry_id=-1, length=0, password=os.urandom(16),
            ctime=int(time.time() * 1000))
        md.fragments.add(first_entry_id=0, ensemble=ensemble)
        version = await self.metadata.put(ledger_path(ledger_id), md.SerializeToString(), expected_version=-1)
        return LedgerHandle(self, ledger_id, md, version, writable=True)

    async def get_metadata(self, ledger_id: int) -> tuple[metadata_pb2.LedgerMetadata, int]:
        """The ledger's metadata and its version; NoSuchLedgerError when absent."""
        res = await self.metadata.get(ledger_path(ledger_id))
        if res is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
        md = metadata_pb2.LedgerMetadata()
        md.ParseFromString(res.value)
        return md, res.version

    async def open_ledger(self, ledger_id: int, recovery: bool = True) -> LedgerHandle:
        """Open a ledger read-only. A CLOSED ledger opens as it is; an OPEN one is
        recovered (fenced and closed) when ``recovery`` is true, otherwise readable
        up to the highest LAC its bookies report."""
        md, version = await self.get_metadata(ledger_id)
        if md.state == LedgerState.CLOSED:
            return LedgerHandle(self, ledger_id, md, version, writable=False)
        if recovery:
            return await self._recover(ledger_id, md, version)
        handle = LedgerHandle(self, ledger_id, md, version, writable=False)
        lacs = []
        for address in handle.ensemble:
            try:
                lacs.append((await self.connection(address).read_last_add_confirmed(ledger_id)).last_add_confirmed)
            except BKException:
                pass
        handle.last_add_confirmed = max(lacs, default=-1)
        return handle

    async def _recover(self, ledger_id: int, md, version: int) -> LedgerHandle:
        """BookKeeper's LedgerRecoveryOp: fence, read forward from max LAC, write back, close."""
        md.state = LedgerState.IN_RECOVERY
        version = await self.metadata.put(ledger_path(ledger_id), md.SerializeToString(), expected_version=version)
        ensemble = list(md.fragments[-1].ensemble)
        results = await asyncio.gather(*(self.connection(b).fence(ledger_id, md.password) for b in ensemble),
                                       return_exceptions=True)
        answered = [r for r in results if not isinstance(r, BaseException)]
        needed = len(ensemble) - md.ack_quorum_size + 1
        if len(answered) < needed:
            errors = [str(r) for r in results if isinstance(r, BaseException)]
            raise BookieUnavailableError(
                f"ledger {ledger_id}: recovery needs {needed} bookies of {ensemble} to fence, "
                f"{len(answered)} answered: {errors}")
        lac = max(r.last_add_confirmed for r in answered)
        handle = LedgerHandle(self, ledger_id, md, version, writable=False)
        handle.last_add_confirmed = lac
        # Entries up to the LAC are known to be at Qa; entries above it are read
        # forward and written back until one is not readable any more. The LAC the
        # writer piggy-backs lags by its whole pipeline (thousands of entries under
        # load), so first go in chunks up to the highest entry a fenced bookie
        # stores (or that precedes the last fragment, all acknowledged): one range
        # read and one pipelined write-back per chunk. A chunk that is not fully
        # readable ends this phase; the entry-by-entry loop below then stops at
        # exactly the first unreadable entry, as BookKeeper's recovery does.
        entry = lac + 1
        written_back = 0
        known_last = max([r.last_entry_id for r in answered] + [md.fragments[-1].first_entry_id - 1])
        chunk = RECOVERY_FIRST_CHUNK_ENTRIES
        while entry <= known_last:
            end = min(known_last, entry + chunk - 1)
            try:
                payloads = await handle._read_range(entry, end)
            except NoSuchEntryError:
                break
            await self._write_back_many(handle, entry, payloads)
            handle.last_add_confirmed = end
            written_back += len(payloads)
            entry = end + 1
            avg = max(1, sum(len(p) for p in payloads) // len(payloads))
            chunk = max(1, min(RECOVERY_MAX_CHUNK_ENTRIES, RECOVERY_CHUNK_BYTES // avg))
        while True:
            try:
                payload = (await handle._read_with_fallback(handle.write_set(entry), entry, entry))[0]
            except NoSuchEntryError:
                break
            await self._write_back(handle, entry, payload)
            handle.last_add_confirmed = entry
            written_back += 1
            entry += 1
        md.state = LedgerState.CLOSED
        md.last_entry_id = handle.last_add_confirmed
        version = await self.metadata.put(ledger_path(ledger_id), md.SerializeToString(), expected_version=version)
        handle._version = version
        handle.metadata = md
        log.info("ledger %d recovered: closed at entry %d (LAC was %d, %d entries written back)",
                 ledger_id, md.last_entry_id, lac, written_back)
        return handle

    async def _write_back(self, handle: LedgerHandle, entry_id: int, payload: bytes) -> None:
        await self._write_back_many(handle, entry_id, [payload])

    async def _write_back_many(self, handle: LedgerHandle, first: int, payloads: list[bytes]) -> None:
        """Write entries ``first, first+1, ...`` back to their write sets (recovery adds),
        all pipelined; raises BookieUnavailableError if one reached fewer than Qa bookies."""
        loop = asyncio.get_running_loop()
        futures = []
        for i, payload in enumerate(payloads):
            entry_id = first + i
            for address in handle.write_set(entry_id):
                fut = loop.create_future()
                futures.append((entry_id, fut))
                request = pb.AddEntryRequest(ledger_id=handle.ledger_id, entry_id=entry_id,
                                             master_key=handle.metadata.password, payload=payload,
                                             last_add_confirmed=entry_id - 1, recovery=True)
                self.connection(address).add(
                    request, lambda s, m, f=fut: f.done() or f.set_result((s, m)))
        await asyncio.gather(*(f for _, f in futures))
        by_entry: dict[int, list] = {}
        for entry_id, fut in futures:
            by_entry.setdefault(entry_id, []).append(fut.result())
        for entry_id, results in by_entry.items():
            ok = sum(1 for s, _ in results if s == pb.EOK)
            if ok < handle.metadata.ack_quorum_size:
                raise BookieUnavailableError(
                    f"ledger {handle.ledger_id}: recovery write-back of entry {entry_id} reached {ok} bookies: "
                    f"{results}")

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger's entries on its bookies (best effort) and its metadata."""
        try:
            md, _ = await self.get_metadata(ledger_id)
        except NoSuchLedgerError:
            return
        bookies = {b for frag in md.fragments for b in frag.ensemble}
        await asyncio.gather(*(self.connection(b).delete_ledger(ledger_id) for b in bookies), return_exceptions=True)
        try:
            await self.metadata.delete(ledger_path(ledger_id))
        except Exception:  # already gone
            pass

    async def close(self) -> None:
        """Close every bookie connection."""
        for conn in list(self._connections.values()):
            await conn.close()
        self._connections.clear()
