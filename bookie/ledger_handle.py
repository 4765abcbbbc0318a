"""Ledger handles (BookKeeper's ``LedgerHandle`` with ``PendingAddOp`` and
``PendingReadOp``): striped adds to the current write set, ack quorum over the
current write set only, ensemble changes, close at the LAC, reads with fallback
over the write set. See ``bookie.client`` for the whole protocol."""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Callable, Optional, Protocol

from crc32c import crc32c as _crc32c

from proto import bookie_pb2 as pb
from proto import metadata_pb2

from .connection import STATUS_UNAVAILABLE, BookieConnection, _framed_add, _status_error, _status_name
from .errors import (BKException, BookieUnavailableError, ClientClosedError, EntryTooLargeError, LedgerClosedError,
                     LedgerFencedError, MetadataStoreError, NoSuchEntryError, NoSuchLedgerError,
                     NotEnoughBookiesError)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .client import BookKeeper

LEDGER_ID_COUNTER_PATH = "/counters/ledger-id"
LedgerState = metadata_pb2.LedgerMetadata.State


def ledger_path(ledger_id: int) -> str:
    """Metadata-store path of a ledger's metadata, as BookKeeper's ``/ledgers/L<id>``."""
    return f"/ledgers/L{ledger_id:012d}"


class MetadataAccess(Protocol):
    """What the bookie client needs of a metadata store (``broker.metadata.MetadataStore`` fits)."""

    async def get(self, path: str):
        """The node at ``path`` as an object with ``value`` (bytes) and ``version`` (int), or None."""
        ...

    async def put(self, path: str, value: bytes, expected_version: Optional[int] = None) -> int:
        """Write ``value``; returns the new version. ``expected_version`` -1 = create only, >= 0 =
        compare-and-set, None = unconditional; a failed condition raises the store's error."""
        ...

    async def delete(self, path: str, expected_version: Optional[int] = None) -> None:
        """Delete the node at ``path`` (conditional on ``expected_version`` when given)."""
        ...

    async def increment_counter(self, path: str) -> int:
        """Atomically increment the counter at ``path`` and return the new value (ledger ids)."""
        ...

    async def get_children(self, path: str) -> list[str]:
        """Sorted child names of ``path``; used only without a static bookie list, to read
        the bookies registered under ``/ledgers/available``."""
        ...


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
        """Report the add complete: ``callback(ctx, entry_id, None)``, else resolve ``future``
        with the entry id (once; a done future is left alone)."""
        if self.callback is not None:
            self.callback(self.ctx, self.entry_id, None)
        elif not self.future.done():
            self.future.set_result(self.entry_id)

    def fail(self, error: BaseException) -> None:
        """Report the add failed: ``callback(ctx, None, error)``, else fail ``future`` with
        ``error`` (once; a done future is left alone)."""
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
                    md.bookie_instance_ids.update(await self.bk.instance_ids([new_ensemble[ensemble.index(b)]
                                                                              for b in replace]))
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
                other = await self._other_instance(address)
                if other:   # wiped and re-initialized: it cannot vouch for what it lost
                    errors.append(f"{exc} (not counted: {other})")
                    continue
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


    async def _other_instance(self, address: str) -> Optional[str]:
        """Why ``address`` is not the bookie instance the ledger metadata recorded for it
        (``bookie_instance_ids``: wiped and re-initialized), or None when it is, or when
        nothing was recorded. Asks its instance id now (GetBookieInfo: a "no such entry" is
        rare, and an id seen earlier may be from before the wipe); a bookie that cannot tell
        is treated as another instance."""
        recorded = self.metadata.bookie_instance_ids.get(address)
        if not recorded:
            return None
        conn = self.bk.connection(address)
        try:
            await conn.get_bookie_info()
        except BKException as exc:
            return f"its instance id is unknown ({exc})"
        if conn.last_instance_id != recorded:
            return (f"bookie {address} is instance {conn.last_instance_id}, not instance {recorded} that took the "
                    f"adds of ledger {self.ledger_id}")
        return None


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
