"""The per-cluster producer loop of ``minipulsar geo demo`` (:mod:`deploy.flights_replay`).

Each airport's flights are produced in one cluster onto the partitioned topic
of the ``[demo]`` table, by one producer per (airport, carrier) named
``flights-<airport>-<carrier>``, with key-based batching (Pulsar's
``BatchingType.KeyBased``: a batch holds one key, as Key_Shared consumers
need) and the replay position as sequence id: the namespace deduplicates
(Pulsar's message deduplication), so a re-run or a producer resending after a
broker crash never stores a flight twice. At most ``--window`` sends per
cluster are unacknowledged; ``--rate`` paces the sends (flights per second).
"""
from __future__ import annotations

import asyncio
import time

from deploy.flights_board import RegionState

__all__ = ["ReplayProducers"]


class ReplayProducers:
    """The producer half of :class:`deploy.flights_replay.Demo` (a mixin working on the
    demo's state: ``clients`` ({cluster: AsyncClient}), ``spec.topic``, ``args.window``
    (count of unacknowledged sends), ``args.rate`` (flights/s, 0 = unpaced), ``victim`` and
    ``takeover`` (the receipts of the victim cluster go to its TakeoverClock, if any)).
    Send failures are recorded in ``region.errors`` and counted, never raised;
    creating a producer raises the client's ``PulsarException``."""

    async def _create_producers(self, region: RegionState) -> None:
        """One producer per carrier of the region's airport, all partitions
        connected before the first send (a lazily started partition producer
        lets later sends overtake the first ones, which deduplication then drops)."""
        from client import BatchingType

        for carrier in sorted({f.carrier for f in region.flights}):
            region.producers[carrier] = await self.clients[region.name].create_producer(
                self.spec.topic, producer_name=f"flights-{region.origin}-{carrier}",
                batching_type=BatchingType.KeyBased, send_timeout_millis=0, max_pending_messages=0,
                batching_max_publish_delay_ms=10, batching_max_messages=500)

    async def _replay(self, region: RegionState) -> None:
        if not region.flights:
            return
        producers = region.producers
        clock = self.takeover if self.victim == region.name else None     # --failover=broker: receipts timed
        window = asyncio.Semaphore(self.args.window)
        inflight = 0
        idle = asyncio.Event()
        idle.set()

        def done(exc, msg_id):
            """``send_async`` callback: free a window slot and count the send as failed or
            acknowledged; a receipt with a negative ledger id (-1:-1) was deduplicated."""
            nonlocal inflight
            inflight -= 1
            window.release()
            if exc is not None:
                region.errors.append(f"send: {exc}")
            else:
                region.acked += 1
                if msg_id is not None and getattr(msg_id, "ledger_id", 0) < 0:
                    region.deduplicated += 1
                if clock is not None:
                    clock.record(msg_id)
            if inflight == 0:
                idle.set()

        loop = asyncio.get_running_loop()
        region.started = time.monotonic()
        start = loop.time()
        rate = self.args.rate
        for i, f in enumerate(region.flights):
            if rate > 0:
                delay = start + i / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            await window.acquire()
            inflight += 1
            idle.clear()
            producers[f.carrier].send_async(f.payload, done, partition_key=f.carrier, event_timestamp=f.event_ms,
                                sequence_id=f.seq, properties={"seq": str(f.seq)})
        for p in producers.values():
            await p.flush()
        await idle.wait()
        region.finished = time.monotonic()
        await asyncio.gather(*(p.close() for p in producers.values()), return_exceptions=True)
