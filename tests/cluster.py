"""A real broker cluster for integration tests: one etcd, bookies and several brokers
sharing it (``metadata_store_url = etcd://...``), each a real process on free loopback
ports, all killed at teardown through the test's ProcessTracker.

    c = BrokerCluster(tmp_path, tracker, brokers=3).start()
    c.service_url          # minipulsar://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
    c.kill_broker(0)       # kill -9
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.procs import BrokerProcess, ProcessTracker, start_bookie, start_etcd

# short timeouts so that failover tests run in seconds (defaults: 5 s session, 5 s reports)
FAST_CONFIG = {
    "metadata_store_session_timeout_millis": 2000,
    "load_balancer_report_update_min_interval_millis": 500,
    "load_balancer_shedding_interval_minutes": 1.0,
    "managed_ledger_default_ensemble_size": 2,
    "managed_ledger_default_write_quorum": 2,
    "managed_ledger_default_ack_quorum": 2,
    "bookkeeper_client_timeout_in_seconds": 5.0,
}


def _toml(values: dict) -> str:
    lines = []
    for key, value in values.items():
        lines.append(f"{key} = {json.dumps(value) if not isinstance(value, bool) else str(value).lower()}")
    return "\n".join(lines) + "\n"


class BrokerCluster:
    """etcd + ``bookies`` bookies + ``brokers`` brokers of one cluster (``cluster_name``).
    ``config``: extra BrokerConfig keys for every broker. After ``start()``: ``etcd``,
    ``bookies`` (BookieProcess list), ``brokers`` (BrokerProcess list, None for a killed one)."""

    def __init__(self, root, tracker: ProcessTracker, brokers: int = 2, bookies: int = 2,
                 cluster_name: str = "standalone", config: dict | None = None, static_bookies: bool = True):
        self.root = Path(root)
        self.tracker = tracker
        self.n_brokers = brokers
        self.n_bookies = bookies
        self.cluster_name = cluster_name
        # False: brokers get no bookie list and choose among the bookies registered in etcd
        self.static_bookies = static_bookies
        self.config = {**FAST_CONFIG, "cluster_name": cluster_name, **(config or {})}
        self.etcd = None
        self.bookies = []
        self.brokers: list[BrokerProcess] = []

    def start(self) -> "BrokerCluster":
        self.etcd = start_etcd(self.root / "etcd", tracker=self.tracker)
        for i in range(self.n_bookies):
            self.bookies.append(start_bookie(self.root / f"bookie-{i}", tracker=self.tracker,
                                             extra_args=self._bookie_args()))
        self.config_file = self.root / "broker.toml"
        self.config_file.write_text(_toml(self.config))
        for i in range(self.n_brokers):
            self.brokers.append(self.start_broker(i))
        return self

    def _bookie_args(self) -> tuple:
        from bookie.__main__ import add_arguments
        import argparse

        p = argparse.ArgumentParser()
        add_arguments(p)
        known = {a.dest for a in p._actions}
        return ("--metadata-store-url", self.etcd.url) if "metadata_store_url" in known else ()

    def start_broker(self, index: int, port: int = 0, metadata_store_url: str | None = None) -> BrokerProcess:
        """Start broker ``index`` (data dir ``broker-<index>``) on ``port`` (0 = free);
        ``metadata_store_url``: its etcd URL when not the cluster's (e.g. through a proxy)."""
        bookies = [b.address for b in self.bookies] if self.static_bookies else []
        proc = BrokerProcess(self.root / f"broker-{index}", bookies, self.config_file,
                             ("--metadata-store-url", metadata_store_url or self.etcd.url), self.tracker, port=port)
        return proc.start()

    def start_broker_behind_etcd_proxy(self, index: int):
        """Start broker ``index`` with its etcd link through a ``ThreadedTcpProxy`` (returned
        with the broker, appended to ``brokers``): ``proxy.hold()`` cuts that one broker off
        from etcd while its clients stay connected. The caller closes the proxy."""
        from tests.tcp_proxy import ThreadedTcpProxy

        host, port = self.etcd.url.split("://", 1)[1].rsplit(":", 1)
        proxy = ThreadedTcpProxy(host, int(port))
        proc = self.start_broker(index, metadata_store_url=f"etcd://{proxy.address}")
        self.brokers.append(proc)
        return proc, proxy

    @property
    def live_brokers(self) -> list[BrokerProcess]:
        return [b for b in self.brokers if b is not None and b.is_running()]

    @property
    def service_url(self) -> str:
        """Multi-host service URL of the live brokers."""
        return "minipulsar://" + ",".join(f"127.0.0.1:{b.port}" for b in self.live_brokers)

    def broker_by_url(self, url: str) -> BrokerProcess:
        port = int(url.rsplit(":", 1)[1])
        for b in self.brokers:
            if b is not None and b.port == port:
                return b
        raise KeyError(url)

    def kill_broker(self, proc: BrokerProcess) -> None:
        """kill -9 of one broker."""
        proc.kill()

    def pause(self, proc: BrokerProcess) -> None:
        os.kill(proc.pid, signal.SIGSTOP)

    def resume(self, proc: BrokerProcess) -> None:
        os.kill(proc.pid, signal.SIGCONT)


def wait_for(predicate, timeout_s: float = 30.0, interval_s: float = 0.1, what: str = "condition"):
    """Poll ``predicate()`` until truthy (returns its value); AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)
