"""One gRPC connection to one bookie (BookKeeper's ``PerChannelBookieClient``):
the add stream with its watchdog (addEntryTimeout), reads verified against the
stored CRC32C (``DigestManager``), LAC reads, fencing, deletes, and the bookie
identity (cookie instance id) seen on this connection.

Used by ``bookie.ledger_handle`` and ``bookie.client``; see ``bookie.client``
for the whole protocol."""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import Callable, Optional

import grpc
from crc32c import crc32c as _crc32c

from proto import bookie_pb2 as pb
from proto import bookie_pb2_grpc
from proto.channels import ChannelSecurity, open_channel
from proto.common import grpc_message_size_options
from proto.tls_errors import describe_tls_failure
from proto.wire import encode_varint

from .errors import (BKException, BookieProtocolError, BookieUnavailableError, DigestMismatchError, EntryTooLargeError,
                     LedgerFencedError, NoSuchEntryError, NoSuchLedgerError, UnauthorizedAccessError)

log = logging.getLogger(__name__)

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
                 corrupt_counter: Optional[collections.Counter] = None,
                 security: Optional[ChannelSecurity] = None):
        self.address = address
        # Digest mismatches read from this bookie (count); also added to corrupt_counter[address].
        self.corrupt_entries = 0
        self._corrupt_counter = corrupt_counter
        # The bookie's cookie instance id as first seen by this connection, and why it is
        # no longer trusted to say "no such entry" (a different instance answered since).
        self.instance_id: Optional[str] = None
        self.instance_changed: Optional[str] = None
        self.last_instance_id: Optional[str] = None   # the latest one an answer carried
        self.rpc_timeout_s = rpc_timeout_s
        self.add_entry_timeout_s = add_entry_timeout_s
        self._channel = open_channel(address, GRPC_CHANNEL_OPTIONS, security)
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
            hint = describe_tls_failure(exc.details() or "", None, self.address) \
                if isinstance(exc, grpc.aio.AioRpcError) else None
            self._fail_stream(call, f"bookie {self.address} unavailable: {hint or exc}")

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
        self.last_instance_id = instance_id
        if self.instance_id is None:
            self.instance_id = instance_id
        elif instance_id != self.instance_id and self.instance_changed is None:
            self.instance_changed = (f"bookie {self.address} is now instance {instance_id}, not instance "
                                     f"{self.instance_id} that this client knew: its data dir was re-initialized")
            log.error("%s; its 'no such entry' answers no longer count", self.instance_changed)

    async def read_last_add_confirmed(self, ledger_id: int) -> pb.ReadLastAddConfirmedResponse:
        """This bookie's ``last_add_confirmed`` and ``last_entry_id`` (entry ids, -1 when none) of
        the ledger and its instance id, which is remembered (BookKeeper's readLastAddConfirmed of
        one bookie). Raises NoSuchLedgerError (no record here) or another error of ``_map_rpc_error``."""
        try:
            resp = await self.stub.ReadLastAddConfirmed(pb.LedgerRequest(ledger_id=ledger_id),
                                                        timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _map_rpc_error(exc, self.address) from None
        self._note_instance(resp.instance_id)
        return resp

    async def fence(self, ledger_id: int, master_key: bytes) -> pb.FenceResponse:
        """Fence the ledger on this bookie (BookKeeper's fencing read of ledger recovery): its normal
        adds are refused from then on. Returns the bookie's LAC, last entry id and instance id
        (remembered). Raises UnauthorizedAccessError (other master key), BookieUnavailableError, ..."""
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
        """Fail every add queued or in flight with ``STATUS_UNAVAILABLE`` (later adds fail at once the
        same way) and close the gRPC channel."""
        self._closed = True
        if self._call is not None:
            self._fail_stream(self._call, f"connection to bookie {self.address} closed")
        await self._channel.close()


def _map_rpc_error(exc: grpc.aio.AioRpcError, address: str) -> BKException:
    code = exc.code()
    detail = f"bookie {address}: {exc.details()}"
    if code == grpc.StatusCode.UNAVAILABLE:
        hint = describe_tls_failure(exc.details() or "", None, address)
        if hint is not None:  # a TLS misconfiguration between broker and bookie: say what to check
            detail = f"bookie {address}: {hint} (bookkeeper_tls_* settings of the broker, tls_* of the bookie)"
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
