"""AckRangeSet (individualDeletedMessages) against a plain-set model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from broker.ledger.range_set import MAX_ENTRY_ID, AckRangeSet

# ---------------------------------------------------------------- model helpers


def model_ranges(model: set[tuple[int, int]]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Maximal closed ranges of a set of positions, in position order."""
    out = []
    for ledger, entry in sorted(model):
        if out and out[-1][1][0] == ledger and out[-1][1][1] == entry - 1:
            out[-1] = (out[-1][0], (ledger, entry))
        else:
            out.append(((ledger, entry), (ledger, entry)))
    return out


def model_between(model, lo, hi):
    return model_ranges({p for p in model if lo <= p <= hi})


def model_contiguous_end(model, ledger, entry):
    e = entry
    while (ledger, e) in model:
        e += 1
    return e - 1


LEDGERS = st.integers(0, 3)
# low entries plus entries at the top of the 32-bit space (roaring edge)
ENTRIES = st.one_of(st.integers(0, 40), st.integers(MAX_ENTRY_ID - 40, MAX_ENTRY_ID))
BOUND_ENTRIES = st.one_of(st.integers(-1, 42), st.integers(MAX_ENTRY_ID - 41, MAX_ENTRY_ID + 1))


@st.composite
def add_range_op(draw):
    ledger = draw(LEDGERS)
    first = draw(ENTRIES)
    length = draw(st.integers(0, 12))
    last = min(first + length, MAX_ENTRY_ID)
    return ("add_range", ledger, first, last)


OPS = st.one_of(
    st.tuples(st.just("add"), LEDGERS, ENTRIES),
    st.tuples(st.just("add"), LEDGERS, ENTRIES),
    add_range_op(),
    st.tuples(st.just("remove_up_to"), st.integers(-1, 4), BOUND_ENTRIES),
    st.tuples(st.just("clear_dirty")),
    st.tuples(st.just("reload"), LEDGERS),
)


def apply(rs: AckRangeSet, model: set, op) -> set[int]:
    """Apply op to both; return the ledgers whose model content changed."""
    before = {L: {e for (l2, e) in model if l2 == L} for L in range(-1, 5)}
    kind = op[0]
    if kind == "add":
        _, L, e = op
        assert rs.add(L, e) == ((L, e) not in model)
        model.add((L, e))
    elif kind == "add_range":
        _, L, a, b = op
        new = {(L, e) for e in range(a, b + 1)} - model
        assert rs.add_range(L, a, b) == len(new)
        model |= new
    elif kind == "remove_up_to":
        _, L, e = op
        gone = {p for p in model if p <= (L, e)}
        assert rs.remove_up_to(L, e) == len(gone)
        model -= gone
    elif kind == "clear_dirty":
        rs.clear_dirty()
    elif kind == "reload":
        # persist one ledger and load it back into the same set: no change, not dirty
        _, L = op
        rs.load_ledger(L, rs.serialize_ledger(L))
    after = {L: {e for (l2, e) in model if l2 == L} for L in range(-1, 5)}
    return {L for L in before if before[L] != after[L]}


