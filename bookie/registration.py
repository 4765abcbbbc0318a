"""Bookie registration in etcd (BookKeeper's ``RegistrationManager.registerBookie``: the
ephemeral znode ``/ledgers/available/<host:port>``).

A bookie started with ``metadata_store_url = "etcd://host:port[,host:port...]"`` writes
the etcd key ``b"/ledgers/available/<host:port>"`` (its advertised address) attached to
a lease of ``ttl_s`` seconds (5 by default) that a background task keeps alive every
``ttl_s / 3`` seconds. The key disappears when the bookie stops cleanly (the lease is
revoked) or ``ttl_s`` after it died (the lease expires), so brokers choosing ensembles
among ``get_children("/ledgers/available")`` (``bookie.client.BookKeeper`` without a
static bookie list) stop choosing it. If the lease is lost anyway (etcd unreachable for
longer than the TTL), the bookie registers again with a new lease as soon as etcd answers.

The key is the metadata node path as UTF-8 bytes, exactly what the broker's
``EtcdMetadataStore`` uses, and the parents ``/ledgers`` and ``/ledgers/available`` are
materialized (empty value) when missing, as that store does. The value is a small JSON
object ``{"address": "host:port", "instance_id": "..."}`` (BookKeeper's BookieServiceInfo,
informative only).

A read-only bookie (disk full) registers under ``/ledgers/available/readonly/<host:port>``
instead (BookKeeper's ``registerBookie(bookieId, readOnly=true)``): the key moves in one
transaction when the state changes (:meth:`BookieRegistration.set_read_only`), so brokers,
which choose new ensembles among the direct children of ``/ledgers/available`` that are
addresses, never put a read-only bookie in a new ensemble, and see it again once it is
writable.

The bookie's cookie (see :mod:`bookie.cookie`) is also kept in etcd, without a lease,
under ``/ledgers/cookies/<host:port>`` (BookKeeper's cookie in the registration manager):
:func:`read_stored_cookie` before the data dir is opened, :func:`write_stored_cookie`
once it is (replacing it only for ``--format``).

Uses ``aetcd`` directly: the ``bookie`` package does not import ``broker``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Optional

import aetcd
import grpc
from aetcd import rpc

from proto.etcd_calls import describe_error as _describe
from proto.etcd_calls import keep_alive_rpc
from proto.metadata_url import parse_etcd_endpoints

__all__ = ["AVAILABLE_PATH", "READONLY_PATH", "DEFAULT_TTL_S", "BookieRegistration", "RegistrationError",
           "registration_value", "read_stored_cookie", "write_stored_cookie"]

log = logging.getLogger(__name__)

AVAILABLE_PATH = "/ledgers/available"  # BookKeeper's available bookies (children: "host:port")
READONLY_PATH = AVAILABLE_PATH + "/readonly"  # BookKeeper's read-only bookies (children: "host:port")
DEFAULT_TTL_S = 5


class RegistrationError(Exception):
    """The bookie could not register with etcd (unreachable for ``connect_timeout_s``, or refused)."""


def registration_value(address: str, instance_id: Optional[str] = None) -> bytes:
    """The registration's value: JSON ``{"address": ..., "instance_id": ...}`` as UTF-8 bytes."""
    return json.dumps({"address": address, "instance_id": instance_id}, sort_keys=True).encode()


def _parent_ops(path: str) -> list:
    """Txn ops creating the missing parents of ``path`` with an empty value (as the broker's
    EtcdMetadataStore materializes them)."""
    ops = []
    parts = path.split("/")[1:-1]
    for i in range(len(parts)):
        parent = ("/" + "/".join(parts[:i + 1])).encode()
        ops.append(rpc.RequestOp(request_txn=rpc.TxnRequest(
            compare=[rpc.Compare(key=parent, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                                 create_revision=0)],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=parent, value=b""))])))
    return ops


