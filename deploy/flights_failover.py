"""The failovers of ``minipulsar geo demo --failover`` (:mod:`deploy.flights_replay`).

* ``--failover`` (``--failover=broker``): a failover *inside* a broker cluster,
  as Pulsar is meant to survive it. When the chosen cluster (``--failover-cluster``,
  default the first) has acknowledged ``--failover-at`` of its flights, the broker
  that owns the most partitions of the flights topic there (found with
  ``topics lookup``, any broker of the cluster answers) is killed with SIGKILL and
  never restarted. Its etcd lease expires (``metadata_store_session_timeout_millis``),
  the cluster's other broker takes its bundles (ledger recovery fences the dead
  owner's ledgers), and the producers and delay-board consumers of that cluster
  follow by lookup; the replicators of the moved partitions restart on the new
  owner. Measured: the takeover -- from the kill to the first send acknowledged
  through a new owner (a receipt naming a ledger the new owner opened), to the
  moment lookups name a live owner for every moved partition, and to every moved
  partition having taken a send again -- and the messages delivered twice to
  the boards (deliveries whose acknowledgment died with the broker).
* ``--failover=cluster``: the whole cluster goes: every broker of it is killed,
  its board's consumers move to the next cluster's copy of their replicated
  subscription, and the brokers are restarted after ``--restart-after`` seconds.

:class:`TakeoverClock` (pure, fed by the producers' receipts) decides when a
partition has published through its new owner.
"""
from __future__ import annotations

import asyncio
import datetime
import os
import signal
import time
from collections import Counter

__all__ = ["TakeoverClock", "Failovers", "choose_victim_broker"]


class TakeoverClock:
    """Receipts of one cluster's sends, in receipt order, before and after a kill.

    ``record(msg_id)`` for every acknowledged send (``ledger_id``, ``partition``; a
    deduplicated send's id has a negative ledger and is ignored). Before
    :meth:`killed`, the last ledger of each partition is remembered; after it, the
    first receipt of a moved partition naming *another* ledger came from the new
    owner (the new owner recovers the topic and opens a new ledger; the dead owner
    can send nothing more). ``now`` is the clock (``time.monotonic``)."""

    def __init__(self, now=time.monotonic):
        self.now = now
        self.last_ledger: dict[int, int] = {}
        self.t_kill: float | None = None
        self.moved: frozenset[int] = frozenset()
        self.first_publish: dict[int, float] = {}

    def record(self, msg_id) -> None:
        """One acknowledged send (a ``client.MessageId``, or None)."""
        if msg_id is None or msg_id.ledger_id < 0:
            return
        part = msg_id.partition
        if self.t_kill is None:
            self.last_ledger[part] = msg_id.ledger_id
        elif part in self.moved and part not in self.first_publish and msg_id.ledger_id != self.last_ledger.get(part):
            self.first_publish[part] = self.now()

    def killed(self, partitions, at: float | None = None) -> None:
        """The owner of ``partitions`` (indexes) was killed at ``at`` (default now)."""
        self.moved = frozenset(partitions)
        self.t_kill = self.now() if at is None else at

    def first_publish_s(self) -> float | None:
        """Seconds from the kill to the first send through a new owner (None: none yet)."""
        return None if not self.first_publish else round(min(self.first_publish.values()) - self.t_kill, 3)

    def all_published_s(self) -> float | None:
        """Seconds from the kill until every moved partition took a send again (None: not yet)."""
        if not self.moved or set(self.first_publish) != set(self.moved):
            return None
        return round(max(self.first_publish.values()) - self.t_kill, 3)


def choose_victim_broker(owners: dict[int, str]) -> tuple[str, list[int]]:
    """The broker owning the most partitions (``owners``: partition -> broker URL; ties go
    to the smallest URL) and its partitions, sorted. ValueError when ``owners`` is empty."""
    if not owners:
        raise ValueError("no partition owners")
    counts = Counter(owners.values())
    url = min(counts, key=lambda u: (-counts[u], u))
    return url, sorted(p for p, u in owners.items() if u == url)


