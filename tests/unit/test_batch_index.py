"""BatchDeletedIndexes (batchDeletedIndexes / BatchedEntryDeletionIndexInfo) against a dict model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.ledger.batch_index import BatchDeletedIndexes, from_long_array, to_long_array
from proto import metadata_pb2


def java_long_array(unacked: set[int]) -> list[int]:
    """Independent re-statement of Java's BitSet.toLongArray(): bit i -> word i // 64, signed longs."""
    if not unacked:
        return []
    words = [0] * (max(unacked) // 64 + 1)
    for i in unacked:
        words[i // 64] |= 1 << (i % 64)
    return [w - 2**64 if w >= 2**63 else w for w in words]


POSITIONS = st.tuples(st.integers(0, 3), st.integers(0, 5))


@st.composite
def ack_op(draw):
    pos = draw(POSITIONS)
    size = SIZE_OF[pos]
    idx = draw(st.lists(st.integers(0, size - 1), max_size=8))
    if draw(st.booleans()) and size <= 10:
        idx = list(range(size))  # ack the whole batch sometimes
    return ("ack", pos, idx)


# every position has a fixed batch size, as a real entry does
SIZE_OF = {(L, e): [1, 2, 3, 10, 63, 64, 65, 128, 130][(L * 6 + e) % 9] for L in range(4) for e in range(6)}

OPS = st.one_of(
    ack_op(),
    ack_op(),
    ack_op(),
    st.tuples(st.just("remove_up_to"), st.tuples(st.integers(-1, 4), st.integers(-1, 6))),
    st.tuples(st.just("remove"), POSITIONS),
    st.tuples(st.just("roundtrip")),
)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(OPS, max_size=40))
def test_matches_model(ops):
    b = BatchDeletedIndexes()
    model: dict[tuple[int, int], set[int]] = {}  # position -> UNacked indexes
    for op in ops:
        kind = op[0]
        if kind == "ack":
            _, pos, idx = op
            size = SIZE_OF[pos]
            if pos not in model and not idx:
                assert b.ack(pos, size, idx) is False
                continue
            unacked = model.get(pos, set(range(size))) - set(idx)
            done = b.ack(pos, size, idx)
            assert done == (not unacked)
            if unacked:
                model[pos] = unacked
            else:
                model.pop(pos, None)
        elif kind == "remove_up_to":
            gone = [p for p in model if p <= op[1]]
            assert b.remove_up_to(op[1]) == len(gone)
            for p in gone:
                del model[p]
        elif kind == "remove":
            assert b.remove(op[1]) == (op[1] in model)
            model.pop(op[1], None)
        elif kind == "roundtrip":
            protos = b.to_protos()
            wire = [metadata_pb2.BatchedEntryDeletionIndexInfo.FromString(p.SerializeToString()) for p in protos]
            b = BatchDeletedIndexes.from_protos(wire)
        # invariants after every op
        assert len(b) == len(model)
        assert b.positions() == sorted(model)
        for pos, size in SIZE_OF.items():
            if pos in model:
                assert b.unacked_indexes(pos) == sorted(model[pos])
                assert b.ack_set_words(pos) == java_long_array(model[pos])
                for i in range(size):
                    assert b.is_acked(pos, i) == (i not in model[pos])
            else:
                assert b.unacked_indexes(pos) is None
                assert b.ack_set_words(pos) is None
                assert not b.is_acked(pos, 0)
        assert list(b.items()) == [(p, java_long_array(model[p])) for p in sorted(model)]


@given(st.sets(st.integers(0, 300), max_size=40))
def test_long_array_layout(unacked):
    mask = sum(1 << i for i in unacked)
    words = to_long_array(mask)
    assert words == java_long_array(unacked)
    assert all(-(2**63) <= w < 2**63 for w in words)
    assert from_long_array(words) == mask
    # unsigned words are accepted too (e.g. from a uint64 source)
    assert from_long_array([w & (2**64 - 1) for w in words]) == mask


def test_java_bitset_examples():
    b = BatchDeletedIndexes()
    assert not b.ack((1, 2), 3, [1])
    assert b.ack_set_words((1, 2)) == [0b101]  # indexes 0 and 2 still unacked
    assert b.unacked_indexes((1, 2)) == [0, 2]
    # bit 63 set -> negative Java long
    assert not b.ack((1, 3), 64, [0])
    assert b.ack_set_words((1, 3)) == [-2]
    # index 64 lives in word 1, bit 0; trailing zero words are trimmed
    assert not b.ack((1, 4), 130, list(range(64)) + list(range(65, 130)))
    assert b.ack_set_words((1, 4)) == [0, 1]
    assert not b.ack((1, 5), 130, range(64, 130))
    assert b.ack_set_words((1, 5)) == [-1]
    assert to_long_array(0) == []
    assert to_long_array(1 << 64 | 1) == [1, 1]


def test_full_ack_drops_entry_and_reports_it():
    b = BatchDeletedIndexes()
    assert not b.ack((5, 0), 4, [0, 1])
    assert b.is_acked((5, 0), 1) and not b.is_acked((5, 0), 2)
    assert not b.ack((5, 0), 4, [1])  # duplicate ack: no change
    assert b.ack((5, 0), 4, [2, 3])
    assert (5, 0) not in b and b.is_empty()
    assert b.ack((5, 1), 2, [1, 0])  # whole batch in one go: never stored
    assert len(b) == 0
    assert not b.ack((5, 2), 2, [])  # nothing acked: nothing stored
    assert len(b) == 0


def test_protos_and_load():
    b = BatchDeletedIndexes()
    b.ack((2, 9), 70, [0, 69])
    b.ack((1, 1), 3, [2])
    protos = b.to_protos()
    assert [(p.position.ledgerId, p.position.entryId) for p in protos] == [(1, 1), (2, 9)]
    assert list(protos[0].deleteSet) == [0b011]
    assert list(protos[1].deleteSet) == java_long_array(set(range(1, 69)))
    assert len(b.to_protos(limit=1)) == 1
    c = BatchDeletedIndexes.from_protos(protos)
    assert list(c.items()) == list(b.items())
    assert c.batch_size((1, 1)) is None  # not persisted, as in Pulsar
    assert c.ack((1, 1), 3, [0, 1])  # learns the size on the next ack
    with pytest.raises(ValueError, match="smaller than the loaded ack set"):
        c.ack((2, 9), 10, [0])
    c.load((3, 0), [0b110], batch_size=3)
    assert c.unacked_indexes((3, 0)) == [1, 2] and c.batch_size((3, 0)) == 3
    c.load((3, 0), [0, 0])  # all zero = fully acked -> removed
    assert (3, 0) not in c
    with pytest.raises(ValueError, match="beyond batch size"):
        c.load((3, 1), [0b1000], batch_size=3)
    with pytest.raises(ValueError, match="64 bits"):
        c.load((3, 1), [2**64])


def test_bad_input_changes_nothing():
    b = BatchDeletedIndexes()
    b.ack((1, 1), 4, [0])
    with pytest.raises(ValueError, match="batch index 4 out of range"):
        b.ack((1, 1), 4, [1, 4])
    with pytest.raises(ValueError, match="batch index -1"):
        b.ack((1, 1), 4, [-1])
    assert b.unacked_indexes((1, 1)) == [1, 2, 3]
    with pytest.raises(ValueError, match="contradicts"):
        b.ack((1, 1), 5, [1])
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        b.ack((1, 2), 0, [])
    with pytest.raises(ValueError, match="out of range"):
        b.is_acked((1, 1), 4)
    with pytest.raises(ValueError, match=">= 0"):
        b.ack((-1, 0), 2, [0])
    with pytest.raises(TypeError):
        b.ack((1, 2), 2, ["0"])
    with pytest.raises(TypeError):
        b.ack(7, 2, [0])
    assert b.positions() == [(1, 1)]
    assert b.remove_up_to((1, 0)) == 0
    assert b.remove_up_to((1, 1)) == 1
