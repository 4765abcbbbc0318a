"""Geo topology files (``deploy/geo.toml``): clusters, their processes and
ports, and the tenants/namespaces/topics to create in every cluster.

A topology is loaded and checked as a whole before anything starts, so that a
typo gives one clear error instead of a half-started demo. The same
``Topology`` drives the three ways to run it:

* ``minipulsar geo up``: local processes listening on ``host`` (default 127.0.0.1),
* ``minipulsar geo compose``: a docker-compose file, one container per process
  (service names ``bookie-<cluster>-<i>`` and ``broker-<cluster>``),
* ``minipulsar geo setup``: the admin calls registering the clusters with each
  other and creating tenants, namespaces and topics (shared by both).

File format (every table and key is optional unless marked)::

    host = "127.0.0.1"              # where local processes listen and are advertised
    journal_sync = true             # bookies fsync before acknowledging
    write_quorum = 2                # Qw; the ensemble is every bookie of the cluster
    ack_quorum = 2                  # Qa

    [broker]                        # extra BrokerConfig keys for every broker
    replicated_subscriptions_snapshot_frequency_millis = 1000

    [[clusters]]                    # required, one table per cluster
    name = "us-east"                # required: lower-case letters, digits, '-'
    broker_port = 6600              # required: gRPC (service URL minipulsar://host:port)
    http_port = 8080                # /metrics; -1 = off
    bookie_ports = [3181, 3182]     # required: one bookie per port

    [[tenants]]
    name = "geo"
    allowed_clusters = ["us-east", "us-west"]

    [[namespaces]]
    name = "geo/flights"
    clusters = ["us-east", "us-west"]      # replication clusters
    deduplication = true
    retention_time_minutes = -1            # -1 = keep forever
    retention_size_mb = -1

    [[topics]]
    name = "persistent://geo/flights/departures"
    partitions = 4                         # 0 = not partitioned

    [demo]                                 # for `minipulsar geo demo`
    topic = "persistent://geo/flights/departures"
    subscription = "delay-board"
    origins = { "us-east" = "EWR", "us-west" = "JFK" }
"""
from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["TopologyError", "ClusterSpec", "TenantSpec", "NamespaceSpec", "TopicSpec", "DemoSpec", "Topology",
           "load_topology", "parse_topology", "DEFAULT_TOPOLOGY", "busy_ports"]

DEFAULT_TOPOLOGY = Path(__file__).resolve().parent / "geo.toml"

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")
_SEGMENT = re.compile(r"^[A-Za-z0-9_.=-]+$")
# BrokerConfig keys the topology itself decides; [broker] may not set them
_RESERVED_BROKER_KEYS = {"cluster_name", "bookies", "data_dir", "broker_service_port", "web_service_port",
                         "bind_address", "advertised_address", "managed_ledger_default_ensemble_size",
                         "managed_ledger_default_write_quorum", "managed_ledger_default_ack_quorum"}


class TopologyError(ValueError):
    """A topology file is unreadable or inconsistent; the message lists every problem."""


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """One cluster: a broker and its bookies."""

    name: str
    broker_port: int
    http_port: int
    bookie_ports: tuple[int, ...]
    write_quorum: int
    ack_quorum: int

    def ports(self) -> list[tuple[str, int]]:
        """Every TCP port this cluster listens on, as ``(what, port)``."""
        out = [(f"{self.name} broker_port", self.broker_port)]
        if self.http_port > 0:
            out.append((f"{self.name} http_port", self.http_port))
        out += [(f"{self.name} bookie_ports[{i}]", p) for i, p in enumerate(self.bookie_ports)]
        return out

    def bookie_service(self, index: int) -> str:
        """docker-compose service name of bookie ``index``."""
        return f"bookie-{self.name}-{index}"

    @property
    def broker_service(self) -> str:
        """docker-compose service name of the broker."""
        return f"broker-{self.name}"


@dataclasses.dataclass(frozen=True)
class TenantSpec:
    """A tenant and the clusters it may use."""

    name: str
    allowed_clusters: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class NamespaceSpec:
    """A namespace with its replication clusters and policies."""

    name: str
    clusters: tuple[str, ...]
    deduplication: bool = False
    retention_time_minutes: int | None = None
    retention_size_mb: int | None = None

    @property
    def tenant(self) -> str:
        """The tenant part of ``tenant/namespace``."""
        return self.name.split("/", 1)[0]


