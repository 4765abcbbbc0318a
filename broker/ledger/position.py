"""Position and Entry, as Pulsar's managed-ledger ``Position`` / ``Entry`` interfaces."""
from __future__ import annotations

from typing import NamedTuple


class Position(NamedTuple):
    """A point in a managed ledger: ``(ledger_id, entry_id)``, ordered as tuples.

    ``entry_id == -1`` means "before the first entry of ``ledger_id``" (Pulsar's
    convention for an initial mark-delete position).
    """

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> "Position":
        """Parse ``"ledger:entry"``; ValueError on anything else."""
        try:
            ledger, entry = text.split(":")
            return cls(int(ledger), int(entry))
        except ValueError:
            raise ValueError(f"invalid position {text!r}: expected 'ledgerId:entryId'") from None


EARLIEST = Position(-1, -1)
LATEST = Position(2**63 - 1, 2**63 - 1)


class Entry(NamedTuple):
    """One stored entry: its position and bytes (Pulsar's headersAndPayload)."""

    position: Position
    data: bytes
