"""Message ids between Pulsar's wire and the broker's positions (pure).

Pulsar's ``MessageIdData`` ledger and entry ids are uint64 on the wire while the
Java side keeps signed longs: -1 (earliest, "no entry") arrives as 2^64-1, and
Long.MAX_VALUE (latest) as 2^63-1. Batch acknowledgment sets are Java ``BitSet``
words in which a SET bit means "not acknowledged yet"."""
from __future__ import annotations

from typing import Optional, Sequence

from broker.ledger.position import Position
from proto.pulsar_wire_pb2 import MessageIdData

_U64 = 1 << 64
_MASK = _U64 - 1
#: Pulsar's request id -1 (broker-initiated closes, errors outside a request), unsigned.
NO_REQUEST = _MASK


def signed(value: int) -> int:
    """A wire uint64 as the Java long it carries (2^64-1 -> -1)."""
    return value - _U64 if value >= 1 << 63 else value


def unsigned(value: int) -> int:
    """A Java long as its wire uint64 (-1 -> 2^64-1)."""
    return value & _MASK


def position_of(mid: MessageIdData) -> Position:
    """The (ledger_id, entry_id) Position of a wire message id (signed: -1 stays -1)."""
    return Position(signed(mid.ledgerId), signed(mid.entryId))


def message_id(ledger_id: int, entry_id: int, batch_index: Optional[int] = None) -> MessageIdData:
    """A wire MessageIdData for a position (negative ids sent unsigned) and batch index."""
    mid = MessageIdData(ledgerId=unsigned(ledger_id), entryId=unsigned(entry_id))
    if batch_index is not None and batch_index >= 0:
        mid.batch_index = batch_index
    return mid


def not_acked_bits(words: Sequence[int]) -> set[int]:
    """Indexes whose bit is set in Java BitSet ``words`` (int64 each): the messages of a
    batch NOT acknowledged yet."""
    bits = set()
    for w, word in enumerate(words):
        word &= _MASK
        while word:
            low = word & -word
            bits.add(w * 64 + low.bit_length() - 1)
            word ^= low
    return bits


def acked_indexes(words: Sequence[int], batch_size: int) -> list[int]:
    """The batch indexes in [0, batch_size) that an ack set acknowledges (clear bits)."""
    pending = not_acked_bits(words)
    return [i for i in range(batch_size) if i not in pending]
