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
    bookies or lower the ensemble/quorum sizes."""


class BookieUnavailableError(BKException):
    """One bookie could not be reached or its stream broke (BKBookieHandleNotAvailableException)."""


class NoSuchLedgerError(BKException):
    """The ledger's metadata does not exist (BKNoSuchLedgerExistsException)."""


class NoSuchEntryError(BKException):
    """No bookie of the entry's write set could return the entry (BKNoSuchEntryException)."""


class LedgerClosedError(BKException):
    """Add on a closed or read-only ledger handle (BKLedgerClosedException)."""


class UnauthorizedAccessError(BKException):
    """The master key does not match the ledger's (BKUnauthorizedAccessException)."""


class EntryTooLargeError(BKException):
    """Entry larger than the bookie's max_entry_size_bytes."""


class BookieProtocolError(BKException):
    """A bookie answered something unexpected (invalid request, duplicate entry with other bytes)."""
