"""Generate ``docker-compose.yml`` from a geo topology (``minipulsar geo compose``).

One service per process, as ``minipulsar geo up`` runs them:

* ``etcd-configuration``: the configuration store shared by every cluster,
* per cluster ``etcd-<cluster>`` (its metadata store), ``bookie-<cluster>-<i>``
  (``minipulsar bookie``, registered in the cluster's etcd) and
  ``broker-<cluster>-<i>`` (``minipulsar geo broker``: the topology's settings),
* ``geo-setup``: one shot, the registration ``geo up`` does (once, in the
  configuration store),
* ``geo-net``: holds the network namespace every other service joins
  (``network_mode: service:geo-net``) and publishes the brokers' ports.

Why one network namespace: a client follows lookups to the broker that owns
its topic, at the address that broker advertises, and replicators reach the
other clusters' brokers the same way. minipulsar has one advertised address
per broker (no ``advertisedListeners`` with internal and external names, as
Pulsar has), so that address must work both inside the stack and from the
host: every process listens on 127.0.0.1 of the shared namespace exactly as
``geo up`` runs them, the brokers bind 0.0.0.0 and advertise 127.0.0.1:<port>,
and ``geo-net`` publishes each broker's port on the host's 127.0.0.1 under the
same number. ``MINIPULSAR_PORT_<CLUSTER>_<i>`` (e.g. ``MINIPULSAR_PORT_US_EAST_1``)
moves broker i of a cluster to another port, inside and outside alike.

Start order through health checks (``minipulsar geo probe``) and
``depends_on: condition: service_healthy``: the etcds, then each cluster's
bookies (they register in their etcd), then its brokers (they need both etcds
and the bookies), then ``geo-setup``. Named volumes keep etcd data and bookie
ledgers (brokers keep nothing of their own). ``geo-net`` builds the image
(``build: .``); the others reuse it.

``compose_model`` gives the file as data (tests inspect it), ``render_compose``
as deterministic YAML; a test fails when the committed file differs.
"""
from __future__ import annotations

import json
from pathlib import Path

from deploy.cluster_plan import etcd_command
from deploy.topology import Topology, port_variable

__all__ = ["compose_model", "render_compose", "port_variable", "IMAGE", "PROJECT_NAME", "NETWORK_SERVICE"]

REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGE = "minipulsar:latest"
PROJECT_NAME = "minipulsar-geo"
NETWORK_SERVICE = "geo-net"
CONFIGURATION_ETCD_SERVICE = "etcd-configuration"
APP_DIR = "/app"       # where the Dockerfile copies the project
HEALTHCHECK = {"interval": "5s", "timeout": "10s", "retries": 36, "start_period": "10s"}
LOCAL = "127.0.0.1"    # inside the shared network namespace


def _container_topology_path(topology: Topology, project_root: Path) -> str:
    src = Path(topology.source).resolve()
    try:
        rel = src.relative_to(project_root.resolve())
    except ValueError:
        raise ValueError(f"the topology {src} must be inside the project ({project_root}) so that the image "
                         f"built from it contains the file; copy it under deploy/") from None
    return f"{APP_DIR}/{rel.as_posix()}"


def _healthcheck(kind: str, address: str) -> dict:
    return {"test": ["CMD", "minipulsar", "geo", "probe", kind, address], **HEALTHCHECK}


def _port(cluster: str, index: int, default: int) -> str:
    """``${MINIPULSAR_PORT_<CLUSTER>_<i>:-<default>}``: the broker port, movable by the variable."""
    return f"${{{port_variable(cluster, index)}:-{default}}}"


def _joined(depends_on: dict) -> dict:
    """A service joining geo-net's network namespace, started after it and ``depends_on``."""
    return {"network_mode": f"service:{NETWORK_SERVICE}",
            "depends_on": {NETWORK_SERVICE: {"condition": "service_started"}, **depends_on}}


def _etcd_service(data_volume: str, port: int, peer_port: int) -> dict:
    return {"image": IMAGE, "command": etcd_command("etcd", "/data", port, peer_port, LOCAL),
            "volumes": [f"{data_volume}:/data"], **_joined({}),
            "healthcheck": _healthcheck("etcd", f"{LOCAL}:{port}"), "restart": "unless-stopped"}


