"""MetadataStore on etcd v3 (Pulsar's ``org.apache.pulsar.metadata.impl.EtcdMetadataStore``).

The metadata store of a broker cluster: several brokers (and the bookies'
registrations) share one etcd. It keeps the SQLite store's semantics
(``broker.metadata.sqlite_store``), which follow ZooKeeper:

* Keys: a node's path as UTF-8 bytes, nothing added (``/ledgers/L12`` is the etcd
  key ``b"/ledgers/L12"``), so other programs (a bookie registering with plain etcd
  under ``b"/ledgers/available/<host:port>"``, ``etcdctl``) read and write the
  same tree. Values: the node's bytes.
* Versions: 0 after creation, +1 per put. etcd's own ``version`` starts at 1, so a
  node's version is etcd's version - 1. Create-only compares etcd's
  ``create_revision`` with 0, a versioned put compares etcd's version with N + 1,
  each in one etcd transaction.
* Parents are materialized (empty value, version 0), in the same transaction as
  the child; ``delete`` refuses a node that still has children (one transaction
  comparing the child range ``path/`` .. ``path0`` to "no key");
  the root ``/`` always exists and cannot be written.
* ``get_children`` is a key-only range scan of ``path/`` keeping the direct child
  names (skipping over the subtree of each child found), so a child whose parent
  was never materialized (another program's key) is listed too.

Watches: one etcd watch stream per store over the whole tree (``/`` .. ``0``),
created on the first ``watch()`` from the revision after the last one this store
has seen, so no change made after ``watch()`` returns is missed; each event goes to
the local watches whose prefix covers it. Unlike the SQLite store's, these watches
see the changes made by OTHER processes and store objects too, and they fire
asynchronously (after the write has returned). A lost stream (etcd down,
restarted) is re-established from the revision after the last event delivered.

Session (Pulsar's etcd session / ZooKeeper session): one lease with TTL =
ceil(session_timeout_ms / 1000) s (at least 1; etcd may grant more, e.g. 2 s),
kept alive every TTL/3 by a background task. ``put_ephemeral`` attaches it.
``SessionEvent``s: CONNECTION_LOST when a keep-alive fails; RECONNECTED when one
works again within the session timeout; SESSION_LOST when etcd reports the lease
gone or no keep-alive succeeded for ``session_timeout_ms``; then, as soon as etcd
answers, a new lease (the old one is revoked) and SESSION_REESTABLISHED.

Errors: a call while etcd cannot be reached raises ``MetadataStoreUnavailable``
(a ``MetadataStoreError``) after at most ``operation_timeout_s`` (10 s by
default), never hangs; calls work again once etcd is back (gRPC reconnects; with
several endpoints the store moves to the next one after a failure).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
import struct
import time
from typing import Any, Awaitable, Callable, Optional

import aetcd
import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end

from broker.metadata.paths import ancestors, check_path, check_writable, is_under
from broker.metadata.store import (
    BadVersion,
    GetResult,
    MetadataStore,
    MetadataStoreError,
    NotFound,
    Notification,
    NotificationType,
    SessionEvent,
    SessionListener,
    WatchCallback,
)
from proto.etcd_calls import describe_error as _describe
from proto.etcd_calls import keep_alive_rpc as _keep_alive_rpc
from proto.metadata_url import parse_etcd_endpoints

__all__ = ["EtcdMetadataStore", "MetadataStoreUnavailable"]

log = logging.getLogger(__name__)

_COUNTER = struct.Struct(">q")
_ROOT_RANGE = (b"/", b"0")  # every key starting with '/' ('0' is '/' + 1)
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
_CHILDREN_PAGE = 1000
_CHANNEL_OPTIONS = {
    # reconnect quickly once etcd is back (gRPC's default backoff grows to 120 s)
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # notice a dead connection under an idle watch stream (etcd refuses pings more often than 5 s)
    "grpc.keepalive_time_ms": 10000,
    "grpc.keepalive_timeout_ms": 5000,
    "grpc.http2.max_pings_without_data": 0,
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
    "grpc.max_send_message_length": 64 * 1024 * 1024,
}


class MetadataStoreUnavailable(MetadataStoreError):
    """etcd could not be reached (or did not answer in time) for this call; the call may
    be retried once etcd is back. The message names the endpoint and the cause."""


def _prefix_end(prefix: bytes) -> bytes:
    """The range end covering every key that starts with ``prefix`` (etcd's prefix range)."""
    return prefix_range_end(prefix)


def _put_op(key: bytes, value: bytes, lease: int = 0, ignore_lease: bool = False) -> rpc.RequestOp:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease, ignore_lease=ignore_lease))


