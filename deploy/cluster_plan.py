"""The pure side of ``minipulsar cluster``: which processes a local broker
cluster has, on which ports, the state file that remembers them, the URLs a
user connects to and the command lines; no I/O (``deploy.cluster`` starts,
watches and stops the processes).

A broker cluster, in Pulsar's model, is N stateless brokers that share one
metadata store (here one etcd) and a set of bookies: each broker can answer
a topic lookup, bundles of topics are owned by one broker at a time, and a
client connects with a multi-host service URL naming every broker
(``minipulsar://127.0.0.1:p1,127.0.0.1:p2``).

Port plan with ``--base-port P`` (P > 0), for M bookies and N brokers::

    P            etcd client port  (etcd://127.0.0.1:P, the brokers' metadata_store_url)
    P+1          etcd peer port
    P+2 ..       bookie-0 .. bookie-(M-1)
    P+2+M ..     broker-0 .. broker-(N-1) gRPC ports (the service URL)
    P+2+M+N ..   broker-0 .. broker-(N-1) HTTP ports (/metrics)

With ``--base-port 0`` etcd gets two free ports chosen up front (it must
advertise its real address) and bookies and brokers bind port 0 and report
the port they got in their ready lines. The state file then records the
real ports, so a later ``up`` on the same data dir reuses them: ledger
metadata names bookies by address (as BookKeeper does), and clients keep
their service URL.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable, Iterable

__all__ = ["ClusterError", "ClusterProcess", "ClusterState", "STATE_FILE", "HOST", "plan_ports", "plan_cluster",
           "service_url", "etcd_url", "etcd_command", "bookie_command", "broker_command", "broker_config_toml",
           "parse_ready_line", "READY_PREFIX"]

STATE_FILE = "cluster.json"
STATE_FORMAT = 1
HOST = "127.0.0.1"
KINDS = ("etcd", "bookie", "broker")
# the line a bookie / broker prints on stdout once it serves
READY_PREFIX = {"bookie": "BOOKIE_READY", "broker": "BROKER_READY"}
MAX_PROCESSES_PER_KIND = 64


class ClusterError(Exception):
    """A cluster command cannot go on; the message says what to do."""


@dataclasses.dataclass
class ClusterProcess:
    """One process of a local cluster, as recorded in the state file.

    ``name``: ``etcd``, ``bookie-<i>`` or ``broker-<i>`` (also the name of its
    data dir ``<data-dir>/<name>/`` and log ``<data-dir>/<name>.log``);
    ``kind``: ``etcd`` | ``bookie`` | ``broker``; ``port``: the client-facing
    TCP port (etcd client port, bookie port, broker gRPC port), 0 = not known
    yet (the process binds any free port and reports it); ``peer_port``: etcd
    only; ``http_port``: brokers only (0 = any free port, as for ``port``);
    ``pid``: the process id while it runs (None after ``down``)."""

    name: str
    kind: str
    port: int = 0
    peer_port: int = 0
    http_port: int = 0
    pid: int | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, or ``-`` while the port is not known."""
        return f"{HOST}:{self.port}" if self.port else "-"

    def to_dict(self) -> dict:
        """The JSON object of this process in the state file (only the fields its kind uses)."""
        d = {"name": self.name, "kind": self.kind, "port": self.port}
        if self.kind == "etcd":
            d["peer_port"] = self.peer_port
        if self.kind == "broker":
            d["http_port"] = self.http_port
        d["pid"] = self.pid
        return d


