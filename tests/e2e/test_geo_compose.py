"""The committed docker-compose.yml, brought up for real: the configuration-store
etcd, per cluster an etcd, three bookies and two brokers, the one-shot
geo-setup; then the README's SDK snippet through the brokers' ports published
on 127.0.0.1 (multi-host service URLs, lookups followed to the owners); then
the broker of us-east that owns the snippet's topic is killed (SIGKILL) and the
snippet runs again: us-east keeps serving through its other broker.

These machines have no Docker engine: ``../shared/tools/compose-up.sh`` runs
the file with podman (see its README). Where that script is absent and a
Docker engine answers, ``docker compose`` is used instead. Where neither can
run a container (a first tiny stack fails to come up), the test is skipped
with the reason. The stack runs under its own project name and free host ports
(``COMPOSE_PROJECT_NAME``, ``MINIPULSAR_PORT_<CLUSTER>_<i>``), so it does not
collide with a user's stack.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from deploy.topology import load_topology, port_variable
from tests.e2e.geo_helpers import REPO_ROOT, free_ports
from tests.e2e.quickstart import run_snippet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TOOLS = REPO_ROOT.parent / "shared" / "tools"
PREFLIGHT = """name: minipulsar-preflight
services:
  hello:
    image: python:3.11-slim
    command: ["python3", "-c", "print('container ok')"]
"""


class Engine:
    """How to run a compose project here: podman through compose-up.sh, or Docker."""

    def __init__(self):
        up, down = TOOLS / "compose-up.sh", TOOLS / "compose-down.sh"
        if up.exists() and down.exists():
            self.kind = "podman"
            self.up = lambda d, *a: ["bash", str(up), str(d), *a]
            self.down = lambda d: ["bash", str(down), str(d)]
            work = os.environ.get("W") or os.path.join(os.environ.get("XDG_CACHE_HOME")
                                                      or os.path.expanduser("~/.cache"), "compose-up")
            self.env = {"CONTAINERS_CONF": os.path.join(work, "containers.conf")}
            return
        docker = shutil.which("docker")
        if docker and subprocess.run([docker, "info"], capture_output=True).returncode == 0:
            self.kind = "docker"
            self.up = lambda d, *a: [docker, "compose", "--project-directory", str(d), "up", *a]
            self.down = lambda d: [docker, "compose", "--project-directory", str(d), "down", "-v"]
            self.env = {}
            return
        pytest.skip(f"no way to run docker-compose.yml here: neither {up} (podman) nor a Docker engine")

    def _container(self, project: str, service: str) -> str:
        """The podman container name of ``service`` in ``project`` (exactly one)."""
        env = dict(os.environ, **self.env)
        names = subprocess.run(["podman", "ps", "--filter", f"label=com.docker.compose.project={project}",
                                "--filter", f"label=com.docker.compose.service={service}", "--format",
                                "{{.Names}}"], env=env, capture_output=True, text=True, check=True).stdout.split()
        assert len(names) == 1, (service, names)
        return names[0]

    def exec(self, project: str, service: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``argv`` in the running container of ``service`` (its network namespace and mounts)."""
        if self.kind == "docker":
            cmd = ["docker", "compose", "-p", project, "exec", "-T", service, *argv]
        else:
            cmd = ["podman", "exec", self._container(project, service), *argv]
        return subprocess.run(cmd, env=dict(os.environ, **self.env), cwd=str(REPO_ROOT), capture_output=True,
                              text=True, timeout=timeout)

    def logs(self, project: str, service: str) -> str:
        """What ``service``'s container wrote to stdout and stderr so far."""
        if self.kind == "docker":
            cmd = ["docker", "compose", "-p", project, "logs", "--no-color", service]
        else:
            cmd = ["podman", "logs", self._container(project, service)]
        done = subprocess.run(cmd, env=dict(os.environ, **self.env), cwd=str(REPO_ROOT), capture_output=True,
                              text=True, timeout=60)
        return done.stdout + done.stderr

    def kill(self, project: str, service: str) -> str:
        """SIGKILL the container of ``service``; returns its name."""
        if self.kind == "docker":
            subprocess.run(["docker", "compose", "-p", project, "kill", "-s", "KILL", service], check=True,
                           cwd=str(REPO_ROOT), capture_output=True)
            return service
        env = dict(os.environ, **self.env)
        names = subprocess.run(["podman", "ps", "--filter", f"label=com.docker.compose.project={project}",
                                "--filter", f"label=com.docker.compose.service={service}", "--format",
                                "{{.Names}}"], env=env, capture_output=True, text=True, check=True).stdout.split()
        assert len(names) == 1, (service, names)
        subprocess.run(["podman", "kill", "--signal", "KILL", names[0]], env=env, check=True, capture_output=True)
        return names[0]