def _range_op(key: bytes, range_end: bytes = b"", limit: int = 0, keys_only: bool = False) -> rpc.RequestOp:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key, range_end=range_end, limit=limit,
                                                        keys_only=keys_only))


def _absent(key: bytes, range_end: bytes = b"") -> rpc.Compare:
    """Compare: no key ``key`` (or none in ``[key, range_end)``)."""
    return rpc.Compare(key=key, range_end=range_end, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                       create_revision=0)


def _parent_ops(path: str) -> list[rpc.RequestOp]:
    """One nested transaction per missing ancestor of ``path``: create it (empty value) if absent."""
    return [rpc.RequestOp(request_txn=rpc.TxnRequest(compare=[_absent(p.encode())],
                                                     success=[_put_op(p.encode(), b"")]))
            for p in ancestors(path)]


def _check_value(value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"metadata value must be bytes, got {type(value).__name__}")
    return bytes(value)


def _check_expected(expected_version: Any, lowest: int) -> None:
    if expected_version is not None and (
            not isinstance(expected_version, int) or isinstance(expected_version, bool)
            or expected_version < lowest):
        allowed = "None, -1 or >= 0" if lowest == -1 else "None or >= 0"
        raise ValueError(f"expected_version must be {allowed}, got {expected_version!r}")


class _Endpoint:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    def client(self) -> aetcd.Client:
        return aetcd.Client(host=self.host, port=self.port, options=dict(_CHANNEL_OPTIONS))


