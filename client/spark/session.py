"""Build a SparkSession that works on these machines (used by the sink job and
the tests).

What a local session needs here, and why:

* ``PYSPARK_PYTHON`` = the running interpreter: Python workers must import
  pyarrow and this package, which a bare ``python3`` on the PATH may lack;
* loopback only (``SPARK_LOCAL_IP=127.0.0.1``, ``spark.driver.host`` and
  ``spark.driver.bindAddress``) for ``local[...]`` masters;
* quiet: a ``log4j2.properties`` (ERROR level) in ``SPARK_CONF_DIR``, no UI,
  no console progress bar;
* ``spark.sql.session.timeZone=UTC`` so timestamps print and truncate alike
  everywhere, and few shuffle partitions (the sink's aggregation is small);
* the ``minipulsar`` data source registered.

Java 17 must be installed (``java`` on the PATH or ``JAVA_HOME``); on Debian:
``apt-get install openjdk-17-jre-headless``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping

__all__ = ["LOG4J2_PROPERTIES", "spark_unavailable_reason", "quiet_conf_dir", "build_session"]

LOG4J2_PROPERTIES = """\
# minipulsar: quiet Spark (errors only) on stderr.  The root level stays WARN
# (Spark prints "Setting default log level" whenever it differs from the
# shell's WARN); the console appender's threshold drops everything below ERROR.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
appender.console.filter.threshold.type = ThresholdFilter
appender.console.filter.threshold.level = error
"""


def spark_unavailable_reason() -> str | None:
    """Why a local Spark session cannot start here (a human-readable reason),
    or None when pyspark, pyarrow, pandas and a Java runtime are present.
    Used to skip Spark tests with a clear message."""
    for module, hint in (("pyspark", "pip install 'minipulsar[spark]'"),
                         ("pyarrow", "pip install 'minipulsar[spark]' (pyspark[sql])"),
                         ("pandas", "pip install 'minipulsar[spark]'")):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed ({hint})"
    java = (Path(os.environ["JAVA_HOME"]) / "bin" / "java") if os.environ.get("JAVA_HOME") else None
    java = str(java) if java is not None and java.exists() else shutil.which("java")
    if java is None:
        return "no Java runtime (Spark needs Java 17: apt-get install openjdk-17-jre-headless)"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"java -version failed: {exc}"
    if out.returncode != 0:
        return f"java -version failed: {out.stderr.strip()[:200]}"
    return None


def quiet_conf_dir() -> str:
    """A directory holding ``LOG4J2_PROPERTIES`` as ``log4j2.properties``
    (created once per process under the temp dir); returns its path."""
    path = Path(tempfile.gettempdir()) / f"minipulsar-spark-conf-{os.getuid() if hasattr(os, 'getuid') else 0}"
    path.mkdir(parents=True, exist_ok=True)
    target = path / "log4j2.properties"
    if not target.exists() or target.read_text() != LOG4J2_PROPERTIES:
        tmp = path / f".log4j2.{os.getpid()}"
        tmp.write_text(LOG4J2_PROPERTIES)
        os.replace(tmp, target)
    return str(path)


def build_session(master: str = "local[2]", app_name: str = "minipulsar", conf: Mapping[str, str] | None = None,
                  quiet: bool = True, shuffle_partitions: int = 4):
    """Get or create a ``SparkSession`` with the settings of the module doc and
    the ``minipulsar`` format registered.

    ``master``: ``local[N]``/``local[*]`` (bound to 127.0.0.1) or a cluster URL
    (``spark://host:7077``; workers need minipulsar installed);
    ``conf``: extra Spark settings (override the defaults); ``quiet``: ERROR-level
    logs; ``shuffle_partitions``: ``spark.sql.shuffle.partitions``.  Environment
    variables are set in this process before the JVM starts (a session that
    already exists is returned as is, with the format registered).  Takes ~5-7 s
    for a new local session.  Raises ``RuntimeError`` with the reason when
    Spark cannot start (see ``spark_unavailable_reason``).

    Create the session before this process opens minipulsar clients: starting
    the JVM forks the process, and a fork while gRPC threads are busy can crash
    the child (the JVM then never starts).
    """
    reason = spark_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"cannot start Spark: {reason}")
    local = master.startswith("local")
    if local or "PYSPARK_PYTHON" not in os.environ:
        os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    if quiet and "SPARK_CONF_DIR" not in os.environ:
        os.environ["SPARK_CONF_DIR"] = quiet_conf_dir()

    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }
    if local:
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    from client.spark import register
    register(spark)
    return spark
