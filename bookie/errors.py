"""Bookie client errors, named after BookKeeper's BKException subclasses."""
from __future__ import annotations


class BKException(Exception):
    """Base of every bookie/ledger error (BookKeeper's BKException)."""


class LedgerFencedError(BKException):
    """The ledger was fenced by a recovery (another writer opened it with
    recovery); this handle can no longer add. BKException.BKLedgerFencedException."""


class NotEnoughBookiesError(BKException):
    """Fewer healthy bookies than the ensemble / quorum needs, and no spare
    bookie to replace a failed one (BKNotEnoughBookiesException). Start more
    bookies or lower the ensemble/quorum sizes.

    ``read_only_bookies``: addresses of bookies that answer but are read-only
    (disk full, BookKeeper's read-only bookie): a condition that lasts until an
    operator frees space, unlike an unreachable bookie that may just be restarting."""

    def __init__(self, message: str = "", read_only_bookies=()):
        super().__init__(message)
        self.read_only_bookies = sorted(read_only_bookies)


class BookieUnavailableError(BKException):
    """One bookie could not be reached or its stream broke (BKBookieHandleNotAvailableException).

    Also raised by ledger recovery when it cannot decide where the ledger ends
    (too few bookies of an entry's write set answered "no such entry" and the
    others were unreachable or failing): the ledger then stays IN_RECOVERY in
    metadata and a later ``open_ledger(recovery=True)`` retries. Retriable."""


class NoSuchLedgerError(BKException):
    """The ledger's metadata does not exist (BKNoSuchLedgerExistsException)."""


class NoSuchEntryError(BKException):
    """The entry does not exist: at least Qw - Qa + 1 bookies of its write set
    answered "no such entry / ledger", so no ack quorum can hold it
    (BKNoSuchEntryException; PendingReadOp's maxMissedReadsAllowed rule). Also
    raised for ids outside 0..LAC. A read that failed because bookies were
    unreachable raises BookieUnavailableError instead."""


class LedgerClosedError(BKException):
    """Add on a closed or read-only ledger handle (BKLedgerClosedException)."""


class UnauthorizedAccessError(BKException):
    """The master key does not match the ledger's (BKUnauthorizedAccessException)."""


class EntryTooLargeError(BKException):
    """Entry larger than the bookie's max_entry_size_bytes. A bookie answering
    E_ENTRY_TOO_LARGE fails the whole ledger handle (every bookie has the same
    limit, so an ensemble change would not help, and entries complete in order,
    so one entry cannot be skipped)."""


class MetadataStoreError(BKException):
    """The ledger metadata could not be read or written (store unavailable), and
    nothing shows that another client changed it (BookKeeper's
    MetaStoreException / ZKException). Retriable."""


class ClientClosedError(BKException):
    """The BookKeeper client was closed while adds were pending (BKClientClosedException)."""


class DigestMismatchError(BKException):
    """An entry read from one bookie does not match the CRC32C its writer stored with it
    (BKDigestMatchException): that replica is corrupt. Readers try the next bookie of
    the entry's write set; the error only surfaces when no replica is intact (then
    as BookieUnavailableError from the ledger handle's read)."""


class BookieProtocolError(BKException):
    """A bookie answered something unexpected (invalid request, duplicate entry with other bytes)."""
