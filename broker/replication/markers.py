"""Marker entries (Pulsar's ``Markers``): server-only entries written into a
topic to carry the replicated-subscription protocol. Encoding in one place.

A marker is an entry whose MessageMetadata has ``marker_type`` set, producer
name ``pulsar.marker``, sequence id 0, and optionally ``replicate_to`` (the
only cluster it may be replicated to). Its payload is one of the marker
messages of proto/pulsar_api.proto (PulsarMarkers.proto in Pulsar).
"""
from __future__ import annotations

import bisect
import time
from typing import Iterable, Optional

from broker.ledger.position import Position
from proto.entry_format import decode_entry, encode_entry
from proto import pulsar_api_pb2 as api

MARKER_PRODUCER = "pulsar.marker"
SNAPSHOT_REQUEST = api.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST
SNAPSHOT_RESPONSE = api.REPLICATED_SUBSCRIPTION_SNAPSHOT_RESPONSE
SNAPSHOT = api.REPLICATED_SUBSCRIPTION_SNAPSHOT
UPDATE = api.REPLICATED_SUBSCRIPTION_UPDATE
SERVER_ONLY = {SNAPSHOT_REQUEST, SNAPSHOT_RESPONSE, SNAPSHOT, UPDATE}


def _message(marker_type: int, payload: bytes, restrict_to: Optional[str]) -> bytes:
    md = api.MessageMetadata(producer_name=MARKER_PRODUCER, sequence_id=0,
                             publish_time=int(time.time() * 1000), marker_type=marker_type)
    if restrict_to:
        md.replicate_to.append(restrict_to)
    return encode_entry(md, payload)


def _mid(pos: Position) -> api.MarkersMessageIdData:
    return api.MarkersMessageIdData(ledger_id=max(0, pos.ledger_id), entry_id=max(0, pos.entry_id))


def snapshot_request(snapshot_id: str, source_cluster: str, follow_up: bool = False) -> bytes:
    """SNAPSHOT_REQUEST, replicated to every remote. ``follow_up``: see the controller."""
    return _message(SNAPSHOT_REQUEST, api.ReplicatedSubscriptionsSnapshotRequest(
        snapshot_id=snapshot_id, source_cluster=source_cluster, follow_up=follow_up).SerializeToString(), None)


def snapshot_response(snapshot_id: str, reply_to: str, cluster: str, last: Position) -> bytes:
    """SNAPSHOT_RESPONSE with this cluster's last position, restricted to ``reply_to``."""
    return _message(SNAPSHOT_RESPONSE, api.ReplicatedSubscriptionsSnapshotResponse(
        snapshot_id=snapshot_id, cluster=api.ClusterMessageId(cluster=cluster, message_id=_mid(last))
    ).SerializeToString(), reply_to)


def snapshot(snapshot_id: str, local_cluster: str, local: Position, clusters: dict[str, Position]) -> bytes:
    """SNAPSHOT (local only): the local position and every remote's position."""
    msg = api.ReplicatedSubscriptionsSnapshot(snapshot_id=snapshot_id, local_message_id=_mid(local))
    for name, pos in sorted(clusters.items()):
        msg.clusters.add(cluster=name, message_id=_mid(pos))
    return _message(SNAPSHOT, msg.SerializeToString(), local_cluster)


def update(subscription: str, clusters: dict[str, Position],
           origin_acks: Optional[dict] = None) -> bytes:
    """UPDATE for ``subscription``: per cluster, the position to acknowledge
    cumulatively (PIP-33, from a passed snapshot; may be empty), and beyond
    PIP-33 the sender's acknowledged state by origin id: ``origin_acks`` =
    {origin cluster: ``origin_acks.OriginAcks``} (issue 15)."""
    msg = api.ReplicatedSubscriptionsUpdate(subscription_name=subscription)
    for name, pos in sorted(clusters.items()):
        msg.clusters.add(cluster=name, message_id=_mid(pos))
    add_origin_acks(msg.individually_acked, origin_acks or {})
    return _message(UPDATE, msg.SerializeToString(), None)


_MAX_ENTRY = 2**63 - 1


def _upper(pos: Position) -> Optional[api.MarkersMessageIdData]:
    """A closed upper bound; ``(L, -1)`` (before entry 0 of L) becomes ``(L-1, max)``."""
    if pos.entry_id >= 0:
        return _mid(pos)
    if pos.ledger_id <= 0:
        return None
    return api.MarkersMessageIdData(ledger_id=pos.ledger_id - 1, entry_id=_MAX_ENTRY)


