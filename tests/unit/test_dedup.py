from broker.service.dedup import DedupStatus, MessageDeduplication


def test_dup_unknown_notdup_sequence():
    d = MessageDeduplication(enabled=True, snapshot_interval=3)
    assert d.check("p", 0) is DedupStatus.NOT_DUP
    assert d.check("p", 0) is DedupStatus.UNKNOWN          # in flight
    assert not d.record_persisted("p", 0)
    assert d.check("p", 0) is DedupStatus.DUP
    assert d.check("p", 1, 5) is DedupStatus.NOT_DUP       # batch 1..5
    assert d.check("p", 3) is DedupStatus.UNKNOWN
    d.record_persisted("p", 5)
    assert d.check("p", 4) is DedupStatus.DUP
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
