"""Batch-index acknowledgements of a managed cursor (``batchDeletedIndexes``).

A batch entry carries ``batch_size`` messages (batch indexes ``0..batch_size-1``).
When consumers acknowledge single messages of a batch, Pulsar's
``ManagedCursorImpl`` keeps, per entry position, an *ack set*: a ``BitSet`` of
``batch_size`` bits where a **set bit means "not yet acknowledged"**.  Each
batch-index ack ANDs the set with the ack's own set; when it becomes empty
the whole entry is acknowledged, the caller acknowledges the entry position
(``individualDeletedMessages`` / mark-delete) and the entry leaves this map.

Persistence follows ``BatchedEntryDeletionIndexInfo`` (``proto/metadata.proto``):
the position plus ``deleteSet``, the ack set as ``BitSet.toLongArray()``
words -- bit ``i`` is bit ``i % 64`` of word ``i // 64``, words are signed
64-bit like Java ``long``s, trailing zero words are omitted.

Here an ack set is held as one Python int bit mask (bit ``i`` set = index
``i`` unacknowledged).  Every operation is linear in the batch size (int
arithmetic, ``int.to_bytes``/``from_bytes``, ``struct``): never one big-int
shift per bit or per word, which made a 2**22-message ack set take seconds per
ack.  Batch sizes are capped at :data:`MAX_BATCH_SIZE`; the broker passes the
entry's *real* batch size (from the entry's metadata), never a client's claim.
Pure synchronous Python, no I/O, not thread-safe.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator

from proto import metadata_pb2

__all__ = ["BatchDeletedIndexes", "MAX_BATCH_SIZE", "to_long_array", "from_long_array"]

Position = tuple[int, int]

_WORD_BITS = 64
_WORD_MASK = (1 << 64) - 1
_SIGN_BIT = 1 << 63

#: Largest batch size (messages in one entry) an ack set may have: 2**24 bits =
#: a 2 MiB mask.  Each message of a batch takes at least a few bytes of its entry
#: (size prefix + SingleMessageMetadata), so even a 64 MiB entry holds fewer.
MAX_BATCH_SIZE = 1 << 24


def to_long_array(mask: int) -> list[int]:
    """Java ``BitSet.toLongArray()`` of a non-negative int bit mask.

    Returns signed 64-bit words (``-2**63 <= w < 2**63``), least significant
    word first; ``[]`` for 0 (trailing zero words are never emitted).
    Linear in the mask's size (one ``to_bytes`` and one ``struct.unpack``).
    Raises ValueError for a negative mask.
    """
    if mask < 0:
        raise ValueError(f"bit mask must be >= 0, got {mask}")
    if not mask:
        return []
    n_words = (mask.bit_length() + _WORD_BITS - 1) // _WORD_BITS
    return list(struct.unpack(f"<{n_words}q", mask.to_bytes(n_words * 8, "little")))


def from_long_array(words: Iterable[int]) -> int:
    """Inverse of :func:`to_long_array` (Java ``BitSet.valueOf(long[])``).

    Accepts words as signed int64 (Java/protobuf ``int64``) or unsigned
    uint64.  Linear in the number of words.  Raises TypeError for non-ints,
    ValueError for a word outside ``[-2**63, 2**64)``.
    """
    unsigned = []
    for i, w in enumerate(words):
        if isinstance(w, bool) or not isinstance(w, int):
            raise TypeError(f"ack set word {i} must be an int, got {type(w).__name__}")
        if not -(1 << 63) <= w < (1 << 64):
            raise ValueError(f"ack set word {i} = {w} does not fit in 64 bits")
        unsigned.append(w & _WORD_MASK)
    if not unsigned:
        return 0
    return int.from_bytes(struct.pack(f"<{len(unsigned)}Q", *unsigned), "little")


def _check_position(position: object) -> Position:
    try:
        ledger_id, entry_id = position  # type: ignore[misc]
    except (TypeError, ValueError):
        raise TypeError(f"position must be a (ledger_id, entry_id) pair, got {position!r}") from None
    for what, v in (("ledger id", ledger_id), ("entry id", entry_id)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"position {what} must be an int, got {type(v).__name__}: {v!r}")
        if v < 0:
            raise ValueError(f"position {what} must be >= 0, got {v}")
    return ledger_id, entry_id


def _check_bound(position: object) -> Position:
    try:
        ledger_id, entry_id = position  # type: ignore[misc]
    except (TypeError, ValueError):
        raise TypeError(f"position must be a (ledger_id, entry_id) pair, got {position!r}") from None
    for v in (ledger_id, entry_id):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"position ids must be ints, got {type(v).__name__}: {v!r}")
    return ledger_id, entry_id


def _check_batch_size(batch_size: object) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch size must be an int, got {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    if batch_size > MAX_BATCH_SIZE:
        raise ValueError(f"batch size {batch_size} is larger than {MAX_BATCH_SIZE}, the most messages an entry holds")
    return batch_size


def _check_index(index: object, batch_size: int | None) -> int:
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"batch index must be an int, got {type(index).__name__}: {index!r}")
    if index < 0 or (batch_size is not None and index >= batch_size):
        bound = f"[0, {batch_size})" if batch_size is not None else ">= 0"
        raise ValueError(f"batch index {index} out of range {bound}")
    return index


def _mask_of(indexes: Iterable[int], batch_size: int) -> int:
    """Bit mask with the bits of ``indexes`` set, each checked against ``[0, batch_size)``.

    A step-1 ``range`` costs O(1) big-int operations; any other iterable is
    collected in a bytearray of ``batch_size / 8`` bytes (linear, never one
    big-int operation per index).
    """
    if isinstance(indexes, range) and indexes.step == 1:
        if not indexes:
            return 0
        _check_index(indexes.start, batch_size)
        _check_index(indexes.stop - 1, batch_size)
        return ((1 << len(indexes)) - 1) << indexes.start
    bits = None
    for index in indexes:
        _check_index(index, batch_size)
        if bits is None:
            bits = bytearray((batch_size + 7) // 8)
        bits[index >> 3] |= 1 << (index & 7)
    return 0 if bits is None else int.from_bytes(bits, "little")


class BatchDeletedIndexes:
    """Per batch entry, which batch indexes are acknowledged.

    Pulsar concept: ``ManagedCursorImpl.batchDeletedIndexes``
    (``ConcurrentSkipListMap<Position, BitSetRecyclable>``), persisted as
    ``BatchedEntryDeletionIndexInfo``.  Positions are ``(ledger_id,
    entry_id)`` int tuples (both ``>= 0``), kept in position order.  An entry
    is present only while it is *partially* acknowledged: at least one index
    acknowledged through this map and at least one still unacknowledged.

    The batch size is known for entries created by :meth:`ack` and for
    :meth:`load` calls that pass it; entries loaded from persisted words alone
    (like Pulsar, which does not persist it) learn it on their next ack.

    Errors: ``ValueError`` for a negative id, a batch size < 1 or above
    :data:`MAX_BATCH_SIZE`, a batch index ``< 0`` or ``>= batch_size``, a batch
    size that contradicts the stored one, or a word not fitting 64 bits;
    ``TypeError`` for non-int values.  A failing call changes nothing.
    Every call is linear in the batch size of the entry it touches.
    """

    __slots__ = ("_masks", "_sizes", "_order")

    def __init__(self) -> None:
        self._masks: dict[Position, int] = {}  # position -> bits of UNacknowledged indexes
        self._sizes: dict[Position, int | None] = {}  # position -> batch size (None: unknown)
        self._order: list[Position] = []  # positions present, ascending

    # ------------------------------------------------------------ internals

    def _store(self, position: Position, mask: int, batch_size: int | None) -> None:
        if position not in self._masks:
            insort(self._order, position)
        self._masks[position] = mask
        self._sizes[position] = batch_size

    def _drop(self, position: Position) -> bool:
        if position not in self._masks:
            return False
        del self._masks[position]
        del self._sizes[position]
        del self._order[bisect_left(self._order, position)]
        return True

    # ------------------------------------------------------------ mutation

    def ack(self, position: Position, batch_size: int, indexes: Iterable[int]) -> bool:
        """Acknowledge batch ``indexes`` of the batch entry at ``position``.

        ``batch_size`` is the entry's number of messages (the broker passes the
        real one, read from the entry).  ``indexes``: ints in ``[0, batch_size)``
        (a ``range`` is applied in O(1) big-int operations).  An unknown position
        starts with all ``batch_size`` indexes unacknowledged.  Returns True
        when every index of the batch is now acknowledged: the entry is then
        dropped from this map and the caller must acknowledge the whole entry
        (Pulsar: ``ackSet`` became empty -> ``individualDeletedMessages.add``).
        Acking an already acknowledged index is a no-op.  An empty
        ``indexes`` on an unknown position stores nothing and returns False.
        Raises ValueError for a bad index / batch size (nothing changes).
        """
        position = _check_position(position)
        batch_size = _check_batch_size(batch_size)
        clear = _mask_of(indexes, batch_size)
        if position in self._masks:
            mask = self._masks[position]
            known = self._sizes[position]
            if known is not None and known != batch_size:
                raise ValueError(
                    f"batch size {batch_size} for {position} contradicts the stored batch size {known}"
                )
            if known is None and mask.bit_length() > batch_size:
                raise ValueError(
                    f"batch size {batch_size} for {position} is smaller than the loaded ack set "
                    f"(unacknowledged index {mask.bit_length() - 1})"
                )
        else:
            if not clear:
                return False
            mask = (1 << batch_size) - 1
        mask &= ~clear
        if mask == 0:
            self._drop(position)
            return True
        self._store(position, mask, batch_size)
        return False

    def load(self, position: Position, words: Iterable[int], batch_size: int | None = None) -> None:
        """Set the ack set of ``position`` from ``BitSet.toLongArray()`` words.

        ``words``: signed (or unsigned) 64-bit ints, bit ``i`` of the batch is
        bit ``i % 64`` of ``words[i // 64]``, set = unacknowledged.  All-zero
        (or empty) words mean fully acknowledged: the position is removed.
        ``batch_size`` (optional) must cover every set bit.  Used on recovery
        from ``BatchedEntryDeletionIndexInfo``.
        """
        position = _check_position(position)
        mask = from_long_array(words)
        if batch_size is not None:
            batch_size = _check_batch_size(batch_size)
            if mask.bit_length() > batch_size:
                raise ValueError(
                    f"ack set of {position} has index {mask.bit_length() - 1} set, beyond batch size {batch_size}"
                )
        if mask == 0:
            self._drop(position)
        else:
            self._store(position, mask, batch_size)

    def remove(self, position: Position) -> bool:
        """Forget ``position`` (e.g. its entry got acknowledged as a whole).

        Returns True if it was present.
        """
        return self._drop(_check_position(position))

    def remove_up_to(self, position: Position) -> int:
        """Forget every position ``<= position`` (mark-delete advanced).

        Any ints accepted, e.g. ``(L, -1)``.  Returns the number removed.
        """
        bound = _check_bound(position)
        cut = bisect_right(self._order, bound)
        for p in self._order[:cut]:
            del self._masks[p]
            del self._sizes[p]
        del self._order[:cut]
        return cut

    def clear(self) -> None:
        """Forget everything."""
        self._masks.clear()
        self._sizes.clear()
        self._order.clear()

    # ------------------------------------------------------------ queries

    def is_acked(self, position: Position, index: int) -> bool:
        """True if batch ``index`` of the entry at ``position`` is acknowledged here.

        False for a position this map does not know: whether such an entry is
        entirely acknowledged or not at all is up to the range set / the
        mark-delete position.  Raises ValueError for a negative index or one
        ``>= batch_size`` when the batch size is known.
        """
        position = _check_position(position)
        mask = self._masks.get(position)
        _check_index(index, self._sizes.get(position))
        if mask is None:
            return False
        return not (mask >> index) & 1

    def unacked_indexes(self, position: Position) -> list[int] | None:
        """Ascending batch indexes still unacknowledged at ``position``, or None if unknown."""
        mask = self._masks.get(_check_position(position))
        if mask is None:
            return None
        bits = bin(mask)[:1:-1]  # least significant bit first; linear for a power-of-two base
        return [i for i, c in enumerate(bits) if c == "1"]

    def ack_set_words(self, position: Position) -> list[int] | None:
        """The ack set of ``position`` as Java ``BitSet.toLongArray()`` words, or None if unknown.

        Signed 64-bit ints, bit ``i`` of word ``i // 64`` set = batch index
        ``64 * (i // 64) + i % 64`` unacknowledged.  This is what the broker
        sends with a redelivered batch entry and persists as ``deleteSet``.
        """
        mask = self._masks.get(_check_position(position))
        return None if mask is None else to_long_array(mask)

    def batch_size(self, position: Position) -> int | None:
        """Stored batch size of ``position``; None if unknown or the position is absent."""
        return self._sizes.get(_check_position(position))

    def items(self) -> Iterator[tuple[Position, list[int]]]:
        """``(position, ack_set_words)`` pairs in position order (snapshot)."""
        return iter([(p, to_long_array(self._masks[p])) for p in self._order])

    def positions(self) -> list[Position]:
        """Partially acknowledged positions, ascending."""
        return list(self._order)

    def __contains__(self, position: object) -> bool:
        return _check_position(position) in self._masks

    def __len__(self) -> int:
        return len(self._order)

    def is_empty(self) -> bool:
        """True when no batch entry is partially acknowledged."""
        return not self._order

    # ------------------------------------------------------------ protobuf

    def to_protos(self, limit: int | None = None) -> list[metadata_pb2.BatchedEntryDeletionIndexInfo]:
        """``BatchedEntryDeletionIndexInfo`` messages in position order.

        ``limit`` caps how many (Pulsar: ``maxBatchDeletedIndexToPersist``);
        None = all.  Raises ValueError for a negative limit.
        """
        order = self._order
        if limit is not None:
            if limit < 0:
                raise ValueError(f"limit must be >= 0, got {limit}")
            order = order[:limit]
        return [
            metadata_pb2.BatchedEntryDeletionIndexInfo(
                position=metadata_pb2.NestedPositionInfo(ledgerId=p[0], entryId=p[1]),
                deleteSet=to_long_array(self._masks[p]),
            )
            for p in order
        ]

    @classmethod
    def from_protos(
        cls, infos: Iterable[metadata_pb2.BatchedEntryDeletionIndexInfo]
    ) -> BatchDeletedIndexes:
        """Build from ``BatchedEntryDeletionIndexInfo`` messages (batch sizes unknown).

        Raises ValueError for a negative ledger/entry id in a message.
        """
        out = cls()
        for info in infos:
            out.load((info.position.ledgerId, info.position.entryId), list(info.deleteSet))
        return out

    def __repr__(self) -> str:
        return f"BatchDeletedIndexes(entries={len(self._order)})"
