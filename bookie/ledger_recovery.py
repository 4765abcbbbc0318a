"""Ledger recovery (BookKeeper's ``LedgerRecoveryOp``): fence the last
ensemble, floor the LAC at the last fragment (BOOKKEEPER #2615), read forward
writing every readable entry back, close before the first entry that
Qw-Qa+1 bookies of its write set say they do not have. Never closes short:
when it cannot decide, it raises and the ledger stays IN_RECOVERY."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Optional

from crc32c import crc32c as _crc32c

from proto import bookie_pb2 as pb
from proto import metadata_pb2

from .connection import STATUS_UNAVAILABLE, _status_error, _status_name
from .errors import BKException, BookieUnavailableError, NoSuchEntryError, NoSuchLedgerError
from .ledger_handle import LedgerHandle, LedgerState, _has_quorum_coverage, ledger_path

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .client import BookKeeper

# Ledger recovery reads and writes back entries above the LAC in chunks of about
# this many payload bytes (first chunk: a fixed count, later ones sized by the
# average entry seen), at most RECOVERY_MAX_CHUNK_ENTRIES entries each.
RECOVERY_CHUNK_BYTES = 4 * 1024 * 1024
RECOVERY_FIRST_CHUNK_ENTRIES = 64
RECOVERY_MAX_CHUNK_ENTRIES = 2048
# Recovery reads that must decide "present / absent" (a fast range read failed)
# read this many entries concurrently, each from its whole write set.
RECOVERY_STRICT_WINDOW = 16
# Refusals of a recovery add that another bookie would give too: no ensemble change helps.
_RECOVERY_FATAL_STATUSES = frozenset((pb.E_UNAUTHORIZED_ACCESS, pb.E_ENTRY_TOO_LARGE))


class LedgerRecoveryOp:
    """One recovery of one ledger by ``bk`` (a ``bookie.client.BookKeeper``):
    ``await LedgerRecoveryOp(bk).recover(ledger_id, metadata, version)`` -> a
    closed, read-only ``LedgerHandle``. Raises BookieUnavailableError when too
    few bookies answer to decide where the ledger ends, MetadataStoreError on a
    metadata version conflict (another recovery won)."""

    def __init__(self, bk: "BookKeeper"):
        self.bk = bk
        self.metadata = bk.metadata
        self.distrusted: dict[str, str] = {}   # address -> why its answers do not count (other instance)

    def connection(self, address: str):
        """The client's shared ``BookieConnection`` to ``address`` (``host:port``)."""
        return self.bk.connection(address)

    def mark_failed(self, address: str) -> None:
        """Quarantine ``address`` in the client (``BookKeeper.mark_failed``)."""
        self.bk.mark_failed(address)

    async def recover(self, ledger_id: int, md, version: int) -> LedgerHandle:
        """BookKeeper's LedgerRecoveryOp: fence, read forward from the LAC, write back, close.

        1. Metadata -> IN_RECOVERY (stays so if this raises: a later open retries).
        2. Fence the last fragment's ensemble; every write set needs Qw-Qa+1 bookies
           answering (quorum coverage), else BookieUnavailableError.
        3. LAC = max(LAC the fenced bookies report, last fragment's first entry - 1)
           (BOOKKEEPER #2615).
        4. Read forward from LAC+1: an entry any bookie returns is written back to
           Qa bookies of its write set; an entry is absent only when Qw-Qa+1
           bookies of its write set answer "no such entry / ledger" -- then the
           ledger ends before it. If neither can be decided (bookies unreachable
           or failing), BookieUnavailableError. A bookie that fails a recovery
           add is replaced by a spare from the first entry that missed its ack
           quorum on, and the entries from there are written again (an ensemble
           change during recovery, as BookKeeper's ReadOnlyLedgerHandle does):
           kept in a local copy of the metadata until the close, while the
           reads keep the fragments the ledger had (a spare knows none of the
           entries still to read, and its "no such entry" must not end the
           ledger). No spare: BookieUnavailableError, the ledger stays IN_RECOVERY.
        5. Metadata -> CLOSED at the last entry written back, with the
           recovery's ensemble changes.
        """
        md.state = LedgerState.IN_RECOVERY
        version = await self.metadata.put(ledger_path(ledger_id), md.SerializeToString(), expected_version=version)
        last_frag = md.fragments[-1]
        ensemble = list(last_frag.ensemble)
        results = await asyncio.gather(*(self.connection(b).fence(ledger_id, md.password) for b in ensemble),
                                       return_exceptions=True)
        answered = {b: r for b, r in zip(ensemble, results) if not isinstance(r, BaseException)}
        # A bookie that is another instance than the one that took the adds (wiped and
        # re-initialized under the same address) cannot vouch for anything it no longer has:
        # its fence answer and its "no such entry" do not count (BookKeeper: cookies).
        self.distrusted = self._other_instances(ledger_id, md, answered)
        for b in self.distrusted:
            answered.pop(b)
        for b, r in zip(ensemble, results):
            if isinstance(r, BookieUnavailableError):
                self.mark_failed(b)  # fast-path reads try it last
        if not _has_quorum_coverage(ensemble, md.write_quorum_size, md.ack_quorum_size, answered):
            errors = [f"{b}: {r}" for b, r in zip(ensemble, results) if isinstance(r, BaseException)]
            errors += [f"{b}: {why}" for b, why in self.distrusted.items()]
            raise BookieUnavailableError(
                f"ledger {ledger_id}: recovery needs {md.write_quorum_size - md.ack_quorum_size + 1} bookies of "
                f"every write set of {ensemble} to fence, only {sorted(answered)} answered: {errors}")
        reported_lac = max(r.last_add_confirmed for r in answered.values())
        lac = max(reported_lac, last_frag.first_entry_id - 1)
        handle = LedgerHandle(self.bk, ledger_id, md, version, writable=False)
        handle.last_add_confirmed = lac
        write_md = metadata_pb2.LedgerMetadata()
        write_md.CopyFrom(md)            # the recovery's ensemble changes, written at the close
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
                    await self._write_back_many(handle, write_md, entry, payloads)
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
                    await self._write_back_many(handle, write_md, entry, payloads)
                    handle.last_add_confirmed = entry + len(payloads) - 1
                    written_back += len(payloads)
                    entry += len(payloads)
            if absent:
                break
        write_md.state = LedgerState.CLOSED
        write_md.last_entry_id = handle.last_add_confirmed
        version = await self.metadata.put(ledger_path(ledger_id), write_md.SerializeToString(),
                                          expected_version=version)
        handle._version = version
        handle.metadata = write_md
        log.info("ledger %d recovered: closed at entry %d (bookies' LAC %d, floor %d, %d entries written back%s)",
                 ledger_id, write_md.last_entry_id, reported_lac, last_frag.first_entry_id - 1, written_back,
                 f", ensemble now {list(write_md.fragments[-1].ensemble)}"
                 if list(write_md.fragments[-1].ensemble) != ensemble else "")
        return handle

    @staticmethod
    def _other_instances(ledger_id: int, md, answered: dict) -> dict[str, str]:
        """{address: why} of the fenced bookies whose answer carries another instance id than
        the one recorded in the ledger metadata when they joined its ensemble."""
        out = {}
        for b, r in answered.items():
            recorded = md.bookie_instance_ids.get(b)
            if recorded and r.instance_id and r.instance_id != recorded:
                out[b] = (f"bookie {b} is instance {r.instance_id}, not instance {recorded} that took the adds "
                          f"of ledger {ledger_id}: its data dir was wiped and re-initialized")
                log.error("ledger %d recovery: %s; its answers do not count", ledger_id, out[b])
        return out

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
                    if isinstance(exc, (NoSuchEntryError, NoSuchLedgerError)) and address in self.distrusted:
                        errors.append(f"{address}: {exc} (not counted: {self.distrusted[address]})")
                    elif isinstance(exc, (NoSuchEntryError, NoSuchLedgerError)):
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

    async def _write_back_many(self, handle: LedgerHandle, write_md, first: int, payloads: list[bytes]) -> None:
        """Write entries ``first, first+1, ...`` back (recovery adds, pipelined) to their
        write sets in ``write_md``; a bookie that fails one is replaced (``_replace``)
        and the entries from the first one short of Qa are written again. Raises
        BookieUnavailableError when no spare is left, LedgerFencedError-like
        ``BKException``s for a refusal no other bookie changes (wrong key, too large)."""
        start = first
        for _ in range(len(self.bk.bookies) + 1):
            results = await self._recovery_adds(handle, write_md, start, payloads[start - first:])
            short = sorted(e for e, answers in results.items()
                           if sum(1 for _, status, _ in answers if status == pb.EOK) < write_md.ack_quorum_size)
            if not short:
                return
            x = short[0]
            for address, status, message in results[x]:
                if status in _RECOVERY_FATAL_STATUSES:
                    raise _status_error(status, f"recovery write-back of entry {x} to {address}: {message}",
                                        handle.ledger_id)
            failed = {address: (message if status == STATUS_UNAVAILABLE else f"{_status_name(status)}: {message}")
                      for e, answers in results.items() if e >= x
                      for address, status, message in answers if status != pb.EOK}
            self._replace(handle.ledger_id, write_md, x, failed)
            start = x
        raise BookieUnavailableError(f"ledger {handle.ledger_id}: recovery write-back from entry {start} failed on "
                                     f"every ensemble tried (last {list(write_md.fragments[-1].ensemble)})")

    def _replace(self, ledger_id: int, write_md, first_entry: int, failed: dict[str, str]) -> None:
        """Ensemble change during recovery (local to ``write_md``): the ``failed``
        bookies of the last fragment are replaced by spares from ``first_entry`` on
        (BookKeeper's ReadOnlyLedgerHandle.handleBookieFailure). Raises
        BookieUnavailableError without a spare: the ledger stays IN_RECOVERY."""
        ensemble = list(write_md.fragments[-1].ensemble)
        replace = [b for b in ensemble if b in failed]
        if not replace:
            raise BookieUnavailableError(f"ledger {ledger_id}: recovery write-back of entry {first_entry} failed "
                                         f"outside the ensemble {ensemble}: {failed}")
        new_ensemble = list(ensemble)
        exclude = set(ensemble) | set(failed)
        for b in replace:
            self.mark_failed(b)
            spare = self.bk.pick_spare(exclude=list(exclude))
            if spare is None:
                raise BookieUnavailableError(
                    f"ledger {ledger_id}: recovery cannot write entry {first_entry} back: bookie(s) {replace} "
                    f"failed ({'; '.join(failed.values())}) and no spare bookie is available (ensemble "
                    f"{ensemble}, known bookies {self.bk.bookies}); the ledger stays in recovery until one is")
            new_ensemble[new_ensemble.index(b)] = spare
            exclude.add(spare)
            known = self.connection(spare).last_instance_id
            if known:
                write_md.bookie_instance_ids[spare] = known
        if write_md.fragments[-1].first_entry_id >= first_entry:
            del write_md.fragments[-1].ensemble[:]
            write_md.fragments[-1].ensemble.extend(new_ensemble)
        else:
            write_md.fragments.add(first_entry_id=first_entry, ensemble=new_ensemble)
        log.warning("ledger %d recovery: ensemble change from entry %d: %s replaced by %s (%s)", ledger_id,
                    first_entry, replace, [new_ensemble[ensemble.index(b)] for b in replace],
                    "; ".join(failed.values()))

    async def _recovery_adds(self, handle: LedgerHandle, write_md, first: int,
                             payloads: list[bytes]) -> dict[int, list[tuple[str, int, str]]]:
        """Send recovery adds of entries ``first, ...`` to their write sets in
        ``write_md``, all pipelined; returns per entry the (bookie, status, message)
        answers (``STATUS_UNAVAILABLE`` for an unreachable bookie)."""
        loop = asyncio.get_running_loop()
        futures = []
        ensemble = list(write_md.fragments[-1].ensemble)
        e, qw = len(ensemble), write_md.write_quorum_size
        for i, payload in enumerate(payloads):
            entry_id = first + i
            for address in (ensemble[(entry_id + j) % e] for j in range(qw)):
                fut = loop.create_future()
                futures.append((entry_id, address, fut))
                request = pb.AddEntryRequest(ledger_id=handle.ledger_id, entry_id=entry_id,
                                             master_key=write_md.password, payload=payload,
                                             last_add_confirmed=entry_id - 1, recovery=True,
                                             crc32c=_crc32c(payload))
                self.connection(address).add(
                    request, lambda s, m, f=fut: f.done() or f.set_result((s, m)))
        await asyncio.gather(*(f for _, _, f in futures))
        by_entry: dict[int, list[tuple[str, int, str]]] = {}
        for entry_id, address, fut in futures:
            status, message = fut.result()
            by_entry.setdefault(entry_id, []).append((address, status, message))
        return by_entry
