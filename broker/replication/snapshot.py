"""Pure state of the replicated-subscription snapshot protocol (PIP-33), no I/O:
``SnapshotBuilder`` (one snapshot in progress, Pulsar's
``ReplicatedSubscriptionsSnapshotBuilder``; driven by
``broker.replication.controller``) and ``SnapshotCache`` (a subscription's
usable snapshots, Pulsar's ``ReplicatedSubscriptionSnapshotCache``; held by
``broker.service.subscription.Subscription``)."""
from __future__ import annotations

import bisect
from typing import Optional

from broker.ledger.position import Position


class SnapshotBuilder:
    """Collects SNAPSHOT_RESPONSEs for one snapshot id (Pulsar's
    ReplicatedSubscriptionsSnapshotBuilder). ``start_ms``: epoch ms the snapshot
    started; ``remote_clusters``: names of the clusters asked. Positions are
    ``Position`` = (ledger_id, entry_id): ``responses`` maps a cluster to the
    position it answered (its last message), ``local`` is the local position
    of the completing SNAPSHOT_RESPONSE marker.

    ``received_response(position, cluster, remote_position)`` returns:
    ``None`` (still waiting), ``"second_round"`` (write another SNAPSHOT_REQUEST:
    with more than two clusters a second round makes sure every cluster saw
    the others' messages), or ``"complete"`` (write the SNAPSHOT; ``local``
    and ``responses`` hold its content).
    """

    def __init__(self, snapshot_id: str, remote_clusters: list[str], start_ms: int):
        self.snapshot_id = snapshot_id
        self.remote_clusters = list(remote_clusters)
        self.missing = set(remote_clusters)
        self.responses: dict[str, Position] = {}
        self.needs_two_rounds = len(remote_clusters) > 1
        self.first_round_complete = False
        self.start_ms = start_ms
        self.local: Optional[Position] = None

    def received_response(self, position: Position, cluster: str, remote_position: Position) -> Optional[str]:
        """Record ``cluster``'s answer: ``remote_position`` is its last position, ``position``
        the local position of the SNAPSHOT_RESPONSE marker (kept as ``local`` on completion).
        Answers from clusters not asked, or repeated within a round, are ignored (None).
        Returns None / ``"second_round"`` / ``"complete"`` as the class says."""
        if cluster not in self.remote_clusters:
            return None
        if cluster not in self.missing:
            return None                              # a repeated answer of this round
        # putIfAbsent in both rounds (ReplicatedSubscriptionsSnapshotBuilder): the first
        # round's position is the one every cluster is known to have replicated up to;
        # a second-round position may cover messages another cluster has not seen yet.
        self.responses.setdefault(cluster, remote_position)
        self.missing.discard(cluster)
        if self.missing:
            return None
        if self.needs_two_rounds and not self.first_round_complete:
            self.first_round_complete = True
            self.missing = set(self.remote_clusters)
            return "second_round"
        self.local = position
        return "complete"

    def timed_out(self, now_ms: int, timeout_ms: int) -> bool:
        """True when more than ``timeout_ms`` ms passed since ``start_ms`` (both epoch ms);
        the controller drops it (broker config
        replicated_subscriptions_snapshot_timeout_seconds, Pulsar's
        replicatedSubscriptionsSnapshotTimeoutSeconds)."""
        return now_ms - self.start_ms > timeout_ms


class SnapshotCache:
    """Snapshots of one subscription ordered by local position, at most
    ``max_snapshots`` (count, at least 2; broker config
    replicated_subscriptions_snapshot_max_cached_per_subscription, Pulsar's
    replicatedSubscriptionsSnapshotMaxCachedPerSubscription). When a new
    snapshot overfills it, the interior snapshot whose neighbours are closest
    is evicted (never the oldest, which the lagging mark-delete position will
    meet first, nor the newest), so a subscription far behind still finds a
    usable snapshot (Pulsar PR #25044)."""

    def __init__(self, max_snapshots: int = 30):
        self.max_snapshots = max(2, max_snapshots)
        self._positions: list[Position] = []
        self._snapshots: list[object] = []

    def __len__(self) -> int:
        return len(self._positions)

    def add(self, local: Position, snapshot) -> None:
        """Cache ``snapshot`` (a ReplicatedSubscriptionsSnapshot message) at its ``local``
        position; ignored unless ``local`` is past the newest cached one."""
        if self._positions and local <= self._positions[-1]:
            return   # old or duplicate snapshot (e.g. re-read after a rewind)
        self._positions.append(local)
        self._snapshots.append(snapshot)
        if len(self._positions) > self.max_snapshots:
            # Drop the interior snapshot with the smallest gap to its neighbours.
            best, best_gap = 1, None
            for i in range(1, len(self._positions) - 1):
                gap = _distance(self._positions[i - 1], self._positions[i + 1])
                if best_gap is None or gap < best_gap:
                    best, best_gap = i, gap
            del self._positions[best]
            del self._snapshots[best]

    def advanced_mark_delete(self, mark_delete: Position):
        """The newest snapshot at or before ``mark_delete`` (removing it and every
        older one), or None."""
        idx = bisect.bisect_right(self._positions, mark_delete)
        if idx == 0:
            return None
        snap = self._snapshots[idx - 1]
        del self._positions[:idx]
        del self._snapshots[:idx]
        return snap

    def positions(self) -> list[Position]:
        """Local positions of the cached snapshots, oldest first (a copy)."""
        return list(self._positions)


def _distance(a: Position, b: Position) -> float:
    # Ledger ids grow over time; within a ledger entry ids do. A rough metric is enough.
    return (b.ledger_id - a.ledger_id) * 1e6 + (b.entry_id - a.entry_id)
