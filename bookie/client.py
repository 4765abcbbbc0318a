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

* Bookie discovery (BookKeeper's ``BookieWatcher`` / ``RegistrationClient``): with an
  empty static bookie list, the client chooses ensembles and spares among the bookies
  registered under ``/ledgers/available`` (``bookie.registration``): the list is read
  again before each new ledger's ensemble choice and before reviving quarantined
  bookies, and kept fresh by a watch on that path when the store has ``watch`` (the
  etcd store's watch sees other processes' registrations).

The bookie client does not import the broker: the metadata store is passed in
and only needs the ``MetadataAccess`` methods (``bookie.ledger_handle``).

Modules: ``bookie.connection`` (one bookie: add stream, reads, fencing),
``bookie.ledger_handle`` (``LedgerHandle``: adds, ensemble changes, reads),
``bookie.ledger_recovery`` (``LedgerRecoveryOp``), and this one (``BookKeeper``:
ledger creation, opening, deletion, bookie selection and quarantine).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import time
from typing import Optional

import grpc

from proto import bookie_pb2 as pb
from proto import metadata_pb2
from proto.channels import ChannelSecurity

from .connection import GRPC_CHANNEL_OPTIONS, PROBE_TIMEOUT_S, BookieConnection
from .errors import BKException, NoSuchLedgerError, NotEnoughBookiesError
from .connection import DEFAULT_ADD_ENTRY_TIMEOUT_S
from .ledger_handle import (LEDGER_ID_COUNTER_PATH, LedgerHandle, LedgerState,
                            MetadataAccess, ledger_path)
from .ledger_recovery import LedgerRecoveryOp

__all__ = ["BookKeeper", "LedgerHandle", "BookieConnection", "LedgerRecoveryOp", "MetadataAccess", "ledger_path",
           "GRPC_CHANNEL_OPTIONS", "DEFAULT_ADD_ENTRY_TIMEOUT_S", "AVAILABLE_BOOKIES_PATH"]

log = logging.getLogger(__name__)

# Where bookies register (BookKeeper's /ledgers/available/<host:port>; bookie.registration).
AVAILABLE_BOOKIES_PATH = "/ledgers/available"
# Where read-only bookies register instead (BookKeeper's /ledgers/available/readonly/<host:port>).
READONLY_BOOKIES_PATH = AVAILABLE_BOOKIES_PATH + "/readonly"


def _is_bookie_address(name: str) -> bool:
    host, sep, port = name.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


class BookKeeper:
    """Entry point of the bookie client (BookKeeper's ``BookKeeper`` class).

    ``bookies``: addresses ``host:port`` of every bookie the client may use;
    ensembles are chosen among them, the others are spares for ensemble changes.
    Empty (or None): the bookies registered under ``/ledgers/available`` in the metadata
    store (read with ``metadata.get_children``, refreshed before each ensemble choice and
    watched when the store has ``watch``); ``bookies`` then holds the last list read.
    ``max_entry_size_bytes``: client-side limit checked before an add (default 5 MiB).
    ``rpc_timeout_s``: deadline of each read / fence / LAC / delete RPC, seconds.
    ``add_entry_timeout_s``: an add a bookie leaves unanswered this long (seconds,
    default 30, BookKeeper's addEntryTimeout; Pulsar sets it from
    bookkeeperClientTimeoutInSeconds) counts as that bookie failing: ensemble
    change when a spare exists, else the ledger handle fails with
    NotEnoughBookiesError. ``None`` disables it.
    ``failed_bookie_quarantine_s``: a failed bookie is not chosen for new
    ensembles or as a spare for this long (seconds).
    ``security``: ``proto.channels.ChannelSecurity`` of the connections to the
    bookies (None: plaintext, no credentials).
    """

    def __init__(self, metadata: MetadataAccess, bookies: Optional[list[str]] = None, *,
                 max_entry_size_bytes: int = 5 * 1024 * 1024, rpc_timeout_s: float = 10.0,
                 failed_bookie_quarantine_s: float = 30.0,
                 add_entry_timeout_s: Optional[float] = DEFAULT_ADD_ENTRY_TIMEOUT_S,
                 security: Optional[ChannelSecurity] = None):
        if add_entry_timeout_s is not None and not add_entry_timeout_s > 0:
            raise ValueError(f"add_entry_timeout_s must be > 0 seconds or None, got {add_entry_timeout_s!r}")
        self.metadata = metadata
        self.static_bookies = bool(bookies)  # False: discovered under /ledgers/available
        self.bookies = list(bookies or [])
        self._cancel_bookies_watch = None
        self.max_entry_size_bytes = max_entry_size_bytes
        self.rpc_timeout_s = rpc_timeout_s
        self.add_entry_timeout_s = add_entry_timeout_s
        self.quarantine_s = failed_bookie_quarantine_s
        self.security = security  # proto.channels.ChannelSecurity of every bookie connection (None: plaintext)
        self._connections: dict[str, BookieConnection] = {}
        self._failed_at: dict[str, float] = {}
        # Bookies that answered a probe as read-only (disk full): never chosen for a new
        # ensemble or as a spare until a probe finds them writable (BookKeeper's placement
        # uses only writable bookies; read-only ones register under /ledgers/available/readonly).
        self.read_only_bookies: set[str] = set()
        self._read_only_probed_at = 0.0   # time.monotonic() of the last probe of quarantined bookies
        self._closed = False
        # Digest mismatches read, per bookie address (DigestManager): corrupt replicas seen.
        self.corrupt_replicas: collections.Counter = collections.Counter()

    def connection(self, address: str) -> BookieConnection:
        """The ``BookieConnection`` to ``address`` (``host:port``), created on first use and
        shared by every ledger handle of this client (BookKeeper's ``BookieClient`` pool)."""
        conn = self._connections.get(address)
        if conn is None:
            conn = self._connections[address] = BookieConnection(address, self.rpc_timeout_s,
                                                                  self.add_entry_timeout_s, self.corrupt_replicas,
                                                                  self.security)
        return conn

    def mark_failed(self, address: str) -> None:
        """Quarantine ``address`` for ``failed_bookie_quarantine_s`` seconds from now: it is not
        chosen for new ensembles or as a spare (BookKeeper's bookieQuarantineTimeSeconds;
        Pulsar: bookkeeperClientHealthCheckQuarantineTimeInSeconds)."""
        self._failed_at[address] = time.monotonic()

    def is_failed(self, address: str) -> bool:
        """True while ``address`` is quarantined (marked failed less than
        ``failed_bookie_quarantine_s`` seconds ago) or was last seen read-only."""
        if address in self.read_only_bookies:
            return True
        t = self._failed_at.get(address)
        return t is not None and time.monotonic() - t < self.quarantine_s

    async def refresh_bookies(self) -> list[str]:
        """Without a static list: read the bookies registered under ``/ledgers/available``
        (``metadata.get_children``) into ``bookies`` and make sure a watch keeps it fresh.
        Returns ``bookies``. A failed read keeps the last list (logged). With a static list:
        returns it unchanged."""
        if self.static_bookies or self._closed:
            return self.bookies
        try:
            names = await self.metadata.get_children(AVAILABLE_BOOKIES_PATH)
        except Exception as exc:  # the store is unreachable: keep choosing among the last known
            log.warning("cannot list the available bookies under %s (%s); using the last list %s",
                        AVAILABLE_BOOKIES_PATH, exc, self.bookies)
            return self.bookies
        self._set_available([n for n in names if _is_bookie_address(n)])
        watch = getattr(self.metadata, "watch", None)
        if self._cancel_bookies_watch is None and watch is not None:
            try:
                self._cancel_bookies_watch = watch(self._on_available_change, AVAILABLE_BOOKIES_PATH)
            except Exception as exc:  # closed store: the next refresh tries again
                log.debug("cannot watch %s: %s", AVAILABLE_BOOKIES_PATH, exc)
        return self.bookies

    async def _on_available_change(self, _notification) -> None:
        await self.refresh_bookies()

    def _set_available(self, names: list[str]) -> None:
        names = sorted(names)
        if names != self.bookies:
            added = sorted(set(names) - set(self.bookies))
            self.read_only_bookies.difference_update(added)   # registered writable again
            removed = sorted(set(self.bookies) - set(names))
            log.info("available bookies: %s (added %s, removed %s)", names, added or "none", removed or "none")
            self.bookies = names

    def pick_spare(self, exclude: list[str]) -> Optional[str]:
        """A random healthy bookie not in ``exclude`` (addresses), or None."""
        candidates = [b for b in self.bookies if b not in exclude and not self.is_failed(b)]
        return random.choice(candidates) if candidates else None

    async def revive_quarantined(self, exclude=()) -> int:
        """Probe the quarantined and read-only bookies not in ``exclude`` (one GetBookieInfo
        each, PROBE_TIMEOUT_S); those that answer as *writable* leave quarantine, those that
        answer read-only (disk full) stay out of the ensemble choices (``read_only_bookies``:
        a read-only bookie serves reads, so answering alone proves nothing). Returns how many
        came back, plus (without a static list) how many healthy bookies not in ``exclude``
        registered since the last read. Used when too few healthy bookies are left for an
        ensemble or a spare, as BookKeeper's placement falls back to quarantined bookies then."""
        discovered = 0
        if not self.static_bookies:
            before = set(self.bookies)
            await self.refresh_bookies()
            discovered = sum(1 for b in self.bookies if b not in before and b not in exclude and not self.is_failed(b))
        quarantined = [b for b in self.bookies if b not in exclude and self.is_failed(b)]
        if not quarantined:
            return discovered

        async def probe(address: str) -> Optional[bool]:
            """None when the probe got UNAVAILABLE / DEADLINE_EXCEEDED / CANCELLED, else whether
            the bookie is read-only (an older bookie without GetBookieInfo: False)."""
            try:
                info = await self.connection(address).stub.GetBookieInfo(
                    pb.BookieInfoRequest(), timeout=PROBE_TIMEOUT_S, wait_for_ready=True)
                return bool(info.read_only)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.CANCELLED):
                    return None
                return False

        results = await asyncio.gather(*(probe(b) for b in quarantined))
        self._read_only_probed_at = time.monotonic()
        revived = 0
        for address, read_only in zip(quarantined, results):
            if read_only is None:
                continue
            if read_only:
                if address not in self.read_only_bookies:
                    log.warning("bookie %s is read-only (disk full): not chosen for new ensembles", address)
                self.read_only_bookies.add(address)
                continue
            self._failed_at.pop(address, None)
            if address in self.read_only_bookies:
                self.read_only_bookies.discard(address)
                log.info("bookie %s is writable again", address)
            revived += 1
            log.info("bookie %s answers again: back in the ensemble choices", address)
        return revived + discovered

    async def _read_only_registered(self) -> list[str]:
        """Bookies registered read-only under ``/ledgers/available/readonly`` (none with a static
        list; [] when the store cannot be read), plus those a probe found read-only."""
        names: list[str] = []
        if not self.static_bookies:
            try:
                names = [n for n in await self.metadata.get_children(READONLY_BOOKIES_PATH)
                         if _is_bookie_address(n)]
            except Exception:  # noqa: BLE001 - only for the error message
                names = []
        return sorted(set(names) | self.read_only_bookies)

    async def create_ledger(self, ensemble_size: int, write_quorum: int, ack_quorum: int) -> LedgerHandle:
        """Create a ledger on ``ensemble_size`` healthy bookies; returns the writer's handle.

        Requires ensemble_size >= write_quorum >= ack_quorum >= 1 (ValueError otherwise);
        raises NotEnoughBookiesError when fewer healthy bookies are known (without a static
        list: registered under ``/ledgers/available``, read again now).
        """
        if not (ensemble_size >= write_quorum >= ack_quorum >= 1):
            raise ValueError(f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                             f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}")
        await self.refresh_bookies()
        if self.read_only_bookies and time.monotonic() - self._read_only_probed_at >= self.quarantine_s:
            await self.revive_quarantined()   # a read-only bookie may be writable again: ask
        healthy = [b for b in self.bookies if not self.is_failed(b)]
        if len(healthy) < ensemble_size and await self.revive_quarantined():
            healthy = [b for b in self.bookies if not self.is_failed(b)]
        if len(healthy) < ensemble_size:
            where = "" if self.static_bookies else f" registered under {AVAILABLE_BOOKIES_PATH}"
            read_only = await self._read_only_registered()
            ro = f"; read-only (disk full): {read_only}" if read_only else ""
            raise NotEnoughBookiesError(
                f"NotEnoughBookies: need {ensemble_size} writable bookies for a new ledger, {len(healthy)} "
                f"healthy of {len(self.bookies)}{where}{ro}", read_only_bookies=read_only)
        ledger_id = await self.metadata.increment_counter(LEDGER_ID_COUNTER_PATH)
        start = ledger_id % len(healthy)
        ensemble = (healthy[start:] + healthy[:start])[:ensemble_size]
        ids = await self.instance_ids(ensemble)
        silent = [b for b in ensemble if b not in ids]
        if silent:
            # A bookie that does not even answer GetBookieInfo now is not healthy: choose among
            # the others when enough are left (its instance id could not be recorded either).
            for b in silent:
                self.mark_failed(b)
            rest = [b for b in healthy if b not in silent]
            if len(rest) >= ensemble_size:
                ensemble = (rest[start % len(rest):] + rest[:start % len(rest)])[:ensemble_size]
                ids = await self.instance_ids(ensemble)
            log.warning("bookie(s) %s did not answer GetBookieInfo within %.1f s: ensemble of ledger %d is %s",
                        silent, PROBE_TIMEOUT_S, ledger_id, ensemble)
        md = metadata_pb2.LedgerMetadata(
            ensemble_size=ensemble_size, write_quorum_size=write_quorum, ack_quorum_size=ack_quorum,
            state=LedgerState.OPEN, last_entry_id=-1, length=0, password=os.urandom(16),
            ctime=int(time.time() * 1000))
        md.fragments.add(first_entry_id=0, ensemble=ensemble)
        md.bookie_instance_ids.update(ids)
        version = await self.metadata.put(ledger_path(ledger_id), md.SerializeToString(), expected_version=-1)
        return LedgerHandle(self, ledger_id, md, version, writable=True)

    async def instance_ids(self, addresses) -> dict[str, str]:
        """The cookie instance id of each bookie of ``addresses`` (``host:port``) as its last
        answer on this client carried it, asked with GetBookieInfo (PROBE_TIMEOUT_S) when none
        did yet. A bookie that does not answer is left out. Recorded in the ledger metadata
        (``bookie_instance_ids``) so that ledger recovery can tell a bookie that took the
        adds from one wiped and re-initialized under its address (BookKeeper: the bookie's
        Cookie, instanceId). Never raises."""
        out: dict[str, str] = {}
        missing = []
        for address in addresses:
            known = self.connection(address).last_instance_id
            if known:
                out[address] = known
            else:
                missing.append(address)

        async def ask(address: str) -> None:
            try:
                info = await self.connection(address).stub.GetBookieInfo(pb.BookieInfoRequest(),
                                                                          timeout=PROBE_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                return
            if info.instance_id:
                self.connection(address)._note_instance(info.instance_id)
                out[address] = info.instance_id

        if missing:
            await asyncio.gather(*(ask(a) for a in missing))
        return out

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
            return await LedgerRecoveryOp(self).recover(ledger_id, md, version)
        handle = LedgerHandle(self, ledger_id, md, version, writable=False)
        lacs = []
        for address in handle.ensemble:
            try:
                lacs.append((await self.connection(address).read_last_add_confirmed(ledger_id)).last_add_confirmed)
            except BKException:
                pass
        handle.last_add_confirmed = max(lacs + [md.fragments[-1].first_entry_id - 1])
        return handle

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
        if self._cancel_bookies_watch is not None:
            self._cancel_bookies_watch()
            self._cancel_bookies_watch = None
        for conn in list(self._connections.values()):
            await conn.close()
        self._connections.clear()
