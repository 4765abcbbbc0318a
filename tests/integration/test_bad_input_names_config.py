"""Bad input gets a clear error status and damages nothing stored, with real processes:

* a partition index beyond a partitioned topic's count is refused ("Illegal topic
  partition name", Pulsar's BrokerService.getTopic) instead of being auto-created;
* topic names with path tricks ('.', '..', empty segments, '/', control characters)
  and admin arguments of the wrong type get INVALID_ARGUMENT with a message a
  user can act on, never INTERNAL with Python exception text;
* a bad broker / bookie / standalone config file is reported as a whole (every
  problem at once), the process exits with status 2 and nothing is left running;
  a broker that cannot bind its port exits (status 1) instead of hanging;
* minipulsar-admin / minipulsar-client report a dead service URL within seconds.

Topics, tenants and namespaces are unique per test (the ``standalone`` fixture is shared).
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest

from client import AsyncClient, InitialPosition
from client.admin import AdminClient
from client.errors import InvalidTopicName, NotAllowed
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from tests.procs import REPO_ROOT, StandaloneProcess, start_bookie

BIN = Path(sys.executable).parent
PYTHON_TEXT = ("Traceback", "ValueError", "TypeError", "KeyError", "AttributeError", "metadata path")


def uid() -> str:
    return uuid.uuid4().hex[:8]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    e = dict(os.environ, PYTHONUNBUFFERED="1")
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), e.get("PYTHONPATH")]))
    e.pop("MINIPULSAR_SERVICE_URL", None)
    return e


def processes_using(path: Path) -> list[str]:
    """Command lines of live processes naming ``path`` (what a failed start may leave behind)."""
    found = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(str(path).encode() in a for a in argv):
            found.append(" ".join(a.decode(errors="replace") for a in argv))
    return found


@pytest.fixture
async def stub(standalone):
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{standalone.port}")
    yield broker_pb2_grpc.PulsarBrokerStub(channel)
    await channel.close()


async def admin_raw(stub, method: str, body) -> tuple[str, str]:
    """(status code name, details) of a raw Admin call; ("OK", body_json) on success."""
    try:
        resp = await stub.Admin(pb.AdminRequest(method=method, body_json=json.dumps(body)), timeout=15)
        return "OK", resp.body_json
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or ""


def assert_clear_client_error(code: str, details: str, classes=("InvalidTopicName", "InvalidArgument")):
    assert code == "INVALID_ARGUMENT", (code, details)
    assert details.split(":", 1)[0] in classes, details
    assert not any(t in details for t in PYTHON_TEXT), details


# ---------------------------------------------------------------------------- 10: partition range
async def test_partition_index_out_of_range_is_refused_and_nothing_is_stored(standalone):
    base = f"persistent://public/default/range-{uid()}"
    async with AdminClient(standalone.service_url) as admin, AsyncClient(standalone.service_url) as client:
        await admin.create_partitioned_topic(base, 2)
        with pytest.raises(NotAllowed, match="Illegal topic partition name"):
            await client.create_producer(f"{base}-partition-5")
        with pytest.raises(NotAllowed, match="Illegal topic partition name"):
            await client.create_producer(f"{base}-partition-2")          # index == count
        with pytest.raises(NotAllowed, match="Illegal topic partition name"):
            await client.subscribe(f"{base}-partition-5", "s")
        with pytest.raises(NotAllowed, match="Illegal topic partition name.*2 partitions"):
            await admin.create_topic(f"{base}-partition-5")
        assert not [t for t in await admin.list_topics("public/default") if t.startswith(f"{base}-partition-")
                    and not t.endswith(("-partition-0", "-partition-1"))]
        # partitions in range and the partitioned topic itself keep working
        producer = await client.create_producer(f"{base}-partition-1")
        await producer.send(b"in range")
        await producer.close()
        whole = await client.create_producer(base)
        await whole.send(b"routed")
        await whole.close()
        consumer = await client.subscribe(base, "all", initial_position=InitialPosition.Earliest)
        got = sorted([(await consumer.receive(timeout_millis=10000)).data() for _ in range(2)])
        assert got == [b"in range", b"routed"]
        await consumer.close()
        # a topic whose name only looks like a partition (no partitioned parent) is still allowed
        lone = f"persistent://public/default/lone-{uid()}-partition-7"
        p = await client.create_producer(lone)
        await p.send(b"x")
        await p.close()


# ---------------------------------------------------------------------------- 12: names and admin types
BAD_TOPICS = [
    "persistent://public/default/..",
    "persistent://public/default/.",
    "persistent://../default/t",
    "persistent://public/../t",
    "..",
    "persistent://public//t",
    "persistent://public/default/",
    "persistent://public/default/a/b",
    "public/default/a\x01b",
    "public/default/t\n",
    "persistent://public/default/t-partition-01",
]


@pytest.mark.parametrize("topic", BAD_TOPICS)
async def test_bad_topic_names_get_invalid_argument_everywhere(stub, topic):
    for method in ("topics.create", "topics.stats", "topics.create_partitioned", "topics.delete"):
        body = {"topic": topic, "partitions": 2} if method == "topics.create_partitioned" else {"topic": topic}
        assert_clear_client_error(*await admin_raw(stub, method, body))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetPartitionedTopicMetadata(pb.TopicRequest(topic=topic), timeout=15)
    assert_clear_client_error(info.value.code().name, info.value.details())
    call = stub.Produce()
    await call.write(pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name="p")))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert_clear_client_error(info.value.code().name, info.value.details())


BAD_BODIES = [
    ("topics.create", {"topic": 5}),
    ("topics.create", {"topic": ["a"]}),
    ("topics.create", {}),
    ("topics.create", {"topic": "t", "typo": 1}),
    ("topics.create_partitioned", {"topic": "pt", "partitions": "3"}),
    ("topics.create_partitioned", {"topic": "pt", "partitions": True}),
    ("topics.delete", {"topic": "nope", "force": "yes"}),
    ("tenants.create", {"tenant": ".."}),
    ("tenants.create", {"tenant": "x", "allowed_clusters": "standalone"}),
    ("tenants.update", {"tenant": "public", "allowed_clusters": [5]}),
    ("namespaces.create", {"namespace": "public/.."}),
    ("namespaces.create", {"namespace": "../x"}),
    ("namespaces.create", {"namespace": 7}),
    ("namespaces.set_clusters", {"namespace": "public/default", "clusters": [1]}),
    ("namespaces.set_retention", {"namespace": "public/default", "retention_time_minutes": "5",
                                  "retention_size_mb": 1}),
    ("namespaces.set_retention", {"namespace": "public/default", "retention_time_minutes": -7,
                                  "retention_size_mb": 1}),
    ("namespaces.set_message_ttl", {"namespace": "public/default", "ttl_seconds": 1.5}),
    ("clusters.get", {"name": ".."}),
    ("clusters.create", {"name": "c", "service_url": "minipulsar://h:99999"}),
    ("topics.set_replication_clusters", {"topic": "t", "clusters": [1]}),
    ("topics.unsubscribe", {"topic": "t", "subscription": "../x"}),
    ("topics.reset_cursor", {"topic": "t", "subscription": "s", "timestamp_ms": "x"}),
]


@pytest.mark.parametrize("method,body", BAD_BODIES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(BAD_BODIES)])
async def test_admin_arguments_of_the_wrong_type_get_invalid_argument(stub, method, body):
    code, details = await admin_raw(stub, method, body)
    assert_clear_client_error(code, details)


async def test_bad_input_leaves_the_stored_metadata_intact(stub):
    before = {m: await admin_raw(stub, m, b) for m, b in (("tenants.list", {}), ("clusters.list", {}),
                                                           ("namespaces.policies", {"namespace": "public/default"}))}
    for method, body in BAD_BODIES:
        await admin_raw(stub, method, body)
    for topic in BAD_TOPICS:
        await admin_raw(stub, "topics.create", {"topic": topic})
    after = {m: await admin_raw(stub, m, b) for m, b in (("tenants.list", {}), ("clusters.list", {}),
                                                          ("namespaces.policies", {"namespace": "public/default"}))}
    assert after == before
    code, topics = await admin_raw(stub, "topics.list", {"namespace": "public/default"})
    assert code == "OK" and not [t for t in json.loads(topics) if "/t-partition-01" in t or t.endswith("/pt")]
    assert (await admin_raw(stub, "brokers.health", {}))[0] == "OK"


async def test_sdk_rejects_path_tricks_before_sending(standalone):
    async with AsyncClient(standalone.service_url) as client:
        for topic in ("..", "public/../t", "t-partition-007"):
            with pytest.raises(InvalidTopicName):
                await client.create_producer(topic)


# ---------------------------------------------------------------------------- 13: config files
def run_module(module: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=str(REPO_ROOT), env=env(), stdin=subprocess.DEVNULL)


BAD_BROKER_CONFIG = """\
broker_service_port = "abc"
max_message_size = "5MB"
bookies = "127.0.0.1:3181"
web_service_port = 99999
managed_ledger_default_write_quorum = 3
no_such_key = 1
"""


def test_broker_reports_every_config_problem_and_exits(tmp_path):
    conf = tmp_path / "broker.toml"
    conf.write_text(BAD_BROKER_CONFIG)
    t0 = time.monotonic()
    proc = run_module("broker", "--config", str(conf), "--data-dir", str(tmp_path / "data"))
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - t0 < 20
    err = proc.stderr
    for needle in ('broker_service_port: expected an integer, got the string "abc"',
                   'max_message_size: expected an integer, got the string "5MB"',
                   "bookies: expected an array of strings",
                   "web_service_port = 99999",
                   "ensemble size >= write quorum >= ack quorum",
                   "no_such_key"):
        assert needle in err, err
    assert "Traceback" not in err and "BROKER_READY" not in proc.stdout
    assert not (tmp_path / "data").exists()         # nothing started, nothing written
    assert processes_using(conf) == []


@pytest.mark.parametrize("args,needle", [
    (("--port", "99999"), "broker_service_port = 99999: must be a TCP port in 0..65535"),
    (("--port", "0", "--http-port", "-5"), "web_service_port = -5"),
])
def test_broker_flags_out_of_range_are_refused(tmp_path, args, needle):
    proc = run_module("broker", "--bookies", "127.0.0.1:1,127.0.0.1:2", "--data-dir", str(tmp_path / "d"), *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert "BROKER_READY" not in proc.stdout


def test_broker_that_cannot_bind_its_port_exits(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_module("broker", "--bookies", "127.0.0.1:1,127.0.0.1:2", "--data-dir", str(tmp_path / "d"),
                          "--port", str(port), "--http-port", "-1", timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert processes_using(tmp_path / "d") == []


def test_bookie_reports_every_config_problem_and_exits(tmp_path):
    conf = tmp_path / "bookie.toml"
    conf.write_text('port = "abc"\nmax_entry_size_bytes = "5MB"\njournal_sync = "yes"\n'
                    "max_inflight_requests_per_stream = 0\n")
    proc = run_module("bookie", "--config", str(conf), "--data-dir", str(tmp_path / "data"))
    assert proc.returncode == 2, proc.stderr
    for needle in ("port: expected an integer", "max_entry_size_bytes: expected an integer",
                   "journal_sync: expected true or false", "max_inflight_requests_per_stream = 0: must be >= 1"):
        assert needle in proc.stderr, proc.stderr
    assert "BOOKIE_READY" not in proc.stdout and processes_using(tmp_path / "data") == []
    conf.write_text("port = 99999\n")
    proc = run_module("bookie", "--config", str(conf), "--data-dir", str(tmp_path / "data"))
    assert proc.returncode == 2 and "port = 99999: must be a TCP port in 0..65535" in proc.stderr, proc.stderr
    assert processes_using(tmp_path / "data") == []


def test_bookie_flag_override_of_a_valid_file_still_works(tmp_path, process_tracker):
    conf = tmp_path / "bookie.toml"
    conf.write_text("port = 3181\nmax_entry_size_bytes = 1000\n")
    bookie = start_bookie(tmp_path / "b", extra_args=("--config", str(conf)), tracker=process_tracker)
    assert bookie.port != 3181
    assert bookie.terminate() == 0


def test_standalone_with_a_bad_broker_config_starts_nothing(tmp_path):
    conf = tmp_path / "broker.toml"
    conf.write_text('max_message_size = "5MB"\nbookies = "h:p"\n')
    data = tmp_path / "sa"
    t0 = time.monotonic()
    proc = run_module("deploy.cli", "standalone", "--port", "0", "--http-port", "-1", "--data-dir", str(data),
                      "--broker-config", str(conf), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - t0 < 30
    assert 'max_message_size: expected an integer, got the string "5MB"' in proc.stderr
    assert "bookies is set by minipulsar standalone itself" in proc.stderr
    assert "STANDALONE_READY" not in proc.stdout
    assert processes_using(data) == []                 # no bookie left behind
    proc = run_module("deploy.cli", "standalone", "--port", "70000", "--http-port", "-1", "--data-dir", str(data),
                      timeout=60)
    assert proc.returncode == 2 and "broker_service_port = 70000" in proc.stderr, proc.stderr
    assert processes_using(data) == []


# ---------------------------------------------------------------------------- 14b: dead service URL
@pytest.mark.parametrize("tool,args", [
    ("minipulsar-admin", ("tenants", "list")),
    ("minipulsar-admin", ("topics", "stats", "some-topic")),
    ("minipulsar-client", ("produce", "some-topic", "-m", "x")),
    ("minipulsar-client", ("consume", "some-topic", "-s", "s", "-n", "1")),
])
def test_cli_reports_a_dead_service_url_fast(tool, args):
    script = BIN / tool
    if not script.exists():
        pytest.skip(f"{script} is not installed")
    url = f"minipulsar://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    proc = subprocess.run([str(script), "--service-url", url, *args], capture_output=True, text=True, timeout=60,
                          env=env(), stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert elapsed < 10, f"took {elapsed:.1f} s"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: no answer from the broker at {url} (connection refused)"), lines[0]
    assert "--service-url" in lines[0]


async def test_admin_client_waits_for_a_broker_that_is_starting(tmp_path, process_tracker):
    """The fail-fast path still gives a broker that comes up within the connect timeout its chance."""
    port = free_port()
    admin = AdminClient(f"minipulsar://127.0.0.1:{port}", operation_timeout_seconds=30, connect_timeout_seconds=25)
    try:
        call = asyncio.create_task(admin.list_clusters())
        await asyncio.sleep(0.5)
        assert not call.done()
        proc = StandaloneProcess(tmp_path / "late", tracker=process_tracker, port=port)
        await asyncio.to_thread(proc.start)
        assert "standalone" in await asyncio.wait_for(call, 30)
    finally:
        await admin.close()