def add_origin_acks(field, origin_acks: dict) -> None:
    """Append {origin cluster: OriginAcks} to a repeated ``ClusterAckRanges`` ``field``
    (intervals with an empty upper bound are left out)."""
    for name, acks in sorted(origin_acks.items()):
        car = field.add(cluster=name)
        if acks.acked_through is not None:
            car.acked_through.CopyFrom(_mid(acks.acked_through))
        for lo, hi in acks.ranges:
            upper = _upper(hi)
            if upper is None:
                continue
            car.range_start.append(_mid(lo))
            car.range_end.append(upper)
        for pos, size, indexes in acks.batches:
            car.batch_acks.add(message_id=_mid(pos), batch_size=size, acked_indexes=list(indexes))


def parse_origin_acks(field) -> dict:
    """The {origin cluster: ``origin_acks.OriginAcks``} of a repeated ``ClusterAckRanges``
    (inverse of :func:`add_origin_acks`; repeated origins are merged)."""
    from .origin_acks import OriginAcks

    out: dict = {}
    for car in field:
        acks = out.setdefault(car.cluster, OriginAcks())
        if car.HasField("acked_through"):
            at = position(car.acked_through)
            acks.acked_through = at if acks.acked_through is None else max(at, acks.acked_through)
        for lo, hi in zip(car.range_start, car.range_end):
            lo_p, hi_p = position(lo), position(hi)
            if lo_p <= hi_p:
                acks.ranges.append((lo_p, hi_p))
        for b in car.batch_acks:
            acks.batches.append((position(b.message_id), b.batch_size, tuple(b.acked_indexes)))
    for acks in out.values():
        acks.ranges.sort()
    return out


def position(mid: api.MarkersMessageIdData) -> Position:
    """The ``Position`` (ledger id, entry id) a marker's MarkersMessageIdData names."""
    return Position(mid.ledger_id, mid.entry_id)


_PARSERS = {
    SNAPSHOT_REQUEST: api.ReplicatedSubscriptionsSnapshotRequest,
    SNAPSHOT_RESPONSE: api.ReplicatedSubscriptionsSnapshotResponse,
    SNAPSHOT: api.ReplicatedSubscriptionsSnapshot,
    UPDATE: api.ReplicatedSubscriptionsUpdate,
}


def is_marker(md) -> bool:
    """True when ``md`` (an entry's MessageMetadata) is a marker's: server-only,
    never dispatched to consumers, never counted in backlogs (Pulsar's
    ``Markers.isServerOnlyMarker``, here every marker type is server-only)."""
    return md.HasField("marker_type")


class MarkerIndex:
    """The positions of a topic's markers that some cursor may not have passed,
    ascending (a sorted list of ``Position``): what lets backlog figures exclude
    markers (Pulsar issue #22926) and UPDATE handling acknowledge them. Filled as
    markers are written (``add``) and by the backlog scan after a restart
    (``merge``), pruned behind the slowest cursor (``prune``); memory is one
    Position per marker not yet passed by every cursor."""

    def __init__(self) -> None:
        self.positions: list[Position] = []

    def __len__(self) -> int:
        return len(self.positions)

    def add(self, pos: Position) -> None:
        """A marker was stored at ``pos`` (usually after every known one)."""
        if not self.positions or self.positions[-1] < pos:
            self.positions.append(pos)
        elif pos not in self.positions:
            bisect.insort(self.positions, pos)

    def merge(self, found: Iterable[Position]) -> None:
        """Markers found by a backlog scan (any order, duplicates allowed)."""
        self.positions = sorted(set(found) | set(self.positions))

    def prune(self, slowest: Optional[Position]) -> None:
        """Forget the markers at or before ``slowest`` (the slowest cursor's
        mark-delete position; None: no cursor, keep everything)."""
        if slowest is not None and self.positions and self.positions[0] <= slowest:
            del self.positions[:bisect.bisect_right(self.positions, slowest)]

    def between(self, after: Position, upto: Position) -> list[Position]:
        """Markers ``p`` with ``after < p <= upto``, ascending."""
        lo = bisect.bisect_right(self.positions, after)
        hi = bisect.bisect_right(self.positions, upto)
        return self.positions[lo:hi]

    def in_backlog(self, cursor) -> int:
        """Markers after ``cursor``'s mark-delete position it has not acknowledged
        individually (``cursor``: a ManagedCursor); a count."""
        md = cursor.mark_delete_position
        if not self.positions or self.positions[-1] <= md:
            return 0
        return sum(1 for p in self.between(md, self.positions[-1]) if not cursor.is_acknowledged(p))


def parse(data: bytes):
    """(marker_type, parsed marker message) of a marker entry; ValueError for
    non-marker or unknown marker entries, CorruptedMessage for bad bytes."""
    md, payload = decode_entry(data)
    if not is_marker(md) or md.marker_type not in _PARSERS:
        raise ValueError(f"not a replicated-subscription marker (marker_type={md.marker_type})")
    msg = _PARSERS[md.marker_type]()
    msg.ParseFromString(bytes(payload))
    return md.marker_type, msg
