import collections

from broker.service.dedup import DedupStatus, MessageDeduplication


def test_dup_unknown_notdup_sequence():
    d = MessageDeduplication(enabled=True, snapshot_interval=3)
    assert d.check("p", 0) is DedupStatus.NOT_DUP
    assert d.check("p", 0) is DedupStatus.UNKNOWN          # in flight
    assert not d.record_persisted("p", 0)
    assert d.check("p", 0) is DedupStatus.DUP
    assert d.check("p", 1, 5) is DedupStatus.NOT_DUP       # batch 1..5
    assert d.check("p", 3) is DedupStatus.UNKNOWN
    d.record_persisted("p", 5, 1)
    assert d.check("p", 4) is DedupStatus.DUP              # a resend of a stored batch
    assert d.check("p", 0) is DedupStatus.DUP              # stored
    assert d.check("q", 0) is DedupStatus.NOT_DUP          # per producer name
    assert d.last_sequence_id("p") == 5 and d.last_sequence_id("zzz") == -1


def test_failed_add_allows_retry_and_snapshot_reload():
    d = MessageDeduplication(enabled=True, snapshot_interval=2)
    d.check("p", 0); d.record_persisted("p", 0)
    d.check("p", 1)
    d.reset_highest_sequence_id_pushed()    # the topic rewinds once the pending adds drained
    assert d.check("p", 1) is DedupStatus.NOT_DUP
    assert d.record_persisted("p", 1)                       # snapshot due after 2 entries
    snap = d.snapshot()
    e = MessageDeduplication(enabled=True)
    e.load(snap, [("p", 7), ("r", 2)])
    assert e.check("p", 7) is DedupStatus.DUP
    assert e.check("r", 3) is DedupStatus.NOT_DUP


def test_disabled_never_drops_but_replicators_always_dedup():
    d = MessageDeduplication(enabled=False)
    assert d.check("p", 0) is DedupStatus.NOT_DUP
    d.record_persisted("p", 0)
    assert d.check("p", 0) is DedupStatus.NOT_DUP
    assert d.last_sequence_id("p") == 0          # tracked even when off
    assert d.check("pulsar.repl.a", 5) is DedupStatus.NOT_DUP
    d.record_persisted("pulsar.repl.a", 5)
    assert d.check("pulsar.repl.a", 5) is DedupStatus.DUP


def test_a_lower_id_after_a_higher_one_was_stored_is_behind_not_a_duplicate():
    """Issue 33 case 4: after a send timeout, later sends stored first; the resend of the
    lower id must not be answered -1:-1 (it may be stored nowhere)."""
    d = MessageDeduplication(enabled=True)
    for seq in (0, 1, 2, 6, 7, 9):                          # 3-5 and 8 timed out in the SDK, never stored
        assert d.check("p", seq) is DedupStatus.NOT_DUP
        d.record_persisted("p", seq, seq)
    assert [d.check("p", s) for s in range(10)] == [DedupStatus.DUP] * 3 + [DedupStatus.BEHIND] * 3 + [
        DedupStatus.DUP] * 2 + [DedupStatus.BEHIND, DedupStatus.DUP]
    assert d.stored_ranges["p"] == collections.deque([(0, 2), (6, 7), (9, 9)])   # contiguous ids merged
    e = MessageDeduplication(enabled=True)
    e.load(d.snapshot())                                    # recovered: only the highest is known
    assert e.check("p", 9) is DedupStatus.DUP and e.check("p", 4) is DedupStatus.DUP   # cannot tell: as Pulsar
    e.check("p", 12); e.record_persisted("p", 12, 12)       # 10-11 skipped after the recovery
    assert e.check("p", 11) is DedupStatus.BEHIND
    d.check("pulsar.repl.b", 9); d.record_persisted("pulsar.repl.b", 9)
    assert d.check("pulsar.repl.b", 3) is DedupStatus.DUP  # a replicator's rewind stays a duplicate