async def _with_etcd(metadata_store_url: str, what: str, call, timeout_s: float):
    """Run ``await call(client)`` against the first etcd endpoint of ``metadata_store_url`` that
    answers, retrying for ``timeout_s`` seconds; raises RegistrationError after that."""
    endpoints = parse_etcd_endpoints(metadata_store_url)
    deadline = time.monotonic() + timeout_s
    i = 0
    while True:
        host, port = endpoints[i % len(endpoints)]
        client = aetcd.Client(host=host, port=port)
        try:
            await client.connect()
            return await call(client)
        except (grpc.aio.AioRpcError, aetcd.ClientError) as exc:
            problem = _describe(exc)
        finally:
            try:
                await client.close()
            except Exception:  # noqa: BLE001 - closing a client that never connected
                pass
        if time.monotonic() >= deadline:
            raise RegistrationError(f"cannot {what} in etcd at {metadata_store_url} after {timeout_s:g} s "
                                    f"({problem}): start etcd or fix metadata_store_url")
        log.warning("%s: cannot reach etcd at %s:%s (%s); retrying", what, host, port, problem)
        i += 1
        await asyncio.sleep(0.5)


async def read_stored_cookie(metadata_store_url: str, bookie_id: str, timeout_s: float = 30.0):
    """The bookie's cookie kept in the metadata store under ``/ledgers/cookies/<bookie_id>``
    (BookKeeper's ``Cookie.readFromRegistrationManager``), a :class:`bookie.cookie.Cookie`,
    or None when there is none. Raises RegistrationError (etcd unreachable for ``timeout_s``)
    and InvalidCookieError when the stored value is not a cookie."""
    from bookie import cookie as cookies

    path = cookies.stored_cookie_path(bookie_id)

    async def get(client):
        reply = await client.kvstub.Range(rpc.RangeRequest(key=path.encode()), timeout=5.0)
        return reply.kvs[0].value if reply.kvs else None

    raw = await _with_etcd(metadata_store_url, f"read the cookie {path}", get, timeout_s)
    if raw is None:
        return None
    try:
        return cookies.cookie_from_json(raw)
    except ValueError as exc:
        raise cookies.InvalidCookieError(f"the metadata store's cookie {path} is damaged ({exc}); delete it "
                                         f"(etcdctl del {path}) to register this bookie again") from None


async def write_stored_cookie(metadata_store_url: str, bookie_id: str, cookie, replace: bool = False,
                              timeout_s: float = 30.0) -> None:
    """Keep ``cookie`` (a :class:`bookie.cookie.Cookie`) under ``/ledgers/cookies/<bookie_id>``
    (BookKeeper's ``Cookie.writeToRegistrationManager``; no lease: it outlives the bookie's
    process, that is its point). Without ``replace`` an existing cookie is left as it is
    (checked at start by :func:`bookie.cookie.check_stored_cookie`); with it (``--format``)
    it is overwritten. Raises RegistrationError when etcd is unreachable for ``timeout_s``."""
    from bookie import cookie as cookies

    path = cookies.stored_cookie_path(bookie_id)
    key, value = path.encode(), cookie.to_json().encode()

    async def put(client):
        put_op = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value))
        if replace:
            ops = _parent_ops(path) + [put_op]
            await client.kvstub.Txn(rpc.TxnRequest(success=ops), timeout=5.0)
        else:
            await client.kvstub.Txn(rpc.TxnRequest(
                compare=[rpc.Compare(key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                                     create_revision=0)],
                success=_parent_ops(path) + [put_op]), timeout=5.0)

    await _with_etcd(metadata_store_url, f"write the cookie {path}", put, timeout_s)
    log.info("bookie %s: cookie (instance %s) kept in the metadata store under %s%s", bookie_id,
             cookie.instance_id, path, " (replaced)" if replace else "")


