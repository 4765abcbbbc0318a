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


class BookieConnection:
    """One gRPC channel to one bookie, with a long-lived, pipelined AddEntry stream.

    ``add(request, callback)`` queues an add; a writer task coalesces everything
    queued into one ``AddEntriesRequest`` (up to ``MAX_ADD_FRAME_BYTES``) and a
    reader task calls ``callback(status, message)`` per result, ``status`` being
    a ``bookie_pb2.AddStatus`` value or ``STATUS_UNAVAILABLE`` when the stream
    broke. A broken stream is re-opened by the next add.
    """

    def __init__(self, address: str, rpc_timeout_s: float = 10.0):
        self.address = address
        self.rpc_timeout_s = rpc_timeout_s
        self._channel = grpc.aio.insecure_channel(address, options=GRPC_CHANNEL_OPTIONS)
        self.stub = bookie_pb2_grpc.BookieStub(self._channel)
        self._queue: list[tuple[pb.AddEntryRequest, AddCallback]] = []
        self._in_flight: dict[tuple[int, int], collections.deque] = {}
        self._wakeup: Optional[asyncio.Event] = None
        self._call = None
        self._tasks: list[asyncio.Task] = []
        self._closed = False

    # ---- adds ---------------------------------------------------------
    def add(self, request: pb.AddEntryRequest, callback: AddCallback) -> None:
        """Queue one add; ``callback(status, message)`` is called exactly once."""
        if self._closed:
            callback(STATUS_UNAVAILABLE, "bookie connection closed")
            return
        self._queue.append((request, callback))
        if self._call is None:
            self._open_stream()
        self._wakeup.set()

    def _open_stream(self) -> None:
        self._wakeup = asyncio.Event()
        self._call = self.stub.AddEntry()
        call = self._call
        self._tasks = [asyncio.create_task(self._writer(call)), asyncio.create_task(self._reader(call))]

    async def _writer(self, call) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._queue:
                    queued, self._queue = self._queue, []
                    batch, size = [], 0
                    for req, cb in queued:
                        if batch and size + len(req.payload) > MAX_ADD_FRAME_BYTES:
                            await call.write(pb.AddEntriesRequest(adds=batch))
                            batch, size = [], 0
                        batch.append(req)
                        size += len(req.payload)
                        self._in_flight.setdefault((req.ledger_id, req.entry_id), collections.deque()).append(cb)
                    await call.write(pb.AddEntriesRequest(adds=batch))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # stream broken
            self._fail_stream(call, f"write to bookie {self.address} failed: {exc}")

    async def _reader(self, call) -> None:
        try:
            async for response in call:
                for result in response.results:
                    key = (result.ledger_id, result.entry_id)
                    waiters = self._in_flight.get(key)
                    if not waiters:
                        continue
                    cb = waiters.popleft()
                    if not waiters:
                        del self._in_flight[key]
                    cb(result.status, result.message)
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
        failed = [cb for waiters in self._in_flight.values() for cb in waiters]
        failed += [cb for _, cb in self._queue]
        self._in_flight.clear()
        self._queue = []
        for cb in failed:
            cb(STATUS_UNAVAILABLE, reason)

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
    __slots__ = ("entry_id", "payload", "future", "acked", "done")

    def __init__(self, entry_id: int, payload: bytes, future: asyncio.Future):
        self.entry_id = entry_id
        self.payload = payload
        self.future = future
        self.acked: set[str] = set()   # bookie addresses that stored it
        self.done = False


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
        if not self.writable or self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed or read-only")
        if self._error is not None:
            raise self._error
        if len(payload) > self.bk.max_entry_size_bytes:
            raise EntryTooLargeError(
                f"entry of {len(payload)} bytes exceeds max_entry_size_bytes={self.bk.max_entry_size_bytes}")
        self.last_add_pushed += 1
        op = _PendingAdd(self.last_add_pushed, payload, asyncio.get_running_loop().create_future())
        self._pending.append(op)
        for address in self.write_set(op.entry_id):
            self._send(op, address)
        return op.future

    async def add_entry(self, payload: bytes) -> int:
        """Add one entry and wait until Qa bookies stored it; returns its entry id."""
        return await self.add_entry_nowait(payload)

    def _send(self, op: _PendingAdd, address: str, recovery: bool = False) -> None:
        request = pb.AddEntryRequest(
            ledger_id=self.ledger_id, entry_id=op.entry_id, master_key=self.metadata.password,
            payload=op.payload, last_add_confirmed=self.last_add_confirmed, recovery=recovery)
        self.bk.connection(address).add(request, lambda status, msg: self._on_result(op, address, status, msg))

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
            if not op.future.done():
                op.future.set_result(op.entry_id)

    def _fail_all(self, error: BKException) -> None:
        if self._error is None:
            self._error = error
            log.warning("ledger %d: failing %d pending adds: %s", self.ledger_id, len(self._pending), error)
        while self._pending:
            op = self._pending.popleft()
            op.done = True
            if not op.future.done():
                op.future.set_exception(error)

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
            await asyncio.gather(*(op.future for op in list(self._pending)), return_exceptions=True)
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
        # Striped ensemble: each entry from its own write set.
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
        # forward and written back until one is not readable any more.
        entry = lac + 1
        written_back = 0
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
        loop = asyncio.get_running_loop()
        write_set = handle.write_set(entry_id)
        futures = []
        for address in write_set:
            fut = loop.create_future()
            futures.append(fut)
            request = pb.AddEntryRequest(ledger_id=handle.ledger_id, entry_id=entry_id,
                                         master_key=handle.metadata.password, payload=payload,
                                         last_add_confirmed=entry_id - 1, recovery=True)
            self.connection(address).add(
                request, lambda s, m, f=fut: f.done() or f.set_result((s, m)))
        results = await asyncio.gather(*futures)
        ok = sum(1 for s, _ in results if s == pb.EOK)
        if ok < handle.metadata.ack_quorum_size:
            raise BookieUnavailableError(
                f"ledger {handle.ledger_id}: recovery write-back of entry {entry_id} reached {ok} bookies: {results}")

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
