"""Managed-ledger and cursor errors (Pulsar's ``ManagedLedgerException``
family): one root, ``ManagedLedgerError``, for the ledger and its cursors.
They stay inside the broker; ``broker.service.errors.to_pulsar`` translates
them (with bookie and metadata-store errors) into the client-visible
hierarchy at the broker's edge."""
from __future__ import annotations

__all__ = ["ManagedLedgerError", "ManagedLedgerFencedError", "ManagedLedgerClosedError", "ManagedCursorError",
           "InvalidMarkDeletePosition", "InvalidCursorPosition"]


class ManagedLedgerError(Exception):
    """Base of managed-ledger and cursor errors (ManagedLedgerException)."""


class ManagedLedgerFencedError(ManagedLedgerError):
    """Another broker took the ledger over (its ledger was fenced); this instance
    is unusable (ManagedLedgerFencedException)."""


class ManagedLedgerClosedError(ManagedLedgerError):
    """Operation on a closed managed ledger (ManagedLedgerAlreadyClosedException)."""


class ManagedCursorError(ManagedLedgerError):
    """Base of cursor errors (ManagedLedgerException raised by ManagedCursorImpl)."""


class InvalidMarkDeletePosition(ManagedCursorError):
    """A mark-delete beyond the last confirmed entry of the managed ledger."""


class InvalidCursorPosition(ManagedCursorError):
    """Reset to a position that is not an entry of the managed ledger nor the
    position after its last entry (Pulsar's InvalidCursorPositionException)."""
