"""The ``minipulsar`` PySpark data source (``pyspark.sql.datasource``, Spark >= 4.0).

::

    from client.spark import register
    register(spark)
    df = (spark.read.format("minipulsar")
          .option("service_url", "minipulsar://localhost:6600")
          .option("topics", "persistent://geo/flights/departures")
          .option("startingOffsets", "earliest").option("endingOffsets", "latest")
          .load())
    stream = spark.readStream.format("minipulsar").option(...).load()

Options: see ``client.spark.options``; offsets: ``client.spark.offsets``; the
streaming reader: ``client.spark.stream``; the input partitions both readers
plan: ``client.spark.input_partitions``.

Rows (``SCHEMA``): ``topic`` (the topic, not the partition's name),
``partition`` (index, -1 when not partitioned), ``message_id``
(``"ledger:entry:partition:batch_index"``), ``key`` (partition key or null),
``value`` (payload bytes), ``properties`` (map), ``publish_time``,
``event_time`` (timestamps, null when the producer set none),
``producer_name``, ``replicated_from`` (cluster, null when published locally),
``redelivery_count``.

How it reads: the driver asks the broker for each partition's last entry
(``latestOffset``) and plans one input partition per topic partition with a
non-empty range, with the ledgers that hold it; each range is read in a
Python worker with a Reader (non-durable cursor, see ``partition_reader``),
which checks that no planned entry was deleted before it was read.  Spark's
checkpoint holds the offsets, so a restarted query resumes exactly after the
last committed micro-batch: nothing lost, nothing repeated.
``Trigger.AvailableNow`` reads up to the offsets at the query's start
(``SupportsTriggerAvailableNow``), in several micro-batches with
``maxOffsetsPerTrigger``.

``startingOffsets=latest`` (the streaming default) is resolved once, by the
first micro-batch, which reads nothing and ends at the partitions' last
entries: Spark writes that end into the checkpoint before running the batch,
so a query restarted before its first batch committed starts from the same
positions (as Kafka's source writes its initial offsets into the checkpoint;
a Python data source has no other place in the checkpoint).

Reads only keep their data while the broker keeps it: a Reader does not hold
ledgers, so give the namespace a retention policy
(``minipulsar-admin namespaces set-retention``) longer than a query may lag,
or set ``durableSubscription=true`` (``retention``).
"""
from __future__ import annotations

import logging
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (BinaryType, IntegerType, MapType, StringType, StructField, StructType,
                               TimestampType)

from client.spark.input_partitions import MinipulsarPartition, lost_message, partition_range, read_input_partition
from client.spark.offsets import EARLIEST, possible_data_loss, resolve_offsets
from client.spark.options import SourceError, SourceOptions

__all__ = ["FORMAT", "SCHEMA", "MinipulsarDataSource", "MinipulsarBatchReader", "MinipulsarPartition"]

log = logging.getLogger(__name__)

FORMAT = "minipulsar"

SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("message_id", StringType()),
    StructField("key", StringType()),
    StructField("value", BinaryType()),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("publish_time", TimestampType()),
    StructField("event_time", TimestampType()),
    StructField("producer_name", StringType()),
    StructField("replicated_from", StringType()),
    StructField("redelivery_count", IntegerType()),
])


class MinipulsarDataSource(DataSource):
    """The ``minipulsar`` format: ``spark.read`` / ``spark.readStream``
    ``.format("minipulsar")``.  Option errors surface as ``SourceError`` text
    naming the option (inside Spark's exception)."""

    @classmethod
    def name(cls) -> str:
        """The format name, ``"minipulsar"``."""
        return FORMAT

    def schema(self) -> StructType:
        """The fixed row schema (``SCHEMA``)."""
        return SCHEMA

    def reader(self, schema: StructType) -> "MinipulsarBatchReader":
        """Batch reader (``spark.read``)."""
        return MinipulsarBatchReader(SourceOptions.parse(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType):
        """Streaming reader (``spark.readStream``): ``stream.MinipulsarStreamReader``."""
        from client.spark.stream import MinipulsarStreamReader
        return MinipulsarStreamReader(SourceOptions.parse(self.options, streaming=True), schema)


class MinipulsarBatchReader(DataSourceReader):
    """``spark.read``: reads ``(startingOffsets, endingOffsets]`` of every
    partition once.  ``partitions()`` runs on the driver (one broker lookup per
    partition); ``read()`` in workers."""

    def __init__(self, options: SourceOptions, schema: StructType):
        self.options = options
        self.schema = schema

    def partitions(self) -> list[MinipulsarPartition]:
        """One input partition per topic partition with entries to read.  Raises
        ``SourceError`` (unknown topic, unreachable broker, offsets naming a
        partition that does not exist, an end beyond the last entry, lost data
        with ``failOnDataLoss``)."""
        from client.spark.lookup import BrokerLookup
        opts = self.options
        with BrokerLookup(opts) as lookup:
            parts = lookup.discover()
            if not parts:
                raise SourceError(f"option 'topicsPattern': no topic matches {opts.topics_pattern}")
            states = lookup.states(parts)
        latest = {tp: st.last for tp, st in states.items()}
        starts = resolve_offsets(opts.starting_offsets, parts, latest, "startingOffsets", unlisted="earliest")
        ends = resolve_offsets(opts.ending_offsets, parts, latest, "endingOffsets", unlisted="latest")
        out = []
        for tp in parts:
            start, end, state = starts[tp], ends[tp], states[tp]
            if start > end:
                shown = end if end != EARLIEST else "(earliest: the topic is empty)"
                raise SourceError(f"option 'startingOffsets': {start} of {tp.topic} partition {tp.partition} is "
                                  f"after its endingOffsets {shown}; a batch query reads (startingOffsets, "
                                  f"endingOffsets] and the start must not be after the end")
            if end > state.last:
                raise SourceError(f"option 'endingOffsets': {end} is beyond the last entry {state.last} of "
                                  f"{tp.topic} partition {tp.partition}")
            if possible_data_loss(start, state.ledgers):
                if opts.fail_on_data_loss:
                    raise SourceError(lost_message(tp, start, state.ledgers[0].ledger_id))
                log.warning("%s", lost_message(tp, start, state.ledgers[0].ledger_id))
                start = EARLIEST
            if end > start:
                out.append(partition_range(opts, tp, start, end, state.ledgers))
        return out

    def read(self, partition: InputPartition) -> Iterator:
        """Arrow record batches of one input partition (runs in a worker)."""
        return read_input_partition(partition, self.schema)
