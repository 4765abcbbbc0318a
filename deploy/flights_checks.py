"""The checks of ``minipulsar geo demo`` (:mod:`deploy.flights_replay`): what every
cluster holds, replication delay, subscription backlogs, and waiting for progress.

* Exactly once: every partition of the topic is read back from the start
  with Pulsar Readers in each cluster; every replayed flight must be stored
  exactly once (counted by :func:`deploy.flights_data.flight_identity`) and,
  per (origin, carrier), in replay order (property ``seq``).
* Replication delay: every second, the replicators' ``replicationDelayInSeconds``
  (Pulsar topic stats) per cluster pair, max over partitions.
* Replicated subscriptions (PIP-33): each board subscription's ``msgBacklog``
  in every cluster, summed over partitions, must reach 0 once its consumers
  acknowledged everything.
"""
from __future__ import annotations

import asyncio
import json
import time

from deploy.console import ProgressBars
from deploy.flights_data import flight_identity

__all__ = ["ClusterChecks"]


class ClusterChecks:
    """The checking half of :class:`deploy.flights_replay.Demo` (a mixin working on the
    demo's state: ``topo``, ``spec.topic``, ``partitions`` (count), ``clients`` /
    ``admins`` ({cluster: client}), ``flights``, ``regions``, ``repl_delay``, ``stop``,
    ``args.plain`` and its ``sub_name``, ``_stop_board``, ``_note``, ``_restarted_state``).
    Reads and stats raise the client's ``PulsarException`` unless a method says it
    retries."""

    async def _sample_replication(self) -> None:
        """Every second: the replicators' delay per pair (max over partitions)."""
        while not self.stop.is_set():
            for name in self.topo.names:
                try:
                    st = await asyncio.wait_for(self.admins[name].get_stats(self.spec.topic), 2)
                except Exception:   # noqa: BLE001 - a killed broker during --failover
                    continue
                delays: dict[str, float] = {}
                for part in st.get("partitions", {}).values():
                    for remote, r in part.get("replication", {}).items():
                        delays[remote] = max(delays.get(remote, 0.0), r.get("replicationDelayInSeconds", 0.0))
                for remote, d in delays.items():
                    self.repl_delay.setdefault((name, remote), []).append(d)
            try:
                await asyncio.wait_for(self.stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    async def _subscription_backlogs(self) -> dict[tuple[str, str], int | None]:
        """(subscription, cluster) -> msgBacklog summed over partitions (None: absent)."""
        out: dict[tuple[str, str], int | None] = {}
        for cluster in self.topo.names:
            st = await self.admins[cluster].get_stats(self.spec.topic)
            for region in self.topo.names:
                sub = self.sub_name(region)
                total, present = 0, False
                for part in st.get("partitions", {}).values():
                    s = part.get("subscriptions", {}).get(sub)
                    if s is not None:
                        present = True
                        total += s.get("msgBacklog", 0)
                out[(sub, cluster)] = total if present else None
        return out

    async def _read_cluster(self, cluster: str) -> dict:
        """Read every partition of the topic in ``cluster`` from the start:
        identity counts and per (origin, carrier) order."""
        from client.errors import Timeout
        from client.message_id import MessageId

        counts: dict[tuple, int] = {}
        order_violations = 0
        loads = json.loads

        async def read_partition(i: int) -> None:
            """Read partition ``i`` from the earliest message into ``counts``, counting order
            violations of the ``seq`` property per (origin, carrier); a 1.5 s read timeout ends it."""
            nonlocal order_violations
            reader = await self.clients[cluster].create_reader(f"{self.spec.topic}-partition-{i}",
                                                               MessageId.earliest, receiver_queue_size=5000)
            last: dict[tuple, int] = {}
            try:
                while await reader.has_message_available():
                    try:
                        msg = await reader.read_next(timeout_millis=1500)
                    except Timeout:
                        break           # the tail is a replication marker, never delivered
                    f = loads(msg.data())
                    ident = flight_identity(f)
                    counts[ident] = counts.get(ident, 0) + 1
                    seq = int(msg.properties().get("seq", -1))
                    k = (f["origin"], f["carrier"])
                    if seq <= last.get(k, -1):
                        order_violations += 1
                    last[k] = seq
            finally:
                await reader.close()

        await asyncio.gather(*(read_partition(i) for i in range(self.partitions)))
        expected = {f.identity for f in self.flights}
        stored = sum(counts.values())
        missing = sum(1 for ident in expected if ident not in counts)
        dups = sum(n - 1 for n in counts.values() if n > 1)
        extra = sum(1 for ident in counts if ident not in expected)
        return {"stored": stored, "distinct": len(counts), "missing": missing, "duplicates": dups,
                "from_other_runs": extra, "order_violations": order_violations,
                "ok": missing == 0 and dups == 0 and order_violations == 0}

    async def _wait_progress(self, what: str, measure, done, timeout_s: float, interval: float = 0.5,
                             stall_s: float = 60.0, bars: bool = False) -> bool:
        """Poll ``measure()`` (sync or async) until ``done(value)``; give up after
        ``timeout_s``, or after ``stall_s`` without any change (nothing more is coming)."""
        deadline = time.monotonic() + timeout_s
        last, changed = object(), time.monotonic()
        progress = None
        if bars:
            progress = ProgressBars({f"board {r.name}": len(self.flights) for r in self.regions.values()},
                                    unit="flights", plain=True if self.args.plain else None)
        try:
            while True:
                try:
                    value = measure()
                    if asyncio.iscoroutine(value):
                        value = await value
                except Exception as exc:   # noqa: BLE001 - a broker restarting: retried
                    value = f"{type(exc).__name__}: {exc}"
                if progress is not None and isinstance(value, list):
                    for r, n in zip(self.regions.values(), value):
                        name = f"board {r.name}"
                        progress.totals[name] = max(progress.totals[name], n)   # flights of earlier runs too
                        progress.update(name, n, f"in {r.consuming_in}")
                    progress.render()
                if not isinstance(value, str) and done(value):
                    return True
                now = time.monotonic()
                if value != last:
                    last, changed = value, now
                if now > deadline or now - changed > stall_s:
                    why = "timed out" if now > deadline else f"no progress for {stall_s:g}s"
                    self._note(f"{why} waiting for {what} (last: {str(last)[:300]})")
                    return False
                await asyncio.sleep(interval)
        finally:
            if progress is not None:
                progress.close()

    async def _wait_positions_agree(self, timeout_s: float) -> tuple[bool, dict]:
        """Every copy of every board subscription must reach backlog 0. Standby
        copies move only by the active cluster's snapshot UPDATEs, which need the
        boards connected (their dispatchers pass the snapshot markers); so wait
        for the standby copies first, then close the boards (flushing their acks)
        and read every copy once more. Returns (ok, {(sub, cluster): backlog})."""
        deadline = time.monotonic() + timeout_s
        standby = {(self.sub_name(r.name), c) for r in self.regions.values() for c in self.topo.names
                   if c != r.consuming_in}
        last: dict = {}
        while time.monotonic() < deadline:
            try:
                last = await self._subscription_backlogs()
            except Exception as exc:   # noqa: BLE001 - retried until the deadline
                self._note(f"subscription stats: {type(exc).__name__}: {exc}")
            if last and all(last.get(k) == 0 for k in standby):
                break
            await asyncio.sleep(1.0)
        for region in self.regions.values():
            await self._stop_board(region)
        await asyncio.sleep(0.5)
        try:
            result = await self._subscription_backlogs()
        except Exception:   # noqa: BLE001
            result = last
        ok = bool(result) and all(v == 0 for v in result.values())
        if not ok:
            behind = ", ".join(f"{s}@{c}: {v}" for (s, c), v in sorted(result.items()) if v != 0)
            self._note(f"subscription copies not caught up ({behind}); a standby copy only moves when its "
                       f"active cluster completes a snapshot after the last data reached the standby (PIP-33; "
                       f"here also a follow-up snapshot, once that data is there)")
        return ok, result

    async def _check_cluster(self, cluster: str, timeout_s: float = 120.0) -> dict:
        """``_read_cluster``, repeated while flights are missing (replication in flight)."""
        from client.errors import PulsarException

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result = await self._read_cluster(cluster)
            except PulsarException as exc:
                self._note(f"reading {cluster} failed: {type(exc).__name__}: {exc}{self._restarted_state()}")
                if time.monotonic() > deadline:
                    return {"stored": 0, "distinct": 0, "missing": len(self.flights), "duplicates": 0,
                            "from_other_runs": 0, "order_violations": 0, "ok": False, "error": str(exc)}
                await asyncio.sleep(3)
                continue
            if result["missing"] == 0 or time.monotonic() > deadline:
                return result
            self._note(f"{cluster} misses {result['missing']:,} flights; replication in flight? reading again")
            await asyncio.sleep(3)
