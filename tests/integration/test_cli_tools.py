"""The console scripts ``minipulsar-client``, ``minipulsar-admin`` and
``minipulsar-perf`` run as real subprocesses against the shared standalone
cluster (``standalone`` fixture).  Every test uses its own topic/tenant names."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def _script(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `.venv/bin/pip install -e '.[test]'` to install the console scripts")
    return str(path)


def run(tool: str, *args: str, timeout: float = 60, check: bool = True, env_url: str | None = None):
    """Run a console script; returns the CompletedProcess (text).  ``check``:
    fail the test (showing stderr) on a non-zero exit status."""
    env = dict(os.environ)
    env.pop("MINIPULSAR_SERVICE_URL", None)
    if env_url:
        env["MINIPULSAR_SERVICE_URL"] = env_url
    proc = subprocess.run([_script(tool), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        pytest.fail(f"{tool} {' '.join(args)} exited with {proc.returncode}\nstdout:\n{proc.stdout}\n"
                    f"stderr:\n{proc.stderr}")
    return proc


def uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def url(standalone) -> str:
    return standalone.service_url


def admin(url: str, *args: str, check: bool = True):
    return run("minipulsar-admin", "--service-url", url, *args, check=check)


def admin_json(url: str, *args: str):
    return json.loads(admin(url, *args, "--json").stdout)


# ---------------------------------------------------------------------------- minipulsar-client
def test_client_produce_then_consume(url):
    topic = f"cli-pc-{uid()}"
    p = run("minipulsar-client", "produce", topic, "-m", "hello,world", "-n", "3", "-k", "k1", "-p", "src=test",
            "--service-url", url)
    assert "6 messages successfully produced" in p.stdout
    c = run("minipulsar-client", "consume", topic, "-s", "sub", "-n", "6", "-p", "Earliest", "--timeout", "30",
            env_url=url)  # the service URL from the environment
    assert c.stdout.count("----- got message -----") == 6
    assert c.stdout.count("key:[k1], properties:[src=test], content:hello") == 3
    assert c.stdout.count("content:world") == 3
    assert "6 messages successfully consumed" in c.stdout
    # everything was acknowledged: nothing more for this subscription
    again = run("minipulsar-client", "--service-url", url, "consume", topic, "-s", "sub", "-n", "1",
                "--timeout", "1", check=False)
    assert again.returncode == 1
    assert "0 messages successfully consumed" in again.stdout
    assert again.stderr.strip().splitlines()[-1].startswith("error: received only 0 of 1")


def test_client_consume_shared_quiet_with_rate(url):
    topic = f"cli-q-{uid()}"
    run("minipulsar-client", "--service-url", url, "produce", topic, "-m", "x", "-n", "20", "--rate", "200")
    c = run("minipulsar-client", "--service-url", url, "consume", topic, "-s", "s", "-t", "Shared", "-n", "20",
            "-p", "Earliest", "--quiet", "--timeout", "30")
    assert "got message" not in c.stdout
    assert "20 messages successfully consumed" in c.stdout


def test_client_errors_are_one_line(url):
    bad = run("minipulsar-client", "--service-url", "pulsar://127.0.0.1:6650", "produce", "t", "-m", "x",
              check=False)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()] and bad.stderr.startswith("error: ")
    assert "minipulsar://" in bad.stderr
    nothing = run("minipulsar-client", "--service-url", url, "produce", "t", check=False)
    assert nothing.returncode == 1 and "-m MSG" in nothing.stderr
    unknown_ns = run("minipulsar-client", "--service-url", url, "produce", f"persistent://no-{uid()}/ns/t",
                     "-m", "x", check=False)
    assert unknown_ns.returncode == 1 and unknown_ns.stderr.startswith("error: ")
    assert "does not exist" in unknown_ns.stderr


# ---------------------------------------------------------------------------- minipulsar-admin
def test_admin_clusters(url):
    name = f"c-{uid()}"
    admin(url, "clusters", "create", name, "--url", "minipulsar://10.1.2.3:6600")
    assert name in admin_json(url, "clusters", "list")
    assert name in admin(url, "clusters", "list").stdout.split()
    assert admin_json(url, "clusters", "get", name)["service_url"] == "minipulsar://10.1.2.3:6600"
    admin(url, "clusters", "update", name, "--url", "minipulsar://10.1.2.4:6601")
    table = admin(url, "clusters", "get", name).stdout
    assert "minipulsar://10.1.2.4:6601" in table and "service_url" in table
    assert "deleted" in admin(url, "clusters", "delete", name).stdout
    assert name not in admin_json(url, "clusters", "list")


def test_admin_tenants_namespaces_topics(url):
    tenant = f"t-{uid()}"
    ns = f"{tenant}/ns"
    assert "created" in admin(url, "tenants", "create", tenant, "--allowed-clusters", "standalone").stdout
    assert tenant in admin_json(url, "tenants", "list")
    assert admin_json(url, "tenants", "get", tenant)["allowed_clusters"] == ["standalone"]
    admin(url, "tenants", "update", tenant, "--allowed-clusters", "standalone")
    admin(url, "namespaces", "create", ns)
    assert admin_json(url, "namespaces", "list", tenant) == [ns]
    admin(url, "namespaces", "set-deduplication", ns, "--enable")
    assert admin_json(url, "namespaces", "policies", ns)["deduplication_enabled"] is True
    admin(url, "namespaces", "set-deduplication", ns, "--disable")
    admin(url, "namespaces", "set-clusters", ns, "--clusters", "standalone")
    admin(url, "namespaces", "set-message-ttl", ns, "--ttl", "120")
    admin(url, "namespaces", "set-retention", ns, "--time", "30", "--size", "64")
    policies = admin_json(url, "namespaces", "policies", ns)
    assert policies["deduplication_enabled"] is False
    assert policies["replication_clusters"] == ["standalone"]
    assert policies["message_ttl_in_seconds"] == 120
    assert (policies["retention_time_in_minutes"], policies["retention_size_in_mb"]) == (30, 64)
    assert "message_ttl_in_seconds     120" in admin(url, "namespaces", "policies", ns).stdout

    topic = f"persistent://{ns}/plain"
    ptopic = f"persistent://{ns}/parted"
    admin(url, "topics", "create", topic)
    admin(url, "topics", "create-partitioned-topic", ptopic, "-p", "3")
    assert admin_json(url, "topics", "partitioned-metadata", ptopic) == {"partitions": 3}
    assert topic in admin_json(url, "topics", "list", ns)
    admin(url, "topics", "set-replication-clusters", topic, "--clusters", "standalone")
    stats = admin_json(url, "topics", "stats", topic)
    assert stats["msgInCounter"] == 0 and stats["subscriptions"] == {}
    internal = admin_json(url, "topics", "internal-stats", topic)
    assert "ledgers" in internal and "cursors" in internal
    assert admin_json(url, "topics", "subscriptions", topic) == []
    admin(url, "topics", "unload", topic)
    assert admin_json(url, "brokers", "health")["ok"] is True

    # a namespace with topics cannot go: the error says what to do
    busy = admin(url, "namespaces", "delete", ns, check=False)
    assert busy.returncode == 1 and busy.stderr.startswith("error: ") and "delete them first" in busy.stderr
    admin(url, "topics", "delete", topic, "--force")
    assert topic not in admin_json(url, "topics", "list", ns)


def test_admin_unknown_tenant_is_one_clear_error_line(url):
    tenant = f"nope-{uid()}"
    for args in (("tenants", "get", tenant), ("namespaces", "list", tenant), ("namespaces", "create", f"{tenant}/x")):
        proc = admin(url, *args, check=False)
        assert proc.returncode == 1, args
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")
        assert tenant in lines[0] and "tenants create" in lines[0]  # says what to do
        assert proc.stdout == ""


def test_admin_several_service_urls(url):
    proc = run("minipulsar-admin", "--service-url", f"{url},minipulsar://127.0.0.1:1", "--timeout", "1",
               "brokers", "health", "--json", check=False)
    assert proc.returncode == 1  # one cluster failed
    assert json.loads(proc.stdout)[url]["ok"] is True
    assert proc.stderr.startswith("error: minipulsar://127.0.0.1:1: no answer from the broker")
    health = admin(url, "--service-url", url, "brokers", "healthcheck")  # the same URL twice counts once
    assert "==" not in health.stdout and health.stdout.split()[:2] == ["cluster", "standalone"]


def _free_port() -> int:
    from tests.procs import free_port
    return free_port()


def test_multi_host_service_url_with_its_first_host_down(url, standalone):
    """minipulsar://<nothing listens>,<the broker>: every tool skips the dead host."""
    multi = f"minipulsar://127.0.0.1:{_free_port()},127.0.0.1:{standalone.port}"
    topic = f"cli-multi-{uid()}"
    p = run("minipulsar-client", "--service-url", multi, "produce", topic, "-m", "a,b", "-n", "2")
    assert "4 messages successfully produced" in p.stdout
    c = run("minipulsar-client", "consume", topic, "-s", "sub", "-n", "4", "-p", "Earliest", "--quiet",
            "--timeout", "30", env_url=multi)
    assert "4 messages successfully consumed" in c.stdout
    assert admin_json(multi, "brokers", "health")["ok"] is True
    assert f"persistent://public/default/{topic}" in admin_json(multi, "topics", "list", "public/default")
    # the multi-host URL is one cluster next to another one
    both = json.loads(run("minipulsar-admin", "--service-url", f"{multi},{url}", "brokers", "health",
                          "--json").stdout)
    assert set(both) == {multi, url} and all(doc["ok"] for doc in both.values())
    perf = run("minipulsar-perf", "produce", f"cli-multi-perf-{uid()}", "--service-url", multi, "-r", "500",
               "-m", "200", "--warmup", "0", "--json")
    assert _perf_json(perf.stdout)["publish"]["messages"] == 200