def check(rs: AckRangeSet, model: set, data) -> None:
    expected = model_ranges(model)
    assert rs.size() == len(rs) == len(model)
    assert rs.is_empty() == (not model)
    assert list(rs.ranges()) == expected
    assert rs.range_count() == len(expected)
    assert rs.first_range() == (expected[0] if expected else None)
    assert rs.last_range() == (expected[-1] if expected else None)
    assert rs.ledger_ids() == sorted({L for L, _ in model})
    limit = data.draw(st.integers(0, 5), label="limit")
    assert rs.to_message_ranges(limit) == expected[:limit]

    probes = set()
    for L, e in model:
        probes |= {(L, e), (L, max(e - 1, 0)), (L, min(e + 1, MAX_ENTRY_ID))}
    probes |= {(L, e) for L in range(4) for e in (0, 1, 20, MAX_ENTRY_ID)}
    for L, e in probes:
        assert rs.contains(L, e) == ((L, e) in model)
        assert ((L, e) in rs) == ((L, e) in model)
        assert rs.contiguous_end(L, e) == model_contiguous_end(model, L, e)

    for _ in range(3):
        lo = (data.draw(st.integers(-1, 4), label="lo ledger"), data.draw(BOUND_ENTRIES, label="lo entry"))
        hi = (data.draw(st.integers(-1, 4), label="hi ledger"), data.draw(BOUND_ENTRIES, label="hi entry"))
        assert list(rs.ranges_between(lo, hi)) == model_between(model, lo, hi)
        assert rs.cardinality_between(lo, hi) == sum(1 for p in model if lo <= p <= hi)

    # PIP-81 round trip: a fresh set loaded ledger by ledger equals the original
    copy = AckRangeSet()
    for L in range(4):
        copy.load_ledger(L, rs.serialize_ledger(L))
    assert list(copy.ranges()) == expected
    assert copy.size() == len(model)
    assert copy.dirty_ledgers() == set()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=30), data=st.data())
def test_matches_model(ops, data):
    rs = AckRangeSet()
    model: set[tuple[int, int]] = set()
    dirty: set[int] = set()
    for op in ops:
        if op[0] == "clear_dirty":
            dirty.clear()
        elif op[0] == "reload":  # load_ledger: memory == persisted copy -> clean
            dirty.discard(op[1])
        changed = apply(rs, model, op)
        dirty |= changed
        assert rs.dirty_ledgers() == dirty, op
    check(rs, model, data)


@settings(max_examples=100, deadline=None)
@given(entries=st.sets(st.integers(0, 300_000), max_size=200), run=st.integers(0, 70_000))
def test_contiguous_end_long_runs(entries, run):
    """Runs crossing roaring container boundaries (65536) and scattered singles."""
    rs = AckRangeSet()
    model = {(7, e) for e in entries}
    for e in entries:
        rs.add(7, e)
    start = 60_000
    rs.add_range(7, start, start + run)
    model |= {(7, e) for e in range(start, start + run + 1)}
    for e in list(entries)[:20] + [start, start + run, start + run + 1, 0]:
        assert rs.contiguous_end(7, e) == model_contiguous_end(model, 7, e)
    assert list(rs.ranges()) == model_ranges(model)
    assert rs.first_range() == model_ranges(model)[0]
    assert rs.last_range() == model_ranges(model)[-1]


# ---------------------------------------------------------------- examples


def test_closed_ranges_merge_adjacent_acks():
    rs = AckRangeSet()
    for e in (0, 1, 2, 4, 5, 6):
        assert rs.add(1, e)
    assert not rs.add(1, 2)
    assert list(rs.ranges()) == [((1, 0), (1, 2)), ((1, 4), (1, 6))]
    rs.add(1, 3)  # fills the hole: one range
    assert list(rs.ranges()) == [((1, 0), (1, 6))]
    assert rs.contiguous_end(1, 0) == 6
    assert rs.contiguous_end(1, 7) == 6  # not acked -> entry - 1
    rs.add(2, 0)  # entry 0 of the next ledger is not adjacent to 1:6
    assert rs.range_count() == 2
    assert rs.first_range() == ((1, 0), (1, 6))


def test_remove_up_to_drops_lower_ledgers_and_marks_dirty():
    rs = AckRangeSet()
    rs.add_range(1, 0, 9)
    rs.add_range(2, 5, 9)
    rs.add(3, 1)
    rs.clear_dirty()
    assert rs.remove_up_to(2, 6) == 10 + 2
    assert rs.ledger_ids() == [2, 3]
    assert list(rs.ranges()) == [((2, 7), (2, 9)), ((3, 1), (3, 1))]
    assert rs.dirty_ledgers() == {1, 2}
    assert rs.remove_up_to(3, -1) == 3
    assert rs.dirty_ledgers() == {1, 2}
    rs.clear_dirty()
    assert rs.remove_up_to(3, 0) == 0
    assert rs.dirty_ledgers() == set()