def compose_model(topology: Topology, project_root: Path = REPO_ROOT) -> dict:
    """The compose file as a dict (``name``, ``services``, ``volumes``; services in
    start order). Raises ValueError when the topology file is outside
    ``project_root`` (the image would not contain it) or has no configuration store,
    or its host is not 127.0.0.1 (every process shares one network namespace)."""
    topo_path = _container_topology_path(topology, project_root)
    if topology.configuration_store is None:
        raise ValueError(f"{topology.source} has no [configuration_store]: the compose file runs the clusters "
                         f"with a shared configuration store (add one, e.g. etcd_port = 2390)")
    if topology.host != LOCAL:
        raise ValueError(f"{topology.source}: host = {topology.host!r}; the compose stack runs every process on "
                         f"{LOCAL} of one shared network namespace (set host = \"{LOCAL}\")")
    services: dict[str, dict] = {}
    volumes: list[str] = []
    ports = [f"{LOCAL}:{_port(c.name, i, b.port)}:{_port(c.name, i, b.port)}"
             for c in topology.clusters for i, b in enumerate(c.brokers)]
    services[NETWORK_SERVICE] = {"build": ".", "image": IMAGE, "command": ["sleep", "infinity"], "init": True,
                                 "ports": ports, "restart": "unless-stopped"}
    cs = topology.configuration_store
    services[CONFIGURATION_ETCD_SERVICE] = _etcd_service(f"{CONFIGURATION_ETCD_SERVICE}-data", cs.port, cs.peer_port)
    volumes.append(f"{CONFIGURATION_ETCD_SERVICE}-data")
    brokers: list[str] = []
    env_all: dict[str, str] = {}
    for c in topology.clusters:
        services[c.etcd_service] = _etcd_service(f"{c.etcd_service}-data", c.etcd.port, c.etcd.peer_port)
        volumes.append(f"{c.etcd_service}-data")
        healthy = {"condition": "service_healthy"}
        for i, port in enumerate(c.bookie_ports):
            svc = c.bookie_service(i)
            cmd = ["minipulsar", "bookie", "--host", LOCAL, "--port", str(port), "--data-dir", "/data",
                   "--metadata-store-url", topology.metadata_store_url(c.name)]
            if not topology.journal_sync:
                cmd.append("--no-journal-sync")
            services[svc] = {"image": IMAGE, "command": cmd, "volumes": [f"{svc}-data:/data"],
                             **_joined({c.etcd_service: healthy}),
                             "healthcheck": _healthcheck("bookie", f"{LOCAL}:{port}"), "restart": "unless-stopped"}
            volumes.append(f"{svc}-data")
        for i, b in enumerate(c.brokers):
            svc = c.broker_service(i)
            var = port_variable(c.name, i)
            env_all[var] = _port(c.name, i, b.port)
            needs = {CONFIGURATION_ETCD_SERVICE: healthy, c.etcd_service: healthy,
                     **{c.bookie_service(k): healthy for k in range(len(c.bookie_ports))}}
            services[svc] = {
                "image": IMAGE,
                "command": ["minipulsar", "geo", "broker", "--topology", topo_path, "--cluster", c.name,
                            "--index", str(i), "--compose", "--data-dir", "/data"],
                "environment": {var: _port(c.name, i, b.port)}, **_joined(needs),
                "healthcheck": _healthcheck("broker", f"{LOCAL}:{_port(c.name, i, b.port)}"),
                "restart": "unless-stopped"}
            brokers.append(svc)
    services["geo-setup"] = {
        "image": IMAGE, "command": ["minipulsar", "geo", "setup", "--topology", topo_path, "--compose"],
        "environment": env_all, **_joined({svc: {"condition": "service_healthy"} for svc in brokers}),
        "restart": "no"}
    return {"name": PROJECT_NAME, "services": services, "volumes": volumes}


def _scalar(value) -> str:
    """A YAML scalar, double-quoted when plain style could be misread."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str):
        return str(value)
    if (not value or value.lower() in ("no", "yes", "true", "false", "on", "off", "null", "~")
            or value[0] in "{}[]&*!|>'\"%@`#-?:," or ": " in value or " #" in value or value.endswith(":")
            or "${" in value or value.replace(".", "", 1).isdigit()):
        return json.dumps(value)
    return value


def _emit(key: str, value, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        out.append(f"{pad}{key}:")
        for k, v in value.items():
            _emit(k, v, indent + 2, out)
    elif isinstance(value, list) and key in ("command", "test"):
        out.append(f"{pad}{key}: [" + ", ".join(json.dumps(v) for v in value) + "]")
    elif isinstance(value, list):
        out.append(f"{pad}{key}:")
        out += [f"{pad}  - {_scalar(v)}" for v in value]
    else:
        out.append(f"{pad}{key}: {_scalar(value)}")


def render_compose(topology: Topology, project_root: Path = REPO_ROOT) -> str:
    """The docker-compose YAML text of ``compose_model(topology)`` with a header."""
    model = compose_model(topology, project_root)
    try:
        shown = Path(topology.source).resolve().relative_to(project_root.resolve()).as_posix()
    except ValueError:
        shown = topology.source
    n = {c.name: (len(c.brokers), len(c.bookie_ports)) for c in topology.clusters}
    out = [
        f"# GENERATED from {shown} by `minipulsar geo compose > docker-compose.yml`; do not edit:",
        "# a test fails when this file differs from the generated one.",
        "#",
        f"# The geo demo in containers: {', '.join(topology.names)}, each an etcd, "
        + ", ".join(sorted({f'{b} brokers and {k} bookies' for b, k in n.values()}))
        + ", plus the configuration-store etcd.",
        "# Every service joins geo-net's network namespace and listens on 127.0.0.1 there, as `geo up`",
        "# runs them (brokers advertise 127.0.0.1:<port>; see deploy/compose.py for why); geo-net",
        "# publishes each broker's port on the host's 127.0.0.1 under the same number.",
        "#     docker compose up -d --build        # then the clusters answer on 127.0.0.1:",
    ]
    for c in topology.clusters:
        out.append(f"#     {c.name}: {topology.service_url(c.name)}   (ports: "
                   + ", ".join(f"${port_variable(c.name, i)}" for i in range(len(c.brokers))) + ")")
    out += ["#     docker compose down -v              # -v also deletes the volumes",
            f"name: {model['name']}", "", "services:"]
    for name, svc in model["services"].items():
        _emit(name, svc, 2, out)
        out.append("")
    out.append("volumes:")
    out += [f"  {v}:" for v in model["volumes"]]
    return "\n".join(out) + "\n"