def test_multi_host_service_url_all_down_is_one_clear_error_line():
    a, b = _free_port(), _free_port()
    multi = f"minipulsar://127.0.0.1:{a},127.0.0.1:{b}"
    for tool, args in (("minipulsar-client", ("produce", "t", "-m", "x")), ("minipulsar-admin", ("tenants", "list"))):
        proc = run(tool, "--service-url", multi, *args, check=False)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: no answer from the broker at " + multi), lines
        assert f"127.0.0.1:{a}: connection refused" in lines[0] and f"127.0.0.1:{b}: connection refused" in lines[0]


def test_admin_subscriptions_reset_cursor_unsubscribe(url):
    topic = f"cli-reset-{uid()}"
    run("minipulsar-client", "--service-url", url, "produce", topic, "-m", "a,b,c,d,e", "--disable-batching")
    first = run("minipulsar-client", "--service-url", url, "consume", topic, "-s", "sub", "-n", "5", "-p",
                "Earliest", "--quiet", "--timeout", "30")
    assert "5 messages successfully consumed" in first.stdout
    assert admin_json(url, "topics", "subscriptions", topic) == ["sub"]
    stats = admin_json(url, "topics", "stats", topic)
    assert stats["subscriptions"]["sub"]["msgBacklog"] == 0

    # back to the third message by id
    ledger = admin_json(url, "topics", "internal-stats", topic)["ledgers"][0]["ledgerId"]
    reset = admin(url, "topics", "reset-cursor", topic, "-s", "sub", "-m", f"{ledger}:2")
    assert f"position {ledger}:2" in reset.stdout
    again = run("minipulsar-client", "--service-url", url, "consume", topic, "-s", "sub", "-n", "3",
                "--timeout", "30")
    assert [line.rsplit("content:", 1)[1] for line in again.stdout.splitlines() if "content:" in line] == \
        ["c", "d", "e"]
    # back to everything published in the last 10 minutes
    assert admin_json(url, "topics", "reset-cursor", topic, "-s", "sub", "-t", "10m")["ok"] is True
    assert admin_json(url, "topics", "stats", topic)["subscriptions"]["sub"]["msgBacklog"] == 5
    bad = admin(url, "topics", "reset-cursor", topic, "-s", "sub", "-m", "oops", check=False)
    assert bad.returncode == 1 and "LEDGER:ENTRY" in bad.stderr

    admin(url, "topics", "unsubscribe", topic, "-s", "sub")
    assert admin_json(url, "topics", "subscriptions", topic) == []
    missing = admin(url, "topics", "unsubscribe", topic, "-s", "sub", check=False)
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and "does not exist" in missing.stderr