class BookieRegistration:
    """Keep ``/ledgers/available/<address>`` registered in etcd while the bookie runs.

    ``metadata_store_url``: ``etcd://host:port[,host:port...]`` (ValueError otherwise).
    ``address``: the bookie's advertised ``host:port``. ``ttl_s``: lease TTL in whole
    seconds (etcd may grant more, at least 2 s). ``connect_timeout_s``: how long
    ``start()`` retries while etcd is unreachable before raising RegistrationError.
    ``operation_timeout_s``: deadline of each etcd call. ``read_only``: register under
    ``/ledgers/available/readonly/<address>`` instead (BookKeeper's read-only bookie, disk
    full); :meth:`set_read_only` moves the key when the state changes.
    """

    def __init__(self, metadata_store_url: str, address: str, *, value: bytes = b"", ttl_s: int = DEFAULT_TTL_S,
                 connect_timeout_s: float = 30.0, operation_timeout_s: float = 5.0,
                 read_only: bool = False) -> None:
        self._endpoints = parse_etcd_endpoints(metadata_store_url)
        if not address or ":" not in address or "/" in address:
            raise ValueError(f"bookie address must be 'host:port', got {address!r}")
        if not isinstance(ttl_s, int) or ttl_s < 1:
            raise ValueError(f"ttl_s must be an int >= 1 second, got {ttl_s!r}")
        self.url = metadata_store_url
        self.address = address
        self.value = bytes(value)
        self.ttl_s = ttl_s
        self.connect_timeout_s = connect_timeout_s
        self.operation_timeout_s = operation_timeout_s
        self.read_only = read_only
        self.path = self._path_for(read_only)
        self._stale_key: Optional[bytes] = None   # the other state's key, deleted at the next registration
        self._move_lock = asyncio.Lock()
        self.lease_id: Optional[int] = None
        self._granted_ttl = ttl_s
        self._index = 0
        self._client: Optional[aetcd.Client] = None
        self._task: Optional[asyncio.Task] = None
        self._stopped = False

    def _path_for(self, read_only: bool) -> str:
        return f"{READONLY_PATH if read_only else AVAILABLE_PATH}/{self.address}"

    async def set_read_only(self, read_only: bool) -> None:
        """Register as read-only (``/ledgers/available/readonly/<address>``) or writable again
        (``/ledgers/available/<address>``): the new key is put with the lease and the old one
        deleted in one transaction (BookKeeper's ``registerBookie(readOnly)``), so brokers never
        choose a read-only bookie for a new ensemble. When etcd cannot be reached now, the
        keep-alive task does the move at its next step. Never raises (logged)."""
        async with self._move_lock:
            if read_only == self.read_only:
                return
            self._stale_key = self.key
            self.read_only = read_only
            self.path = self._path_for(read_only)
            if self._stopped or self.lease_id is None:
                return   # start() registers under the new path
            try:
                await self._move()
                log.info("bookie %s registered as %s under %s", self.address,
                         "READ-ONLY" if read_only else "writable", self.path)
            except (grpc.aio.AioRpcError, aetcd.ClientError) as exc:
                log.warning("bookie registration: cannot move %s to %s now (%s); retrying with the keep-alive",
                            self.address, self.path, _describe(exc))

    async def _move(self) -> None:
        """Put ``key`` with the current lease (parents materialized) and delete the stale key."""
        client = await self._connected()
        ops = self._parent_ops() + [rpc.RequestOp(request_put=rpc.PutRequest(key=self.key, value=self.value,
                                                                             lease=self.lease_id))]
        if self._stale_key is not None:
            ops.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self._stale_key)))
        await client.kvstub.Txn(rpc.TxnRequest(success=ops), timeout=self.operation_timeout_s)
        self._stale_key = None

    def _parent_ops(self) -> list:
        return _parent_ops(self.path)

    @property
    def key(self) -> bytes:
        """The etcd key: ``b"/ledgers/available/<host:port>"``."""
        return self.path.encode()

    async def start(self) -> None:
        """Register (retrying while etcd is unreachable, one warning per attempt) and start
        the keep-alive task. Raises RegistrationError after ``connect_timeout_s`` seconds
        without success."""
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                await self._register()
                break
            except (grpc.aio.AioRpcError, aetcd.ClientError) as exc:
                problem = _describe(exc)
                self._next_endpoint()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                await self._close_client()
                raise RegistrationError(f"cannot register bookie {self.address} in etcd at {self.url} after "
                                        f"{self.connect_timeout_s:g} s ({problem}): start etcd or fix "
                                        f"metadata_store_url")
            log.warning("bookie registration: cannot reach etcd at %s (%s); retrying", self.url, problem)
            await asyncio.sleep(min(0.5, remaining))
        log.info("bookie %s registered in etcd at %s under %s (lease %x, TTL %d s)", self.address,
                 self._endpoint_text(), self.path, self.lease_id, self._granted_ttl)
        self._task = asyncio.get_running_loop().create_task(self._keep_alive())

    async def stop(self) -> None:
        """Stop keeping the lease alive and revoke it: the key disappears at once (best
        effort: if etcd is unreachable it expires after the TTL). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self.lease_id is not None and self._client is not None:
            try:
                await self._client.leasestub.LeaseRevoke(rpc.LeaseRevokeRequest(ID=self.lease_id),
                                                        timeout=min(2.0, self.operation_timeout_s))
                log.info("bookie %s unregistered from etcd", self.address)
            except grpc.aio.AioRpcError as exc:
                log.warning("bookie registration: could not revoke lease %x (%s); the key expires in %d s",
                            self.lease_id, _describe(exc), self._granted_ttl)
        self.lease_id = None
        await self._close_client()

    # -------------------------------------------------------------- internals

    async def _connected(self) -> aetcd.Client:
        if self._client is None:
            host, port = self._endpoints[self._index]
            self._client = aetcd.Client(host=host, port=port, options={
                "grpc.initial_reconnect_backoff_ms": 100, "grpc.min_reconnect_backoff_ms": 100,
                "grpc.max_reconnect_backoff_ms": 1000})
        await self._client.connect()
        return self._client

    def _endpoint_text(self) -> str:
        host, port = self._endpoints[self._index]
        return f"{host}:{port}"

    def _next_endpoint(self) -> None:
        """With several endpoints, use the next one from the next call on."""
        if len(self._endpoints) > 1 and self._client is not None:
            old, self._client = self._client, None
            self._index = (self._index + 1) % len(self._endpoints)
            asyncio.get_running_loop().create_task(old.close())

    async def _close_client(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                await client.close()
            except Exception:
                log.debug("closing the etcd client failed", exc_info=True)

    async def _register(self) -> None:
        """Grant a new lease and put the key with it (parents materialized when missing)."""
        client = await self._connected()
        timeout = self.operation_timeout_s
        grant = await client.leasestub.LeaseGrant(rpc.LeaseGrantRequest(TTL=self.ttl_s), timeout=timeout)
        ops = self._parent_ops()
        ops.append(rpc.RequestOp(request_put=rpc.PutRequest(key=self.key, value=self.value, lease=grant.ID)))
        stale = self._stale_key
        if stale is not None:
            ops.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=stale)))
        await client.kvstub.Txn(rpc.TxnRequest(success=ops), timeout=timeout)
        if self._stale_key == stale:
            self._stale_key = None
        old, self.lease_id, self._granted_ttl = self.lease_id, grant.ID, grant.TTL
        if old is not None and old != grant.ID:  # a lease we lost track of: let it go
            try:
                await client.leasestub.LeaseRevoke(rpc.LeaseRevokeRequest(ID=old), timeout=timeout)
            except grpc.aio.AioRpcError:
                pass

    async def _keep_alive(self) -> None:
        """Refresh the lease every TTL/3 s; register again when etcd says the lease is gone."""
        failing = False
        while not self._stopped:
            interval = max(0.3, min(self.ttl_s, self._granted_ttl) / 3.0)
            started = time.monotonic()
            try:
                client = await self._connected()
                reply = await keep_alive_rpc(client, self.lease_id, timeout=max(0.5, min(interval, 5.0)))
                ttl = reply.TTL if reply is not None else 0
                if ttl <= 0:
                    log.warning("bookie registration: lease %x of %s expired; registering again",
                                self.lease_id, self.address)
                    await self._register()
                    log.info("bookie %s registered again (lease %x)", self.address, self.lease_id)
                elif self._stale_key is not None:   # a read-only move that failed earlier
                    async with self._move_lock:
                        if self._stale_key is not None:
                            await self._move()
                            log.info("bookie %s registered under %s", self.address, self.path)
                if failing:
                    log.info("bookie registration: etcd at %s answers again", self._endpoint_text())
                failing = False
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, aetcd.ClientError) as exc:
                if not failing:
                    log.warning("bookie registration: keep-alive to etcd at %s failed (%s); retrying",
                                self._endpoint_text(), _describe(exc))
                failing = True
                self._next_endpoint()
            except Exception:
                log.exception("bookie registration: keep-alive step failed")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
