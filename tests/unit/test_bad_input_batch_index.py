"""Issue 21 item 5, the pure part: batch-index ack sets stay linear in the batch size.

One batch-index ack with ``batch_size=2**22`` used to stall the broker 3-4 s on
that ack and on every later persist and topic load (``to_long_array`` shifted the
whole big int once per 64-bit word, ``from_long_array`` or'ed one shifted word at
a time, ``unacked_indexes`` shifted once per bit). Now every operation is one or
two big-int operations plus ``struct``/``int.to_bytes`` (linear), and batch sizes
are capped at ``MAX_BATCH_SIZE`` (the broker passes the entry's real batch size,
see tests/integration/test_bad_input_acks.py).

The time bound below is generous (the new code needs ~0.1 s on a 2-core shared
machine, the old one ~25 s for the same calls at 2**23 bits).
"""
from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.ledger.batch_index import MAX_BATCH_SIZE, BatchDeletedIndexes, from_long_array, to_long_array
from proto import metadata_pb2


def test_huge_batch_ack_set_operations_are_linear():
    bits = 1 << 23
    started = time.perf_counter()
    b = BatchDeletedIndexes()
    assert not b.ack((3, 7), bits, [0, 5, bits - 1])
    words = b.ack_set_words((3, 7))
    assert len(words) == bits // 64
    assert words[0] == -2 - 32 and words[-1] == (1 << 63) - 1        # bits 0, 5 and the top one cleared
    wire = [metadata_pb2.BatchedEntryDeletionIndexInfo.FromString(p.SerializeToString()) for p in b.to_protos()]
    c = BatchDeletedIndexes.from_protos(wire)
    assert c.ack_set_words((3, 7)) == words
    assert not c.ack((3, 7), bits, range(0, bits // 2))              # a range: O(1) big-int operations
    assert not c.ack((3, 7), bits, list(range(bits // 2, bits // 2 + 50_000)))
    assert c.is_acked((3, 7), bits // 2 + 49_999) and not c.is_acked((3, 7), bits - 2)
    assert c.ack((3, 7), bits, range(bits // 2 + 50_000, bits))      # everything acknowledged now
    elapsed = time.perf_counter() - started
    print(f"2**23-message ack set: ack, words, protos round trip, range/list acks in {elapsed:.3f} s")
    assert elapsed < 5.0, elapsed


def test_batch_size_above_the_cap_is_refused_and_changes_nothing():
    b = BatchDeletedIndexes()
    for size in (MAX_BATCH_SIZE + 1, 2**31 - 1, 2**63):
        with pytest.raises(ValueError, match="larger than"):
            b.ack((1, 1), size, [1])
    assert b.is_empty()
    assert not b.ack((1, 1), MAX_BATCH_SIZE, [MAX_BATCH_SIZE - 1])   # the cap itself is allowed
    assert b.batch_size((1, 1)) == MAX_BATCH_SIZE


def test_range_and_list_acks_check_every_index():
    b = BatchDeletedIndexes()
    with pytest.raises(ValueError, match="out of range"):
        b.ack((1, 1), 10, range(5, 11))
    with pytest.raises(ValueError, match="out of range"):
        b.ack((1, 1), 10, range(-1, 3))
    with pytest.raises(ValueError, match="out of range"):
        b.ack((1, 1), 10, [3, 10])
    assert b.is_empty()
    assert not b.ack((1, 1), 10, range(0))                            # empty range on an unknown entry
    assert not b.ack((1, 1), 10, range(2, 9, 3))                      # a stepped range goes the general way
    assert b.unacked_indexes((1, 1)) == [0, 1, 3, 4, 6, 7, 9]


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 2000), max_size=60), st.booleans())
def test_words_round_trip_signed_and_unsigned(unacked, unsigned):
    mask = sum(1 << i for i in unacked)
    words = to_long_array(mask)
    assert all(-(2**63) <= w < 2**63 for w in words)
    assert not words or words[-1] != 0
    assert from_long_array([w & (2**64 - 1) for w in words] if unsigned else words) == mask
    b = BatchDeletedIndexes()
    if unacked:
        b.load((1, 1), words)
        assert b.unacked_indexes((1, 1)) == sorted(unacked)