# ---------------------------------------------------------------------------- minipulsar-perf
def _perf_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"--json must print exactly one line, got:\n{stdout}"
    return json.loads(lines[0])


def test_perf_produce(url):
    p = run("minipulsar-perf", "produce", f"perf-p-{uid()}", "--service-url", url, "-r", "2000", "-s", "100",
            "-t", "2", "--warmup", "0.5", "-i", "1", "--json")
    doc = _perf_json(p.stdout)
    pub = doc["publish"]
    assert doc["command"] == "produce" and pub["errors"] == 0
    assert 2000 <= pub["messages"] <= 2000 * 2.5 + 100  # ~2 s at 2000 msg/s (+ the drain)
    assert 0 < pub["latency_ms"]["p50"] <= pub["latency_ms"]["p99"] <= pub["latency_ms"]["max"]
    assert pub["mb_per_s"] > 0
    assert "[publish]" in p.stderr and "msg/s" in p.stderr  # the interval lines


def test_perf_consume_with_a_separate_producer(url):
    topic = f"perf-c-{uid()}"
    consumer = subprocess.Popen(
        [_script("minipulsar-perf"), "consume", topic, "--service-url", url, "-s", "perf", "-t", "Shared", "--ack",
         "-p", "Earliest", "-m", "3000", "-d", "30", "--warmup", "0", "-i", "1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        prod = run("minipulsar-perf", "produce", topic, "--service-url", url, "-r", "1500", "-s", "64", "-m", "3000",
                   "--warmup", "0", "--json", "--compression", "LZ4")
        out, err = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    assert consumer.returncode == 0, err
    doc = _perf_json(out)
    assert _perf_json(prod.stdout)["publish"]["messages"] == 3000
    con = doc["consume"]
    assert con["messages"] == 3000
    assert con["latency_ms"]["p50"] > 0
    assert doc["latency_source"] == "payload send time (us)"
    stats = admin_json(url, "topics", "stats", topic)
    assert stats["subscriptions"]["perf"]["msgBacklog"] == 0  # --ack: everything acknowledged


def test_perf_e2e(url):
    p = run("minipulsar-perf", "e2e", f"perf-e-{uid()}", "--service-url", url, "-r", "1000", "-s", "100", "-d", "2",
            "--warmup", "0.5", "-i", "1", "--json")
    doc = _perf_json(p.stdout)
    assert doc["command"] == "e2e" and doc["not_received"] == 0
    assert doc["publish"]["messages"] >= 1500 and doc["consume"]["messages"] >= 1500
    e2e = doc["consume"]["latency_ms"]
    assert 0 < e2e["p50"] <= e2e["p95"] <= e2e["p99"] <= e2e["p99.9"] <= e2e["max"]
    assert "[e2e]" in p.stderr
