"""Geo topology files (``deploy/geo.toml``): the broker clusters, their
processes and ports, the configuration store they share, and the
tenants/namespaces/topics to create.

A topology is loaded and checked as a whole before anything starts, so that a
typo gives one clear error instead of a half-started demo. The same
``Topology`` drives the three ways to run it:

* ``minipulsar geo up``: local processes listening on ``host`` (default 127.0.0.1),
* ``minipulsar geo compose``: a docker-compose file, one container per process
  (services ``etcd-<cluster>``, ``bookie-<cluster>-<i>``, ``broker-<cluster>-<i>``,
  ``etcd-configuration``),
* ``minipulsar geo setup``: the admin calls registering the clusters and
  creating tenants, namespaces and topics (shared by both).

Each cluster is a Pulsar broker cluster: its own etcd (the metadata store:
bundle ownership, managed ledgers, cursors, load reports), its bookies, and
several brokers sharing both. With a ``[configuration_store]`` (Pulsar's
``configurationMetadataStoreUrl``, its own etcd) the cluster list, tenants,
namespace policies and partitioned topics live once for all clusters: a
change made through any broker of any cluster is seen by all. Without it,
each cluster keeps its own and ``geo setup`` configures every cluster.

File format (every table and key is optional unless marked)::

    host = "127.0.0.1"              # where local processes listen and are advertised
    journal_sync = true             # bookies fsync before acknowledging
    ensemble_size = 2               # E: bookies per ledger (of the cluster's bookies)
    write_quorum = 2                # Qw
    ack_quorum = 2                  # Qa

    [broker]                        # extra BrokerConfig keys for every broker
    replicated_subscriptions_snapshot_frequency_millis = 1000

    [configuration_store]           # one etcd shared by every cluster
    etcd_port = 2390                # required in the table: client port
    etcd_peer_port = 2391           # default etcd_port + 1

    [[clusters]]                    # required, one table per cluster
    name = "us-east"                # required: lower-case letters, digits, '-'
    brokers = 2                     # default 2 (or the length of broker_ports)
    broker_ports = [6600, 6610]     # gRPC, one per broker; or broker_port = 6600: broker i on 6600 + 10*i
    http_ports = [8080, 8090]       # /metrics, one per broker; or http_port = 8080 (+ 10*i); -1 / absent = off
    pulsar_ports = [6650, 6660]     # Pulsar binary protocol for the official clients (pulsar://), one per
                                    # broker; or pulsar_port = 6650 (+ 10*i); -1 / absent = off
    bookies = 3                     # default 3 (or the length of bookie_ports)
    bookie_ports = [3181, 3182, 3183]   # or bookie_port = 3181: bookie i on 3181 + i
    etcd_port = 2392                # required: the cluster's metadata store (client port)
    etcd_peer_port = 2393           # default etcd_port + 1

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
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

__all__ = ["TopologyError", "EtcdSpec", "BrokerSpec", "ClusterSpec", "TenantSpec", "NamespaceSpec", "TopicSpec",
           "DemoSpec", "Topology", "load_topology", "parse_topology", "DEFAULT_TOPOLOGY", "busy_ports",
           "CONFIGURATION_STORE", "DEFAULT_BROKERS", "DEFAULT_BOOKIES", "BROKER_PORT_STRIDE", "port_variable"]

DEFAULT_TOPOLOGY = Path(__file__).resolve().parent / "geo.toml"
CONFIGURATION_STORE = "configuration-store"     # the pseudo-cluster name of the shared etcd (process labels)
DEFAULT_BROKERS = 2
DEFAULT_BOOKIES = 3
BROKER_PORT_STRIDE = 10                          # broker_port = P: broker i listens on P + 10*i

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")
_SEGMENT = re.compile(r"^[A-Za-z0-9_.=-]+$")
# BrokerConfig keys the topology itself decides; [broker] may not set them
_RESERVED_BROKER_KEYS = {"cluster_name", "bookies", "data_dir", "broker_service_port", "web_service_port",
                         "bind_address", "advertised_address", "managed_ledger_default_ensemble_size",
                         "managed_ledger_default_write_quorum", "managed_ledger_default_ack_quorum",
                         "metadata_store_url", "configuration_metadata_store_url"}


class TopologyError(ValueError):
    """A topology file is unreadable or inconsistent; the message lists every problem."""


def port_variable(cluster: str, index: int) -> str:
    """The environment variable that moves broker ``index`` of ``cluster`` to another port in
    docker-compose (``MINIPULSAR_PORT_US_EAST_0``): the broker listens on it inside the stack
    and it is published on the same 127.0.0.1 port, so the addresses lookups answer work
    from the host too."""
    return f"MINIPULSAR_PORT_{cluster.upper().replace('-', '_')}_{index}"


@dataclasses.dataclass(frozen=True)
class EtcdSpec:
    """One single-member etcd server: client ``port`` and ``peer_port``."""

    port: int
    peer_port: int


@dataclasses.dataclass(frozen=True)
class BrokerSpec:
    """One broker of a cluster: gRPC ``port`` (its service URL), ``http_port`` and
    ``pulsar_port`` (Pulsar's binary protocol for the official clients); -1 = off."""

    port: int
    http_port: int = -1
    pulsar_port: int = -1      # Pulsar binary protocol (broker_service_port_pulsar); -1 = off


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """One broker cluster: its brokers, bookies and etcd (metadata store), and the
    quorums of its ledgers (E bookies of the cluster's, Qw, Qa)."""

    name: str
    brokers: tuple[BrokerSpec, ...]
    bookie_ports: tuple[int, ...]
    etcd: EtcdSpec
    ensemble_size: int = 2
    write_quorum: int = 2
    ack_quorum: int = 2

    @property
    def broker_ports(self) -> list[int]:
        """The brokers' gRPC ports, in broker order."""
        return [b.port for b in self.brokers]

    def ports(self) -> list[tuple[str, int]]:
        """Every TCP port this cluster listens on, as ``(what, port)``."""
        out = [(f"{self.name} etcd_port", self.etcd.port), (f"{self.name} etcd_peer_port", self.etcd.peer_port)]
        out += [(f"{self.name} bookie_ports[{i}]", p) for i, p in enumerate(self.bookie_ports)]
        for i, b in enumerate(self.brokers):
            out.append((f"{self.name} broker_ports[{i}]", b.port))
            if b.http_port > 0:
                out.append((f"{self.name} http_ports[{i}]", b.http_port))
            if b.pulsar_port > 0:
                out.append((f"{self.name} pulsar_ports[{i}]", b.pulsar_port))
        return out

    # docker-compose service names
    @property
    def etcd_service(self) -> str:
        """docker-compose service name of the cluster's etcd."""
        return f"etcd-{self.name}"

    def bookie_service(self, index: int) -> str:
        """docker-compose service name of bookie ``index``."""
        return f"bookie-{self.name}-{index}"

    def broker_service(self, index: int) -> str:
        """docker-compose service name of broker ``index``."""
        return f"broker-{self.name}-{index}"


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
    configuration_store: EtcdSpec | None = None
    source: str = "<string>"
    # `geo up --tls`: the directory of the demo's CA and certificate (deploy.tls_certs), "" = plaintext.
    # Not a file key: set from the data dir (deploy.geo.resolve_topology).
    tls_dir: str = ""
    # `geo up --auth`: the directory of the demo's token secret key and tokens (deploy.geo_auth), "" = open.
    # Not a file key either: set from the data dir.
    auth_dir: str = ""

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
        """What must not change between two ``geo up`` on the same data dir: cluster
        names and every port (ledger metadata names bookies by address, etcd keeps its
        member's peer URL, clients keep their service URLs)."""
        cs = self.configuration_store
        return [("configuration-store", cs.port if cs else None, cs.peer_port if cs else None)] + \
            [(c.name, tuple(c.ports())) for c in self.clusters]

    def ports(self) -> list[tuple[str, int]]:
        """Every TCP port of every process, as ``(what, port)``."""
        out = []
        if self.configuration_store is not None:
            out += [("configuration_store etcd_port", self.configuration_store.port),
                    ("configuration_store etcd_peer_port", self.configuration_store.peer_port)]
        for c in self.clusters:
            out += c.ports()
        return out

    def with_broker_ports(self, env: Mapping[str, str] | None = None) -> "Topology":
        """This topology with each broker's gRPC port taken from the environment variable
        :func:`port_variable` when it is set (docker-compose moves the published ports with
        them); ``env`` defaults to ``os.environ``. Raises TopologyError for a bad value."""
        env = os.environ if env is None else env
        clusters = []
        for c in self.clusters:
            brokers = []
            for i, b in enumerate(c.brokers):
                raw = env.get(port_variable(c.name, i), "").strip()
                if raw:
                    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
                        raise TopologyError(f"{port_variable(c.name, i)}={raw!r} is not a TCP port")
                    b = dataclasses.replace(b, port=int(raw))
                brokers.append(b)
            clusters.append(dataclasses.replace(c, brokers=tuple(brokers)))
        return dataclasses.replace(self, clusters=tuple(clusters))

    # ---- addresses -----------------------------------------------------------------
    # ---- TLS (`geo up --tls`) --------------------------------------------------------
    @property
    def scheme(self) -> str:
        """``minipulsar+ssl`` when the demo runs over TLS (``tls_dir``), else ``minipulsar``."""
        return "minipulsar+ssl" if self.tls_dir else "minipulsar"

    @property
    def tls_ca_file(self) -> str:
        """The demo CA's certificate (PEM), "" without TLS."""
        return os.path.join(self.tls_dir, "ca.cert.pem") if self.tls_dir else ""

    def tls_node_files(self) -> tuple[str, str]:
        """``(cert, key)`` of the certificate every broker and bookie serves and the brokers
        present to the bookies (mutual TLS); ("", "") without TLS."""
        if not self.tls_dir:
            return "", ""
        return os.path.join(self.tls_dir, "node.cert.pem"), os.path.join(self.tls_dir, "node.key.pem")

    def client_tls_options(self) -> dict:
        """Keyword arguments of ``Client`` / ``AdminClient`` for this demo: the CA to trust ({} without
        TLS) and, with ``geo up --auth``, the demo administrator's token (a superuser role)."""
        options = {"tls_trust_certs_file_path": self.tls_ca_file} if self.tls_dir else {}
        if self.auth_dir:
            from deploy.geo_auth import admin_authentication
            options["authentication"] = admin_authentication(self.auth_dir)
        return options

    def broker_auth_settings(self) -> dict:
        """``geo up --auth``: the brokers' authentication and authorization keys (tokens signed
        with the demo's secret key; the brokers' own role and the administrator's are
        superusers; the brokers' token towards other brokers, remote clusters and the bookies)
        ({} without)."""
        if not self.auth_dir:
            return {}
        from deploy.geo_auth import broker_auth_settings
        return broker_auth_settings(self.auth_dir)

    def bookie_auth_args(self) -> list[str]:
        """``geo up --auth``: the bookies refuse calls without a token of the demo's key, and every
        role but the brokers' own (``geo-broker``: ``--authorized-roles``, BookKeeper's
        authorizedRoles) with PERMISSION_DENIED ([] without)."""
        if not self.auth_dir:
            return []
        from deploy.geo_auth import bookie_auth_args
        return bookie_auth_args(self.auth_dir)

    def broker_tls_settings(self) -> dict:
        """The brokers' TLS keys: TLS-only ports, TLS to other brokers and clusters, mutual TLS
        to the bookies with the node certificate ({} without TLS)."""
        if not self.tls_dir:
            return {}
        cert, key = self.tls_node_files()
        return dict(tls_enabled=True, tls_certificate_file_path=cert, tls_key_file_path=key,
                    tls_trust_certs_file_path=self.tls_ca_file,
                    broker_client_tls_enabled=True, broker_client_trust_certs_file_path=self.tls_ca_file,
                    bookkeeper_tls_enabled=True, bookkeeper_tls_trust_certs_file_path=self.tls_ca_file,
                    bookkeeper_tls_client_authentication=True, bookkeeper_tls_certificate_file_path=cert,
                    bookkeeper_tls_key_file_path=key)

    def bookie_tls_args(self) -> list[str]:
        """The bookies' TLS flags: TLS only, and only clients with a certificate of the demo CA
        (the brokers) connect ([] without TLS)."""
        if not self.tls_dir:
            return []
        cert, key = self.tls_node_files()
        return ["--tls-enabled", "--tls-certificate-file-path", cert, "--tls-key-file-path", key,
                "--tls-trust-certs-file-path", self.tls_ca_file, "--tls-require-trusted-client-cert-on-connect"]

    def broker_url(self, cluster: str, index: int) -> str:
        """The service URL of one broker: ``minipulsar://host:port`` (``minipulsar+ssl://`` over TLS)."""
        return f"{self.scheme}://{self.host}:{self.cluster(cluster).brokers[index].port}"

    def service_url(self, cluster: str) -> str:
        """The cluster's multi-host service URL naming every broker, as Pulsar's
        ``pulsar://h1:p1,h2:p2``: ``minipulsar://127.0.0.1:6600,127.0.0.1:6610``
        (``minipulsar+ssl://`` over TLS)."""
        c = self.cluster(cluster)
        return f"{self.scheme}://" + ",".join(f"{self.host}:{b.port}" for b in c.brokers)

    def pulsar_url(self, cluster: str) -> str:
        """The cluster's ``pulsar://h1:p1,h2:p2`` for the official Pulsar clients (its brokers'
        ``pulsar_ports``; ``pulsar+ssl://`` over TLS, where the same ports serve TLS only, as
        the gRPC ports do); "" when none has one."""
        c = self.cluster(cluster)
        ports = [b.pulsar_port for b in c.brokers if b.pulsar_port > 0]
        scheme = "pulsar+ssl" if self.tls_dir else "pulsar"
        return f"{scheme}://" + ",".join(f"{self.host}:{p}" for p in ports) if ports else ""

    def bookie_addresses(self, cluster: str) -> list[str]:
        """``host:port`` of the cluster's bookies."""
        return [f"{self.host}:{p}" for p in self.cluster(cluster).bookie_ports]

    def metadata_store_url(self, cluster: str) -> str:
        """The cluster's metadata store: ``etcd://host:<etcd client port>``."""
        return f"etcd://{self.host}:{self.cluster(cluster).etcd.port}"

    @property
    def configuration_store_url(self) -> str:
        """The shared configuration store ``etcd://host:port``, or "" when there is none."""
        cs = self.configuration_store
        return f"etcd://{self.host}:{cs.port}" if cs else ""

    def broker_config(self, cluster: str, index: int, data_dir: str, bind_address: str | None = None):
        """The ``broker.config.BrokerConfig`` of broker ``index`` of ``cluster``: its ports,
        the cluster's etcd as metadata store, the shared configuration store, every bookie
        of the cluster (ensembles of E of them), the topology's E/Qw/Qa and ``[broker]``
        settings on top. ``bind_address`` defaults to ``host`` (containers bind 0.0.0.0
        and advertise ``host``)."""
        from broker.config import BrokerConfig

        c = self.cluster(cluster)
        b = c.brokers[index]
        values = dict(self.broker_settings)
        values.update(
            cluster_name=c.name, bookies=self.bookie_addresses(cluster), data_dir=str(data_dir),
            broker_service_port=b.port, web_service_port=b.http_port, broker_service_port_pulsar=b.pulsar_port,
            broker_service_port_pulsar_tls=b.pulsar_port,     # used only over TLS (then the only Pulsar port)
            bind_address=bind_address or self.host, advertised_address=self.host,
            metadata_store_url=self.metadata_store_url(cluster),
            configuration_metadata_store_url=self.configuration_store_url,
            managed_ledger_default_ensemble_size=c.ensemble_size,
            managed_ledger_default_write_quorum=c.write_quorum,
            managed_ledger_default_ack_quorum=c.ack_quorum)
        values.update(self.broker_tls_settings())
        values.update(self.broker_auth_settings())
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

    TOP_KEYS = {"host", "journal_sync", "ensemble_size", "write_quorum", "ack_quorum", "broker",
                "configuration_store", "clusters", "tenants", "namespaces", "topics", "demo"}
    CLUSTER_KEYS = {"name", "brokers", "broker_ports", "broker_port", "http_ports", "http_port", "pulsar_ports",
                    "pulsar_port", "bookies",
                    "bookie_ports", "bookie_port", "etcd_port", "etcd_peer_port", "ensemble_size", "write_quorum",
                    "ack_quorum"}

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
        quorums = (self._int(d.get("ensemble_size", 2), "ensemble_size", 1) or 2,
                   self._int(d.get("write_quorum", 2), "write_quorum", 1) or 2,
                   self._int(d.get("ack_quorum", 2), "ack_quorum", 1) or 2)
        config_store = self._configuration_store(d.get("configuration_store"))
        clusters = self._clusters(d.get("clusters"), quorums)
        names = [c.name for c in clusters]
        self._port_clashes(clusters, config_store)
        tenants = self._tenants(d.get("tenants", []), names)
        namespaces = self._namespaces(d.get("namespaces", []), names, tenants)
        topics = self._topics(d.get("topics", []), namespaces)
        demo = self._demo(d.get("demo"), names, topics)
        broker = self._broker(d.get("broker", {}))
        if self.errors:
            raise TopologyError(f"{self.source}: {len(self.errors)} problem(s):\n  - " + "\n  - ".join(self.errors))
        return Topology(clusters=tuple(clusters), tenants=tuple(tenants), namespaces=tuple(namespaces),
                        topics=tuple(topics), demo=demo, host=host, journal_sync=journal_sync,
                        broker_settings=tuple(sorted(broker.items())), configuration_store=config_store,
                        source=self.source)

    def _etcd(self, table: dict, where: str, required: bool = True) -> EtcdSpec | None:
        if "etcd_port" not in table:
            if required:
                self.err(f"{where}: etcd_port is missing (the client port of its etcd; "
                         f"etcd_peer_port defaults to etcd_port + 1)")
            return None
        port = self._port(table["etcd_port"], f"{where}: etcd_port")
        if port is None:
            return None
        peer = self._port(table.get("etcd_peer_port", port + 1), f"{where}: etcd_peer_port")
        if peer is None:
            return None
        if peer == port:
            self.err(f"{where}: etcd_peer_port must differ from etcd_port ({port})")
            return None
        return EtcdSpec(port, peer)

    def _configuration_store(self, raw: Any) -> EtcdSpec | None:
        if raw is None:
            return None
        t = self._keys(raw, {"etcd_port", "etcd_peer_port"}, "[configuration_store]")
        return self._etcd(t, "[configuration_store]") if t else None

    def _port_list(self, c: dict, where: str, list_key: str, base_key: str, count: int | None, stride: int,
                   required: bool) -> list[int | None] | None:
        """Ports from ``list_key`` (explicit) or ``base_key`` + stride*i for ``count`` processes."""
        if list_key in c:
            ports = c[list_key]
            if not isinstance(ports, list) or not ports:
                self.err(f"{where}: {list_key} must be a non-empty list of ports")
                return None
            if base_key in c:
                self.err(f"{where}: give {list_key} or {base_key}, not both")
            return [self._port(p, f"{where}: {list_key}[{k}]") for k, p in enumerate(ports)]
        if base_key in c:
            base = self._port(c[base_key], f"{where}: {base_key}")
            if base is None:
                return None
            n = count or 1
            if base + stride * (n - 1) > 65535:
                self.err(f"{where}: {base_key} = {base} leaves no room for {n} process(es) ({stride} apart)")
                return None
            return [base + stride * i for i in range(n)]
        if required:
            self.err(f"{where}: {list_key} is missing (or {base_key} = first port)")
        return None

    def _count(self, c: dict, key: str, where: str, default: int, ports: list | None, list_key: str) -> int | None:
        if key not in c:
            return len(ports) if ports else default
        n = self._int(c[key], f"{where}: {key}", 1, 64)
        if n is not None and ports is not None and list_key in c and len(ports) != n:
            self.err(f"{where}: {key} = {n} but {list_key} lists {len(ports)} port(s)")
        return n

    def _clusters(self, raw: Any, quorums: tuple[int, int, int]) -> list[ClusterSpec]:
        if not raw:
            self.err("no [[clusters]]: define at least one cluster (name, broker_ports, bookie_ports, etcd_port)")
            return []
        if not isinstance(raw, list):
            self.err("clusters must be an array of tables ([[clusters]])")
            return []
        out, seen = [], set()
        for i, c in enumerate(raw):
            where = f"clusters[{i}]"
            c = self._keys(c, self.CLUSTER_KEYS, where)
            name = c.get("name")
            if not isinstance(name, str) or not _NAME.match(name):
                self.err(f"{where}: name must be lower-case letters, digits and '-' (got {name!r})")
                continue
            where = f"cluster {name}"
            if name in seen:
                self.err(f"cluster name {name!r} is defined twice")
                continue
            seen.add(name)
            n_brokers = c.get("brokers") if isinstance(c.get("brokers"), int) else DEFAULT_BROKERS
            broker_ports = self._port_list(c, where, "broker_ports", "broker_port", n_brokers, BROKER_PORT_STRIDE,
                                           True)
            n_brokers = self._count(c, "brokers", where, DEFAULT_BROKERS, broker_ports, "broker_ports")
            if n_brokers is not None and broker_ports is not None and "broker_ports" not in c:
                broker_ports = broker_ports[:n_brokers]
            n_http = len(broker_ports) if broker_ports else (n_brokers or 1)
            http_ports: list | None
            if c.get("http_port") == -1 and "http_ports" not in c:
                http_ports = [-1] * n_http
            else:
                http_ports = self._port_list(c, where, "http_ports", "http_port", n_http, BROKER_PORT_STRIDE,
                                             False)
                if http_ports is None and "http_ports" not in c and "http_port" not in c:
                    http_ports = [-1] * n_http
            if http_ports is not None and broker_ports is not None and len(http_ports) != len(broker_ports):
                self.err(f"{where}: http_ports lists {len(http_ports)} port(s) for {len(broker_ports)} broker(s)")
                http_ports = None
            pulsar_ports: list | None
            if c.get("pulsar_port", -1) == -1 and "pulsar_ports" not in c:
                pulsar_ports = [-1] * n_http
            else:
                pulsar_ports = self._port_list(c, where, "pulsar_ports", "pulsar_port", n_http, BROKER_PORT_STRIDE,
                                               False)
            if pulsar_ports is not None and broker_ports is not None and len(pulsar_ports) != len(broker_ports):
                self.err(f"{where}: pulsar_ports lists {len(pulsar_ports)} port(s) for {len(broker_ports)} "
                         f"broker(s)")
                pulsar_ports = None
            n_bookies = c.get("bookies") if isinstance(c.get("bookies"), int) else DEFAULT_BOOKIES
            bookie_ports = self._port_list(c, where, "bookie_ports", "bookie_port", n_bookies, 1, True)
            self._count(c, "bookies", where, DEFAULT_BOOKIES, bookie_ports, "bookie_ports")
            etcd = self._etcd(c, where)
            e = self._int(c.get("ensemble_size", quorums[0]), f"{where}: ensemble_size", 1) or quorums[0]
            qw = self._int(c.get("write_quorum", quorums[1]), f"{where}: write_quorum", 1) or quorums[1]
            qa = self._int(c.get("ack_quorum", quorums[2]), f"{where}: ack_quorum", 1) or quorums[2]
            if bookie_ports and e > len(bookie_ports):
                self.err(f"{where}: ensemble_size {e} needs at least {e} bookies, it has {len(bookie_ports)}")
            if qw > e:
                self.err(f"{where}: write_quorum ({qw}) must not exceed ensemble_size ({e})")
            if qa > qw:
                self.err(f"{where}: ack_quorum ({qa}) must not exceed write_quorum ({qw})")
            if (broker_ports is None or http_ports is None or bookie_ports is None or etcd is None
                    or pulsar_ports is None or None in broker_ports or None in http_ports or None in bookie_ports
                    or None in pulsar_ports):
                continue
            brokers = tuple(BrokerSpec(p, h, q) for p, h, q in zip(broker_ports, http_ports, pulsar_ports))
            out.append(ClusterSpec(name, brokers, tuple(bookie_ports), etcd, e, qw, qa))
        return out

    def _port_clashes(self, clusters: list[ClusterSpec], config_store: EtcdSpec | None) -> None:
        owners: dict[int, list[str]] = {}
        whats = []
        if config_store is not None:
            whats += [("configuration_store etcd_port", config_store.port),
                      ("configuration_store etcd_peer_port", config_store.peer_port)]
        for c in clusters:
            whats += c.ports()
        for what, port in whats:
            owners.setdefault(port, []).append(what)
        for port, names in sorted(owners.items()):
            if len(names) > 1:
                self.err(f"port {port} is used more than once: {' and '.join(names)}; give each process its own port")

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
