"""Fixtures of the fault suite: ``fault_cluster(n_bookies=3, bookie_args=None, **broker_config)``
starts a :class:`tests.faults.harness.FaultCluster` (real processes, killed at teardown)."""
from __future__ import annotations

import pytest

from tests.faults.harness import FaultCluster


@pytest.fixture
def fault_cluster(tmp_path, process_tracker):
    def start(n_bookies: int = 3, bookie_args=None, **broker_config) -> FaultCluster:
        return FaultCluster(tmp_path, process_tracker, n_bookies, bookie_args, **broker_config).start()

    return start
