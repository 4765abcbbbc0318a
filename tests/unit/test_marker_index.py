"""MarkerIndex (broker/replication/markers.py): the markers a topic holds that
some cursor has not passed, kept sorted for backlog figures and UPDATE acks."""
from __future__ import annotations

from broker.ledger.position import Position as P
from broker.replication.markers import MarkerIndex, is_marker
from proto.pulsar_api_pb2 import MessageMetadata


class FakeCursor:
    """Just what in_backlog reads: a mark-delete position and individual acks."""

    def __init__(self, mark_delete: P, acked=()):
        self.mark_delete_position = mark_delete
        self._acked = set(acked)

    def is_acknowledged(self, pos: P) -> bool:
        return pos <= self.mark_delete_position or pos in self._acked


def test_add_merge_keep_one_sorted_copy_of_each_position():
    index = MarkerIndex()
    for p in (P(1, 2), P(1, 5), P(2, 0)):
        index.add(p)
    index.add(P(1, 3))                      # out of order (a late write callback)
    index.merge([P(0, 7), P(1, 5), P(2, 0)])
    assert index.positions == [P(0, 7), P(1, 2), P(1, 3), P(1, 5), P(2, 0)]
    assert len(index) == 5


def test_prune_forgets_what_the_slowest_cursor_passed_and_none_keeps_all():
    index = MarkerIndex()
    index.merge([P(1, 1), P(1, 4), P(3, 0)])
    index.prune(None)
    assert len(index) == 3
    index.prune(P(1, 4))
    assert index.positions == [P(3, 0)]
    index.prune(P(9, 9))
    assert index.positions == []


def test_between_is_exclusive_then_inclusive():
    index = MarkerIndex()
    index.merge([P(1, 1), P(1, 4), P(2, 0), P(3, 3)])
    assert index.between(P(1, 1), P(2, 0)) == [P(1, 4), P(2, 0)]
    assert index.between(P(3, 3), P(9, 9)) == []
    assert index.between(P(0, 0), P(1, 0)) == []


def test_in_backlog_counts_markers_after_the_mark_delete_not_acked_individually():
    index = MarkerIndex()
    index.merge([P(1, 1), P(1, 4), P(2, 0), P(3, 3)])
    assert index.in_backlog(FakeCursor(P(1, 1))) == 3
    assert index.in_backlog(FakeCursor(P(1, 1), acked=[P(2, 0)])) == 2
    assert index.in_backlog(FakeCursor(P(3, 3))) == 0
    assert MarkerIndex().in_backlog(FakeCursor(P(0, 0))) == 0


def test_is_marker_reads_the_marker_type_field():
    assert is_marker(MessageMetadata(producer_name="pulsar.marker", sequence_id=0, publish_time=1, marker_type=10))
    assert not is_marker(MessageMetadata(producer_name="p", sequence_id=0, publish_time=1))