def test_dirty_only_on_change_and_load_is_clean():
    rs = AckRangeSet()
    rs.add(5, 1)
    assert rs.dirty_ledgers() == {5}
    rs.clear_dirty()
    assert not rs.add(5, 1)
    assert rs.add_range(5, 1, 1) == 0
    assert rs.dirty_ledgers() == set()
    data = rs.serialize_ledger(5)
    other = AckRangeSet()
    other.add(5, 99)
    other.load_ledger(5, data)  # replaces, does not merge
    assert list(other.ranges()) == [((5, 1), (5, 1))]
    assert other.dirty_ledgers() == set()
    other.load_ledger(5, BitMap().serialize())  # empty -> ledger disappears
    assert other.ledger_ids() == [] and other.size() == 0
    assert AckRangeSet().serialize_ledger(42) == BitMap().serialize()
    rs.clear()
    assert rs.is_empty() and rs.dirty_ledgers() == {5}


def test_bad_input():
    rs = AckRangeSet()
    with pytest.raises(ValueError, match="2\\*\\*32"):
        rs.add(1, 2**32)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        rs.add(1, -1)
    with pytest.raises(ValueError, match="ledger id"):
        rs.add(-1, 0)
    with pytest.raises(ValueError, match="first entry 5 > last entry 4"):
        rs.add_range(1, 5, 4)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        rs.contains(1, 2**32)
    with pytest.raises(TypeError):
        rs.add(1, "3")
    with pytest.raises(TypeError):
        rs.add(1.0, 3)
    with pytest.raises(ValueError, match="roaring"):
        rs.load_ledger(1, b"garbage")
    with pytest.raises(ValueError):
        rs.to_message_ranges(-1)
    assert rs.is_empty() and rs.dirty_ledgers() == set()
    rs.add(7, MAX_ENTRY_ID)  # top of the 32-bit space is fine
    assert rs.contiguous_end(7, MAX_ENTRY_ID) == MAX_ENTRY_ID
    assert rs.remove_up_to(7, 2**40) == 1


def test_one_million_every_other_fits_in_256k():
    """The Pulsar article's worst case: 1M entries, every other one acknowledged."""
    rs = AckRangeSet()
    for e in range(0, 1_000_000, 2):
        rs.add(3, e)
    assert rs.size() == 500_000
    assert rs.range_count() == 500_000
    assert rs.first_range() == ((3, 0), (3, 0))
    assert rs.last_range() == ((3, 999_998), (3, 999_998))
    assert rs.contiguous_end(3, 500_000) == 500_000
    assert rs.contiguous_end(3, 500_001) == 500_000
    assert len(rs.to_message_ranges(1000)) == 1000
    assert sum(1 for _ in rs.ranges()) == 500_000
    mem = rs.memory_bytes()
    serialized = len(rs.serialize_ledger(3))
    assert mem <= 256 * 1024, mem
    # the estimate is honest: close to (and not below) the serialized form
    assert serialized <= mem <= serialized + 4096, (mem, serialized)
    print(f"memory_bytes for 1M every-other: {mem} (serialized {serialized})")


def test_remove_up_to_one_million_entries():
    """Mark-delete jumps over a million acked entries: must be instant (C-level range removal)."""
    rs = AckRangeSet()
    rs.add_range(1, 0, 999_999)
    rs.add_range(2, 0, 999_999)
    rs.add_range(3, 0, 999_999)
    for e in range(0, 1_000_000, 1000):  # scattered acks in ledger 4
        rs.add(4, e)
    assert rs.contiguous_end(1, 0) == 999_999
    assert rs.range_count() == 3 + 1000
    assert rs.remove_up_to(3, 499_999) == 2_500_000
    assert rs.size() == 500_000 + 1000
    assert rs.first_range() == ((3, 500_000), (3, 999_999))
    assert rs.remove_up_to(4, 999_999) == 500_000 + 1000
    assert rs.is_empty()
