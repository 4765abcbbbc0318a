"""Fixtures of the fault suite: ``fault_cluster(n_bookies=3, bookie_args=None, **broker_config)``
starts a :class:`tests.faults.harness.FaultCluster` (real processes, killed at teardown).

When a scenario fails, its report carries what is needed to tell where it broke, since the
temporary dirs are gone by the time CI output is read: the SDK's own INFO log lines
(reconnections, redeliveries; captured for every fault test, shown only on failure) and
the last :data:`SERVER_LOG_LINES` lines of every server's stderr log under the test's
``tmp_path`` (brokers and bookies log at INFO: subscriptions, consumers added and
removed, read failures, ensemble changes)."""
from __future__ import annotations

import logging

import pytest

from tests.faults.harness import SERVER_LOG_LINES, FaultCluster, server_log_tails

@pytest.fixture
def fault_cluster(tmp_path, process_tracker):
    def start(n_bookies: int = 3, bookie_args=None, **broker_config) -> FaultCluster:
        return FaultCluster(tmp_path, process_tracker, n_bookies, bookie_args, **broker_config).start()

    return start


@pytest.fixture(autouse=True)
def _sdk_info_log(caplog):
    caplog.set_level(logging.INFO, logger="client")
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when == "call" and report.failed and tmp_path is not None:
        for name, text in server_log_tails(tmp_path):
            report.sections.append((f"server log {name} (last {SERVER_LOG_LINES} lines)", text))