class EtcdMetadataStore(MetadataStore):
    """MetadataStore on an etcd v3 cluster through ``aetcd`` (Pulsar's EtcdMetadataStore).

    Create with ``await EtcdMetadataStore.open("etcd://host:port[,host:port...]")``; the
    constructor is private. Same contract and path rules as ``SqliteMetadataStore``
    (values ``bytes``, versions ``int >= 0``, ValueError on a bad path); see the module
    docstring for keys, versions, watches and the session. ``shared = True``: several
    brokers use it at once. Errors: ``BadVersion`` / ``NotFound`` as the contract says,
    ``MetadataStoreUnavailable`` when etcd does not answer within ``operation_timeout_s``
    seconds, ``MetadataStoreError("metadata store is closed")`` after ``close()``.
    """

    shared = True

    def __init__(self, url: str, endpoints: list[_Endpoint], index: int, client: aetcd.Client, *,
                 session_timeout_ms: int, operation_timeout_s: float) -> None:
        self.url = url
        self._endpoints = endpoints
        self._index = index
        self._client = client
        self._session_timeout_s = session_timeout_ms / 1000.0
        self._ttl = max(1, math.ceil(session_timeout_ms / 1000.0))
        self._op_timeout_s = operation_timeout_s
        self._closed = False
        self._revision = 0  # highest etcd revision seen in any answer
        self._lease_id: Optional[int] = None
        self._stale_leases: list[int] = []  # leases of lost sessions, revoked once etcd answers
        self._lease_ttl = self._ttl  # as granted by etcd
        self._last_keepalive = time.monotonic()
        self._connection_lost = False
        self._session_lost = False
        self._watches: dict[int, tuple[str, WatchCallback]] = {}
        self._listeners: dict[int, SessionListener] = {}
        self._next_id = 0
        self._watch_task: Optional[asyncio.Task] = None
        self._keepalive_task: Optional[asyncio.Task] = None
        self._tasks: set[asyncio.Future] = set()  # coroutine callbacks (left to finish at close)
        self._internal: set[asyncio.Task] = set()  # lease revokes, client closes (cancelled at close)

    # ------------------------------------------------------------------ open

    @classmethod
    async def open(cls, url: str, *, session_timeout_ms: int = 5000, connect_timeout_s: float = 30.0,
                   operation_timeout_s: float = 10.0) -> "EtcdMetadataStore":
        """Connect to etcd at ``url`` (``etcd://host:port[,host:port...]``), open the session
        (grant its lease) and start keeping it alive.

        ``session_timeout_ms``: the session's lease TTL (rounded up to whole seconds, at least
        1 s) and how long keep-alives may fail before SESSION_LOST. ``connect_timeout_s``:
        how long to retry while no endpoint answers (one log line per attempt:
        "metadata store: cannot reach etcd at ...; retrying"); the first endpoint that answers
        is used. ``operation_timeout_s``: deadline of each etcd call (seconds).
        Raises ValueError on a bad URL or timeout, MetadataStoreError("cannot reach etcd at
        <url> after N s: start etcd or fix metadata_store_url") when none answered in time.
        """
        endpoints = [_Endpoint(h, p) for h, p in parse_etcd_endpoints(url)]
        if not isinstance(session_timeout_ms, int) or session_timeout_ms <= 0:
            raise ValueError(f"session_timeout_ms must be a positive int, got {session_timeout_ms!r}")
        if not connect_timeout_s >= 0 or not operation_timeout_s > 0:
            raise ValueError("connect_timeout_s must be >= 0 and operation_timeout_s > 0 seconds")
        ttl = max(1, math.ceil(session_timeout_ms / 1000.0))
        deadline = time.monotonic() + connect_timeout_s
        while True:
            problems = []
            for index, endpoint in enumerate(endpoints):
                client = endpoint.client()
                try:
                    await client.connect()
                    timeout = max(0.2, min(2.0, operation_timeout_s, deadline - time.monotonic()))
                    grant = await client.leasestub.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl), timeout=timeout)
                except (grpc.aio.AioRpcError, aetcd.ClientError, asyncio.TimeoutError) as exc:
                    problems.append(f"{endpoint}: {_describe(exc)}")
                    await _close_quietly(client)
                    continue
                store = cls(url, endpoints, index, client, session_timeout_ms=session_timeout_ms,
                            operation_timeout_s=operation_timeout_s)
                store._lease_id, store._lease_ttl = grant.ID, grant.TTL
                store._seen(grant.header)
                store._keepalive_task = asyncio.get_running_loop().create_task(store._keep_alive())
                log.info("metadata store: etcd at %s (session lease %x, TTL %d s)", endpoint, grant.ID, grant.TTL)
                return store
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MetadataStoreError(f"cannot reach etcd at {url} after {connect_timeout_s:g} s: "
                                         f"start etcd or fix metadata_store_url ({'; '.join(problems)})")
            log.warning("metadata store: cannot reach etcd at %s (%s); retrying", url, "; ".join(problems))
            await asyncio.sleep(min(0.5, remaining))

    # ------------------------------------------------------------------ reads

    async def get(self, path: str) -> Optional[GetResult]:
        """``GetResult(value: bytes, version: int)`` of ``path``, or None when absent (the root
        always exists: empty value, version 0). Raises ValueError on a bad path,
        MetadataStoreUnavailable / MetadataStoreError."""
        path = check_path(path)
        self._check_open()
        if path == "/":
            return GetResult(b"", 0)
        resp = await self._kv("get", lambda kv, t: kv.Range(rpc.RangeRequest(key=path.encode()), timeout=t))
        if not resp.kvs:
            return None
        kv = resp.kvs[0]
        return GetResult(bytes(kv.value), kv.version - 1)

    async def exists(self, path: str) -> bool:
        """True when ``path`` exists (the root always does). Raises as ``get``."""
        path = check_path(path)
        self._check_open()
        if path == "/":
            return True
        resp = await self._kv("exists", lambda kv, t: kv.Range(
            rpc.RangeRequest(key=path.encode(), keys_only=True), timeout=t))
        return bool(resp.kvs)

    async def get_children(self, path: str) -> list[str]:
        """Sorted names (not full paths) of the direct children of ``path``: a key-only range
        scan of ``path/``, pages of 1000 keys, jumping over each child's subtree. Lists a
        child even when ``path`` itself was never written; an absent node has no children.
        Raises as ``get``."""
        path = check_path(path)
        self._check_open()
        prefix = b"/" if path == "/" else path.encode() + b"/"
        end = _prefix_end(prefix)
        names: list[bytes] = []
        start = prefix
        while True:
            resp = await self._kv("get_children", lambda kv, t, s=start: kv.Range(
                rpc.RangeRequest(key=s, range_end=end, keys_only=True, limit=_CHILDREN_PAGE), timeout=t))
            last_name = None
            for kv in resp.kvs:
                name = kv.key[len(prefix):].split(b"/", 1)[0]
                if name and (not names or names[-1] != name):
                    names.append(name)
                last_name = name
            if not resp.more or not resp.kvs:
                break
            last_key = resp.kvs[-1].key
            if last_key == prefix + last_name:  # a direct child: its subtree (if any) comes next
                start = last_key + b"\x00"
            else:  # inside that child's subtree: skip the rest of it
                start = prefix + last_name + b"0"
        # UTF-8 byte order is code point order, so this is also sorted(str) order.
        return sorted({n.decode("utf-8", errors="replace") for n in names})

    # ----------------------------------------------------------------- writes

    async def put(self, path: str, value: bytes, expected_version: Optional[int] = None) -> int:
        """Write ``value`` (bytes-like) at ``path``; return the new version. ``expected_version``:
        None = create or update, -1 = create only (BadVersion if it exists), N >= 0 = update
        only at version N (BadVersion if it differs, NotFound if absent). Missing parents are
        created (empty value, version 0). An existing ephemeral node stays ephemeral.
        Raises ValueError (bad path / expected_version), TypeError (value not bytes-like),
        MetadataStoreUnavailable / MetadataStoreError."""
        return await self._put(path, value, expected_version, lease=0)

    async def put_ephemeral(self, path: str, value: bytes, expected_version: Optional[int] = -1) -> int:
        """``put`` attaching the node to this store's session lease: etcd deletes it when the
        lease ends (``close()`` revokes it; expiry ``session_timeout_ms`` after the last
        keep-alive, e.g. when the process died). ``expected_version`` as in ``put`` (default
        -1: create only). Raises as ``put``, and MetadataStoreUnavailable while the session
        is lost (until SESSION_REESTABLISHED)."""
        self._check_open()
        if self._lease_id is None:
            raise MetadataStoreUnavailable(f"the etcd session is lost (waiting for a new lease from {self.url}); "
                                           f"ephemeral node {path} not written")
        return await self._put(path, value, expected_version, lease=self._lease_id)

    async def _put(self, path: str, value: bytes, expected_version: Optional[int], lease: int) -> int:
        path = check_writable(path)
        _check_expected(expected_version, -1)
        data = _check_value(value)
        self._check_open()
        key = path.encode()
        read = _range_op(key)
        create = _parent_ops(path) + [_put_op(key, data, lease=lease), read]
        update = _parent_ops(path) + [_put_op(key, data, lease=lease, ignore_lease=not lease), read]
        if expected_version is None:
            txn = rpc.TxnRequest(compare=[_absent(key)], success=create, failure=update)
        elif expected_version == -1:
            txn = rpc.TxnRequest(compare=[_absent(key)], success=create, failure=[read])
        else:
            txn = rpc.TxnRequest(compare=[rpc.Compare(key=key, target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL,
                                                      version=expected_version + 1)],
                                 success=update, failure=[read])
        resp = await self._kv("put", lambda kv, t: kv.Txn(txn, timeout=t))
        kvs = resp.responses[-1].response_range.kvs
        if expected_version is None or resp.succeeded:
            return kvs[0].version - 1
        if expected_version == -1:
            raise BadVersion(f"{path} already exists (version {kvs[0].version - 1})")
        if not kvs:
            raise NotFound(f"{path} does not exist (expected version {expected_version})")
        raise BadVersion(f"{path} is at version {kvs[0].version - 1}, expected {expected_version}")

    async def delete(self, path: str, expected_version: Optional[int] = None) -> None:
        """Delete ``path``; ``expected_version`` None = unconditional, N >= 0 = CAS. One etcd
        transaction. Raises NotFound if absent, BadVersion if the version differs,
        MetadataStoreError if the node has children (ZooKeeper's NotEmpty), ValueError on a
        bad path / the root / a negative expected_version, MetadataStoreUnavailable."""
        path = check_writable(path)
        _check_expected(expected_version, 0)
        self._check_open()
        key = path.encode()
        children = key + b"/"
        compare = [rpc.Compare(key=key, target=rpc.Compare.VERSION, result=rpc.Compare.GREATER, version=0),
                   _absent(children, _prefix_end(children))]
        if expected_version is not None:
            compare.append(rpc.Compare(key=key, target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL,
                                       version=expected_version + 1))
        txn = rpc.TxnRequest(
            compare=compare,
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))],
            failure=[_range_op(key), _range_op(children, _prefix_end(children), limit=1, keys_only=True)])
        resp = await self._kv("delete", lambda kv, t: kv.Txn(txn, timeout=t))
        if resp.succeeded:
            return
        node, kids = resp.responses[0].response_range.kvs, resp.responses[1].response_range.kvs
        if not node:
            raise NotFound(f"{path} does not exist")
        version = node[0].version - 1
        if expected_version is not None and expected_version != version:
            raise BadVersion(f"{path} is at version {version}, expected {expected_version}")
        if kids:
            raise MetadataStoreError(f"cannot delete {path}: it has children")
        raise MetadataStoreError(f"cannot delete {path}: etcd refused the transaction")  # not reached

    async def increment_counter(self, path: str, max_attempts: int = 1000) -> int:
        """Atomically add 1 to the int64 counter at ``path`` (8 bytes, big-endian signed, as
        the SQLite store) and return the new value (1 the first time): a compare-and-set
        loop on the node's version. Raises MetadataStoreError if the node holds something
        else or ``max_attempts`` CAS attempts all lost a race, ValueError on a bad path,
        MetadataStoreUnavailable."""
        path = check_writable(path)
        for _ in range(max_attempts):
            current = await self.get(path)
            try:
                if current is None:
                    await self.put(path, _COUNTER.pack(1), expected_version=-1)
                    return 1
                if len(current.value) != _COUNTER.size:
                    raise MetadataStoreError(f"{path} does not hold a counter ({len(current.value)} bytes)")
                value = _COUNTER.unpack(current.value)[0] + 1
                await self.put(path, _COUNTER.pack(value), expected_version=current.version)
                return value
            except (BadVersion, NotFound):
                continue  # another writer won: read again
        raise MetadataStoreError(f"increment_counter({path}): {max_attempts} compare-and-set attempts lost a race")

    # ---------------------------------------------------------------- watches

    def watch(self, callback: WatchCallback, prefix: str = "/") -> Callable[[], None]:
        """Call ``callback(Notification)`` for every change of a node at or under ``prefix``
        (``/a`` covers ``/a`` and ``/a/x``, not ``/ab``), made by ANY etcd client (other
        processes and store objects included), in etcd revision order, asynchronously
        (after the writer's call returned). A put creating a node is CREATED (parents
        materialized with it are CREATED too), other puts MODIFIED, deletions (lease
        expiry included) DELETED. Coroutine callbacks are scheduled as tasks; exceptions
        are logged. Returns an idempotent cancel function. Raises ValueError on a bad
        prefix, TypeError on a non-callable, MetadataStoreError when closed."""
        prefix = check_path(prefix)
        self._check_open()
        if not callable(callback):
            raise TypeError("watch callback must be callable")
        watch_id = self._new_id()
        self._watches[watch_id] = (prefix, callback)
        if self._watch_task is None:
            self._watch_task = asyncio.get_running_loop().create_task(self._watch_loop(self._revision + 1))

        def cancel() -> None:
            self._watches.pop(watch_id, None)

        return cancel

    async def _watch_loop(self, next_revision: int) -> None:
        """Keep one watch stream over the whole tree; re-create it after a failure from the
        revision after the last event delivered (one log line when lost, one when back)."""
        outage = False
        attempt = 0
        while not self._closed:
            client = await self._current_client()
            stop = asyncio.Event()

            async def requests(start=next_revision):
                yield rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
                    key=_ROOT_RANGE[0], range_end=_ROOT_RANGE[1], start_revision=start))
                await stop.wait()

            call = rpc.WatchStub(client.channel).Watch(requests())
            problem = "the stream ended"
            try:
                async for resp in call:
                    if resp.created:
                        if outage:
                            log.info("metadata store: etcd watch re-established at %s from revision %d",
                                     self._endpoint, next_revision)
                        outage, attempt = False, 0
                    if resp.compact_revision:
                        log.warning("metadata store: etcd compacted revisions below %d; changes between %d and "
                                    "%d were not watched", resp.compact_revision, next_revision, resp.compact_revision)
                        next_revision = resp.compact_revision
                        problem = "compacted"
                        break
                    if resp.canceled:
                        problem = f"etcd cancelled it: {resp.cancel_reason}"
                        break
                    for event in resp.events:
                        next_revision = max(next_revision, event.kv.mod_revision + 1)
                        self._revision = max(self._revision, event.kv.mod_revision)
                        self._dispatch(event)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                problem = _describe(exc)
                if exc.code() in _UNREACHABLE and not self._closed:
                    self._unreachable(client)
            except Exception as exc:
                problem = _describe(exc)
                log.exception("metadata store: etcd watch stream failed")
            finally:
                stop.set()
                call.cancel()
            if self._closed:
                return
            if not outage:
                outage = True
                log.warning("metadata store: etcd watch stream to %s lost (%s); re-establishing",
                            self._endpoint, problem)
            attempt += 1
            await asyncio.sleep(min(1.0, 0.05 * 2 ** min(attempt, 5)))

    def _dispatch(self, event) -> None:
        try:
            path = event.kv.key.decode("utf-8")
        except UnicodeDecodeError:
            return
        if not path.startswith("/"):
            return
        if event.type == rpc.Event.DELETE:
            kind = NotificationType.DELETED
        elif event.kv.version == 1:
            kind = NotificationType.CREATED
        else:
            kind = NotificationType.MODIFIED
        note = Notification(kind, path)
        for prefix, callback in list(self._watches.values()):
            if is_under(path, prefix):
                self._invoke(callback, note, f"metadata watch callback for {kind} {path}")

    # ------------------------------------------------------------ sessions

    def add_session_listener(self, callback: SessionListener) -> Callable[[], None]:
        """Call ``callback(event)`` (a ``SessionEvent`` value) on each session change (see the
        module docstring); coroutine callbacks are scheduled as tasks, exceptions logged.
        Returns an idempotent function removing the listener. MetadataStoreError when closed."""
        self._check_open()
        if not callable(callback):
            raise TypeError("session listener must be callable")
        listener_id = self._new_id()
        self._listeners[listener_id] = callback
        return lambda: self._listeners.pop(listener_id, None) and None

    @property
    def session_lease_id(self) -> Optional[int]:
        """The etcd lease id of the current session (int), None while the session is lost."""
        return self._lease_id

    def _emit(self, event: str) -> None:
        (log.info if event in (SessionEvent.RECONNECTED, SessionEvent.SESSION_REESTABLISHED) else log.warning)(
            "metadata store: session event %s (etcd %s, lease %s)", event, self._endpoint,
            "none" if self._lease_id is None else f"{self._lease_id:x}")
        for callback in list(self._listeners.values()):
            self._invoke(callback, event, f"metadata session listener for {event}")

    async def _keep_alive(self) -> None:
        """Background task: refresh the lease every TTL/3 s; emit the session events."""
        while not self._closed:
            interval = max(0.1, min(self._lease_ttl, self._session_timeout_s) / 3.0)
            started = time.monotonic()
            try:
                await self._keep_alive_once(timeout=max(0.5, min(interval, self._op_timeout_s)))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("metadata store: session keep-alive step failed")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def _keep_alive_once(self, timeout: float) -> None:
        if self._lease_id is None:  # session lost: open a new one as soon as etcd answers
            try:
                grant = await self._call("lease grant", lambda c, t: c.leasestub.LeaseGrant(
                    rpc.LeaseGrantRequest(TTL=self._ttl), timeout=t), timeout)
            except MetadataStoreError:
                return
            self._lease_id, self._lease_ttl = grant.ID, grant.TTL
            self._last_keepalive = time.monotonic()
            self._connection_lost = self._session_lost = False
            # The lost session's nodes go before listeners re-create what they still want.
            stale, self._stale_leases = self._stale_leases, []
            for lease_id in stale:
                await self._revoke_quietly(lease_id)
            self._emit(SessionEvent.SESSION_REESTABLISHED)
            return
        lease_id = self._lease_id
        try:
            reply = await self._call("lease keep-alive", lambda c, t: _keep_alive_rpc(c, lease_id, t), timeout)
        except MetadataStoreError as exc:
            if not self._connection_lost:
                self._connection_lost = True
                log.warning("metadata store: session keep-alive failed: %s", exc)
                self._emit(SessionEvent.CONNECTION_LOST)
            if time.monotonic() - self._last_keepalive >= self._session_timeout_s:
                self._lose_session(f"no keep-alive succeeded for {self._session_timeout_s:g} s")
            return
        if reply is None or reply.TTL <= 0:
            self._lose_session("etcd reports the lease expired")
            return
        self._last_keepalive = time.monotonic()
        if self._connection_lost:
            self._connection_lost = False
            self._emit(SessionEvent.RECONNECTED)

    def _lose_session(self, why: str) -> None:
        old = self._lease_id
        self._lease_id = None
        self._session_lost = True
        self._stale_leases.append(old)
        log.warning("metadata store: session lease %x lost: %s", old, why)
        self._emit(SessionEvent.SESSION_LOST)

    async def _revoke_quietly(self, lease_id: int) -> None:
        """Revoke a lost session's lease (its ephemeral nodes go at once; listeners were told
        they are gone). One attempt: otherwise it expires by itself within its TTL."""
        try:
            await self._call("lease revoke", lambda c, t: c.leasestub.LeaseRevoke(
                rpc.LeaseRevokeRequest(ID=lease_id), timeout=t), min(2.0, self._op_timeout_s))
        except MetadataStoreError:  # lease not found (expired already), or etcd gone again
            pass

    # ------------------------------------------------------------------ close

    async def close(self) -> None:
        """Revoke the session lease (the session's ephemeral nodes vanish at once), stop the
        keep-alive and watch tasks, close the connection. Idempotent; best effort when etcd
        is unreachable (the lease then expires after its TTL). Further calls raise
        MetadataStoreError("metadata store is closed")."""
        if self._closed:
            return
        lease_id = self._lease_id
        if lease_id is not None:
            try:
                await self._call("lease revoke", lambda c, t: c.leasestub.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=lease_id), timeout=t), min(2.0, self._op_timeout_s))
            except MetadataStoreError as exc:
                log.warning("metadata store: could not revoke session lease %x (%s); it expires in %d s",
                            lease_id, exc, self._lease_ttl)
        self._closed = True
        self._lease_id = None
        tasks = [t for t in (self._keepalive_task, self._watch_task) if t is not None] + list(self._internal)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watches.clear()
        self._listeners.clear()
        await _close_quietly(self._client)

    # -------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataStoreError("metadata store is closed")

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    @property
    def _endpoint(self) -> _Endpoint:
        return self._endpoints[self._index]

    def _seen(self, header) -> None:
        if header is not None and header.revision > self._revision:
            self._revision = header.revision

    async def _current_client(self) -> aetcd.Client:
        client = self._client
        await client.connect()  # no I/O: creates the channel and stubs once
        return client

    def _unreachable(self, client: aetcd.Client) -> None:
        """The call on ``client`` found etcd unreachable: with several endpoints, move on to the
        next one (gRPC itself reconnects to a single endpoint)."""
        if len(self._endpoints) < 2 or client is not self._client or self._closed:
            return
        old = self._endpoint
        self._index = (self._index + 1) % len(self._endpoints)
        self._client = self._endpoint.client()
        log.warning("metadata store: etcd at %s unreachable, switching to %s", old, self._endpoint)
        self._spawn(_close_quietly(client))

    async def _call(self, what: str, fn: Callable[[aetcd.Client, float], Awaitable[Any]],
                    timeout: Optional[float] = None) -> Any:
        """Run ``fn(client, timeout_s)`` (one etcd RPC with that deadline); map gRPC errors to
        MetadataStoreUnavailable (unreachable, deadline) / MetadataStoreError (refused)."""
        self._check_open()
        timeout = self._op_timeout_s if timeout is None else timeout
        client = await self._current_client()
        endpoint = self._endpoint
        try:
            resp = await fn(client, timeout)
        except grpc.aio.AioRpcError as exc:
            if self._closed:
                raise MetadataStoreError("metadata store is closed") from None
            if exc.code() in _UNREACHABLE:
                self._unreachable(client)
                cause = (f"no answer within {timeout:.3g} s" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                         else _describe(exc))
                raise MetadataStoreUnavailable(f"etcd at {endpoint} unreachable for {what} ({cause}); "
                                               f"is etcd running?") from None
            raise MetadataStoreError(f"etcd at {endpoint} refused {what}: {_describe(exc)}") from None
        self._seen(getattr(resp, "header", None))
        return resp

    async def _kv(self, what: str, fn: Callable[[Any, float], Awaitable[Any]]) -> Any:
        return await self._call(what, lambda client, t: fn(client.kvstub, t))

    def _invoke(self, callback: Callable[[Any], Any], arg: Any, what: str) -> None:
        try:
            outcome = callback(arg)
        except Exception:
            log.exception("%s failed", what)
            return
        if inspect.isawaitable(outcome):
            task = asyncio.ensure_future(outcome)
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._internal.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        self._internal.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("metadata store callback failed", exc_info=task.exception())


async def _close_quietly(client: aetcd.Client) -> None:
    try:
        await client.close()
    except Exception:
        log.debug("closing an etcd client failed", exc_info=True)