class Failovers:
    """The failover half of :class:`deploy.flights_replay.Demo` (a mixin working on the
    demo's state: ``topo``, ``data_dir``, ``spec.topic``, ``partitions`` (count),
    ``admins`` ({cluster: AdminClient}), ``regions``, ``victim``, ``rescuer``,
    ``args.failover`` / ``failover_at`` / ``restart_after``, ``stop``, ``takeover``
    (a :class:`TakeoverClock` for broker failovers) and its ``_stop_board``,
    ``_start_board``, ``_note``). Raises ``DemoError`` (from ``deploy.flights_replay``)
    when there is no broker to kill."""

    async def _failover(self) -> None:
        from deploy.flights_replay import DemoError

        region = self.regions[self.victim]
        total = len(region.flights) or len(self.flights)
        at = int(total * min(1.0, max(0.0, self.args.failover_at)))
        owners = None
        if self.args.failover != "cluster":
            # looked up before the replay gets there, so that the kill comes at the chosen point
            try:
                owners = await self.partition_owners(self.victim, timeout_s=20)
            except Exception as exc:   # noqa: BLE001
                raise DemoError(f"--failover: cannot look up the owners of {self.spec.topic}'s partitions in "
                                f"{self.victim}: {type(exc).__name__}: {exc}") from None
        while (region.acked if region.flights else sum(r.acked for r in self.regions.values())) < at:
            if self.stop.is_set():
                return
            await asyncio.sleep(0.01)
        if self.args.failover == "cluster":
            await self._failover_cluster(region, total)
        else:
            await self._failover_broker(region, total, owners)

    def _brokers_of(self, cluster: str) -> list:
        from deploy.geo_processes import plan_processes

        return [p for p in plan_processes(self.topo, self.data_dir) if p.kind == "broker" and p.cluster == cluster]

    async def partition_owners(self, cluster: str, timeout_s: float = 5.0) -> dict[int, str]:
        """partition index -> service URL of the broker serving it in ``cluster`` (Pulsar's
        ``topics lookup``; an unowned bundle gets an owner)."""
        answers = await asyncio.gather(*(
            asyncio.wait_for(self.admins[cluster].lookup_topic(f"{self.spec.topic}-partition-{i}"), timeout_s)
            for i in range(self.partitions)))
        return {i: answer["broker_url"] for i, answer in enumerate(answers)}

    async def _failover_broker(self, region, total: int, owners: dict[int, str]) -> None:
        from deploy.flights_replay import DemoError

        url, moved = choose_victim_broker(owners)
        port = int(url.rsplit(":", 1)[1])
        brokers = self._brokers_of(self.victim)
        proc = next((p for p in brokers if p.port == port), None)
        pid = proc.running_pid() if proc is not None else None
        if pid is None:
            raise DemoError(f"--failover: the owner of partitions {moved} in {self.victim} is {url}, which is not a "
                            f"running broker started by `geo up` in {self.data_dir}")
        if len(brokers) < 2:
            raise DemoError(f"--failover: {self.victim} has one broker; killing it stops the cluster "
                            f"(use --failover=cluster, or a topology with brokers = 2)")
        dups_before = {r.name: r.board.duplicates for r in self.regions.values()}
        deliveries_before = {r.name: r.board.deliveries for r in self.regions.values()}
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        killed_at = datetime.datetime.now().isoformat(sep=" ", timespec="milliseconds")   # to match the logs
        at_flight = region.acked
        self.takeover.killed(moved, t_kill)
        self._note(f"failover: at {killed_at} killed -9 broker {url} of {self.victim} (pid {pid}, owner of partition(s) "
                   f"{', '.join(map(str, moved))} of {self.partitions}) at flight {at_flight:,}/{total:,}; "
                   f"no restart: its bundles move to the cluster's other broker(s)")
        # lookups name a live owner for every moved partition
        owners_s, new_owners = None, {}
        deadline = t_kill + 120
        while time.monotonic() < deadline and not self.stop.is_set():
            try:
                now_owners = await self.partition_owners(self.victim, timeout_s=5)
            except Exception:   # noqa: BLE001 - no leader yet, or the dead host first in the list
                now_owners = {}
            if now_owners and all(now_owners[p] != url for p in moved):
                owners_s = round(time.monotonic() - t_kill, 3)
                new_owners = {p: now_owners[p] for p in moved}
                break
            await asyncio.sleep(0.1)
        # every moved partition published again (while this cluster still produces)
        while time.monotonic() < deadline and self.takeover.all_published_s() is None:
            if region.finished or self.stop.is_set():
                break
            await asyncio.sleep(0.05)
        first, every = self.takeover.first_publish_s(), self.takeover.all_published_s()
        self._note(f"failover: takeover in {self.victim}: lookups name a live owner for every moved partition after "
                   f"{_secs(owners_s)}; first send through a new owner after {_secs(first)}; every moved partition "
                   f"published again after {_secs(every)}")
        self.failover_report = {
            "mode": "broker", "killed": self.victim, "cluster": self.victim, "broker": url, "pid": pid,
            "killed_at": killed_at,
            "partitions_moved": moved, "partitions": self.partitions, "owners_before": owners,
            "new_owners": new_owners, "at_flight": at_flight,
            "owners_live_s": owners_s, "first_publish_s": first, "all_partitions_published_s": every,
            "duplicates_before_kill": dups_before, "deliveries_before_kill": deliveries_before}

    async def _failover_cluster(self, region, total: int) -> None:
        from deploy.flights_replay import DemoError
        from deploy.geo_processes import start_processes

        brokers = self._brokers_of(self.victim)
        pids = [(b, b.running_pid()) for b in brokers]
        if not any(pid for _, pid in pids):
            raise DemoError(f"--failover=cluster: no running broker of {self.victim} in {self.data_dir} (pid files "
                            f"{', '.join(str(b.pid_file) for b in brokers)}); the demo can only kill brokers started "
                            f"by `geo up` there")
        before = len(region.board.seen)
        for _, pid in pids:
            if pid:
                os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        at_flight = region.acked
        killed = [b for b, pid in pids if pid]
        self._note(f"failover: killed every broker of {self.victim} ({', '.join(str(pid) for _, pid in pids if pid)}) "
                   f"at flight {at_flight:,}/{total:,}; moving its board to {self.rescuer}")
        await self._stop_board(region, timeout_s=3)
        await self._start_board(region, self.rescuer)
        moved_s = time.monotonic() - t_kill
        await asyncio.sleep(self.args.restart_after)
        await asyncio.to_thread(start_processes, killed)
        self.restarted = killed
        self._note(f"failover: the brokers of {self.victim} restarted after {time.monotonic() - t_kill:.1f}s")
        self.failover_report = {"mode": "cluster", "killed": self.victim, "moved_to": self.rescuer,
                                "pid": [pid for _, pid in pids if pid], "at_flight": at_flight,
                                "board_before_kill": before, "consumers_moved_in_s": round(moved_s, 2),
                                "down_s": round(time.monotonic() - t_kill, 2)}

    def _restarted_state(self) -> str:
        """If a broker restarted by --failover=cluster has exited since: its status and log tail."""
        out = ""
        for b in self.restarted or []:
            if getattr(b, "popen", None) is None or b.popen.poll() is None:
                continue
            out += (f"\n  {b.label}, restarted by --failover, exited with status {b.popen.returncode}; "
                    f"log {b.log_file}:\n{b.log_tail(800)}")
        return out


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"
