"""The README quickstart's SDK snippet, run by the e2e tests against local
(`geo up`) and containerized (docker-compose) clusters.

``README_SNIPPET`` is the canonical text; when README.md carries the
quickstart (a python block using ``minipulsar://127.0.0.1:6600``) the tests run
README's own copy instead, so the documentation cannot drift from what works.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

README_SNIPPET = '''\
from client import Client, InitialPosition

east = Client("minipulsar://127.0.0.1:6600")   # cluster us-east
west = Client("minipulsar://127.0.0.1:6601")   # cluster us-west
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
        if "minipulsar://127.0.0.1:6600" in block and "minipulsar://127.0.0.1:6601" in block:
            return block
    return README_SNIPPET


def run_snippet(east_port: int, west_port: int, timeout: float = 90) -> str:
    """Run the snippet with the two clusters' real ports; returns its stdout
    (AssertionError with the output when it fails)."""
    code = snippet().replace("127.0.0.1:6600", f"127.0.0.1:{east_port}").replace("127.0.0.1:6601",
                                                                                  f"127.0.0.1:{west_port}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=str(REPO_ROOT), env=env)
    assert proc.returncode == 0, f"quickstart snippet failed:\n{proc.stdout}\n{proc.stderr}"
    assert "b'hello from us-east' replicated from us-east" in proc.stdout, proc.stdout
    return proc.stdout
