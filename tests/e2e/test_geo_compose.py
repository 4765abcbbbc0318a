"""The committed docker-compose.yml, brought up for real: every container of the
three clusters, the one-shot geo-setup, then the README's SDK snippet through
the brokers' ports published on 127.0.0.1, and everything taken down.

These machines have no Docker engine: ``../shared/tools/compose-up.sh`` runs
the file with podman (see its README). Where that script is absent and a
Docker engine answers, ``docker compose`` is used instead. The stack runs
under its own project name and free host ports (``COMPOSE_PROJECT_NAME``,
``MINIPULSAR_PORT_<CLUSTER>``), so it does not collide with a user's stack.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time

import pytest

from deploy.compose import port_variable
from deploy.topology import load_topology
from tests.e2e.geo_helpers import REPO_ROOT, free_ports
from tests.e2e.quickstart import run_snippet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

TOOLS = REPO_ROOT.parent / "shared" / "tools"


def _engine() -> tuple[list[str], list[str]]:
    """(up command, down command) for the project dir."""
    up, down = TOOLS / "compose-up.sh", TOOLS / "compose-down.sh"
    if up.exists() and down.exists():
        return (["bash", str(up), str(REPO_ROOT), "-d", "--build"], ["bash", str(down), str(REPO_ROOT)])
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True).returncode == 0:
        base = [docker, "compose", "--project-directory", str(REPO_ROOT)]
        return ([*base, "up", "-d", "--build"], [*base, "down", "-v"])
    pytest.fail(f"no way to run docker-compose.yml: neither {up} (podman) nor a Docker engine is available")


async def _wait_configured(ports: dict[str, int], timeout_s: float) -> None:
    """Until geo-setup has registered every cluster and created the topic everywhere."""
    from client.admin import AdminClient

    topo = load_topology()
    deadline = time.monotonic() + timeout_s
    last = None
    for name, port in ports.items():
        admin = AdminClient(f"minipulsar://127.0.0.1:{port}", operation_timeout_seconds=5)
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


def test_compose_stack_replicates_between_published_ports():
    topo = load_topology()
    up_cmd, down_cmd = _engine()
    host_ports = dict(zip(topo.names, free_ports(len(topo.names))))
    env = dict(os.environ, COMPOSE_PROJECT_NAME=f"minipulsar-geo-test-{os.getpid()}")
    env.update({port_variable(name): str(port) for name, port in host_ports.items()})
    try:
        t0 = time.monotonic()
        up = subprocess.run(up_cmd, env=env, capture_output=True, text=True, timeout=1200)
        assert up.returncode == 0, f"compose up failed:\n{up.stdout[-5000:]}\n{up.stderr[-5000:]}"
        asyncio.run(_wait_configured(host_ports, 240))
        print(f"compose stack configured in {time.monotonic() - t0:.0f}s")
        run_snippet(host_ports["us-east"], host_ports["us-west"])
    finally:
        down = subprocess.run(down_cmd, env=env, capture_output=True, text=True, timeout=600)
        assert down.returncode == 0, f"compose down failed:\n{down.stdout[-3000:]}\n{down.stderr[-3000:]}"
