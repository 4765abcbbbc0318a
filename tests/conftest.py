"""Shared pytest fixtures: real server processes that are always killed at teardown.

``hypothesis`` is imported here, at start-up, on purpose: otherwise its pytest
plugin imports it in the terminal summary after a run that used no hypothesis
test, and under CPython 3.11.7 the assertion rewriter's ``ast.parse`` of it
then fails now and then with "SystemError: AST constructor recursion depth
mismatch" (CPython gh-106905), turning a green run's exit status into 1."""

from __future__ import annotations

import hypothesis  # noqa: F401
import pytest

from tests.procs import BookieProcess, ProcessTracker, start_bookie

# Test modules that use the shared SparkSession (tests.spark.fixtures.spark_session).
_SPARK_MODULES = ("test_spark_geo.py", "test_spark_sink.py", "test_spark_source.py", "test_spark_source_chunks.py",
                  "test_spark_source_loss.py", "test_spark_cluster.py")


def pytest_collection_finish(session):
    """Start the shared SparkSession before any test runs, when Spark tests are collected.

    Starting it forks the JVM gateway (pyspark's Popen with a preexec_fn). Forking
    this process later, while earlier tests' gRPC threads are busy, can crash the
    child ("Other threads are currently calling into gRPC, skipping fork()
    handlers", then a segfault) and fail a Spark test at random.
    """
    if not any(item.nodeid.split("::")[0].endswith(_SPARK_MODULES) for item in session.items):
        return
    from tests.spark.fixtures import SKIP_REASON, spark_session

    if SKIP_REASON is None:
        spark_session()


@pytest.fixture
def process_tracker():
    """A ProcessTracker; every process registered with it is SIGKILLed at teardown."""
    tracker = ProcessTracker()
    try:
        yield tracker
    finally:
        tracker.kill_all()


@pytest.fixture
def bookie_factory(tmp_path, process_tracker):
    """``bookie_factory(data_dir=None, journal_sync=True, extra_args=()) -> BookieProcess``.

    Starts a real bookie (``python -m bookie --port 0``); data_dir defaults to
    a fresh ``tmp_path/bookie-<n>``. The bookie and anything it ``restart()``s
    are killed at teardown, even when the test fails.
    """
    counter = iter(range(1_000_000))

    def factory(data_dir=None, journal_sync: bool = True, extra_args=()) -> BookieProcess:
        if data_dir is None:
            data_dir = tmp_path / f"bookie-{next(counter)}"
        return start_bookie(data_dir, journal_sync, extra_args, tracker=process_tracker)

    return factory


@pytest.fixture(scope="session")
def standalone(tmp_path_factory):
    """One real standalone cluster (2 bookies + broker) shared by the session's
    tests; ``.service_url``. Tests must use their own topic names."""
    from tests.procs import ProcessTracker, start_standalone

    tracker = ProcessTracker()
    proc = start_standalone(tmp_path_factory.mktemp("standalone"), tracker=tracker)
    try:
        yield proc
    finally:
        proc.terminate()
        tracker.kill_all()


@pytest.fixture
def standalone_factory(tmp_path, process_tracker):
    """``standalone_factory(data_dir=None, extra_args=()) -> StandaloneProcess``: a
    private cluster (for restart/kill tests); killed at teardown."""
    from tests.procs import start_standalone

    counter = iter(range(1000))

    def factory(data_dir=None, extra_args=()):
        return start_standalone(data_dir or tmp_path / f"standalone-{next(counter)}", extra_args,
                                tracker=process_tracker)

    return factory


@pytest.fixture
async def meta(tmp_path):
    """A SqliteMetadataStore in the test's tmp dir (storage tests run the bookie client in-process)."""
    from broker.metadata import SqliteMetadataStore

    store = await SqliteMetadataStore.open(str(tmp_path / "metadata.db"))
    yield store
    await store.close()


@pytest.fixture
def etcd(tmp_path, process_tracker):
    """A real etcd server of this test (``tests.procs.EtcdProcess``: ``.url`` is
    ``etcd://127.0.0.1:<port>``), killed at teardown."""
    from tests.procs import start_etcd

    return start_etcd(tmp_path / "etcd", tracker=process_tracker)