@dataclasses.dataclass(frozen=True)
class TopicSpec:
    """A topic created in every cluster of its namespace."""

    name: str
    partitions: int = 0

    @property
    def namespace(self) -> str:
        """``tenant/namespace`` of the topic."""
        return self.name.split("://", 1)[1].rsplit("/", 1)[0]


@dataclasses.dataclass(frozen=True)
class DemoSpec:
    """What ``minipulsar geo demo`` replays where."""

    topic: str
    subscription: str
    origins: tuple[tuple[str, str], ...]          # (cluster, origin airport), in cluster order

    def origin_of(self, cluster: str) -> str | None:
        """The airport whose flights are produced in ``cluster`` (None if none)."""
        return dict(self.origins).get(cluster)


@dataclasses.dataclass(frozen=True)
class Topology:
    """A checked topology (see the module doc for the file format)."""

    clusters: tuple[ClusterSpec, ...]
    tenants: tuple[TenantSpec, ...] = ()
    namespaces: tuple[NamespaceSpec, ...] = ()
    topics: tuple[TopicSpec, ...] = ()
    demo: DemoSpec | None = None
    host: str = "127.0.0.1"
    journal_sync: bool = True
    broker_settings: tuple[tuple[str, Any], ...] = ()
    source: str = "<string>"

    # ---- lookups -------------------------------------------------------------
    def cluster(self, name: str) -> ClusterSpec:
        """The cluster called ``name``; KeyError naming the known ones."""
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(f"no cluster {name!r} in {self.source}; clusters: {', '.join(self.names)}")

    @property
    def names(self) -> list[str]:
        """Cluster names in file order."""
        return [c.name for c in self.clusters]

    def layout_key(self) -> list[tuple]:
        """What must not change between two ``geo up`` on the same data dir:
        cluster names and ports (ledger metadata names bookies by address)."""
        return [(c.name, c.broker_port, c.http_port, c.bookie_ports) for c in self.clusters]

    # ---- addresses -----------------------------------------------------------------
    def service_url(self, cluster: str, compose: bool = False) -> str:
        """The broker's service URL: local (``minipulsar://host:port``) or, with
        ``compose``, as other containers reach it (``minipulsar://broker-<name>:port``)."""
        c = self.cluster(cluster)
        host = c.broker_service if compose else self.host
        return f"minipulsar://{host}:{c.broker_port}"

    def bookie_addresses(self, cluster: str, compose: bool = False) -> list[str]:
        """``host:port`` of the cluster's bookies (compose: service names)."""
        c = self.cluster(cluster)
        if compose:
            return [f"{c.bookie_service(i)}:{p}" for i, p in enumerate(c.bookie_ports)]
        return [f"{self.host}:{p}" for p in c.bookie_ports]

    def broker_config(self, cluster: str, data_dir: str, compose: bool = False):
        """The ``broker.config.BrokerConfig`` of the cluster's broker: ensemble =
        all its bookies, the topology's Qw/Qa, ``[broker]`` settings on top."""
        from broker.config import BrokerConfig

        c = self.cluster(cluster)
        values = dict(self.broker_settings)
        values.update(
            cluster_name=c.name, bookies=self.bookie_addresses(cluster, compose), data_dir=str(data_dir),
            broker_service_port=c.broker_port, web_service_port=c.http_port,
            bind_address="0.0.0.0" if compose else self.host,
            advertised_address=c.broker_service if compose else self.host,
            managed_ledger_default_ensemble_size=len(c.bookie_ports),
            managed_ledger_default_write_quorum=c.write_quorum,
            managed_ledger_default_ack_quorum=c.ack_quorum)
        return BrokerConfig.from_dict(values)


def load_topology(path: str | Path | None = None) -> Topology:
    """Read and check a topology file (default ``deploy/geo.toml``); raises
    ``TopologyError`` listing every problem."""
    path = Path(path) if path is not None else DEFAULT_TOPOLOGY
    try:
        text = path.read_text()
    except OSError as exc:
        raise TopologyError(f"cannot read topology file {path}: {exc.strerror or exc}") from None
    return parse_topology(text, str(path))