def _preflight(engine: Engine) -> None:
    """Bring up a one-container project: skip the test (with the reason) when this machine
    cannot run containers at all."""
    d = Path(tempfile.mkdtemp(prefix="minipulsar-preflight-"))
    (d / "docker-compose.yml").write_text(PREFLIGHT)
    env = dict(os.environ, COMPOSE_PROJECT_NAME=f"minipulsar-preflight-{os.getpid()}")
    try:
        up = subprocess.run(engine.up(d), env=env, capture_output=True, text=True, timeout=900)
        if up.returncode != 0:
            pytest.skip(f"{engine.kind} cannot run a container on this machine (a one-container compose file "
                        f"failed to come up, exit {up.returncode}): {(up.stderr or up.stdout)[-1500:]}")
    finally:
        subprocess.run(engine.down(d), env=env, capture_output=True, text=True, timeout=300)
        shutil.rmtree(d, ignore_errors=True)


async def _wait_configured(urls: dict[str, str], timeout_s: float, **client_options) -> None:
    """Until geo-setup has registered every cluster and created the topic, seen through
    every cluster (one configuration store); ``client_options`` go to ``AdminClient``
    (e.g. ``tls_trust_certs_file_path``)."""
    from client.admin import AdminClient

    topo = load_topology()
    deadline = time.monotonic() + timeout_s
    last = None
    for name, url in urls.items():
        admin = AdminClient(url, operation_timeout_seconds=5, **client_options)
        try:
            while True:
                try:
                    clusters = set(await admin.list_clusters())
                    policies = await admin.get_policies("geo/flights")
                    partitions = await admin.get_partitioned_topic_metadata(topo.topics[0].name)
                    if clusters >= set(topo.names) and set(policies["replication_clusters"]) == set(topo.names) \
                            and policies["deduplication_enabled"] and partitions == 4:
                        break
                    last = (clusters, policies.get("replication_clusters"), partitions)
                except Exception as exc:   # noqa: BLE001 - not up yet
                    last = f"{type(exc).__name__}: {exc}"
                if time.monotonic() > deadline:
                    raise AssertionError(f"{name}: geo-setup did not configure the cluster in {timeout_s:g}s "
                                         f"(last: {last})")
                await asyncio.sleep(1)
        finally:
            await admin.close()


async def _owner(url: str, topic: str) -> str:
    from client.admin import AdminClient

    admin = AdminClient(url, operation_timeout_seconds=10)
    try:
        return (await admin.lookup_topic(topic))["broker_url"]
    finally:
        await admin.close()


def test_compose_stack_replicates_and_survives_a_broker_kill(compose_turn):
    engine = Engine()
    _preflight(engine)
    topo = load_topology()
    project = f"minipulsar-geo-test-{os.getpid()}"
    brokers = [(c.name, i, b.port) for c in topo.clusters for i, b in enumerate(c.brokers)]
    host_ports = dict(zip([(c, i) for c, i, _ in brokers], free_ports(len(brokers))))
    env = dict(os.environ, COMPOSE_PROJECT_NAME=project, **engine.env)
    env.update({port_variable(c, i): str(p) for (c, i), p in host_ports.items()})
    urls = {c.name: "minipulsar://" + ",".join(f"127.0.0.1:{host_ports[(c.name, i)]}" for i in range(len(c.brokers)))
            for c in topo.clusters}
    snippet_ports = {6600: host_ports[("us-east", 0)], 6610: host_ports[("us-east", 1)],
                     6601: host_ports[("us-west", 0)], 6611: host_ports[("us-west", 1)]}
    try:
        t0 = time.monotonic()
        up = subprocess.run(engine.up(REPO_ROOT, "-d", "--build"), env=env, capture_output=True, text=True,
                            timeout=1500)
        assert up.returncode == 0, f"compose up failed:\n{up.stdout[-5000:]}\n{up.stderr[-5000:]}"
        asyncio.run(_wait_configured(urls, 300))
        print(f"compose stack of {len(topo.clusters)} broker clusters configured in {time.monotonic() - t0:.0f}s")
        run_snippet(snippet_ports)

        # kill -9 the us-east broker that serves the snippet's topic: us-east keeps serving
        topic = "persistent://geo/flights/hello"
        owner = asyncio.run(_owner(urls["us-east"], topic))
        index = next(i for (c, i), p in host_ports.items() if c == "us-east" and owner.endswith(f":{p}"))
        name = engine.kill(project, topo.cluster("us-east").broker_service(index))
        t_kill = time.monotonic()
        run_snippet(snippet_ports, timeout=120)
        took = time.monotonic() - t_kill
        new_owner = asyncio.run(_owner(urls["us-east"], topic))
        print(f"killed {name} ({owner}); the snippet ran again through {new_owner} {took:.1f}s after the kill")
        assert new_owner != owner and new_owner.endswith(f":{host_ports[('us-east', 1 - index)]}")
    finally:
        down = subprocess.run(engine.down(REPO_ROOT), env=env, capture_output=True, text=True, timeout=600)
        assert down.returncode == 0, f"compose down failed:\n{down.stdout[-3000:]}\n{down.stderr[-3000:]}"
