"""Generate ``docker-compose.yml`` from a geo topology (``minipulsar geo compose``).

One service per process, as ``minipulsar geo up`` runs them:

* ``etcd-configuration``: the configuration store shared by every cluster,
* per cluster ``etcd-<cluster>`` (its metadata store), ``bookie-<cluster>-<i>``
  (``minipulsar bookie``, registered in the cluster's etcd) and
  ``broker-<cluster>-<i>`` (``minipulsar geo broker``: the topology's settings),
* ``geo-setup``: one shot, the registration ``geo up`` does (once, in the
  configuration store),
* ``geo-dashboard``: ``minipulsar geo dashboard``, the live page of every cluster
  (published on the host's 127.0.0.1:8070; each broker's web port, also published,
  has its own cluster's page at ``/dashboard``),
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

``--tls`` (``docker-compose.tls.yml``, project ``minipulsar-geo-tls``): the stack
of ``geo up --tls``. ``geo-certs`` (``minipulsar geo certs``, as
``ensure_tls_material`` does) writes the demo CA and the node certificate once
into the directory ``MINIPULSAR_COMPOSE_TLS_DIR`` (default ``./data/compose-tls``,
a bind mount so the host gets the CA its clients trust), mounted at ``/tls``;
the bookies, brokers and ``geo-setup`` mount it read-only and start once
``geo-certs`` is healthy (``geo certs --check``: the files are there and load).
``geo-certs`` then idles until stopped rather than exiting: podman-compose 1.6
on podman 4.3 waits forever for ``service_completed_successfully`` (``podman
wait --condition=stopped`` fails on an exited container), ``service_healthy``
works with both engines. Bookies serve TLS
only and require a client certificate of the CA, brokers serve TLS only (and use
TLS to each other, to remote clusters and, with the node certificate, to the
bookies), ``geo probe --tls-dir`` speaks TLS to both. The etcds stay plaintext
inside the shared namespace (nothing publishes their ports).

The TLS stack also authenticates and authorizes as ``geo up --tls --auth``
(``deploy/geo_auth.py``): ``geo-certs`` runs with ``--auth`` and writes the
token secret key, ``broker.token`` (role ``geo-broker``) and ``admin.token``
(role ``geo-admin``) once into ``/tls/auth`` (its health check waits for them
too). Brokers run with ``--auth-dir /tls/auth``: authentication and
authorization on, both roles superusers, ``geo-broker`` the brokers' own
credentials towards the bookies, the other brokers and the remote clusters
(the replicators). Bookies take ``--authentication-enabled --token-secret-key
file:///tls/auth/secret.key --authorized-roles geo-broker``: every other role
gets PERMISSION_DENIED there. ``geo-setup``, the broker health checks and the
dashboard use the administrator's token; the bookie health check also calls
``GetBookieInfo`` with the brokers' token.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from deploy.cluster_plan import etcd_command
from deploy.geo_auth import AUTH_DIR
from deploy.geo_dashboard import DEFAULT_PORT as DASHBOARD_PORT
from deploy.topology import Topology, port_variable

__all__ = ["compose_model", "render_compose", "port_variable", "IMAGE", "PROJECT_NAME", "NETWORK_SERVICE",
           "TLS_PROJECT_NAME", "CERTS_SERVICE", "TLS_MOUNT", "AUTH_MOUNT", "TLS_DIR_VARIABLE", "compose_file_name"]

REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGE = "minipulsar:latest"
PROJECT_NAME = "minipulsar-geo"
NETWORK_SERVICE = "geo-net"
CONFIGURATION_ETCD_SERVICE = "etcd-configuration"
APP_DIR = "/app"       # where the Dockerfile copies the project
HEALTHCHECK = {"interval": "5s", "timeout": "10s", "retries": 36, "start_period": "10s"}
LOCAL = "127.0.0.1"    # inside the shared network namespace
# --tls: the CA and node certificate, written once by geo-certs into a host directory
TLS_PROJECT_NAME = "minipulsar-geo-tls"
CERTS_SERVICE = "geo-certs"
DASHBOARD_SERVICE = "geo-dashboard"
TLS_MOUNT = "/tls"                                  # where every container sees the directory
AUTH_MOUNT = f"{TLS_MOUNT}/{AUTH_DIR}"              # the token key and tokens, beside the certificates
TLS_DIR_VARIABLE = "MINIPULSAR_COMPOSE_TLS_DIR"     # the host directory (bind mount)
TLS_HOST_DIR_DEFAULT = "./data/compose-tls"         # relative to the compose file's directory


def _container_topology_path(topology: Topology, project_root: Path) -> str:
    src = Path(topology.source).resolve()
    try:
        rel = src.relative_to(project_root.resolve())
    except ValueError:
        raise ValueError(f"the topology {src} must be inside the project ({project_root}) so that the image "
                         f"built from it contains the file; copy it under deploy/") from None
    return f"{APP_DIR}/{rel.as_posix()}"


def compose_file_name(tls: bool = False) -> str:
    """``docker-compose.yml``, or ``docker-compose.tls.yml`` for the TLS stack."""
    return "docker-compose.tls.yml" if tls else "docker-compose.yml"


def _tls_volume(read_only: bool = True) -> str:
    """The bind mount of the TLS directory: ``${MINIPULSAR_COMPOSE_TLS_DIR:-./data/compose-tls}:/tls[:ro]``."""
    return f"${{{TLS_DIR_VARIABLE}:-{TLS_HOST_DIR_DEFAULT}}}:{TLS_MOUNT}" + (":ro" if read_only else "")


def _healthcheck(kind: str, address: str, tls: bool = False) -> dict:
    test = ["CMD", "minipulsar", "geo", "probe", kind, address]
    if tls:
        test += ["--tls-dir", TLS_MOUNT, "--auth-dir", AUTH_MOUNT]
    return {"test": test, **HEALTHCHECK}


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


def compose_model(topology: Topology, project_root: Path = REPO_ROOT, tls: bool = False) -> dict:
    """The compose file as a dict (``name``, ``services``, ``volumes``; services in
    start order). ``tls``: the ``geo up --tls`` stack (see the module doc: ``geo-certs``,
    the ``/tls`` bind mount, TLS flags and probes). Raises ValueError when the topology
    file is outside ``project_root`` (the image would not contain it) or has no
    configuration store, or its host is not 127.0.0.1 (every process shares one
    network namespace)."""
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
    ports += [f"{LOCAL}:{b.pulsar_port}:{b.pulsar_port}"          # Pulsar binary protocol (official clients)
              for c in topology.clusters for b in c.brokers if b.pulsar_port > 0]
    # the brokers' web ports (REST admin, /metrics, each cluster's dashboard) and the geo dashboard's page
    ports += [f"{LOCAL}:{b.http_port}:{b.http_port}" for c in topology.clusters for b in c.brokers if b.http_port > 0]
    ports.append(f"{LOCAL}:{DASHBOARD_PORT}:{DASHBOARD_PORT}")
    services[NETWORK_SERVICE] = {"build": ".", "image": IMAGE, "command": ["sleep", "infinity"], "init": True,
                                 "ports": ports, "restart": "unless-stopped"}
    certs: dict = {}            # --tls: what every service using the certificates adds to depends_on
    tls_args: list[str] = []    # --tls: the flags of `geo broker` / `geo setup`
    dashboard_args: list[str] = []
    if tls:
        services[CERTS_SERVICE] = {
            "image": IMAGE, "command": ["minipulsar", "geo", "certs", "--tls-dir", TLS_MOUNT, "--auth", "--topology",
                                        topo_path, "--keep-running"],
            "volumes": [_tls_volume(read_only=False)], **_joined({}),
            "healthcheck": {"test": ["CMD", "minipulsar", "geo", "certs", "--tls-dir", TLS_MOUNT, "--auth", "--check"],
                            **HEALTHCHECK},
            "restart": "unless-stopped"}
        certs = {CERTS_SERVICE: {"condition": "service_healthy"}}
        tls_args = ["--tls-dir", TLS_MOUNT, "--auth-dir", AUTH_MOUNT]
        dashboard_args = ["--tls-dir", TLS_MOUNT, "--token-file", f"{AUTH_MOUNT}/admin.token"]
        topology = dataclasses.replace(topology, tls_dir=TLS_MOUNT, auth_dir=AUTH_MOUNT)
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
            cmd += topology.bookie_tls_args() + topology.bookie_auth_args()
            services[svc] = {"image": IMAGE, "command": cmd,
                             "volumes": [f"{svc}-data:/data"] + ([_tls_volume()] if tls else []),
                             **_joined({**certs, c.etcd_service: healthy}),
                             "healthcheck": _healthcheck("bookie", f"{LOCAL}:{port}", tls),
                             "restart": "unless-stopped"}
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
                            "--index", str(i), "--compose", "--data-dir", "/data", *tls_args],
                "environment": {var: _port(c.name, i, b.port)}, **_joined({**certs, **needs}),
                "healthcheck": _healthcheck("broker", f"{LOCAL}:{_port(c.name, i, b.port)}", tls),
                "restart": "unless-stopped"}
            if tls:
                services[svc]["volumes"] = [_tls_volume()]
            brokers.append(svc)
    services["geo-setup"] = {
        "image": IMAGE, "command": ["minipulsar", "geo", "setup", "--topology", topo_path, "--compose", *tls_args],
        "environment": env_all, **_joined({**certs, **{svc: {"condition": "service_healthy"} for svc in brokers}}),
        "restart": "no"}
    if tls:
        services["geo-setup"]["volumes"] = [_tls_volume()]
    services[DASHBOARD_SERVICE] = {
        "image": IMAGE, "command": ["minipulsar", "geo", "dashboard", "--topology", topo_path, "--host", "0.0.0.0",
                                    "--port", str(DASHBOARD_PORT), *dashboard_args],
        **_joined({**certs, **{svc: {"condition": "service_healthy"} for svc in brokers}}),
        "restart": "unless-stopped"}
    if tls:
        services[DASHBOARD_SERVICE]["volumes"] = [_tls_volume()]
    return {"name": TLS_PROJECT_NAME if tls else PROJECT_NAME, "services": services, "volumes": volumes}


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


def render_compose(topology: Topology, project_root: Path = REPO_ROOT, tls: bool = False) -> str:
    """The docker-compose YAML text of ``compose_model(topology, tls=tls)`` with a header
    (``docker-compose.yml``; ``docker-compose.tls.yml`` with ``tls``)."""
    model = compose_model(topology, project_root, tls)
    if tls:
        topology = dataclasses.replace(topology, tls_dir=TLS_MOUNT)   # minipulsar+ssl:// in the header
    try:
        shown = Path(topology.source).resolve().relative_to(project_root.resolve()).as_posix()
    except ValueError:
        shown = topology.source
    n = {c.name: (len(c.brokers), len(c.bookie_ports)) for c in topology.clusters}
    out = [
        f"# GENERATED from {shown} by `minipulsar geo compose{' --tls' if tls else ''} > {compose_file_name(tls)}`; "
        f"do not edit:",
        "# a test fails when this file differs from the generated one.",
        "#",
        f"# The geo demo in containers: {', '.join(topology.names)}, each an etcd, "
        + ", ".join(sorted({f'{b} brokers and {k} bookies' for b, k in n.values()}))
        + ", plus the configuration-store etcd.",
        "# Every service joins geo-net's network namespace and listens on 127.0.0.1 there, as `geo up`",
        "# runs them (brokers advertise 127.0.0.1:<port>; see deploy/compose.py for why); geo-net",
        "# publishes each broker's port on the host's 127.0.0.1 under the same number.",
    ]
    if tls:
        out += [
            f"# Over TLS, as `geo up --tls`: {CERTS_SERVICE} writes a demo CA and the node certificate once",
            f"# into ${TLS_DIR_VARIABLE} (default {TLS_HOST_DIR_DEFAULT}, next to this file), which the bookies,",
            f"# brokers and geo-setup mount read-only at {TLS_MOUNT}; brokers and bookies serve TLS only, the bookies",
            "# require the node certificate (mutual TLS); clients on the host trust ca.cert.pem of that directory.",
            f"# Tokens, as `geo up --tls --auth`: {CERTS_SERVICE} also writes {AUTH_DIR}/secret.key, {AUTH_DIR}/broker.token",
            "# (role geo-broker: the brokers' own, the only one the bookies serve) and auth/admin.token (role geo-admin);",
            "# brokers authenticate and authorize, clients present a token (e.g. auth/admin.token).",
            f"#     docker compose -f {compose_file_name(tls)} up -d --build   # then the clusters answer on 127.0.0.1:",
        ]
    else:
        out.append("#     docker compose up -d --build        # then the clusters answer on 127.0.0.1:")
    for c in topology.clusters:
        out.append(f"#     {c.name}: {topology.service_url(c.name)}   (ports: "
                   + ", ".join(f"${port_variable(c.name, i)}" for i in range(len(c.brokers))) + ")"
                   + (f", official Pulsar clients: {topology.pulsar_url(c.name)}" if topology.pulsar_url(c.name) else ""))
    if tls:
        out += [f"#     (clients: --tls-trust-certs-file-path {TLS_HOST_DIR_DEFAULT}/ca.cert.pem "
                f"--auth-params file://$PWD/{TLS_HOST_DIR_DEFAULT[2:]}/{AUTH_DIR}/admin.token)",
                f"#     docker compose -f {compose_file_name(tls)} down -v   # -v deletes the volumes, "
                f"not the TLS directory"]
    else:
        out.append("#     docker compose down -v              # -v also deletes the volumes")
    out += [
            f"name: {model['name']}", "", "services:"]
    for name, svc in model["services"].items():
        _emit(name, svc, 2, out)
        out.append("")
    out.append("volumes:")
    out += [f"  {v}:" for v in model["volumes"]]
    return "\n".join(out) + "\n"
