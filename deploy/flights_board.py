"""The delay boards of ``minipulsar geo demo`` (:mod:`deploy.flights_replay`):
what a region counts, its replication-lag histograms, and the Key_Shared
consumers that feed a board.

Every region runs a delay board: Key_Shared consumers (Pulsar's
``KeyShared`` subscription type: one carrier's flights always reach the same
consumer) on its own cluster's *replicated subscription* (PIP-33)
``delay-board-<cluster>``, keeping departures, cancellations and mean
departure delay per carrier, counted by flight identity
(:func:`deploy.flights_data.flight_identity`). Every cluster holds every
flight, so the boards must agree. Each delivery also records the publish ->
delivery latency per (source cluster, delivering cluster) in :class:`LagStats`.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from deploy.flights_data import Flight, flight_identity

__all__ = ["DelayBoard", "LagStats", "RegionState", "BoardConsumers"]


class DelayBoard:
    """Departures, cancellations and mean departure delay per carrier, counted
    once per flight identity; deliveries of a flight already counted are
    duplicates."""

    def __init__(self, name: str):
        self.name = name
        self.seen: set[tuple] = set()
        self.duplicates = 0
        self.deliveries = 0
        self.carriers: dict[str, list] = {}      # carrier -> [departures, cancelled, delay_sum, delay_n]

    def add(self, flight: dict) -> bool:
        """Count ``flight`` (a decoded message: the dict of :mod:`deploy.flights_data`, with
        ``carrier``, ``dep_time`` (None = cancelled) and ``dep_delay`` (minutes or None)); False
        if it was counted before (a duplicate delivery). Raises KeyError for a missing field."""
        self.deliveries += 1
        ident = flight_identity(flight)
        if ident in self.seen:
            self.duplicates += 1
            return False
        self.seen.add(ident)
        row = self.carriers.get(flight["carrier"])
        if row is None:
            row = self.carriers[flight["carrier"]] = [0, 0, 0.0, 0]
        row[0] += 1
        if flight["dep_time"] is None:
            row[1] += 1
        delay = flight["dep_delay"]
        if delay is not None:
            row[2] += delay
            row[3] += 1
        return True

    def table_rows(self) -> list[tuple]:
        """(carrier, departures (count), cancelled (count), mean departure delay in minutes
        rounded to 0.01, or None) per carrier, most departures first."""
        out = []
        for carrier, (n, cancelled, dsum, dn) in sorted(self.carriers.items(), key=lambda kv: (-kv[1][0], kv[0])):
            out.append((carrier, n, cancelled, round(dsum / dn, 2) if dn else None))
        return out


class LagStats:
    """Per (source cluster, delivering cluster): publish -> delivery latency (ms), in HDR
    histograms (1 ms .. 24 h, 2 significant digits). Raises ImportError without ``hdrh``."""

    def __init__(self):
        from hdrh.histogram import HdrHistogram

        self._new = lambda: HdrHistogram(1, 24 * 3600 * 1000, 2)
        self.hist: dict[tuple[str, str], object] = {}

    def record(self, src: str, dst: str, ms: float) -> None:
        """One message published in ``src``, delivered in ``dst`` after ``ms`` milliseconds
        (recorded as at least 1 ms)."""
        h = self.hist.get((src, dst))
        if h is None:
            h = self.hist[(src, dst)] = self._new()
        h.record_value(max(1, int(ms)))

    def percentiles(self, src: str, dst: str) -> tuple[int, int, int] | None:
        """(p50 ms, p99 ms, message count) of the pair ``src`` -> ``dst``, or None when
        nothing was recorded for it."""
        h = self.hist.get((src, dst))
        if h is None or not h.get_total_count():
            return None
        return h.get_value_at_percentile(50), h.get_value_at_percentile(99), h.get_total_count()


@dataclass
class RegionState:
    """One cluster during the demo: its flights (those of its ``origin`` airport),
    producers ({carrier: Producer}), board and consumers; ``acked`` / ``deduplicated``
    (counts of sends acknowledged / dropped by deduplication), ``errors`` (messages),
    ``started`` / ``finished`` (``time.monotonic()`` seconds of the replay), ``consuming_in``
    (the cluster its board consumes in: another one after ``--failover``)."""

    name: str
    origin: str | None
    flights: list[Flight]
    board: DelayBoard
    acked: int = 0
    deduplicated: int = 0
    errors: list[str] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0
    producers: dict = field(default_factory=dict)
    consumers: list = field(default_factory=list)
    consumer_tasks: list = field(default_factory=list)
    consuming_in: str = ""



class BoardConsumers:
    """The consumer half of :class:`deploy.flights_replay.Demo` (a mixin working on the
    demo's state: ``args.consumers`` (count), ``clients`` ({cluster: AsyncClient}),
    ``spec.topic``, ``lag`` (:class:`LagStats`), ``t_start_ms`` (ms since the epoch) and
    its ``sub_name(region)``): start, feed and stop the Key_Shared consumers of a
    region's board. Pulsar errors of a receive are recorded in ``region.errors``,
    never raised; creating a consumer raises the client's ``PulsarException``."""

    async def _start_board(self, region: RegionState, cluster: str) -> None:
        from client import ConsumerType, InitialPosition
        from client.consumer_config import BatchReceivePolicy

        region.consuming_in = cluster
        for k in range(self.args.consumers):
            consumer = await self.clients[cluster].subscribe(
                self.spec.topic, self.sub_name(region.name), consumer_type=ConsumerType.KeyShared,
                initial_position=InitialPosition.Earliest, replicate_subscription_state_enabled=True,
                consumer_name=f"board-{region.name}-{k}", receiver_queue_size=2000,
                batch_receive_policy=BatchReceivePolicy(max_num_messages=500, timeout_ms=50))
            region.consumers.append(consumer)
            region.consumer_tasks.append(asyncio.create_task(self._consume(region, consumer, cluster)))

    async def _consume(self, region: RegionState, consumer, cluster: str) -> None:
        from client.errors import AlreadyClosed, PulsarException

        board, lag, loads, since = region.board, self.lag, json.loads, self.t_start_ms
        while True:
            try:
                msgs = await consumer.batch_receive()
            except AlreadyClosed:
                return
            except PulsarException as exc:
                region.errors.append(f"receive: {exc}")
                await asyncio.sleep(0.5)
                continue
            if not msgs:
                continue
            now = time.time() * 1000
            for msg in msgs:
                board.add(loads(msg.data()))
                published = msg.publish_timestamp()
                if published >= since:      # not flights stored by an earlier run
                    lag.record(msg.replicated_from() or cluster, cluster, now - published)
                consumer.acknowledge(msg)

    async def _stop_board(self, region: RegionState, timeout_s: float = 10.0) -> None:
        for t in region.consumer_tasks:
            t.cancel()
        for c in region.consumers:
            try:
                await asyncio.wait_for(c.close(), timeout_s)
            except Exception:   # noqa: BLE001 - a consumer of a dead broker may not close cleanly
                pass
        region.consumers.clear()
        region.consumer_tasks.clear()
