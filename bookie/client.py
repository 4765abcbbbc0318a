"""BookKeeper client used by brokers: ledgers striped over an ensemble of bookies.

Follows BookKeeper's client (``BookKeeper``, ``LedgerHandle``, ``PendingAddOp``,
``LedgerRecoveryOp``, ``ReadLastConfirmedOp``, ``PendingReadOp``, ``EnsembleUtils``):

* A ledger is written to an ensemble of E bookies; entry ``e`` goes to the
  write set ``ensemble[(e + i) % E] for i in range(Qw)`` (round-robin
  distribution schedule) and is acknowledged to the caller once Qa bookies of
  its *current* write set stored it *and* every earlier entry was
  acknowledged: the LastAddConfirmed (LAC) only advances over contiguously
  acknowledged entries. An ack from a bookie that an ensemble change replaced
  does not count (``PendingAddOp``, ``AckSet.removeBookieAndCheck``).
* Ledger metadata (``proto.metadata_pb2.LedgerMetadata``: ensemble fragments,
  Qw, Qa, state, last entry) lives in the metadata store at ``/ledgers/L<id>``;
  ledger ids come from a counter in the same store.
* A bookie fails for a ledger when its add stream breaks, when it answers an
  add with an error status other than E_LEDGER_FENCED / E_UNAUTHORIZED_ACCESS /
  E_ENTRY_TOO_LARGE (those fail the whole handle), or when it leaves an add
  unanswered for ``add_entry_timeout_s`` (BookKeeper's addEntryTimeout). Then
  ONE ensemble change replaces it by a spare bookie from LAC+1 on (a new
  fragment), no entry completes while the change is in progress, and each
  pending entry is re-sent once, to the replacement only. No spare: the
  handle fails with NotEnoughBookiesError and the caller closes the ledger at
  its LAC (``close()`` needs no bookie).
* ``open_ledger(id, recovery=True)`` fences the ledger on its last ensemble
  (each write set must have Qw-Qa+1 bookies answering), takes the highest LAC
  they report floored at the last fragment's first entry - 1 (BOOKKEEPER
  #2615: an ensemble change implies every earlier entry was acknowledged),
  reads forward writing every readable entry back to its write set, and closes
  the ledger before the first entry that Qw-Qa+1 bookies of its write set say
  they do not have (ledger recovery). If too few bookies answer to decide, the
  recovery raises BookieUnavailableError and the ledger stays IN_RECOVERY. The
  previous writer then gets ``LedgerFencedError``.

* Digests (BookKeeper's ``DigestManager``): every add carries the CRC32C of its
  payload, computed here (``AddEntryRequest.crc32c``: one C call per entry,
  whatever the payload is: Pulsar's headersAndPayload or a cursor ledger's
  PositionInfo); the bookie stores it with the entry and returns it on read,
  and ``BookieConnection.read_entries`` verifies it. A mismatch raises
  ``DigestMismatchError`` for that bookie, is logged and counted
  (``BookKeeper.corrupt_replicas``), and the read goes on to the next replica
  of the entry's write set. Entries stored without a checksum (written before
  checksums existed) are returned unverified.
* Bookie identity: a bookie reports its cookie's instance id in
  ReadLastAddConfirmed / Fence / GetBookieInfo answers. A connection remembers
  the first one it saw; when a later answer carries another one, the bookie was
  wiped and re-initialized under the same address, so from then on its "no such
  entry / ledger" answers count as "unavailable" (it cannot vouch for the
  absence of entries it may have lost) -- for this client's lifetime.

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
from crc32c import crc32c as _crc32c

from proto import bookie_pb2 as pb
from proto import bookie_pb2_grpc
from proto import metadata_pb2
from proto.common import grpc_message_size_options
from proto.wire import encode_varint

from .errors import (
    BKException,
    BookieProtocolError,
    BookieUnavailableError,
    ClientClosedError,
    DigestMismatchError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataStoreError,
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
    *grpc_message_size_options(),
    # A restarted bookie is reachable again within a second (gRPC's default
    # reconnect backoff grows to 120 s and kept a recovered bookie "refused").
    # (grpc.min_reconnect_backoff_ms is the connect timeout: left at its 20 s.)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# How long a quarantined bookie gets to answer a liveness probe (seconds).
PROBE_TIMEOUT_S = 1.0
# Upper bound of one AddEntriesRequest stream message (bytes of payload).
MAX_ADD_FRAME_BYTES = 8 * 1024 * 1024
# Status passed to add callbacks when the bookie could not be reached, its add
# stream broke, or it left an add unanswered for the add-entry timeout.
STATUS_UNAVAILABLE = -1
# BookKeeper's addEntryTimeout (Pulsar: bookkeeperClientTimeoutInSeconds), seconds.
DEFAULT_ADD_ENTRY_TIMEOUT_S = 30.0
# Ledger recovery reads and writes back entries above the LAC in chunks of about
# this many payload bytes (first chunk: a fixed count, later ones sized by the
# average entry seen), at most RECOVERY_MAX_CHUNK_ENTRIES entries each.
RECOVERY_CHUNK_BYTES = 4 * 1024 * 1024
RECOVERY_FIRST_CHUNK_ENTRIES = 64
RECOVERY_MAX_CHUNK_ENTRIES = 2048
# Recovery reads that must decide "present / absent" (a fast range read failed)
# read this many entries concurrently, each from its whole write set.
RECOVERY_STRICT_WINDOW = 16


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

    Add timeout (BookKeeper's addEntryTimeout): while the stream is open, one
    watchdog task per connection looks at the oldest unanswered add every
    ``tick = min(1 s, add_entry_timeout_s / 4)``; when the same add has been the
    oldest for ``add_entry_timeout_s`` seconds (so it is detected between the
    timeout and the timeout + 2 ticks after it became the oldest), the stream
    is failed: every add in flight or queued gets ``STATUS_UNAVAILABLE``, which
    the ledger handles treat as this bookie failing. Nothing is done per add.
    ``add_entry_timeout_s=None`` disables it.
    """

    def __init__(self, address: str, rpc_timeout_s: float = 10.0,
                 add_entry_timeout_s: Optional[float] = DEFAULT_ADD_ENTRY_TIMEOUT_S,
                 corrupt_counter: Optional[collections.Counter] = None):
        self.address = address
        # Digest mismatches read from this bookie (count); also added to corrupt_counter[address].
        self.corrupt_entries = 0
        self._corrupt_counter = corrupt_counter
        # The bookie's cookie instance id as first seen by this connection, and why it is
        # no longer trusted to say "no such entry" (a different instance answered since).
        self.instance_id: Optional[str] = None
        self.instance_changed: Optional[str] = None
        self.rpc_timeout_s = rpc_timeout_s
        self.add_entry_timeout_s = add_entry_timeout_s
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
        if self.add_entry_timeout_s is not None:
            self._tasks.append(asyncio.create_task(self._watchdog(call)))

    async def _watchdog(self, call) -> None:
        """Fail the stream when its oldest unanswered add stays unanswered for the add timeout."""
        timeout = self.add_entry_timeout_s
        tick = max(0.005, min(1.0, timeout / 4))
        loop = asyncio.get_running_loop()
        head, since = None, 0.0
        while self._call is call:
            await asyncio.sleep(tick)
            in_flight = self._in_flight
            if not in_flight:
                head = None
                continue
            oldest = in_flight[0]
            now = loop.time()
            if oldest is not head:
                head, since = oldest, now
            elif now - since >= timeout:
                self._fail_stream(call, f"bookie {self.address} left an add of {oldest[1]}:{oldest[2]} "
                                        f"unanswered for {timeout:g} s (add entry timeout)")
                return

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
        """Entries ``first..last`` (inclusive) of a ledger from this bookie, each verified
        against the CRC32C its writer stored with it (DigestManager).

        Raises NoSuchEntryError / NoSuchLedgerError / BookieUnavailableError, and
        DigestMismatchError (logged and counted) when an entry's bytes do not match
        its checksum: the caller reads another replica. A "no such entry / ledger"
        from a bookie whose instance id changed raises BookieUnavailableError."""
        out: list[bytes] = []
        try:
            call = self.stub.ReadEntries(
                pb.ReadEntriesRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last),
                timeout=self.rpc_timeout_s)
            async for response in call:
                for e in response.entries:
                    payload = e.payload
                    if e.HasField("crc32c"):
                        actual = _crc32c(payload)
                        if actual != e.crc32c:
                            call.cancel()
                            raise self._digest_mismatch(ledger_id, e.entry_id, e.crc32c, actual, len(payload))
                    out.append(payload)
        except grpc.aio.AioRpcError as exc:
            error = _map_rpc_error(exc, self.address)
            if self.instance_changed and isinstance(error, (NoSuchEntryError, NoSuchLedgerError)):
                raise BookieUnavailableError(f"{error}; not trusted: {self.instance_changed}") from None
            raise error from None
        if len(out) != last - first + 1:
            raise NoSuchEntryError(f"bookie {self.address} returned {len(out)} of {last - first + 1} entries")
        return out

    def _digest_mismatch(self, ledger_id: int, entry_id: int, stored: int, actual: int,
                         size: int) -> DigestMismatchError:
        self.corrupt_entries += 1
        if self._corrupt_counter is not None:
            self._corrupt_counter[self.address] += 1
        msg = (f"bookie {self.address}: entry {ledger_id}:{entry_id} is corrupt: CRC32C 0x{actual:08x} of its "
               f"{size} bytes does not match the writer's 0x{stored:08x}")
        log.error("%s (corrupt replica #%d from this bookie); reading another replica", msg, self.corrupt_entries)
        return DigestMismatchError(msg)

    def _note_instance(self, instance_id: str) -> None:
        """Remember the bookie's instance id; a different one later means the bookie at this
        address was wiped and re-initialized (its old entries are gone)."""
        if not instance_id:
            return
        if self.instance_id is None:
            self.instance_id = instance_id
        elif instance_id != self.instance_id and self.instance_changed is None:
            self.instance_changed = (f"bookie {self.address} is now instance {instance_id}, not instance "
                                     f"{self.instance_id} that this client knew: its data dir was re-initialized")
            log.error("%s; its 'no such entry' answers no longer count", self.instance_changed)

    async def read_last_add_confirmed(self, ledger_id: int) -> pb.ReadLastAddConfirmedResponse:
        try:
            resp = await self.stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=ledger_id),
                                                        timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _map_rpc_error(exc, self.address) from None
        self._note_instance(resp.instance_id)
        return resp

    async def fence(self, ledger_id: int, master_key: bytes) -> pb.FenceResponse:
        try:
            resp = await self.stub.Fence(pb.LedgerRequest(ledger_id=ledger_id, master_key=master_key),
                                         timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _map_rpc_error(exc, self.address) from None
        self._note_instance(resp.instance_id)
        return resp

    async def get_bookie_info(self) -> pb.BookieInfo:
        """The bookie's instance id, cookie address and read-only state."""
        try:
            resp = await self.stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _map_rpc_error(exc, self.address) from None
        self._note_instance(resp.instance_id)
        return resp

    async def delete_ledger(self, ledger_id: int, master_key: bytes) -> None:
        """Delete the ledger on this bookie; ``master_key`` must be the ledger's (the bookie
        answers PERMISSION_DENIED -> UnauthorizedAccessError otherwise)."""
        try:
            await self.stub.DeleteLedger(pb.LedgerRequest(ledger_id=ledger_id, master_key=master_key),
                                         timeout=self.rpc_timeout_s)
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
    return BookieProtocolError(f"ledger {ledger_id}: status {_status_name(status)}: {message}")


def _status_name(status: int) -> str:
    """``AddStatus`` name of ``status`` (its number when unknown, UNAVAILABLE for -1)."""
    if status == STATUS_UNAVAILABLE:
        return "UNAVAILABLE"
    return pb.AddStatus.Name(status) if status in pb.AddStatus.values() else str(status)


class _PendingAdd:
    """One add in flight (BookKeeper's PendingAddOp): completes ``future`` or, for
    internal callers, calls ``callback(ctx, entry_id, error)`` (no future, no
    extra loop round trip).

    ``ws``: addresses (frozenset) of the entry's write set in the CURRENT
    ensemble, replaced by an ensemble change; ``acked``: the addresses of
    ``ws`` that stored the entry (an ensemble change drops the replaced ones,
    as ``AckSet.removeBookieAndCheck``).
    """

    __slots__ = ("entry_id", "payload", "future", "acked", "done", "callback", "ctx", "ws")

    def __init__(self, entry_id: int, payload: bytes, future: Optional[asyncio.Future],
                 callback: Optional[Callable] = None, ctx=None, ws: frozenset = frozenset()):
        self.entry_id = entry_id
        self.payload = payload
        self.future = future
        self.acked: set[str] = set()   # bookie addresses of ``ws`` that stored it
        self.done = False
        self.callback = callback
        self.ctx = ctx
        self.ws = ws

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


# Add statuses that fail the whole handle instead of the answering bookie
# (PendingAddOp.writeComplete: fenced / unauthorized are unrecoverable; a too
# large entry is too large for every bookie).
_HANDLE_FATAL_STATUSES = frozenset((pb.E_LEDGER_FENCED, pb.E_UNAUTHORIZED_ACCESS, pb.E_ENTRY_TOO_LARGE))


class LedgerHandle:
    """An open ledger: the writer's handle (``add_entry``) or a read-only one.

    Attributes: ``ledger_id``; ``last_add_confirmed`` (entry id, -1 when empty);
    ``length`` (bytes acknowledged by this writer); ``metadata`` (LedgerMetadata);
    ``ensemble_changes`` (count of ensemble changes this writer made) and
    ``entries_resent`` (count of (entry, bookie) add requests re-sent by them).

    Writer rules (BookKeeper's ``LedgerHandle`` / ``PendingAddOp``):

    * an entry completes once Qa bookies of its current write set acknowledged
      it and every earlier entry completed; no entry completes while an
      ensemble change is in progress (``changingEnsemble``);
    * an EOK from a bookie not in the entry's current write set is ignored, and
      so is a failure reported by such a bookie (it was already replaced);
    * E_LEDGER_FENCED / E_UNAUTHORIZED_ACCESS / E_ENTRY_TOO_LARGE fail every
      pending add and the handle (``_fail_all``); every other error status, a
      broken stream and an add timeout mark that bookie failed: one ensemble
      change per failed bookie (failures reported while a change is in
      progress are handled by the next one), each pending entry re-sent once
      to the bookies that replaced members of its write set;
    * after ``_fail_all`` nothing completes any more (the LAC is final) and
      ``close()`` writes CLOSED at the LAC without talking to any bookie.
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
        self._ensemble_lock = asyncio.Lock()   # ensemble changes and close() write metadata one at a time
        self._changing_ensemble = False
        self._failed_bookies: dict[str, str] = {}   # address -> reason, awaiting the ensemble change
        self._ensemble_task: Optional[asyncio.Task] = None
        self.ensemble_changes = 0
        self.entries_resent = 0
        self._closing = False
        self._read_rotation = 0
        self._drained: Optional[asyncio.Future] = None  # set when _pending empties (close)
        # Write path cache (current fragment): per entry_id % E, the write set as
        # (address, connection) pairs and as a frozenset of addresses; rebuilt
        # when the metadata object changes.
        self._ws_metadata = None
        self._ws_sets: list[tuple[tuple[str, BookieConnection], ...]] = []
        self._ws_addrs: list[frozenset] = []
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
        or the error that broke the handle (LedgerFencedError, NotEnoughBookiesError,
        ...); the future fails with such an error when the handle breaks later.
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
        if self._ws_metadata is not self.metadata:
            self._build_write_sets()
        idx = entry_id % len(self._ws_sets)
        op = _PendingAdd(entry_id, payload, future, callback, ctx, self._ws_addrs[idx])
        self._pending.append(op)
        # One serialization shared by the whole write set.
        framed = _framed_add(self._add_prefix + pb.AddEntryRequest(
            entry_id=entry_id, payload=payload, last_add_confirmed=self.last_add_confirmed,
            crc32c=_crc32c(payload)).SerializeToString())
        ledger_id = self.ledger_id
        on_result = self._on_result_cb
        failed = self._failed_bookies
        for address, conn in self._ws_sets[idx]:
            if failed and address in failed:
                continue  # being replaced: the ensemble change sends it to the replacement
            if conn._closed:  # the client's connections were closed and re-created since
                conn = self.bk.connection(address)
            conn._enqueue(framed, ledger_id, entry_id, on_result, op)

    def _build_write_sets(self) -> None:
        md = self.metadata
        ens = list(md.fragments[-1].ensemble)
        e, qw = len(ens), md.write_quorum_size
        conns = {a: self.bk.connection(a) for a in ens}
        self._ws_sets = [tuple((ens[(i + j) % e], conns[ens[(i + j) % e]]) for j in range(qw)) for i in range(e)]
        self._ws_addrs = [frozenset(a for a, _ in ws) for ws in self._ws_sets]
        # ledger_id and master_key never change: serialized once, prepended to every add.
        self._add_prefix = pb.AddEntryRequest(ledger_id=self.ledger_id, master_key=md.password).SerializeToString()
        self._ws_metadata = md

    async def add_entry(self, payload: bytes) -> int:
        """Add one entry and wait until Qa bookies stored it; returns its entry id."""
        return await self.add_entry_nowait(payload)

    def _send(self, op: _PendingAdd, address: str) -> None:
        """Re-send a pending add to one bookie (after an ensemble change)."""
        self.entries_resent += 1
        request = pb.AddEntryRequest(
            ledger_id=self.ledger_id, entry_id=op.entry_id, master_key=self.metadata.password,
            payload=op.payload, last_add_confirmed=self.last_add_confirmed, crc32c=_crc32c(op.payload))
        self.bk.connection(address)._enqueue(_framed_add(request.SerializeToString()), self.ledger_id, op.entry_id,
                                             self._on_result_cb, op)

    def _on_result(self, op: _PendingAdd, address: str, status: int, message: str) -> None:
        """One bookie's answer to one add (PendingAddOp.writeComplete)."""
        if op.done:
            return  # completed, or failed by _fail_all: nothing moves the LAC any more
        if status == pb.EOK:
            if address not in op.ws:
                return  # a bookie that an ensemble change replaced: its copy does not count
            acked = op.acked
            acked.add(address)
            if len(acked) >= self.metadata.ack_quorum_size and op is self._pending[0] \
                    and not self._changing_ensemble:
                self._complete_in_order()
            return
        if status in _HANDLE_FATAL_STATUSES:
            self._fail_all(_status_error(status, message, self.ledger_id))
            return
        if address not in op.ws:
            return  # already replaced
        if status != STATUS_UNAVAILABLE:
            message = f"status {_status_name(status)}: {message}"
        self._bookie_failed(address, message)

    def _complete_in_order(self) -> None:
        if self._changing_ensemble:
            return
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
        """Fail every pending add and the handle (BookKeeper's errorOutPendingAdds +
        handleUnrecoverableErrorDuringAdd). The LAC stays where it is: answers that
        arrive later are ignored, and ``close()`` closes the ledger at this LAC."""
        if self._error is None:
            self._error = error
            log.warning("ledger %d: failing %d pending adds at LAC %d: %s", self.ledger_id, len(self._pending),
                        self.last_add_confirmed, error)
        self._failed_bookies.clear()
        while self._pending:
            op = self._pending.popleft()
            op.done = True
            op.fail(error)
        self._set_drained()

    def _bookie_failed(self, address: str, reason: str) -> None:
        """A bookie of the current ensemble failed an add: schedule ONE ensemble change for it
        (LedgerHandle.handleBookieFailure). Completions stop until the change is done."""
        if self._error is not None or address in self._failed_bookies:
            return
        self.bk.mark_failed(address)
        if self.bk._closed:
            self._fail_all(ClientClosedError(f"ledger {self.ledger_id}: the bookie client was closed ({reason})"))
            return
        log.warning("ledger %d: bookie %s failed: %s", self.ledger_id, address, reason)
        self._failed_bookies[address] = reason
        self._changing_ensemble = True
        if self._ensemble_task is None:
            self._ensemble_task = asyncio.ensure_future(self._change_ensemble())

    async def _change_ensemble(self) -> None:
        """Replace the failed bookies of the current ensemble by spares from LAC+1 on, then
        re-send each pending entry once to the replacements of its write set
        (LedgerHandle.ensembleChange + PendingAddOp.unsetSuccessAndSendWriteRequest)."""
        try:
            async with self._ensemble_lock:
                while self._failed_bookies and self._error is None:
                    failed = dict(self._failed_bookies)
                    ensemble = self.ensemble
                    replace = [b for b in ensemble if b in failed]
                    if not replace or not self._pending or self.metadata.state != LedgerState.OPEN:
                        # Nothing waits on them (or the ledger is being closed): the next add
                        # to a failed bookie reports it again.
                        self._failed_bookies.clear()
                        break
                    new_ensemble = list(ensemble)
                    exclude = set(ensemble) | set(failed)
                    for b in replace:
                        spare = self.bk.pick_spare(exclude=list(exclude))
                        if spare is None and await self.bk.revive_quarantined(exclude=exclude):
                            spare = self.bk.pick_spare(exclude=list(exclude))
                        if spare is None:
                            self._fail_all(NotEnoughBookiesError(
                                f"ledger {self.ledger_id}: bookie(s) {replace} failed ({'; '.join(failed.values())}) "
                                f"and no spare bookie is available (ensemble {ensemble}, known bookies "
                                f"{self.bk.bookies})"))
                            return
                        new_ensemble[new_ensemble.index(b)] = spare
                        exclude.add(spare)
                    # No entry completed since the failure (completions are held), so
                    # every entry below ``first`` was acknowledged by the old ensemble.
                    first = self.last_add_confirmed + 1
                    md = metadata_pb2.LedgerMetadata()
                    md.CopyFrom(self.metadata)
                    if md.fragments[-1].first_entry_id >= first:
                        del md.fragments[-1].ensemble[:]
                        md.fragments[-1].ensemble.extend(new_ensemble)
                    else:
                        md.fragments.add(first_entry_id=first, ensemble=new_ensemble)
                    try:
                        version = await self.bk.metadata.put(ledger_path(self.ledger_id), md.SerializeToString(),
                                                             expected_version=self._version)
                    except Exception as exc:
                        self._fail_all(await self._metadata_write_error("ensemble change", exc))
                        return
                    if self._error is not None:
                        return
                    self._version = version
                    for b in replace:
                        self._failed_bookies.pop(b, None)
                    old_addrs = self._ws_addrs
                    self.metadata = md
                    self._build_write_sets()
                    self.ensemble_changes += 1
                    log.info("ledger %d: ensemble change from entry %d: %s replaced by %s", self.ledger_id, first,
                             replace, [new_ensemble[ensemble.index(b)] for b in replace])
                    self._resend_after_change(old_addrs)
        finally:
            self._ensemble_task = None
            self._changing_ensemble = False
            if self._pending and self._error is None:
                self._complete_in_order()

    def _resend_after_change(self, old_addrs: list[frozenset]) -> None:
        """Point every pending op at its new write set, drop acks of replaced bookies and
        send the entry to the bookies that joined its write set (each once)."""
        new_addrs = self._ws_addrs
        joined = [new - old for new, old in zip(new_addrs, old_addrs)]
        n = len(new_addrs)
        for op in list(self._pending):
            idx = op.entry_id % n
            ws = op.ws = new_addrs[idx]
            added = joined[idx]
            if added:
                op.acked &= ws   # AckSet.removeBookieAndCheck
                for address in added:
                    self._send(op, address)

    async def _metadata_write_error(self, what: str, exc: Exception) -> BKException:
        """The error for a failed metadata write: LedgerFencedError when another client
        changed the ledger's metadata (a recovery took it over), else MetadataStoreError."""
        try:
            md, version = await self.bk.get_metadata(self.ledger_id)
        except Exception as read_exc:  # the store is unavailable: we cannot tell
            return MetadataStoreError(f"ledger {self.ledger_id}: {what} failed: {exc}; "
                                      f"metadata not readable: {read_exc}")
        if version != self._version or md.state != LedgerState.OPEN:
            return LedgerFencedError(f"ledger {self.ledger_id}: metadata changed under the writer during "
                                     f"{what} ({exc}); state {LedgerState.Name(md.state)}")
        return MetadataStoreError(f"ledger {self.ledger_id}: {what} failed: {exc}")

    async def close(self) -> None:
        """Wait for pending adds, then mark the ledger CLOSED at its LAC in metadata.

        Works on a handle whose adds failed (``_fail_all``: NotEnoughBookiesError,
        ...): it only writes metadata (no bookie needed), with ``last_entry_id`` =
        the writer's LAC. A fenced handle (a recovery took the ledger over) is
        just marked not writable. Idempotent; read-only handles just drop their
        state. Raises LedgerFencedError when the metadata changed under the
        writer, MetadataStoreError when the store failed.
        """
        if not self.writable or self._closing:
            return
        self._closing = True
        if self._pending:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)
        async with self._ensemble_lock:
            try:
                if isinstance(self._error, LedgerFencedError):
                    return
                md = metadata_pb2.LedgerMetadata()
                md.CopyFrom(self.metadata)
                md.state = LedgerState.CLOSED
                md.last_entry_id = self.last_add_confirmed
                md.length = self.length
                try:
                    version = await self.bk.metadata.put(ledger_path(self.ledger_id), md.SerializeToString(),
                                                         expected_version=self._version)
                except Exception as exc:
                    raise await self._metadata_write_error("close", exc) from None
                self._version = version
                self.metadata = md
            finally:
                self.writable = False

    # ---- reads --------------------------------------------------------
    async def read_entries(self, first: int, last: int) -> list[bytes]:
        """Entries ``first..last`` inclusive (bytes each), up to the LAC / last entry.

        Each entry is read from a bookie of its write set, falling back to the next
        bookie when one fails. Raises NoSuchEntryError for ids outside 0..LAC or when
        Qw-Qa+1 bookies of an entry's write set say they do not have it, and
        BookieUnavailableError when an entry could not be read because bookies were
        unreachable or failing (retry later: the entry may exist).
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
            try:
                return await self._read_with_fallback(order, first, last)
            except BKException:
                if last == first:
                    raise
            # No bookie has the whole range (with Qa < Qw each may miss other
            # entries) or bookies failed: read entry by entry, each with fallback.
            return await self._read_each(first, last)
        # Striped ensemble: entries e..e+Qw-1 all live on ens[(e+Qw-1) % E] (the
        # round-robin write sets overlap there), so read blocks of Qw entries, one
        # range read each, concurrently; a block that fails is read entry by entry.
        qw = self.metadata.write_quorum_size
        results = await asyncio.gather(*(
            self._read_striped_block(ens, s, min(last, s + qw - 1)) for s in range(first, last + 1, qw)),
            return_exceptions=True)
        return [payload for block in _first_error_or(results) for payload in block]

    async def _read_striped_block(self, ens: list[str], first: int, last: int) -> list[bytes]:
        if last > first:
            holder = ens[last % len(ens)]  # holds every entry of first..last (last - first < Qw)
            if not self.bk.is_failed(holder):
                try:
                    return await self.bk.connection(holder).read_entries(self.ledger_id, first, last)
                except BKException as exc:
                    if isinstance(exc, BookieUnavailableError):
                        self.bk.mark_failed(holder)
        return await self._read_each(first, last)

    async def _read_each(self, first: int, last: int) -> list[bytes]:
        """Entries first..last, each read from its write set with fallback, concurrently.
        Raises the first entry's error in entry order, preferring errors other than
        NoSuchEntryError (an unreachable bookie must not read as "absent")."""
        results = await asyncio.gather(*(
            self._read_with_fallback(sorted(self.write_set(e), key=self.bk.is_failed), e, e)
            for e in range(first, last + 1)), return_exceptions=True)
        return [r[0] for r in _first_error_or(results)]

    async def _read_with_fallback(self, bookies: list[str], first: int, last: int) -> list[bytes]:
        """Entries first..last from the first of ``bookies`` that has them all.

        Raises NoSuchEntryError only when at least Qw-Qa+1 of them answered "no such
        entry / ledger" (PendingReadOp's maxMissedReadsAllowed = Qw - Qa: then no ack
        quorum can hold the entries); otherwise BookieUnavailableError.
        """
        errors = []
        negatives = 0
        for address in bookies:
            try:
                return await self.bk.connection(address).read_entries(self.ledger_id, first, last)
            except (NoSuchEntryError, NoSuchLedgerError) as exc:
                negatives += 1
                errors.append(str(exc))
            except BKException as exc:
                if isinstance(exc, BookieUnavailableError):
                    self.bk.mark_failed(address)
                errors.append(str(exc))
        md = self.metadata
        if negatives >= min(len(bookies), md.write_quorum_size - md.ack_quorum_size + 1):
            raise NoSuchEntryError(f"ledger {self.ledger_id}: entries {first}..{last} not stored: {'; '.join(errors)}")
        raise BookieUnavailableError(
            f"ledger {self.ledger_id}: entries {first}..{last} not readable ({negatives} bookies answered "
            f"'no such entry'): {'; '.join(errors)}")


def _first_error_or(results: list):
    """``results`` of ``gather(return_exceptions=True)`` when none failed; else raise the
    first error that is not NoSuchEntryError, or the first NoSuchEntryError."""
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        for err in errors:
            if not isinstance(err, NoSuchEntryError):
                raise err
        raise errors[0]
    return results


def _has_quorum_coverage(ensemble: list[str], write_quorum: int, ack_quorum: int, responders) -> bool:
    """True when every write set of ``ensemble`` has at least Qw-Qa+1 bookies in ``responders``
    (RoundRobinDistributionSchedule's quorum coverage: then no ack quorum of any entry
    can be made only of bookies that did not respond)."""
    e = len(ensemble)
    need = write_quorum - ack_quorum + 1
    for i in range(e):
        if sum(1 for j in range(write_quorum) if ensemble[(i + j) % e] in responders) < need:
            return False
    return True


class BookKeeper:
    """Entry point of the bookie client (BookKeeper's ``BookKeeper`` class).

    ``bookies``: addresses ``host:port`` of every bookie the client may use;
    ensembles are chosen among them, the others are spares for ensemble changes.
    ``max_entry_size_bytes``: client-side limit checked before an add (default 5 MiB).
    ``rpc_timeout_s``: deadline of each read / fence / LAC / delete RPC, seconds.
    ``add_entry_timeout_s``: an add a bookie leaves unanswered this long (seconds,
    default 30, BookKeeper's addEntryTimeout; Pulsar sets it from
    bookkeeperClientTimeoutInSeconds) counts as that bookie failing: ensemble
    change when a spare exists, else the ledger handle fails with
    NotEnoughBookiesError. ``None`` disables it.
    ``failed_bookie_quarantine_s``: a failed bookie is not chosen for new
    ensembles or as a spare for this long (seconds).
    """

    def __init__(self, metadata: MetadataAccess, bookies: list[str], *,
                 max_entry_size_bytes: int = 5 * 1024 * 1024, rpc_timeout_s: float = 10.0,
                 failed_bookie_quarantine_s: float = 30.0,
                 add_entry_timeout_s: Optional[float] = DEFAULT_ADD_ENTRY_TIMEOUT_S):
        if not bookies:
            raise ValueError("BookKeeper client needs at least one bookie address")
        if add_entry_timeout_s is not None and not add_entry_timeout_s > 0:
            raise ValueError(f"add_entry_timeout_s must be > 0 seconds or None, got {add_entry_timeout_s!r}")
        self.metadata = metadata
        self.bookies = list(bookies)
        self.max_entry_size_bytes = max_entry_size_bytes
        self.rpc_timeout_s = rpc_timeout_s
        self.add_entry_timeout_s = add_entry_timeout_s
        self.quarantine_s = failed_bookie_quarantine_s
        self._connections: dict[str, BookieConnection] = {}
        self._failed_at: dict[str, float] = {}
        self._closed = False
        # Digest mismatches read, per bookie address (DigestManager): corrupt replicas seen.
        self.corrupt_replicas: collections.Counter = collections.Counter()

    def connection(self, address: str) -> BookieConnection:
        conn = self._connections.get(address)
        if conn is None:
            conn = self._connections[address] = BookieConnection(address, self.rpc_timeout_s,
                                                                  self.add_entry_timeout_s, self.corrupt_replicas)
        return conn

    def mark_failed(self, address: str) -> None:
        self._failed_at[address] = time.monotonic()

    def is_failed(self, address: str) -> bool:
        t = self._failed_at.get(address)
        return t is not None and time.monotonic() - t < self.quarantine_s

    def pick_spare(self, exclude: list[str]) -> Optional[str]:
        """A random healthy bookie not in ``exclude`` (addresses), or None."""
        candidates = [b for b in self.bookies if b not in exclude and not self.is_failed(b)]
        return random.choice(candidates) if candidates else None

    async def revive_quarantined(self, exclude=()) -> int:
        """Probe the quarantined bookies not in ``exclude`` (one ReadLastAddConfirmed each,
        PROBE_TIMEOUT_S); those that answer leave quarantine. Returns how many did.
        Used when too few healthy bookies are left for an ensemble or a spare, as
        BookKeeper's placement falls back to quarantined bookies then."""
        quarantined = [b for b in self.bookies if b not in exclude and self.is_failed(b)]
        if not quarantined:
            return 0

        async def alive(address: str) -> bool:
            try:
                await self.connection(address).stub.ReadLastAddConfirmed(
                    pb.LedgerRequest(ledger_id=0), timeout=PROBE_TIMEOUT_S, wait_for_ready=True)
                return True
            except grpc.aio.AioRpcError as exc:
                return exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                          grpc.StatusCode.CANCELLED)

        results = await asyncio.gather(*(alive(b) for b in quarantined))
        revived = 0
        for address, ok in zip(quarantined, results):
            if ok:
                self._failed_at.pop(address, None)
                revived += 1
                log.info("bookie %s answers again: back in the ensemble choices", address)
        return revived

    async def create_ledger(self, ensemble_size: int, write_quorum: int, ack_quorum: int) -> LedgerHandle:
        """Create a ledger on ``ensemble_size`` healthy bookies; returns the writer's handle.

        Requires ensemble_size >= write_quorum >= ack_quorum >= 1 (ValueError otherwise);
        raises NotEnoughBookiesError when fewer healthy bookies are known.
        """
        if not (ensemble_size >= write_quorum >= ack_quorum >= 1):
            raise ValueError(f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                             f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}")
        healthy = [b for b in self.bookies if not self.is_failed(b)]
        if len(healthy) < ensemble_size and await self.revive_quarantined():
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
        """Open a ledger read-only. A CLOSED ledger opens as it is; an OPEN (or
        IN_RECOVERY) one is recovered (fenced and closed) when ``recovery`` is true,
        otherwise readable up to the highest LAC its bookies report (at least up to
        the entry before the last fragment, BOOKKEEPER #2615).

        Raises NoSuchLedgerError (no metadata) and, for a recovery, what
        ``_recover`` raises (BookieUnavailableError when the recovery cannot decide
        where the ledger ends: the ledger stays IN_RECOVERY, open it again later)."""
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
        handle.last_add_confirmed = max(lacs + [md.fragments[-1].first_entry_id - 1])
        return handle

    async def _recover(self, ledger_id: int, md, version: int) -> LedgerHandle:
        """BookKeeper's LedgerRecoveryOp: fence, read forward from the LAC, write back, close.

        1. Metadata -> IN_RECOVERY (stays so if this raises: a later open retries).
        2. Fence the last fragment's ensemble; every write set needs Qw-Qa+1 bookies
           answering (quorum coverage), else BookieUnavailableError.
        3. LAC = max(LAC the fenced bookies report, last fragment's first entry - 1)
           (BOOKKEEPER #2615).
        4. Read forward from LAC+1: an entry any bookie returns is written back to
           Qa bookies of its write set (else BookieUnavailableError); an entry is
           absent only when Qw-Qa+1 bookies of its write set answer "no such
           entry / ledger" -- then the ledger ends before it. If neither can be
           decided (bookies unreachable or failing), BookieUnavailableError.
        5. Metadata -> CLOSED at the last entry written back.
        """
        md.state = LedgerState.IN_RECOVERY
        version = await self.metadata.put(ledger_path(ledger_id), md.SerializeToString(), expected_version=version)
        last_frag = md.fragments[-1]
        ensemble = list(last_frag.ensemble)
        results = await asyncio.gather(*(self.connection(b).fence(ledger_id, md.password) for b in ensemble),
                                       return_exceptions=True)
        answered = {b: r for b, r in zip(ensemble, results) if not isinstance(r, BaseException)}
        for b, r in zip(ensemble, results):
            if isinstance(r, BookieUnavailableError):
                self.mark_failed(b)  # fast-path reads try it last
        if not _has_quorum_coverage(ensemble, md.write_quorum_size, md.ack_quorum_size, answered):
            errors = [f"{b}: {r}" for b, r in zip(ensemble, results) if isinstance(r, BaseException)]
            raise BookieUnavailableError(
                f"ledger {ledger_id}: recovery needs {md.write_quorum_size - md.ack_quorum_size + 1} bookies of "
                f"every write set of {ensemble} to fence, only {sorted(answered)} answered: {errors}")
        reported_lac = max(r.last_add_confirmed for r in answered.values())
        lac = max(reported_lac, last_frag.first_entry_id - 1)
        handle = LedgerHandle(self, ledger_id, md, version, writable=False)
        handle.last_add_confirmed = lac
        # Entries up to the LAC are known to be at Qa; entries above it are read
        # forward and written back until one is absent. The LAC the writer
        # piggy-backs lags by its whole pipeline (thousands of entries under
        # load), so first go in chunks up to the highest entry a fenced bookie
        # stores: one range read and one pipelined write-back per chunk. A chunk
        # that is not fully readable proves nothing (a bookie may just be
        # unreachable): its entries are then read strictly, each from its whole
        # write set, which decides "present", "absent" or "cannot tell" (raise).
        entry = lac + 1
        written_back = 0
        known_last = max(r.last_entry_id for r in answered.values())
        chunk = RECOVERY_FIRST_CHUNK_ENTRIES
        while True:
            if entry <= known_last:
                end = min(known_last, entry + chunk - 1)
                try:
                    payloads = await handle._read_range(entry, end)
                except BKException as exc:
                    log.info("ledger %d recovery: entries %d..%d not all readable at once (%s); reading them "
                             "one by one from their write sets", ledger_id, entry, end, exc)
                    payloads = None
                if payloads is not None:
                    await self._write_back_many(handle, entry, payloads)
                    handle.last_add_confirmed = end
                    written_back += len(payloads)
                    entry = end + 1
                    avg = max(1, sum(len(p) for p in payloads) // len(payloads))
                    chunk = max(1, min(RECOVERY_MAX_CHUNK_ENTRIES, RECOVERY_CHUNK_BYTES // avg))
                    continue
            else:
                end = entry  # beyond what any fenced bookie stores: one entry at a time
            absent = False
            while entry <= end and not absent:
                window_end = min(end, entry + RECOVERY_STRICT_WINDOW - 1)
                payloads, absent = await self._recovery_read_window(handle, entry, window_end)
                if payloads:
                    await self._write_back_many(handle, entry, payloads)
                    handle.last_add_confirmed = entry + len(payloads) - 1
                    written_back += len(payloads)
                    entry += len(payloads)
            if absent:
                break
        md.state = LedgerState.CLOSED
        md.last_entry_id = handle.last_add_confirmed
        version = await self.metadata.put(ledger_path(ledger_id), md.SerializeToString(), expected_version=version)
        handle._version = version
        handle.metadata = md
        log.info("ledger %d recovered: closed at entry %d (bookies' LAC %d, floor %d, %d entries written back)",
                 ledger_id, md.last_entry_id, reported_lac, last_frag.first_entry_id - 1, written_back)
        return handle

    async def _recovery_read_window(self, handle: LedgerHandle, first: int,
                                    last: int) -> tuple[list[bytes], bool]:
        """Recovery reads of entries first..last, concurrently. Returns (payloads of the
        present prefix, True if the entry after that prefix is absent). Raises
        BookieUnavailableError when an entry before the first absent one cannot be decided."""
        results = await asyncio.gather(*(self._recovery_read(handle, e) for e in range(first, last + 1)),
                                       return_exceptions=True)
        payloads: list[bytes] = []
        for r in results:
            if isinstance(r, BaseException):
                raise r
            if r is None:
                return payloads, True
            payloads.append(r)
        return payloads, False

    async def _recovery_read(self, handle: LedgerHandle, entry_id: int) -> Optional[bytes]:
        """One recovery read (PendingReadOp in recovery mode): ask every bookie of the
        entry's write set at once. Returns the payload as soon as one has it, None once
        Qw-Qa+1 answered "no such entry / ledger" (no ack quorum can hold it), and
        raises BookieUnavailableError when all answered without deciding."""
        ws = handle.write_set(entry_id)
        need = handle.metadata.write_quorum_size - handle.metadata.ack_quorum_size + 1
        tasks = {asyncio.ensure_future(self.connection(a).read_entries(handle.ledger_id, entry_id, entry_id)): a
                 for a in ws}
        negatives = 0
        errors = []
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    address = tasks[t]
                    exc = t.exception()
                    if exc is None:
                        return t.result()[0]
                    if isinstance(exc, (NoSuchEntryError, NoSuchLedgerError)):
                        negatives += 1
                        if negatives >= need:
                            return None
                    elif isinstance(exc, BKException):
                        if isinstance(exc, BookieUnavailableError):
                            self.mark_failed(address)
                        errors.append(f"{address}: {exc}")
                    else:
                        raise exc
        finally:
            for t in tasks:
                t.cancel()
        raise BookieUnavailableError(
            f"ledger {handle.ledger_id}: recovery cannot tell whether entry {entry_id} exists: {negatives} of "
            f"write set {ws} answered 'no such entry', {need} needed; {'; '.join(errors)}")

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
                                             last_add_confirmed=entry_id - 1, recovery=True,
                                             crc32c=_crc32c(payload))
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
        bookies = sorted({b for frag in md.fragments for b in frag.ensemble})
        results = await asyncio.gather(*(self.connection(b).delete_ledger(ledger_id, md.password) for b in bookies),
                                       return_exceptions=True)
        for address, r in zip(bookies, results):
            if isinstance(r, BaseException):
                log.warning("ledger %d: delete on bookie %s failed: %s", ledger_id, address, r)
        try:
            await self.metadata.delete(ledger_path(ledger_id))
        except Exception:  # already gone
            pass

    async def close(self) -> None:
        """Close every bookie connection; adds still pending fail with ClientClosedError
        (no ensemble change is attempted for them)."""
        self._closed = True
        for conn in list(self._connections.values()):
            await conn.close()
        self._connections.clear()
