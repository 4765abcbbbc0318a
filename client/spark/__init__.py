"""minipulsar and Apache Spark: the ``minipulsar`` PySpark data source and the
analytics sink job (``minipulsar-spark-sink``).

Needs the ``spark`` extra (``pip install 'minipulsar[spark]'``: pyspark[sql],
pandas) and Java 17.  Modules:

* ``source``: the data source and its batch reader; ``stream``: the streaming reader;
* ``options`` / ``offsets`` / ``ledgers``: option parsing, offsets and what
  the driver knows of a partition's ledgers (pure);
* ``progress``: where a range read stands: its end, chunked messages, lost
  entries (pure);
* ``lookup`` / ``partition_reader`` (with ``tracked_reader``): broker I/O on
  the driver / in workers;
* ``retention``: the optional durable subscription (``durableSubscription``);
* ``session``: a SparkSession with the settings these machines need;
* ``flights``: the geo demo's flight messages (pure, no Spark);
* ``sink``: the analytics job.

Importing this package does not import pyspark.
"""
from __future__ import annotations

__all__ = ["FORMAT", "register"]

FORMAT = "minipulsar"


def register(spark) -> None:
    """Register the ``minipulsar`` format on ``spark`` (a ``SparkSession``), so
    that ``spark.read.format("minipulsar")`` / ``spark.readStream.format(...)``
    work.  Idempotent.  Raises ``ImportError`` when pyspark is missing."""
    from client.spark.source import MinipulsarDataSource
    spark.dataSource.register(MinipulsarDataSource)