def parse_topology(text: str, source: str = "<string>") -> Topology:
    """Parse and check topology TOML ``text``; ``source`` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"{source}: not valid TOML: {exc}") from None
    return _Checker(data, source).topology()


def busy_ports(ports: list[tuple[str, int]], host: str = "127.0.0.1") -> list[tuple[str, int]]:
    """The ``(what, port)`` pairs whose port cannot be bound on ``host`` right now."""
    from deploy.standalone import port_is_free

    return [(what, p) for what, p in ports if not port_is_free(p, host)]


class _Checker:
    """Builds a Topology from parsed TOML, collecting every problem."""

    TOP_KEYS = {"host", "journal_sync", "write_quorum", "ack_quorum", "broker", "clusters", "tenants",
                "namespaces", "topics", "demo"}

    def __init__(self, data: dict, source: str):
        self.data = data
        self.source = source
        self.errors: list[str] = []

    def err(self, msg: str) -> None:
        """Record one problem."""
        self.errors.append(msg)

    def _keys(self, table: Any, allowed: set[str], where: str) -> dict:
        if not isinstance(table, dict):
            self.err(f"{where} must be a table")
            return {}
        unknown = sorted(set(table) - allowed)
        if unknown:
            self.err(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")
        return table

    def _int(self, value: Any, where: str, lo: int | None = None, hi: int | None = None) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(f"{where} must be an integer, got {value!r}")
            return None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self.err(f"{where} = {value} is out of range [{lo}, {hi}]")
            return None
        return value

    def _port(self, value: Any, where: str) -> int | None:
        return self._int(value, where, 1, 65535)

    def _str_list(self, value: Any, where: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.err(f"{where} must be a list of strings, got {value!r}")
            return ()
        return tuple(value)

    def topology(self) -> Topology:
        """The checked Topology; TopologyError listing every problem."""
        d = self._keys(self.data, self.TOP_KEYS, "top level")
        host = d.get("host", "127.0.0.1")
        if not isinstance(host, str) or not host:
            self.err(f"host must be a non-empty string, got {host!r}")
            host = "127.0.0.1"
        journal_sync = d.get("journal_sync", True)
        if not isinstance(journal_sync, bool):
            self.err(f"journal_sync must be true or false, got {journal_sync!r}")
            journal_sync = True
        qw = self._int(d.get("write_quorum", 2), "write_quorum", 1) or 2
        qa = self._int(d.get("ack_quorum", 2), "ack_quorum", 1) or 2
        if qa > qw:
            self.err(f"ack_quorum ({qa}) must not exceed write_quorum ({qw})")
        clusters = self._clusters(d.get("clusters"), qw, qa)
        names = [c.name for c in clusters]
        self._port_clashes(clusters)
        tenants = self._tenants(d.get("tenants", []), names)
        namespaces = self._namespaces(d.get("namespaces", []), names, tenants)
        topics = self._topics(d.get("topics", []), namespaces)
        demo = self._demo(d.get("demo"), names, topics)
        broker = self._broker(d.get("broker", {}))
        if self.errors:
            raise TopologyError(f"{self.source}: {len(self.errors)} problem(s):\n  - " + "\n  - ".join(self.errors))
        return Topology(clusters=tuple(clusters), tenants=tuple(tenants), namespaces=tuple(namespaces),
                        topics=tuple(topics), demo=demo, host=host, journal_sync=journal_sync,
                        broker_settings=tuple(sorted(broker.items())), source=self.source)

    def _clusters(self, raw: Any, qw: int, qa: int) -> list[ClusterSpec]:
        if not raw:
            self.err("no [[clusters]]: define at least one cluster (name, broker_port, bookie_ports)")
            return []
        if not isinstance(raw, list):
            self.err("clusters must be an array of tables ([[clusters]])")
            return []
        out, seen = [], set()
        for i, c in enumerate(raw):
            where = f"clusters[{i}]"
            c = self._keys(c, {"name", "broker_port", "http_port", "bookie_ports", "write_quorum", "ack_quorum"},
                           where)
            name = c.get("name")
            if not isinstance(name, str) or not _NAME.match(name):
                self.err(f"{where}: name must be lower-case letters, digits and '-' (got {name!r})")
                continue
            where = f"cluster {name}"
            if name in seen:
                self.err(f"cluster name {name!r} is defined twice")
                continue
            seen.add(name)
            if "broker_port" not in c:
                self.err(f"{where}: broker_port is missing")
            broker_port = self._port(c.get("broker_port"), f"{where}: broker_port") if "broker_port" in c else None
            http_port = c.get("http_port", -1)
            http_port = -1 if http_port == -1 else self._port(http_port, f"{where}: http_port (or -1 = off)")
            ports = c.get("bookie_ports")
            if not isinstance(ports, list) or not ports:
                self.err(f"{where}: bookie_ports must be a non-empty list of ports")
                ports = []
            bookie_ports = [self._port(p, f"{where}: bookie_ports[{k}]") for k, p in enumerate(ports)]
            cqw = self._int(c.get("write_quorum", qw), f"{where}: write_quorum", 1) or qw
            cqa = self._int(c.get("ack_quorum", qa), f"{where}: ack_quorum", 1) or qa
            if ports and cqw > len(ports):
                self.err(f"{where}: write_quorum {cqw} needs at least {cqw} bookies, it has {len(ports)}")
            if cqa > cqw:
                self.err(f"{where}: ack_quorum ({cqa}) must not exceed write_quorum ({cqw})")
            if broker_port is None or http_port is None or None in bookie_ports:
                continue
            out.append(ClusterSpec(name, broker_port, http_port, tuple(bookie_ports), cqw, cqa))
        return out

    def _port_clashes(self, clusters: list[ClusterSpec]) -> None:
        owners: dict[int, list[str]] = {}
        for c in clusters:
            for what, port in c.ports():
                owners.setdefault(port, []).append(what)
        for port, whats in sorted(owners.items()):
            if len(whats) > 1:
                self.err(f"port {port} is used more than once: {' and '.join(whats)}; give each process its own port")

    def _tenants(self, raw: Any, names: list[str]) -> list[TenantSpec]:
        out = []
        for i, t in enumerate(raw if isinstance(raw, list) else []):
            t = self._keys(t, {"name", "allowed_clusters"}, f"tenants[{i}]")
            name = t.get("name")
            if not isinstance(name, str) or not _SEGMENT.match(name):
                self.err(f"tenants[{i}]: name must be a plain name, got {name!r}")
                continue
            allowed = self._str_list(t.get("allowed_clusters", names), f"tenant {name}: allowed_clusters")
            for c in allowed:
                if c not in names:
                    self.err(f"tenant {name}: unknown cluster {c!r} in allowed_clusters (clusters: {', '.join(names)})")
            if any(x.name == name for x in out):
                self.err(f"tenant {name!r} is defined twice")
            out.append(TenantSpec(name, allowed))
        if not isinstance(raw, list):
            self.err("tenants must be an array of tables ([[tenants]])")
        return out

    def _namespaces(self, raw: Any, names: list[str], tenants: list[TenantSpec]) -> list[NamespaceSpec]:
        out = []
        tmap = {t.name: t for t in tenants}
        for i, n in enumerate(raw if isinstance(raw, list) else []):
            n = self._keys(n, {"name", "clusters", "deduplication", "retention_time_minutes", "retention_size_mb"},
                           f"namespaces[{i}]")
            name = n.get("name")
            parts = name.split("/") if isinstance(name, str) else []
            if len(parts) != 2 or not all(_SEGMENT.match(p) for p in parts):
                self.err(f"namespaces[{i}]: name must be 'tenant/namespace', got {name!r}")
                continue
            where = f"namespace {name}"
            tenant = tmap.get(parts[0])
            if tenant is None:
                self.err(f"{where}: tenant {parts[0]!r} is not defined; add a [[tenants]] entry for it")
            clusters = self._str_list(n.get("clusters", names), f"{where}: clusters")
            for c in clusters:
                if c not in names:
                    self.err(f"{where}: unknown cluster {c!r} (clusters: {', '.join(names)})")
                elif tenant is not None and c not in tenant.allowed_clusters:
                    self.err(f"{where}: cluster {c!r} is not in tenant {tenant.name}'s allowed_clusters")
            dedup = n.get("deduplication", False)
            if not isinstance(dedup, bool):
                self.err(f"{where}: deduplication must be true or false")
                dedup = False
            rt = n.get("retention_time_minutes")
            rs = n.get("retention_size_mb")
            if rt is not None:
                rt = self._int(rt, f"{where}: retention_time_minutes", -1)
            if rs is not None:
                rs = self._int(rs, f"{where}: retention_size_mb", -1)
            if (rt is None) != (rs is None):
                self.err(f"{where}: set both retention_time_minutes and retention_size_mb (-1 = unlimited)")
            if any(x.name == name for x in out):
                self.err(f"namespace {name!r} is defined twice")
            out.append(NamespaceSpec(name, clusters, dedup, rt, rs))
        if not isinstance(raw, list):
            self.err("namespaces must be an array of tables ([[namespaces]])")
        return out

    def _topics(self, raw: Any, namespaces: list[NamespaceSpec]) -> list[TopicSpec]:
        out = []
        known = {n.name for n in namespaces}
        for i, t in enumerate(raw if isinstance(raw, list) else []):
            t = self._keys(t, {"name", "partitions"}, f"topics[{i}]")
            name = t.get("name")
            m = re.match(r"^persistent://([^/]+)/([^/]+)/([^/]+)$", name) if isinstance(name, str) else None
            if not m:
                self.err(f"topics[{i}]: name must be 'persistent://tenant/namespace/topic', got {name!r}")
                continue
            ns = f"{m.group(1)}/{m.group(2)}"
            if ns not in known:
                self.err(f"topic {name}: namespace {ns} is not defined; add a [[namespaces]] entry for it")
            partitions = self._int(t.get("partitions", 0), f"topic {name}: partitions", 0, 1000)
            if "-partition-" in m.group(3):
                self.err(f"topic {name}: give the partitioned topic's name, not a partition's")
            out.append(TopicSpec(name, partitions or 0))
        if not isinstance(raw, list):
            self.err("topics must be an array of tables ([[topics]])")
        return out

    def _demo(self, raw: Any, names: list[str], topics: list[TopicSpec]) -> DemoSpec | None:
        if raw is None:
            return None
        d = self._keys(raw, {"topic", "subscription", "origins"}, "[demo]")
        topic = d.get("topic")
        if not any(t.name == topic for t in topics):
            self.err(f"[demo] topic {topic!r} is not one of the [[topics]]")
        sub = d.get("subscription", "delay-board")
        if not isinstance(sub, str) or not _SEGMENT.match(sub):
            self.err(f"[demo] subscription must be a plain name, got {sub!r}")
        origins = d.get("origins", {})
        if not isinstance(origins, dict) or not all(isinstance(v, str) for v in origins.values()):
            self.err("[demo] origins must map cluster names to airport codes, e.g. { \"us-east\" = \"EWR\" }")
            origins = {}
        for c in origins:
            if c not in names:
                self.err(f"[demo] origins: unknown cluster {c!r} (clusters: {', '.join(names)})")
        if len(set(origins.values())) != len(origins):
            self.err("[demo] origins: each airport may be produced in one cluster only")
        ordered = tuple((c, origins[c]) for c in names if c in origins)
        return DemoSpec(str(topic), str(sub), ordered)

    def _broker(self, raw: Any) -> dict:
        if not isinstance(raw, dict):
            self.err("[broker] must be a table of BrokerConfig keys")
            return {}
        from broker.config import BrokerConfig

        known = {f.name for f in dataclasses.fields(BrokerConfig)}
        for k in sorted(raw):
            if k in _RESERVED_BROKER_KEYS:
                self.err(f"[broker] {k} is set by the topology itself (clusters/ports/quorums); remove it")
            elif k not in known:
                self.err(f"[broker] unknown broker setting {k!r} (see broker/config.py)")
        settings = {k: v for k, v in raw.items() if k in known and k not in _RESERVED_BROKER_KEYS}
        for problem in BrokerConfig.parse(settings)[1]:    # types and ranges, as the broker checks them
            self.err(f"[broker] {problem}")
        return settings
