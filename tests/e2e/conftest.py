"""Fixtures of the e2e tests."""
from __future__ import annotations

import fcntl
import os
import tempfile

import pytest


@pytest.fixture
def compose_turn():
    """Hold ``<tmp>/minipulsar-compose-e2e.lock`` (flock) for the test: the compose
    stacks (``test_geo_compose.py``, ``test_geo_compose_tls.py``) build the same image
    tag (``minipulsar:latest``) and each runs some twenty containers, so with
    pytest-xdist's two workers they take turns instead of running at once."""
    with open(os.path.join(tempfile.gettempdir(), "minipulsar-compose-e2e.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