@dataclasses.dataclass
class ClusterState:
    """Everything a cluster command needs to know about a local cluster: its
    name (Pulsar's ``clusterName``, the brokers' ``--cluster-name``) and its
    processes, etcd first, then bookies, then brokers. Stored as JSON in
    ``<data-dir>/cluster.json`` (:meth:`to_json` / :meth:`from_json`)."""

    cluster_name: str
    processes: list[ClusterProcess]

    @property
    def etcd(self) -> ClusterProcess:
        """The etcd process (there is exactly one)."""
        return next(p for p in self.processes if p.kind == "etcd")

    @property
    def bookies(self) -> list[ClusterProcess]:
        """The bookie processes, in index order."""
        return [p for p in self.processes if p.kind == "bookie"]

    @property
    def brokers(self) -> list[ClusterProcess]:
        """The broker processes, in index order."""
        return [p for p in self.processes if p.kind == "broker"]

    def get(self, name: str) -> ClusterProcess:
        """The process called ``name``; KeyError if there is none."""
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def service_url(self) -> str:
        """The multi-host service URL of the brokers (see :func:`service_url`)."""
        return service_url(p.port for p in self.brokers)

    @property
    def etcd_url(self) -> str:
        """The metadata store URL of the brokers, ``etcd://127.0.0.1:<client port>``."""
        return etcd_url(self.etcd.port)

    def bookie_addresses(self) -> list[str]:
        """``host:port`` of every bookie (the brokers' ``--bookies``); ValueError while a port is unknown."""
        missing = [p.name for p in self.bookies if not p.port]
        if missing:
            raise ValueError(f"bookie port(s) not known yet: {', '.join(missing)}")
        return [p.address for p in self.bookies]

    def to_json(self) -> str:
        """The state file's text (JSON, one process per line for people reading it)."""
        procs = ",\n".join("    " + json.dumps(p.to_dict()) for p in self.processes)
        return (f'{{\n  "format": {STATE_FORMAT},\n  "cluster_name": {json.dumps(self.cluster_name)},\n'
                f'  "host": "{HOST}",\n  "processes": [\n{procs}\n  ]\n}}\n')

    @classmethod
    def from_json(cls, text: str, source: str = STATE_FILE) -> "ClusterState":
        """Parse a state file's text. Raises ClusterError naming ``source`` and
        what is wrong (not JSON, unknown format, a missing or bad field)."""
        def bad(why: str) -> ClusterError:
            return ClusterError(f"{source} is not a minipulsar cluster state file ({why}); "
                                f"fix or remove it, or use another --data-dir")
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise bad(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise bad("not a JSON object")
        if data.get("format") != STATE_FORMAT:
            raise bad(f"format {data.get('format')!r}, expected {STATE_FORMAT}")
        name = data.get("cluster_name")
        if not isinstance(name, str) or not name:
            raise bad("cluster_name missing")
        raw = data.get("processes")
        if not isinstance(raw, list):
            raise bad("processes missing")
        procs = []
        for i, d in enumerate(raw):
            if not isinstance(d, dict) or d.get("kind") not in KINDS or not isinstance(d.get("name"), str):
                raise bad(f"process #{i} needs a name and a kind in {KINDS}")
            ints = {k: d.get(k, 0) for k in ("port", "peer_port", "http_port")}
            pid = d.get("pid")
            if any(not _is_port(v, allow_zero=True) for v in ints.values()) or \
                    not (pid is None or (type(pid) is int and pid > 0)):
                raise bad(f"process {d['name']}: bad port or pid")
            procs.append(ClusterProcess(d["name"], d["kind"], pid=pid, **ints))
        kinds = [p.kind for p in procs]
        if kinds.count("etcd") != 1 or "bookie" not in kinds or "broker" not in kinds:
            raise bad("needs one etcd, bookies and brokers")
        return cls(name, procs)


def _is_port(v, allow_zero: bool = False) -> bool:
    return type(v) is int and (0 if allow_zero else 1) <= v <= 65535


def plan_ports(brokers: int, bookies: int, base_port: int) -> dict[str, dict[str, int]]:
    """The port plan of a new cluster (see the module docstring): process name
    -> ``{"port": p, "peer_port"/"http_port": q}``, all 0 when ``base_port`` is
    0 (etcd's two ports are then chosen by :func:`plan_cluster`). Raises
    ClusterError for counts outside 1..64 or a plan leaving 1..65535."""
    for what, n in (("--brokers", brokers), ("--bookies", bookies)):
        if not 1 <= n <= MAX_PROCESSES_PER_KIND:
            raise ClusterError(f"{what} must be between 1 and {MAX_PROCESSES_PER_KIND}, got {n}")
    last = base_port + 1 + bookies + 2 * brokers
    if base_port != 0 and not (1 <= base_port and last <= 65535):
        raise ClusterError(f"--base-port {base_port} does not fit: this cluster needs ports {base_port}..{last} "
                           f"(2 for etcd, {bookies} bookie(s), 2 per broker) within 1..65535; "
                           f"use a lower --base-port, or 0 for free ports")

    def at(offset: int) -> int:
        return base_port + offset if base_port else 0
    plan = {"etcd": {"port": at(0), "peer_port": at(1)}}
    for i in range(bookies):
        plan[f"bookie-{i}"] = {"port": at(2 + i)}
    for i in range(brokers):
        plan[f"broker-{i}"] = {"port": at(2 + bookies + i), "http_port": at(2 + bookies + brokers + i)}
    return plan


def plan_cluster(brokers: int | None, bookies: int | None, base_port: int | None, cluster_name: str | None,
                 previous: ClusterState | None, free_port: Callable[[], int]) -> ClusterState:
    """The cluster ``up`` should run. ``None`` arguments were not given on the command line.

    New data dir (``previous`` None): ``brokers`` (default 2) and ``bookies``
    (default 2) on the ports of :func:`plan_ports` (``base_port`` default 0);
    with base port 0, etcd's client and peer ports come from ``free_port()``.

    Existing data dir: the recorded processes and ports (the pids are kept:
    the caller decides which still run). Raises ClusterError when a given
    count, cluster name or base port differs from what the data dir holds
    (bookie addresses and the cluster name live in the stored metadata)."""
    if previous is None:
        nb, nk = 2 if brokers is None else brokers, 2 if bookies is None else bookies
        base = 0 if base_port is None else base_port
        name = cluster_name or "standalone"
        if not re.fullmatch(r"[-=:.\w]+", name) or set(name) == {"."}:
            raise ClusterError(f"--cluster-name {name!r}: use letters, digits, '-', '_', '=', ':' or '.'")
        plan = plan_ports(nb, nk, base)
        if base == 0:
            plan["etcd"]["port"] = free_port()
            peer = free_port()
            while peer == plan["etcd"]["port"]:
                peer = free_port()
            plan["etcd"]["peer_port"] = peer
        procs = [ClusterProcess(n, n.split("-")[0], **ports) for n, ports in plan.items()]
        return ClusterState(name, procs)
    state = ClusterState(previous.cluster_name, [dataclasses.replace(p) for p in previous.processes])
    differs = []
    if brokers is not None and brokers != len(state.brokers):
        differs.append(f"{len(state.brokers)} broker(s), not --brokers {brokers}")
    if bookies is not None and bookies != len(state.bookies):
        differs.append(f"{len(state.bookies)} bookie(s), not --bookies {bookies}")
    if cluster_name is not None and cluster_name != state.cluster_name:
        differs.append(f"cluster name {state.cluster_name!r}, not --cluster-name {cluster_name!r}")
    if base_port:
        try:
            expected = plan_ports(len(state.brokers), len(state.bookies), base_port)
        except ClusterError:
            expected = {}
        recorded = {p.name: {k: v for k, v in dataclasses.asdict(p).items() if k in expected.get(p.name, {})}
                    for p in state.processes}
        if recorded != expected:
            differs.append(f"other ports than --base-port {base_port} gives (etcd on {state.etcd.port})")
    if differs:
        raise ClusterError("this data dir holds a cluster with " + "; ".join(differs) + ". "
                           "Leave those flags out to restart it as it was, use another --data-dir, or delete it "
                           "first with `minipulsar cluster down --purge --data-dir ...`")
    return state


def service_url(ports: Iterable[int], host: str = HOST) -> str:
    """The multi-host service URL clients connect with, one ``host:port`` per
    broker gRPC port in order: ``minipulsar://127.0.0.1:6600,127.0.0.1:6601``
    (Pulsar's ``pulsar://h1:p1,h2:p2``: the client tries the hosts in turn for
    lookups). A port of 0 (not known yet) is left out."""
    return "minipulsar://" + ",".join(f"{host}:{p}" for p in ports if p)


def etcd_url(port: int, host: str = HOST) -> str:
    """The brokers' ``metadata_store_url`` for the etcd client port: ``etcd://127.0.0.1:<port>``
    (``etcdctl`` takes the same address as ``--endpoints http://127.0.0.1:<port>``)."""
    return f"etcd://{host}:{port}"


def etcd_command(binary: str, data_dir: str, client_port: int, peer_port: int, host: str = HOST) -> list[str]:
    """argv of a single-member etcd server (Debian's etcd-server) serving clients on
    ``client_port`` and peers on ``peer_port`` of ``host`` (127.0.0.1), data in ``data_dir``."""
    client = f"http://{host}:{client_port}"
    peer = f"http://{host}:{peer_port}"
    return [binary, "--name", "default", "--data-dir", data_dir,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--log-level", "warn"]


def bookie_command(python: str, data_dir: str, port: int, metadata_store_url: str | None) -> list[str]:
    """argv of one bookie on ``port`` (0 = any free port) with its ledgers in
    ``data_dir``; with ``metadata_store_url`` it registers itself there
    (BookKeeper's ``/ledgers/available``) so that brokers can find it."""
    cmd = [python, "-m", "bookie", "--port", str(port), "--data-dir", data_dir]
    if metadata_store_url:
        cmd += ["--metadata-store-url", metadata_store_url]
    return cmd


def broker_command(python: str, proc: ClusterProcess, data_dir: str, metadata_store_url: str,
                   bookies: list[str], cluster_name: str, config_file: str | None = None) -> list[str]:
    """argv of broker ``proc`` of cluster ``cluster_name``: it joins the cluster
    through ``metadata_store_url`` (every broker of one URL is one cluster),
    writes to ``bookies`` (``host:port`` list, the static list that keeps working
    next to bookie registration), binds ``proc.port`` / ``proc.http_port`` (0 = any
    free port; the Pulsar-protocol port is any free port, named on its ready line);
    ``config_file``: extra BrokerConfig keys (the quorums)."""
    cmd = [python, "-m", "broker", "--metadata-store-url", metadata_store_url, "--bookies", ",".join(bookies),
           "--data-dir", data_dir, "--port", str(proc.port), "--http-port", str(proc.http_port),
           "--pulsar-port", "0", "--pulsar-tls-port", "0", "--cluster-name", cluster_name]
    if config_file:
        cmd += ["--config", config_file]
    return cmd


def broker_config_toml(bookies: int) -> str:
    """The brokers' shared config file: ensemble = write quorum = ack quorum =
    min(2, ``bookies``), as ``minipulsar standalone`` chooses (with one bookie the
    broker's default of 2 could create no ledger)."""
    q = min(2, bookies)
    return ("# written by `minipulsar cluster up` on every start (quorums from --bookies)\n"
            f"managed_ledger_default_ensemble_size = {q}\n"
            f"managed_ledger_default_write_quorum = {q}\n"
            f"managed_ledger_default_ack_quorum = {q}\n")


def parse_ready_line(prefix: str, text: str) -> dict[str, int] | None:
    """The numbers of the last ``<prefix> key=value ...`` line in ``text``
    (e.g. ``BROKER_READY port=6600 pid=12 http_port=8080`` -> ``{"port": 6600,
    "pid": 12, "http_port": 8080}``), or None when there is none yet."""
    found = None
    for m in re.finditer(rf"^{re.escape(prefix)}((?: \w+=-?\d+)+)\s*$", text, re.M):
        found = {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", m.group(1))}
    return found
