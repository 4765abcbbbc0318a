"""Generate ``docker-compose.yml`` from a geo topology (``minipulsar geo compose``).

One service per process: ``bookie-<cluster>-<i>`` (``minipulsar bookie``),
``broker-<cluster>`` (``minipulsar geo broker``: the topology's settings,
advertised by its service name) and a one-shot ``geo-setup`` running the same
registration as ``minipulsar geo up``. Named volumes keep bookie ledgers and
broker metadata; health checks run ``minipulsar geo probe``; each broker waits
for its bookies to be healthy and ``geo-setup`` for every broker. Each broker's
gRPC port is published on 127.0.0.1 with the topology's number (movable with
``MINIPULSAR_PORT_<CLUSTER>``, e.g. ``MINIPULSAR_PORT_US_EAST=16600``). The
first service builds the image (``build: .``); the others reuse it.

``compose_model`` gives the file as data (tests inspect it), ``render_compose``
as deterministic YAML; a test fails when the committed file differs.
"""
from __future__ import annotations

import json
from pathlib import Path

from deploy.topology import Topology

__all__ = ["compose_model", "render_compose", "port_variable", "IMAGE", "PROJECT_NAME"]

REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGE = "minipulsar:latest"
PROJECT_NAME = "minipulsar-geo"
APP_DIR = "/app"       # where the Dockerfile copies the project
HEALTHCHECK = {"interval": "5s", "timeout": "10s", "retries": 24, "start_period": "10s"}


def port_variable(cluster: str) -> str:
    """Environment variable that moves a broker's published host port."""
    return "MINIPULSAR_PORT_" + cluster.upper().replace("-", "_")


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


def compose_model(topology: Topology, project_root: Path = REPO_ROOT) -> dict:
    """The compose file as a dict (``name``, ``services``, ``volumes``; services
    in start order). Raises ValueError when the topology file is outside
    ``project_root`` (the image would not contain it)."""
    topo_path = _container_topology_path(topology, project_root)
    services: dict[str, dict] = {}
    volumes: list[str] = []
    for c in topology.clusters:
        for i, port in enumerate(c.bookie_ports):
            svc = c.bookie_service(i)
            cmd = ["minipulsar", "bookie", "--host", "0.0.0.0", "--port", str(port), "--data-dir", "/data"]
            if not topology.journal_sync:
                cmd.append("--no-journal-sync")
            services[svc] = {"image": IMAGE, "command": cmd, "volumes": [f"{svc}-data:/data"],
                             "healthcheck": _healthcheck("bookie", f"127.0.0.1:{port}"),
                             "restart": "unless-stopped"}
            volumes.append(f"{svc}-data")
        svc = c.broker_service
        cmd = ["minipulsar", "geo", "broker", "--topology", topo_path, "--cluster", c.name, "--compose",
               "--data-dir", "/data"]
        services[svc] = {
            "image": IMAGE, "command": cmd, "volumes": [f"{svc}-metadata:/data"],
            "ports": [f"127.0.0.1:${{{port_variable(c.name)}:-{c.broker_port}}}:{c.broker_port}"],
            "depends_on": {c.bookie_service(i): {"condition": "service_healthy"} for i in range(len(c.bookie_ports))},
            "healthcheck": _healthcheck("broker", f"127.0.0.1:{c.broker_port}"),
            "restart": "unless-stopped"}
        volumes.append(f"{svc}-metadata")
    services["geo-setup"] = {
        "image": IMAGE, "command": ["minipulsar", "geo", "setup", "--topology", topo_path, "--compose"],
        "depends_on": {c.broker_service: {"condition": "service_healthy"} for c in topology.clusters},
        "restart": "no"}
    first = next(iter(services))
    services[first] = {"build": ".", **services[first]}
    return {"name": PROJECT_NAME, "services": services, "volumes": volumes}


def _scalar(value) -> str:
    """A YAML scalar, double-quoted when plain style could be misread."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str):
        return str(value)
    if (not value or value.lower() in ("no", "yes", "true", "false", "on", "off", "null", "~")
            or value[0] in "{}[]&*!|>'\"%@`#-?:," or ": " in value or " #" in value or value.endswith(":")
            or "${" in value):
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
    out = [
        f"# GENERATED from {shown} by `minipulsar geo compose > docker-compose.yml`; do not edit:",
        "# a test fails when this file differs from the generated one.",
        "#",
        f"# The geo demo in containers: {', '.join(topology.names)}, each a broker and its bookies.",
        "#     docker compose up -d --build        # then the brokers answer on 127.0.0.1:",
    ]
    for c in topology.clusters:
        out.append(f"#     {c.name}: minipulsar://127.0.0.1:{c.broker_port}   (host port: ${port_variable(c.name)})")
    out += ["#     docker compose down -v              # -v also deletes the volumes",
            f"name: {model['name']}", "", "services:"]
    for name, svc in model["services"].items():
        _emit(name, svc, 2, out)
        out.append("")
    out.append("volumes:")
    out += [f"  {v}:" for v in model["volumes"]]
    return "\n".join(out) + "\n"
