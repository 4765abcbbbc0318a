from broker.ledger.position import Position as P
from broker.replication import markers
from broker.replication.origin_acks import OriginAcks
from broker.replication.snapshot import SnapshotBuilder, SnapshotCache


def test_builder_two_clusters_completes_in_one_round():
    b = SnapshotBuilder("s1", ["b"], 0)
    assert b.received_response(P(1, 5), "x", P(9, 9)) is None      # unknown cluster ignored
    assert b.received_response(P(1, 5), "b", P(2, 20)) == "complete"
    assert b.local == P(1, 5) and b.responses == {"b": P(2, 20)}


def test_builder_three_clusters_needs_two_rounds():
    b = SnapshotBuilder("s1", ["b", "c"], 0)
    assert b.received_response(P(1, 5), "b", P(2, 20)) is None
    assert b.received_response(P(1, 6), "c", P(3, 30)) == "second_round"
    assert b.received_response(P(1, 9), "c", P(3, 35)) is None
    assert b.received_response(P(1, 10), "b", P(2, 25)) == "complete"
    # The first round's positions are kept (Pulsar's putIfAbsent in both rounds): a second-round
    # position may hold messages another cluster has not received yet (uneven lag), and
    # acknowledging up to it in B would skip a message A never delivered.
    assert b.responses == {"b": P(2, 20), "c": P(3, 30)} and b.local == P(1, 10)
    assert b.timed_out(31_000, 30_000) and not b.timed_out(10, 30_000)


def test_cache_returns_newest_usable_and_keeps_spread():
    c = SnapshotCache(max_snapshots=4)
    for e in range(0, 100, 10):
        c.add(P(1, e), f"snap{e}")
    pos = c.positions()
    assert len(pos) == 4 and pos[0] == P(1, 0) and pos[-1] == P(1, 90)   # oldest and newest kept
    assert c.advanced_mark_delete(P(0, 5)) is None
    assert c.advanced_mark_delete(P(1, 0)) == "snap0"
    assert c.positions()[0] > P(1, 0)
    newest_before = [p for p in c.positions() if p <= P(1, 95)][-1]
    assert c.advanced_mark_delete(P(1, 95)) == f"snap{newest_before.entry_id}"
    assert len(c) == 0


def test_marker_encoding_round_trip():
    kind, msg = markers.parse(markers.snapshot_request("id1", "a"))
    assert kind == markers.SNAPSHOT_REQUEST and msg.source_cluster == "a"
    acks = {"b": OriginAcks(acked_through=P(2, 7), ranges=[(P(3, 6), P(3, 9)), (P(3, 12), P(4, -1))],
                            batches=[(P(4, 2), 10, (0, 3))])}
    kind, msg = markers.parse(markers.update("sub", {"b": P(3, 4)}, acks))
    assert kind == markers.UPDATE and msg.clusters[0].message_id.entry_id == 4
    assert msg.individually_acked[0].range_end[0].entry_id == 9
    back = markers.parse_origin_acks(msg.individually_acked)["b"]
    assert back.acked_through == P(2, 7) and back.batches == [(P(4, 2), 10, (0, 3))]
    # (4, -1) closes before ledger 4: encoded as the end of ledger 3
    assert back.ranges[0] == (P(3, 6), P(3, 9)) and back.ranges[1][1] == P(3, 2**63 - 1)
