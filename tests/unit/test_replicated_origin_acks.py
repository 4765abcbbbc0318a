"""Acknowledgments by origin id (issue 15): the origin index, the sender's
origin-id sets and the receiver's RemoteAcks, as pure logic; a hypothesis model
of two clusters' logs checks that the receiver acknowledges exactly what the
sender acknowledged, whenever the entries arrive."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.ledger.position import Position as P
from broker.ledger.range_set import AckRangeSet
from broker.replication.origin_acks import (MIN_POSITION, OriginAcks, RemoteAcks, acked_origins, subtract,
                                            union)
from broker.replication.origin_index import OriginIndex


# ---- the origin index ------------------------------------------------------------
def test_index_runs_merge_consecutive_entries_of_one_origin():
    ix = OriginIndex()
    for e in range(5):
        ix.add(P(7, e), "a", P(7, e))                 # local entries: their own origin
    for e in range(5, 8):
        ix.add(P(7, e), "c", P(3, 10 + e))           # replicated from c
    ix.add(P(7, 9), "c", P(3, 18))                   # a local marker at 7:8 breaks the local run
    ix.add(P(7, 10), "c", P(3, 20))                  # c's own marker at 3:19 breaks the origin run
    ix.add(P(8, 0), "c", P(3, 21))                   # local rollover
    ix.add(P(8, 1), "c", P(3, 22), frozenset({"c", "b"}))   # another replicate_to scope
    assert len(ix) == 6
    assert ix.origin_of(P(7, 6))[:2] == ("c", P(3, 16))
    assert ix.origin_of(P(7, 8)) is None             # the marker
    assert ix.high("c") == P(3, 22) and ix.high("a") == P(7, 4)
    assert ix.last_of_origin_at_or_before("c", P(7, 9)) == P(3, 18)
    assert ix.last_of_origin_at_or_before("c", P(7, 4)) is None
    got = [(r.local_start, f, l) for r, f, l in ix.local_ranges("c", P(3, 16), P(3, 21))]
    assert got == [(P(7, 5), 1, 2), (P(7, 9), 0, 0), (P(7, 10), 0, 0), (P(8, 0), 0, 0)]
    assert [r.local_start for r, _, _ in ix.local_ranges("c", P(3, 22), P(9, 0), acker="a")] == []
    assert [r.local_start for r, _, _ in ix.local_ranges("c", P(3, 22), P(9, 0), acker="b")] == [P(8, 1)]


def test_index_prune_and_cap_keep_floors_and_the_window():
    ix = OriginIndex(max_runs=3)
    ix.add(P(1, 0), "a", P(1, 0))
    ix.add(P(1, 1), "c", P(5, 0))
    ix.add(P(1, 2), "a", P(1, 2))
    assert ix.complete_after == P(1, -1)
    assert ix.prune(P(1, 0)) == 1 and ix.floor("a") == P(1, 0) and ix.complete_after == P(1, 0)
    ix.add(P(1, 3), "c", P(5, 2))
    ix.add(P(1, 4), "a", P(1, 4))                    # 4 runs > 3: the oldest is evicted
    assert len(ix) == 3 and ix.floor("c") == P(5, 0) and ix.complete_after == P(1, 1)
    assert ix.evicted_runs == 1
    older = OriginIndex(complete_after=P(0, -1))
    older.add(P(0, 0), "b", P(9, 9))
    newer = OriginIndex(complete_after=P(0, 0))
    newer.add(P(0, 1), "b", P(9, 10))
    newer.prepend(older)
    assert len(newer) == 2 and newer.complete_after == P(0, -1)   # runs are not merged across the seam
    assert newer.origin_of(P(0, 0))[1] == P(9, 9) and newer.origin_of(P(0, 1))[1] == P(9, 10)


# ---- interval helpers ------------------------------------------------------------------
def test_subtract_and_union_on_positions_across_ledgers():
    rs = [(P(1, 3), P(1, 5)), (P(2, 0), P(2, 4))]
    assert subtract(P(1, 0), P(2, 9), rs) == [(P(1, 0), P(1, 2)), (P(1, 6), P(2, -1)), (P(2, 5), P(2, 9))]
    assert subtract(P(1, 3), P(1, 4), rs) == []
    assert subtract(MIN_POSITION, P(1, 3), rs) == [(MIN_POSITION, P(1, 2))]
    assert union(rs, [(P(1, 6), P(1, 8)), (P(0, 1), P(0, 2))]) == [
        (P(0, 1), P(0, 2)), (P(1, 3), P(1, 8)), (P(2, 0), P(2, 4))]


# ---- sender side --------------------------------------------------------------
def index_of(log):
    ix = OriginIndex(complete_after=P(1, -1))
    for local, origin, opos in log:
        ix.add(local, origin, opos)
    return ix


def test_cumulative_ack_covers_only_what_the_sender_had():
    # a's log: a0 a1 c0 a2 c1 | unacked: a3 c2
    log = [(P(1, 0), "a", P(1, 0)), (P(1, 1), "a", P(1, 1)), (P(1, 2), "c", P(4, 0)),
           (P(1, 3), "a", P(1, 3)), (P(1, 4), "c", P(4, 1)), (P(1, 5), "a", P(1, 5)), (P(1, 6), "c", P(4, 2))]
    state = acked_origins(index_of(log), P(1, 4), [])
    assert state == {"a": OriginAcks(acked_through=P(1, 3)), "c": OriginAcks(acked_through=P(4, 1))}


def test_individual_acks_are_bridged_per_origin_and_batches_named_by_origin():
    log = [(P(1, e), "c", P(4, 2 * e)) for e in range(8)]       # c's own markers between its entries
    acked = AckRangeSet()
    acked.add_range(1, 2, 3)
    acked.add_range(1, 5, 6)
    # entry 4 partially acknowledged (batch), 0..1 and 7 not at all
    state = acked_origins(index_of(log), P(1, -1), acked.ranges(), [(P(1, 4), 10, [1, 2])])
    assert state == {"c": OriginAcks(ranges=[(P(4, 4), P(4, 6)), (P(4, 10), P(4, 12))],
                                     batches=[(P(4, 8), 10, (1, 2))])}
    # acks spread over two local ranges with another origin's unacked entry between them: one interval
    log2 = [(P(1, 0), "c", P(4, 0)), (P(1, 1), "a", P(1, 1)), (P(1, 2), "c", P(4, 1)), (P(1, 3), "c", P(4, 2))]
    acked2 = AckRangeSet()
    acked2.add(1, 0)
    acked2.add_range(1, 2, 3)
    assert acked_origins(index_of(log2), P(1, -1), acked2.ranges()) == {"c": OriginAcks(acked_through=P(4, 2))}


def test_mark_delete_before_the_window_gives_no_acked_through():
    ix = OriginIndex(complete_after=P(1, 9))
    ix.add(P(1, 10), "c", P(4, 0))
    ix.add(P(1, 11), "c", P(4, 1))
    acked = AckRangeSet()
    acked.add(1, 11)
    assert acked_origins(ix, P(1, 5), acked.ranges()) == {"c": OriginAcks(ranges=[(P(4, 1), P(4, 1))])}


# ---- receiver side ------------------------------------------------------------
def test_remote_acks_apply_is_idempotent_and_keeps_pending_above_arrivals():
    r = RemoteAcks()
    pieces = r.apply("a", {"c": OriginAcks(acked_through=P(4, 3), ranges=[(P(4, 6), P(4, 8))],
                                           batches=[(P(4, 10), 4, (0, 2))])})
    assert [(p.lo, p.hi, p.indexes) for p in pieces] == [
        (MIN_POSITION, P(4, 3), None), (P(4, 6), P(4, 8), None), (P(4, 10), P(4, 10), frozenset({0, 2}))]
    assert r.apply("a", {"c": OriginAcks(acked_through=P(4, 3), ranges=[(P(4, 6), P(4, 8))],
                                         batches=[(P(4, 10), 4, (0, 2))])}) == []
    more = r.apply("a", {"c": OriginAcks(acked_through=P(4, 7), ranges=[(P(4, 9), P(4, 12))])})
    assert [(p.lo, p.hi) for p in more] == [(P(4, 4), P(4, 5)), (P(4, 9), P(4, 12))]
    assert r.match("c", P(4, 10)) == (True, None)              # the batch entry is now whole
    assert r.match("c", P(4, 13)) == (False, None)
    assert r.match("c", P(4, 12), frozenset({"c", "b"})) == (False, None)   # a never had it
    assert r.covered_until("a", "c", P(4, 0)) == P(4, 12)
    pend = r.pending(lambda origin: P(4, 8))
    assert pend == {"a": {"c": OriginAcks(ranges=[(P(4, 8), P(4, 12))])}}   # whole intervals
    assert r.pending_count(lambda origin: P(4, 8)) == 1 and r.memory_bytes() > 0


# ---- the model: two clusters' logs -----------------------------------------------
def positions(rng_draws, start_ledger):
    """Local positions for a log of n entries, with marker gaps and rollovers."""
    ledger, entry = start_ledger, 0
    for gap, roll in rng_draws:
        if roll:
            ledger, entry = ledger + 1, 0
        entry += gap
        yield P(ledger, entry)
        entry += 1


@st.composite
def two_clusters(draw):
    n_a = draw(st.integers(0, 12))
    n_b = draw(st.integers(0, 8))
    n_c = draw(st.integers(0, 14))
    c_not_to_a = draw(st.sets(st.integers(0, max(0, n_c - 1)), max_size=3)) if n_c else set()
    c_seq = [i for i in range(n_c) if i not in c_not_to_a]
    nc_in_a = draw(st.integers(0, len(c_seq)))            # a received a prefix of c's entries for it
    nb_in_a = draw(st.integers(0, n_b))                   # and of b's
    flags = st.tuples(st.integers(0, 1), st.booleans().map(lambda b: b and draw(st.integers(0, 5)) == 0))

    def interleave(streams):
        streams = [list(s) for s in streams if s]
        out = []
        while streams:
            i = draw(st.integers(0, len(streams) - 1))
            out.append(streams[i].pop(0))
            if not streams[i]:
                streams.pop(i)
        return out

    a_tokens = interleave([[("a", i) for i in range(n_a)], [("b", j) for j in range(nb_in_a)],
                           [("c", c_seq[k]) for k in range(nc_in_a)]])
    b_tokens = interleave([[("a", i) for i in range(n_a)], [("b", j) for j in range(n_b)],
                           [("c", k) for k in range(n_c)]])
    a_pos = list(positions([draw(flags) for _ in a_tokens], 10))
    b_pos = list(positions([draw(flags) for _ in b_tokens], 20))
    c_pos = list(positions([draw(flags) for _ in range(n_c)], 30))
    origin_pos = {}
    for tok, pos in zip(a_tokens, a_pos):
        if tok[0] == "a":
            origin_pos[tok] = pos
    for tok, pos in zip(b_tokens, b_pos):
        if tok[0] == "b":
            origin_pos[tok] = pos
    for k in range(n_c):
        origin_pos[("c", k)] = c_pos[k]
    acked = set(draw(st.sets(st.sampled_from(a_tokens)))) if a_tokens else set()
    arrived = draw(st.integers(0, len(b_tokens)))        # b's entries stored when the update arrives
    # what b already stored must include a's entries (they precede a's update in a's log)
    last_a = max((i for i, t in enumerate(b_tokens) if t[0] == "a"), default=-1)
    arrived = max(arrived, last_a + 1)
    return a_tokens, a_pos, b_tokens, b_pos, origin_pos, acked, arrived, c_not_to_a


@settings(max_examples=300, deadline=None)
@given(two_clusters())
def test_model_receiver_acknowledges_exactly_what_the_sender_did(case):
    a_tokens, a_pos, b_tokens, b_pos, origin_pos, acked, arrived, c_not_to_a = case
    # sender a: its index and cursor state (mark-delete + individual ranges)
    ix_a = OriginIndex(complete_after=P(10, -1))
    for tok, pos in zip(a_tokens, a_pos):
        ix_a.add(pos, tok[0], origin_pos[tok])
    md = P(10, -1)
    for tok, pos in zip(a_tokens, a_pos):
        if tok not in acked:
            break
        md = pos
    ranges = AckRangeSet()
    for tok, pos in zip(a_tokens, a_pos):
        if tok in acked and pos > md:
            ranges.add(pos.ledger_id, pos.entry_id)
    state = acked_origins(ix_a, md, ranges.ranges())
    # receiver b: entries stored so far, the update, then the rest arriving
    ix_b = OriginIndex(complete_after=P(20, -1))
    scope = {("c", k): frozenset({"c", "b"}) for k in c_not_to_a}
    for tok, pos in zip(b_tokens[:arrived], b_pos[:arrived]):
        ix_b.add(pos, tok[0], origin_pos[tok], scope.get(tok))
    remote = RemoteAcks()
    acked_b = set()
    local_tok = dict(zip(b_pos, b_tokens))
    for piece in remote.apply("a", state):
        for run, f, l in ix_b.local_ranges(piece.origin, piece.lo, piece.hi, acker="a"):
            assert piece.indexes is None
            for e in range(run.local_first + f, run.local_first + l + 1):
                acked_b.add(local_tok[P(run.local_ledger, e)])
    for tok, pos in zip(b_tokens[arrived:], b_pos[arrived:]):
        ix_b.add(pos, tok[0], origin_pos[tok], scope.get(tok))
        whole, partial = remote.match(tok[0], origin_pos[tok], scope.get(tok))
        assert partial is None
        if whole:
            acked_b.add(tok)
    assert acked_b == acked
    # the pending part restored in a fresh RemoteAcks (a restart) acknowledges the same arrivals
    high = {o: ix_b.high(o) for o in ("a", "b", "c")}
    fresh = RemoteAcks()
    for sender, per in remote.pending(lambda o: None).items():
        fresh.apply(sender, per)
    for tok in b_tokens[arrived:]:
        assert fresh.match(tok[0], origin_pos[tok], scope.get(tok))[0] == (tok in acked)
    assert all(h is None or isinstance(h, P) for h in high.values())


# ---- where a subscription created by an UPDATE starts ---------------------------
def _prev(pos):
    return P(pos.ledger_id, pos.entry_id - 1) if pos.entry_id > 0 else P(-1, -1)


def test_creation_position_walks_to_the_first_unacknowledged_entry():
    from broker.replication.origin_acks import creation_position

    ix = OriginIndex(complete_after=P(1, -1))
    for e in range(6):
        ix.add(P(1, e), "a", P(7, e))           # a's messages 7:0..7:5 at 1:0..1:5 here
    ix.add(P(1, 7), "c", P(9, 0), frozenset({"c", "b"}))   # one a never had (replicate_to)
    r = RemoteAcks()
    r.apply("a", {"a": OriginAcks(acked_through=P(7, 2), ranges=[(P(7, 4), P(7, 5))])})
    assert creation_position(ix, r, "a", P(1, 0), P(1, 7), _prev) == P(1, 2)   # 1:3 = a's 7:3 not acked
    r.apply("a", {"a": OriginAcks(acked_through=P(7, 5))})
    assert creation_position(ix, r, "a", P(1, 0), P(1, 7), _prev) == P(1, 6)   # stops before c's message
    fresh = RemoteAcks()
    fresh.apply("a", {"c": OriginAcks(acked_through=P(9, 0))})
    assert creation_position(ix, fresh, "a", P(1, 0), P(1, 7), _prev) == P(1, -1)   # nothing of a's acked


def test_creation_position_before_the_index_window():
    from broker.replication.origin_acks import creation_position

    ix = OriginIndex(complete_after=P(1, 49))   # entries 1:0..1:49 not indexed (a big old topic)
    ix.add(P(1, 50), "a", P(7, 50))
    ix.add(P(1, 51), "a", P(7, 51))
    r = RemoteAcks()
    r.apply("a", {"a": OriginAcks(acked_through=P(7, 50))})
    assert creation_position(ix, r, "a", P(1, 0), P(1, 51), _prev) == P(1, 50)   # older ones acked too
    r2 = RemoteAcks()
    r2.apply("a", {"a": OriginAcks(ranges=[(P(7, 51), P(7, 51))])})
    assert creation_position(ix, r2, "a", P(1, 0), P(1, 51), _prev) == P(1, -1)  # unknown: from the start
    r3 = RemoteAcks()
    r3.apply("a", {"a": OriginAcks(acked_through=P(7, 60))})
    assert creation_position(ix, r3, "a", P(1, 0), P(1, 51), _prev) == P(1, 51)  # all of it, up to the end
