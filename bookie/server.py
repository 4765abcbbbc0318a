"""Bookie gRPC server: the BookKeeper bookie protocol over grpc.aio.

``BookieServicer`` maps the RPCs of ``proto/bookie.proto`` onto
:class:`bookie.storage.LedgerStorage`; ``BookieServer`` owns the grpc.aio
server and the storage. Bad input never kills a stream or the server: adds
get a per-add ``AddStatus``, the other RPCs a specific gRPC status code with a
message saying what is wrong.

Disk usage (BookKeeper's LedgerDirsMonitor, :mod:`bookie.disk_monitor`): every
``disk_check_interval_s`` the server measures the storage's disk usage (and each add
request checks the filesystem quickly); at ``disk_usage_threshold`` or more the
bookie turns read-only (normal adds get E_READ_ONLY at once, without being
queued), below ``disk_usage_lwm_threshold`` it is writable again. A commit that
fails because the disk is full also turns it read-only (see bookie.storage).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import tomllib
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from bookie import storage as st
from bookie.disk_monitor import DiskMonitor, next_read_only  # noqa: F401 - next_read_only: re-exported
from proto import bookie_pb2, bookie_pb2_grpc
from proto.channels import ServerSecurity, add_server_port
from proto.common import GRPC_MAX_MESSAGE_BYTES
from proto.frame_errors import InvalidFrameInterceptor

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = GRPC_MAX_MESSAGE_BYTES
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
READ_CHUNK_BYTES = 1024 * 1024


@dataclass
class BookieConfig:
    """Configuration of one bookie process (BookKeeper's bk_server.conf, snake_case).

    port: TCP port to listen on (0 = pick a free one; BookKeeper's default is 3181).
    data_dir: directory holding the ledger database (created if missing).
    journal_sync: fsync each group commit before acknowledging adds (default True).
    max_entry_size_bytes: largest accepted entry payload in bytes (default 5 MiB).
    host: interface to bind (default loopback).
    max_inflight_requests_per_stream: AddEntry request messages (count) one
        stream may have awaiting commit before the bookie stops reading it.
    max_inflight_bytes_per_stream: same limit in payload bytes (a single larger
        message is still accepted when nothing else is in flight).
    disk_usage_threshold: share (0..1) of the disk in use at which the bookie turns
        read-only (BookKeeper's diskUsageThreshold, 0.95).
    disk_usage_lwm_threshold: share below which a read-only bookie is writable again
        (diskUsageLwmThreshold, 0.90; at most disk_usage_threshold).
    disk_check_interval_s: seconds between disk usage checks (diskCheckInterval, 10 s).
    max_db_size_bytes: cap of the ledger database in bytes (None = the disk is the
        limit); its share in use counts as disk usage. Meant for tests and small
        dedicated volumes.
    metadata_store_url: "" (no registration: brokers list this bookie themselves) or
        "etcd://host:port[,host:port...]": register the bookie as available under
        ``/ledgers/available/<advertised host>:<port>`` with a lease (BookKeeper's
        metadataServiceUri and bookie registration; see bookie.registration).
    advertised_address: host name or IP the bookie registers (BookKeeper's
        advertisedAddress); "" = ``host``.
    authentication_enabled: refuse every call without a valid token (status
        UNAUTHENTICATED; the broker sends its ``bookkeeper_client_authentication_parameters``);
        the token keys as the broker's: ``token_secret_key`` or ``token_public_key``
        (``file:///path`` or ``data:;base64,...``), ``authentication_providers``
        (empty = the token provider). BookKeeper's bookie authentication.
    authorized_roles: with authentication, the only roles served (the brokers' token
        subjects); every other role gets PERMISSION_DENIED on every RPC; required when
        authentication_enabled (BookKeeper's BookieAuthZFactory ``authorizedRoles``;
        see bookie.authorization).
    journal_directory: directory of the journal files (BookKeeper's journalDirectories;
        "" = ``<data_dir>/journal``); may sit on its own disk.
    journal_max_size_mb: a journal file is rolled when a group would take it past this
        size (MiB; journalMaxSizeMB). Each checkpoint also rolls it.
    journal_pre_alloc_size_mb: journal files grow in preallocated chunks of this size
        (MiB; journalPreAllocSizeMB; at most 2 % of the journal's filesystem).
    journal_max_group_wait_ms: under load, at most one group commit (one journal write
        and fdatasync) per this many ms; a lone add is written at once
        (journalMaxGroupWaitMSec; default 0: each group is what queued while the previous
        one was written, as BookKeeper's journalFlushWhenQueueEmpty).
    journal_buffered_writes_threshold: payload bytes queued that start the next group at
        once (journalBufferedWritesThreshold).
    flush_interval_ms: checkpoint period (flushInterval): ledger storage is synced, the
        journal mark persisted and the journal files behind it deleted (bookie.checkpoint).
    tls_enabled: serve TLS only (BookKeeper's tlsProvider), with
        tls_certificate_file_path / tls_key_file_path (PEM; BookKeeper's
        tlsCertificatePath / tlsKeyStore). tls_trust_certs_file_path: the CA of
        client certificates (tlsTrustStore); with
        tls_require_trusted_client_cert_on_connect (tlsClientAuthentication)
        only clients presenting a certificate that CA signed (the brokers) connect.
    """

    port: int = 3181
    data_dir: str = "data/bookie"
    journal_sync: bool = True
    max_entry_size_bytes: int = 5 * 1024 * 1024
    host: str = "127.0.0.1"
    max_inflight_requests_per_stream: int = 256
    max_inflight_bytes_per_stream: int = 64 * 1024 * 1024
    disk_usage_threshold: float = 0.95
    disk_usage_lwm_threshold: float = 0.90
    disk_check_interval_s: float = 10.0
    max_db_size_bytes: int | None = None
    metadata_store_url: str = ""
    advertised_address: str = ""
    authentication_enabled: bool = False
    authentication_providers: list = dataclasses.field(default_factory=list)
    token_secret_key: str = ""
    token_public_key: str = ""
    authorized_roles: list = dataclasses.field(default_factory=list)
    journal_directory: str = ""
    journal_max_size_mb: int = st.DEFAULT_JOURNAL_MAX_SIZE_MB
    journal_pre_alloc_size_mb: int = st.DEFAULT_JOURNAL_PRE_ALLOC_SIZE_MB
    journal_max_group_wait_ms: float = st.DEFAULT_JOURNAL_MAX_GROUP_WAIT_MS
    journal_buffered_writes_threshold: int = st.DEFAULT_JOURNAL_BUFFERED_WRITES_THRESHOLD
    flush_interval_ms: int = st.DEFAULT_FLUSH_INTERVAL_MS
    tls_enabled: bool = False
    tls_certificate_file_path: str = ""
    tls_key_file_path: str = ""
    tls_trust_certs_file_path: str = ""
    tls_require_trusted_client_cert_on_connect: bool = False

    @classmethod
    def from_toml(cls, path: str, **overrides: Any) -> "BookieConfig":
        """Load from a TOML file of top-level ``key = value`` pairs named like the fields.

        ``overrides`` (non-None values) win over the file. Raises ``ValueError``
        for unknown keys, ``OSError``/``tomllib.TOMLDecodeError`` for bad files.
        """
        with open(path, "rb") as f:
            data = tomllib.load(f)
        data = data.get("bookie", data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{path}: unknown bookie config keys: {sorted(unknown)}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)


class BookieServicer(bookie_pb2_grpc.BookieServicer):
    """grpc.aio servicer of the Bookie service (BookKeeper's BookieRequestProcessor).

    AddEntry: each request message gets exactly one response message with one
    result per add, sent once the group commit holding its adds is done.
    Responses go out in completion order (normally the request order), so a
    client must match results by (ledger_id, entry_id).
    """

    def __init__(self, storage: st.LedgerStorage, config: BookieConfig) -> None:
        self._storage = storage
        self._config = config
        self._pumps: set[asyncio.Task] = set()
        self._stopping = False
        self.disk_monitor: DiskMonitor | None = None   # set by BookieServer (usage, quick checks)

    def close_streams(self) -> None:
        """Shutdown step: stop reading every AddEntry stream; each one ends (status OK)
        after the responses of the adds already read are sent. New streams get UNAVAILABLE."""
        self._stopping = True
        for pump in list(self._pumps):
            pump.cancel()

    # ------------------------------------------------------------------ AddEntry

    async def AddEntry(self, request_iterator, context):
        """Pipelined adds (BookKeeper's ADD_ENTRY, recovery adds included): stream of
        AddEntriesRequest in, one AddEntriesResponse per request out, a result per add.
        Bad adds get a per-add AddStatus, the stream goes on: E_INVALID_REQUEST (negative
        ids, empty master_key, LAC < -1), E_ENTRY_TOO_LARGE, E_READ_ONLY, and from storage
        E_UNAUTHORIZED_ACCESS, E_LEDGER_FENCED, E_DUPLICATE_ENTRY, E_BOOKIE_ERROR. Aborts with
        UNAVAILABLE while shutting down, INVALID_ARGUMENT on an unparsable request message."""
        out: asyncio.Queue = asyncio.Queue()
        window = _Window(self._config.max_inflight_requests_per_stream, self._config.max_inflight_bytes_per_stream)
        if self._stopping:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "bookie is shutting down")
        reader = asyncio.create_task(self._pump_adds(request_iterator, window, out))
        self._pumps.add(reader)
        reader.add_done_callback(self._pumps.discard)
        log.debug("AddEntry stream from %s opened", context.peer())
        try:
            while True:
                item = await out.get()
                if item is None:
                    break
                resp, nbytes = item
                window.release(nbytes)
                yield resp
        finally:
            reader.cancel()
        exc = reader.exception() if reader.done() and not reader.cancelled() else None
        if isinstance(exc, DecodeError):
            # A frame that is not an AddEntriesRequest: say so (the answers to the adds
            # read before it were sent above).
            log.warning("AddEntry stream from %s: unparsable request message: %s", context.peer(), exc)
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"AddEntry request message is not a valid AddEntriesRequest: {exc}")
        elif exc is not None:
            log.info("AddEntry stream from %s ended: %r", context.peer(), exc)
        else:
            log.debug("AddEntry stream from %s closed", context.peer())

    async def _pump_adds(self, request_iterator, window: "_Window", out: asyncio.Queue) -> None:
        """Read request messages while the window has room; queue each response once committed.

        Cancelled (shutdown or client gone): stops reading, still waits for the
        adds already submitted, then ends the response stream.
        """
        outstanding: set[asyncio.Future] = set()
        try:
            async for req in request_iterator:
                adds = req.adds
                ops, index, pre_errors, nbytes = self._validate(adds)
                await window.acquire(nbytes)
                if not ops:
                    out.put_nowait((_response(adds, pre_errors, None, None), nbytes))
                    continue
                fut = self._storage.add_entries(ops)
                outstanding.add(fut)

                def done(f, adds=adds, pre_errors=pre_errors, index=index, nbytes=nbytes):
                    """Queue the request's response (its window share, ``nbytes``) once committed."""
                    outstanding.discard(f)
                    out.put_nowait((_response(adds, pre_errors, index, f.result()), nbytes))

                fut.add_done_callback(done)
        finally:
            if outstanding:
                await asyncio.wait(list(outstanding))
            out.put_nowait(None)

    def _validate(self, adds):
        """Stateless checks. Returns (ops, index, pre_errors, nbytes).

        ops: storage tuples for the valid adds; index: position in ``adds`` of
        each op (None when all are valid); pre_errors: {position: (status, msg)};
        nbytes: payload bytes of the valid adds.
        """
        max_size = self._config.max_entry_size_bytes
        if not self._storage.read_only and self.disk_monitor is not None:
            self.disk_monitor.quick_check()
        read_only = self._storage.read_only
        nbytes = 0
        ops = []
        pre_errors: dict[int, tuple[int, str]] = {}
        for i, a in enumerate(adds):
            ledger_id = a.ledger_id
            entry_id = a.entry_id
            key = a.master_key
            payload = a.payload
            lac = a.last_add_confirmed
            if ledger_id < 0 or entry_id < 0:
                pre_errors[i] = (
                    bookie_pb2.E_INVALID_REQUEST,
                    f"ledger_id and entry_id must be >= 0 (got {ledger_id}:{entry_id})",
                )
            elif not key:
                pre_errors[i] = (bookie_pb2.E_INVALID_REQUEST, f"entry {ledger_id}:{entry_id}: empty master_key")
            elif lac < -1:
                pre_errors[i] = (
                    bookie_pb2.E_INVALID_REQUEST,
                    f"entry {ledger_id}:{entry_id}: last_add_confirmed must be >= -1 (got {lac})",
                )
            elif len(payload) > max_size:
                pre_errors[i] = (
                    bookie_pb2.E_ENTRY_TOO_LARGE,
                    f"entry {ledger_id}:{entry_id}: payload of {len(payload)} bytes exceeds "
                    f"max_entry_size_bytes={max_size}",
                )
            elif read_only and not a.recovery:
                pre_errors[i] = (bookie_pb2.E_READ_ONLY, f"bookie is read-only: {self._storage.read_only_reason}")
            else:
                ops.append((ledger_id, entry_id, key, payload, lac, a.recovery,
                            a.crc32c if a.HasField("crc32c") else None))
                nbytes += len(payload)
        index = [i for i in range(len(adds)) if i not in pre_errors] if pre_errors else None
        return ops, index, pre_errors, nbytes

    # ------------------------------------------------------------------ reads

    async def ReadEntries(self, request, context):
        """Stream entries ``first_entry_id..last_entry_id`` (inclusive) of a ledger with their
        stored CRC32C, in chunks of about READ_CHUNK_BYTES (1 MiB) of payload (BookKeeper's
        READ_ENTRY over a range, as BP-62's batched read). INVALID_ARGUMENT for negative ids or
        first > last, NOT_FOUND for an unknown ledger, OUT_OF_RANGE when an entry of the range is
        not stored here, UNAVAILABLE when the storage is closed, INTERNAL on a storage failure."""
        ledger_id, first, last = request.ledger_id, request.first_entry_id, request.last_entry_id
        if ledger_id < 0 or first < 0 or last < 0:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"ledger_id and entry ids must be >= 0 (got ledger {ledger_id}, {first}..{last})")
        if first > last:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"first_entry_id {first} > last_entry_id {last}")
        try:
            await self._storage.check_range(ledger_id, first, last)
            async for chunk in self._storage.read_entries(ledger_id, first, last, READ_CHUNK_BYTES,
                                                          with_checksums=True):
                resp = bookie_pb2.ReadEntriesResponse()
                entries = resp.entries
                for e, p, crc in chunk:
                    if crc is None:
                        entries.add(ledger_id=ledger_id, entry_id=e, payload=p)
                    else:
                        entries.add(ledger_id=ledger_id, entry_id=e, payload=p, crc32c=crc)
                yield resp
        except st.StorageError as exc:
            await _abort_storage(context, exc)

    async def ReadLastAddConfirmed(self, request, context):
        """The committed LAC and last entry id of a ledger on this bookie, with its instance id
        (what BookKeeper's ReadLastConfirmedOp asks each bookie; a read, nothing is fenced).
        INVALID_ARGUMENT for a negative ledger id, NOT_FOUND when no record is held here,
        UNAVAILABLE when the storage is closed."""
        if request.ledger_id < 0:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"ledger_id must be >= 0 (got {request.ledger_id})")
        try:
            lac, last = await self._storage.read_lac(request.ledger_id)
        except st.StorageError as exc:
            await _abort_storage(context, exc)
        return bookie_pb2.ReadLastAddConfirmedResponse(last_add_confirmed=lac, last_entry_id=last,
                                                       instance_id=self._storage.instance_id)

    # ------------------------------------------------------------------ fence / delete

    async def Fence(self, request, context):
        """Fence a ledger durably (BookKeeper's fencing read, FENCE_LEDGER flag, of ledger
        recovery): from then on its normal adds get E_LEDGER_FENCED. Returns its LAC, last entry
        id and the instance id; an unknown ledger is recorded fenced with this key at -1/-1.
        INVALID_ARGUMENT for a negative id or empty master_key, PERMISSION_DENIED for another
        master key, UNAVAILABLE when the storage is closed, INTERNAL on a storage failure."""
        if request.ledger_id < 0:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"ledger_id must be >= 0 (got {request.ledger_id})")
        if not request.master_key:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "Fence needs a non-empty master_key")
        try:
            lac, last = await self._storage.fence(request.ledger_id, request.master_key)
        except st.StorageError as exc:
            await _abort_storage(context, exc)
        log.info("fenced ledger %d (lac=%d, last_entry_id=%d)", request.ledger_id, lac, last)
        return bookie_pb2.FenceResponse(last_add_confirmed=lac, last_entry_id=last,
                                        instance_id=self._storage.instance_id)

    async def DeleteLedger(self, request, context):
        """Delete a ledger's entries and record here; idempotent (an unknown ledger answers OK).
        No BookKeeper op: BookKeeper deletes the metadata and bookies garbage-collect
        (GarbageCollectorThread); here the client asks each bookie. INVALID_ARGUMENT for a
        negative id or empty master_key, PERMISSION_DENIED for another master key (nothing is
        deleted), UNAVAILABLE when the storage is closed, INTERNAL on a storage failure."""
        if request.ledger_id < 0:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"ledger_id must be >= 0 (got {request.ledger_id})")
        if not request.master_key:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         "DeleteLedger needs the ledger's master_key")
        try:
            existed = await self._storage.delete_ledger(request.ledger_id, request.master_key)
        except st.StorageError as exc:
            if isinstance(exc, st.UnauthorizedAccess):
                log.warning("refused to delete ledger %d for %s: wrong master key", request.ledger_id,
                            context.peer())
            await _abort_storage(context, exc)
        if existed:
            log.info("deleted ledger %d", request.ledger_id)
        return bookie_pb2.DeleteLedgerResponse()

    async def GetBookieInfo(self, request, context):
        """The bookie's instance id, cookie address, read-only state and reason, and last measured
        disk usage (share 0..1) (BookKeeper's GET_BOOKIE_INFO). Never fails on input."""
        storage = self._storage
        return bookie_pb2.BookieInfo(instance_id=storage.instance_id or "", cookie_address=storage.cookie_address,
                                     read_only=storage.read_only, read_only_reason=storage.read_only_reason,
                                     disk_usage=self.disk_monitor.usage if self.disk_monitor else 0.0)


class _Window:
    """Per-stream back-pressure: at most ``max_count`` requests / ``max_bytes`` payload bytes in flight."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self.count = self.bytes = 0
        self._room = asyncio.Event()
        self._room.set()

    async def acquire(self, nbytes: int) -> None:
        """Wait for room for one request of ``nbytes`` payload bytes, then take it; with nothing
        in flight one request is always admitted, whatever its size."""
        while self.count and (self.count >= self.max_count or self.bytes + nbytes > self.max_bytes):
            self._room.clear()
            await self._room.wait()
        self.count += 1
        self.bytes += nbytes

    def release(self, nbytes: int) -> None:
        """Return one request's room (``nbytes`` payload bytes) and wake the waiting reader."""
        self.count -= 1
        self.bytes -= nbytes
        self._room.set()


def _response(adds, pre_errors, index, errors) -> bookie_pb2.AddEntriesResponse:
    """One AddEntriesResponse for one request: a result per add, in request order."""
    resp = bookie_pb2.AddEntriesResponse()
    results = resp.results
    if errors and index is not None:
        errors = {index[i]: e for i, e in errors.items()}
    if pre_errors:
        errors = {**(errors or {}), **pre_errors}
    if not errors:
        for a in adds:
            results.add(ledger_id=a.ledger_id, entry_id=a.entry_id)
    else:
        for i, a in enumerate(adds):
            err = errors.get(i)
            if err is None:
                results.add(ledger_id=a.ledger_id, entry_id=a.entry_id)
            else:
                results.add(ledger_id=a.ledger_id, entry_id=a.entry_id, status=err[0], message=err[1])
    return resp


_STORAGE_STATUS = [
    (st.LedgerNotFound, grpc.StatusCode.NOT_FOUND),
    (st.EntriesNotStored, grpc.StatusCode.OUT_OF_RANGE),
    (st.UnauthorizedAccess, grpc.StatusCode.PERMISSION_DENIED),
    (st.StorageClosed, grpc.StatusCode.UNAVAILABLE),
]


async def _abort(context, code: grpc.StatusCode, message: str):
    await context.abort(code, message)


async def _abort_storage(context, exc: st.StorageError):
    for cls, code in _STORAGE_STATUS:
        if isinstance(exc, cls):
            await context.abort(code, str(exc))
    log.error("storage failure: %s", exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"bookie storage error: {exc}")


class BookieServer:
    """A bookie: LedgerStorage in ``config.data_dir`` served over gRPC.

    ``await start()`` binds ``config.host:config.port`` (``.port`` then holds the
    bound port), opens the storage (locking the data dir and checking its cookie,
    see :mod:`bookie.cookie`; ``format=True`` first wipes the data dir, BookKeeper's
    bookieformat; ``create_cookie=True`` adopts a database that has no cookie),
    measures the disk usage once and starts serving and the disk monitor.
    ``await stop(grace_s)`` stops accepting RPCs, ends the AddEntry streams once
    the adds already read are answered, lets other RPCs finish for up to
    ``grace_s`` seconds, then commits what is queued and closes the database.
    With ``config.metadata_store_url`` set, ``start()`` first checks the data dir's cookie
    against the one etcd keeps for this address (``/ledgers/cookies/<advertised_address>``:
    a wiped data dir is refused, ``--format`` replaces it), finally keeps the cookie there
    and registers the bookie under ``/ledgers/available/<advertised_address>``
    (``/ledgers/available/readonly/...`` while read-only), and ``stop()`` first unregisters
    it (:mod:`bookie.registration`).
    Raises ``RuntimeError`` if the port cannot be bound,
    :class:`bookie.cookie.InvalidCookieError` / :class:`bookie.storage.DataDirInUse`
    if the data dir is not this bookie's and
    :class:`bookie.registration.RegistrationError` if etcd cannot be reached (nothing is
    served then).
    """

    def __init__(self, config: BookieConfig, format: bool = False, create_cookie: bool = False) -> None:
        self.config = config
        self.format = format
        self.create_cookie = create_cookie
        self.storage = st.LedgerStorage(config.data_dir, journal_sync=config.journal_sync,
                                        max_db_size_bytes=config.max_db_size_bytes,
                                        journal_dir=config.journal_directory or None,
                                        journal_max_size_mb=config.journal_max_size_mb,
                                        journal_pre_alloc_size_mb=config.journal_pre_alloc_size_mb,
                                        journal_max_group_wait_ms=config.journal_max_group_wait_ms,
                                        journal_buffered_writes_threshold=config.journal_buffered_writes_threshold,
                                        flush_interval_ms=config.flush_interval_ms)
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._servicer: BookieServicer | None = None
        self._monitor: asyncio.Task | None = None
        self.disk_monitor: DiskMonitor | None = None   # bookie.disk_monitor (LedgerDirsMonitor), from start()
        self.registration = None  # bookie.registration.BookieRegistration when metadata_store_url is set
        self._registration_moves: set[asyncio.Task] = set()   # read-only <-> writable re-registrations
        # proto.channels.ServerSecurity of the bookie's port (None: plaintext, no authentication)
        self.security: ServerSecurity | None = None
        if config.tls_enabled:
            self.security = ServerSecurity(
                tls=True, tls_certificate_file_path=config.tls_certificate_file_path,
                tls_key_file_path=config.tls_key_file_path,
                tls_trust_certs_file_path=config.tls_trust_certs_file_path or None,
                tls_require_trusted_client_cert_on_connect=config.tls_require_trusted_client_cert_on_connect)

    @property
    def address(self) -> str:
        """``host:port`` the server listens on (after start)."""
        return f"{self.config.host}:{self.port}"

    @property
    def advertised_address(self) -> str:
        """``<advertised_address or host>:<port>``: what the bookie registers (after start)."""
        return f"{self.config.advertised_address or self.config.host}:{self.port}"

    async def start(self) -> None:
        """Bind, open the storage (lock, cookie check), measure the disk once, serve, start the
        disk monitor. Raises RuntimeError (port not bindable), InvalidCookieError, DataDirInUse,
        ValueError (authentication without authorized_roles);
        on any failure nothing is left serving."""
        # AddEntry decodes its own stream: it answers the adds read before a bad frame first.
        interceptors = [InvalidFrameInterceptor(own_decoding={"/minipulsar.bookie.Bookie/AddEntry"})]
        if self.config.authentication_enabled:  # refuse calls without a valid token of the brokers' roles first
            from bookie.authorization import interceptor_for
            interceptors.insert(0, interceptor_for(self.config))
        server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=interceptors)
        self._servicer = BookieServicer(self.storage, self.config)
        self._servicer.disk_monitor = self.disk_monitor = DiskMonitor(self.storage, self.config)
        bookie_pb2_grpc.add_BookieServicer_to_server(self._servicer, server)
        target = f"{self.config.host}:{self.config.port}"
        try:
            port = add_server_port(server, target, self.security)
        except RuntimeError as exc:
            from proto.process_info import describe_pid, pids_listening_on, stop_hint

            holders = pids_listening_on(self.config.port) if self.config.port else []
            who = f" (held by {', '.join(map(describe_pid, holders))}; {stop_hint(holders)})" if holders else ""
            raise RuntimeError(f"cannot bind bookie to {target}: {exc}{who}") from exc
        self.port = port
        try:
            if self.config.metadata_store_url:
                await self._check_stored_cookie()
            await self.storage.open(self.address, format=self.format, create_cookie=self.create_cookie)
        except BaseException:
            await server.stop(None)
            raise
        try:
            await self.disk_monitor.check()
            await server.start()
        except BaseException:
            await server.stop(None)
            await self.storage.close()
            raise
        self._server = server
        self._monitor = asyncio.create_task(self.disk_monitor.run())
        if self.config.metadata_store_url:
            await self._register()
        log.info("bookie listening on %s (instance %s, data_dir=%s, journal_sync=%s%s)",
                 self.address, self.storage.instance_id, self.config.data_dir, self.config.journal_sync,
                 ", READ-ONLY" if self.storage.read_only else "")

    async def _check_stored_cookie(self) -> None:
        """Before the data dir is opened: the cookie the metadata store keeps for this bookie
        (``/ledgers/cookies/<advertised address>``) against the data dir's
        (:func:`bookie.cookie.check_stored_cookie`). Raises InvalidCookieError (a wiped or
        swapped data dir) or RegistrationError (etcd unreachable)."""
        from bookie import cookie as cookies
        from bookie.registration import read_stored_cookie

        stored = await read_stored_cookie(self.config.metadata_store_url, self.advertised_address)
        local = cookies.read_cookie(self.config.data_dir)
        cookies.check_stored_cookie(self.config.data_dir, local, stored, self.advertised_address, self.format)

    async def _register(self) -> None:
        """Keep the cookie in etcd (``/ledgers/cookies/<address>``; replaced with ``--format``),
        then register under /ledgers/available; on failure stop serving and re-raise
        (``bookie.registration.RegistrationError``)."""
        from bookie import cookie as cookies
        from bookie.registration import BookieRegistration, registration_value, write_stored_cookie

        try:
            local = cookies.read_cookie(self.config.data_dir)
            if local is not None:
                await write_stored_cookie(self.config.metadata_store_url, self.advertised_address, local,
                                          replace=self.format)
        except BaseException:
            await self.stop(grace_s=0)
            raise

        registration = BookieRegistration(self.config.metadata_store_url, self.advertised_address,
                                          value=registration_value(self.advertised_address,
                                                                   self.storage.instance_id),
                                          read_only=self.storage.read_only)
        try:
            await registration.start()
        except BaseException:
            await self.stop(grace_s=0)
            raise
        self.registration = registration
        self.storage.on_read_only_change = self._on_read_only_change
        if registration.read_only != self.storage.read_only:   # changed while registering
            self._on_read_only_change(self.storage.read_only)

    def _on_read_only_change(self, read_only: bool) -> None:
        """The storage turned read-only or writable (disk monitor, or a commit that hit a full
        disk): register under /ledgers/available/readonly or /ledgers/available accordingly."""
        registration = self.registration
        if registration is not None:
            task = asyncio.get_running_loop().create_task(registration.set_read_only(read_only))
            self._registration_moves.add(task)
            task.add_done_callback(self._registration_moves.discard)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Unregister from etcd (when registered: brokers stop choosing this bookie), stop the
        disk monitor, end the AddEntry streams after answering the adds already read, give
        other RPCs up to ``grace_s`` seconds, then close the storage (queued adds commit)."""
        if self.registration is not None:
            registration, self.registration = self.registration, None
            self.storage.on_read_only_change = None
            if self._registration_moves:
                await asyncio.wait(list(self._registration_moves), timeout=2.0)
            await registration.stop()
        if self._monitor is not None:
            self._monitor.cancel()
            self._monitor = None
        if self._server is not None:
            self._servicer.close_streams()
            await self._server.stop(grace_s)
            self._server = None
        await self.storage.close()
        log.info("bookie on port %s stopped", self.port)

    async def wait_for_termination(self) -> None:
        """Block until the gRPC server terminates."""
        if self._server is not None:
            await self._server.wait_for_termination()
