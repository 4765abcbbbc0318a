"""The README quickstart's SDK snippet, run by the e2e tests against local
(`geo up`) and containerized (docker-compose) clusters.

``README_SNIPPET`` is the canonical text; when README.md carries the
quickstart (a python block using the multi-host service URLs of us-east and
us-west, ``minipulsar://127.0.0.1:6600,127.0.0.1:6610`` and
``minipulsar://127.0.0.1:6601,127.0.0.1:6611``) the tests run README's own copy
instead, so the documentation cannot drift from what works.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EAST = "minipulsar://127.0.0.1:6600,127.0.0.1:6610"
WEST = "minipulsar://127.0.0.1:6601,127.0.0.1:6611"
SNIPPET_PORTS = (6600, 6610, 6601, 6611)        # us-east's two brokers, us-west's two brokers

README_SNIPPET = '''\
from client import Client, InitialPosition

east = Client("minipulsar://127.0.0.1:6600,127.0.0.1:6610")   # cluster us-east: any of its brokers
west = Client("minipulsar://127.0.0.1:6601,127.0.0.1:6611")   # cluster us-west
topic = "persistent://geo/flights/hello"
consumer = west.subscribe(topic, "hello", initial_position=InitialPosition.Earliest)
east.create_producer(topic).send(b"hello from us-east")
msg = consumer.receive(timeout_millis=30000)
print(msg.data(), "replicated from", msg.replicated_from())
consumer.acknowledge(msg)
east.close(); west.close()
'''


def snippet() -> str:
    """README.md's quickstart snippet if it has one, else ``README_SNIPPET``."""
    try:
        readme = (REPO_ROOT / "README.md").read_text()
    except OSError:
        return README_SNIPPET
    for block in re.findall(r"```python\n(.*?)```", readme, re.S):
        if EAST in block and WEST in block:
            return block
    return README_SNIPPET


def run_snippet(ports: dict[int, int], timeout: float = 90) -> str:
    """Run the snippet with the clusters' real ports (``ports``: the snippet's port ->
    the real one, for 6600, 6610, 6601 and 6611); returns its stdout (AssertionError
    with the output when it fails)."""
    code = snippet()
    pattern = re.compile(r"127\.0\.0\.1:(" + "|".join(str(p) for p in SNIPPET_PORTS) + r")\b")
    code = pattern.sub(lambda m: f"127.0.0.1:{ports[int(m.group(1))]}", code)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=str(REPO_ROOT), env=env)
    assert proc.returncode == 0, f"quickstart snippet failed:\n{proc.stdout}\n{proc.stderr}"
    assert "b'hello from us-east' replicated from us-east" in proc.stdout, proc.stdout
    return proc.stdout
