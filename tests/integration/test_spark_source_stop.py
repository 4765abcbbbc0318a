"""The streaming source's durable subscription is deleted when Spark stops the
stream reader's process, however Spark sends its SIGTERMs.

Spark stops a Python stream reader (``PythonStreamingSourceRunner.stop``) with
``PythonWorkerFactory.stopWorker``, which destroys the simple worker (SIGTERM),
and then ``PythonWorkerFactory.stop``, which destroys it again: two SIGTERMs a
moment apart.  CI once kept ``spark-keep`` after ``query.stop()``: the second
SIGTERM raised ``SystemExit`` inside the ``stop()`` the first one started.

The process here is a stand-in for Spark's runner: a module whose name ends in
``python_streaming_source_runner`` (so the source installs its SIGTERM handler)
that plans a micro-batch like the runner, then waits on stdin for the next call
with Spark's ``finally: reader.stop()``; it takes a moment before that
``stop()`` so a second SIGTERM lands where Spark's can.  The session's real
standalone broker and bookies answer (``standalone`` fixture).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from client.admin import SyncAdminClient
from client.sync import Client
from tests.procs import REPO_ROOT
from tests.spark.fixtures import produce, requires_spark, unique_topic

pytestmark = [requires_spark, pytest.mark.timeout(120)]

RUNNER = textwrap.dedent('''
    import sys, time
    from client.spark.options import SourceOptions
    from client.spark.source import SCHEMA
    from client.spark.stream import MinipulsarStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    url, topic = sys.argv[1], sys.argv[2]
    reader = MinipulsarStreamReader(SourceOptions.parse(
        {"service_url": url, "topics": topic, "startingOffsets": "earliest",
         "durableSubscription": "true", "subscriptionPrefix": "spark-stop"}, True), SCHEMA)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())   # holds the durable subscription
        reader.partitions(start, end)
        print("planned", flush=True)
        sys.stdin.read()                                        # Spark's read_int: the next call
    finally:
        time.sleep(1.0)                                         # unwinding, where the 2nd SIGTERM lands
        reader.stop()
''')


def start_runner(tmp_path, url: str, topic: str) -> subprocess.Popen:
    (tmp_path / "fake_python_streaming_source_runner.py").write_text(RUNNER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO_ROOT)]))
    proc = subprocess.Popen([sys.executable, "-m", "fake_python_streaming_source_runner", url, topic],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=tmp_path)
    line = proc.stdout.readline()
    assert line.strip() == b"planned", f"the runner did not plan a batch (exit code {proc.poll()})"
    return proc


def test_two_sigterms_from_spark_still_delete_the_durable_subscription(standalone, tmp_path):
    url = standalone.service_url
    topic = unique_topic("spark-stop")
    with Client(url) as client:
        produce(client, topic, 0, 3, batching=False)
    admin = SyncAdminClient(url)
    try:
        runner = start_runner(tmp_path, url, topic)
        try:
            assert admin.get_subscriptions(topic) == ["spark-stop"]
            runner.send_signal(signal.SIGTERM)      # stopWorker: destroy()
            time.sleep(0.3)
            runner.send_signal(signal.SIGTERM)      # stop(): stopDaemon destroys the same worker again
            runner.wait(timeout=60)
        finally:
            if runner.poll() is None:
                runner.kill()
        assert admin.get_subscriptions(topic) == [], "the durable subscription outlived the stream reader"
    finally:
        admin.close()
