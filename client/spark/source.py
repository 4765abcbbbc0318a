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

Options: see ``client.spark.options``; offsets: ``client.spark.offsets``.

Rows (``SCHEMA``): ``topic`` (the topic, not the partition's name),
``partition`` (index, -1 when not partitioned), ``message_id``
(``"ledger:entry:partition:batch_index"``), ``key`` (partition key or null),
``value`` (payload bytes), ``properties`` (map), ``publish_time``,
``event_time`` (timestamps, null when the producer set none),
``producer_name``, ``replicated_from`` (cluster, null when published locally),
``redelivery_count``.

How it reads: the driver asks the broker for each partition's last entry
(``latestOffset``) and plans one input partition per topic partition with a
non-empty range; each range is read in a Python worker with a Reader
(non-durable cursor, see ``partition_reader``).  Spark's checkpoint holds the
offsets (no broker cursor does), so a restarted query resumes exactly after
the last committed micro-batch: nothing lost, nothing repeated.
``Trigger.AvailableNow`` reads up to the offsets at the query's start
(``SupportsTriggerAvailableNow``), in several micro-batches with
``maxOffsetsPerTrigger``.

Reads only keep their data while the broker keeps it: a Reader does not hold
ledgers, so give the namespace a retention policy
(``minipulsar-admin namespaces set-retention``) longer than a query may lag.
"""
from __future__ import annotations

import logging
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (BinaryType, IntegerType, MapType, StringType, StructField, StructType,
                               TimestampType)

from client.spark.offsets import (EARLIEST, Position, TopicPartition, from_spark, possible_data_loss, rate_limit,
                                  resolve_offsets, start_beyond_end, to_spark, update_seen)
from client.spark.options import SourceError, SourceOptions
from client.spark.partition_reader import PartitionRange, read_partition

__all__ = ["FORMAT", "SCHEMA", "MinipulsarDataSource", "MinipulsarBatchReader", "MinipulsarStreamReader",
           "MinipulsarPartition"]

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


class MinipulsarPartition(InputPartition):
    """One Spark input partition: a ``PartitionRange`` (picklable)."""

    def __init__(self, value: PartitionRange):
        super().__init__(value)


def _arrow_schema(schema: StructType):
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone="UTC")


def _read(partition: InputPartition, schema: StructType) -> Iterator:
    value = getattr(partition, "value", None)
    if not isinstance(value, PartitionRange):
        return iter(())   # Spark's placeholder partition when there is nothing to read
    return read_partition(value, _arrow_schema(schema))


def _range(options: SourceOptions, tp: TopicPartition, start: Position, end: Position) -> MinipulsarPartition:
    return MinipulsarPartition(PartitionRange(
        service_url=options.service_url, tp=tp, start=start, end=end, fail_on_data_loss=options.fail_on_data_loss,
        poll_timeout_ms=options.poll_timeout_ms, read_timeout_ms=options.read_timeout_ms,
        operation_timeout_ms=options.operation_timeout_ms, receiver_queue_size=options.receiver_queue_size))


def _recreated_message(tp: TopicPartition, start: Position, last: Position) -> str:
    return (f"option 'failOnDataLoss': the checkpointed position {start} of {tp.topic} partition {tp.partition} "
            f"is after its last entry {last if last != EARLIEST else '(none: the topic is empty)'}, so the topic was "
            f"deleted and recreated since the checkpoint was written and resuming would skip its entries up to "
            f"{start}; delete the checkpoint directory to start over from startingOffsets, or set "
            f"failOnDataLoss=false to read the new topic from its first entry")


def _lost_message(tp: TopicPartition, start: Position, first_ledger: int) -> str:
    return (f"option 'failOnDataLoss': entries of {tp.topic} partition {tp.partition} after {start} may have "
            f"been deleted before being read (the oldest ledger kept is now {first_ledger}); Readers do not hold "
            f"data, so set a retention policy on the namespace; set failOnDataLoss=false to continue from the "
            f"oldest entry kept")


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

    def streamReader(self, schema: StructType) -> "MinipulsarStreamReader":
        """Streaming reader (``spark.readStream``)."""
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
            if end > state.last:
                raise SourceError(f"option 'endingOffsets': {end} is beyond the last entry {state.last} of "
                                  f"{tp.topic} partition {tp.partition}")
            if possible_data_loss(start, state.ledgers):
                if opts.fail_on_data_loss:
                    raise SourceError(_lost_message(tp, start, state.ledgers[0].ledger_id))
                log.warning("%s", _lost_message(tp, start, state.ledgers[0].ledger_id))
                start = EARLIEST
            if end > start:
                out.append(_range(opts, tp, start, end))
        return out

    def read(self, partition: InputPartition) -> Iterator:
        """Arrow record batches of one input partition (runs in a worker)."""
        return _read(partition, self.schema)


class MinipulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches between checkpointed offsets.

    Lives in a long-running Python process next to the driver; keeps a
    ``BrokerLookup`` (not pickled) and, per partition, the ledgers seen (to
    tell a fully read trimmed ledger from lost data).
    """

    def __init__(self, options: SourceOptions, schema: StructType):
        self.options = options
        self.schema = schema
        self._lookup = None
        self._target: dict[TopicPartition, Position] | None = None   # Trigger.AvailableNow end
        self._seen: dict[TopicPartition, dict[int, int | None]] = {}
        self._latest: dict[TopicPartition, Position] | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_lookup"] = None
        return state

    def _broker(self):
        if self._lookup is None:
            from client.spark.lookup import BrokerLookup
            self._lookup = BrokerLookup(self.options)
        return self._lookup

    def _snapshot(self, known: list[TopicPartition]) -> tuple[list[TopicPartition], dict]:
        """Current partitions (discovered, plus ``known`` ones still existing)
        and their states; partitions of ``known`` that are gone are absent."""
        broker = self._broker()
        parts = broker.discover()
        wanted = list(dict.fromkeys([*parts, *known]))
        states = broker.states(wanted, missing_ok=True)
        for tp, st in states.items():
            update_seen(self._seen.setdefault(tp, {}), st.ledgers)
        return [tp for tp in wanted if tp in states], states

    def initialOffset(self) -> dict:
        """Offsets of ``startingOffsets`` (default ``latest``) resolved now."""
        parts, states = self._snapshot([])
        latest = {tp: states[tp].last for tp in parts}
        starts = resolve_offsets(self.options.starting_offsets, parts, latest, "startingOffsets",
                                 unlisted="earliest")
        return to_spark(starts)

    def prepareForTriggerAvailableNow(self) -> None:
        """Record the current last entries: an AvailableNow query stops there."""
        parts, states = self._snapshot([])
        self._target = {tp: states[tp].last for tp in parts}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxOffsetsPerTrigger)`` (entries) when that option is set."""
        n = self.options.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """End of the next micro-batch: each partition's last entry (capped by
        the AvailableNow target and ``limit``); new partitions start at the
        beginning.  Raises ``SourceError`` for checkpointed partitions that are
        gone or lost data (``failOnDataLoss``)."""
        opts = self.options
        starts = from_spark(start or {})
        parts, states = self._snapshot(list(starts))
        for tp in starts:
            if tp not in states:
                message = (f"option 'failOnDataLoss': {tp.topic} partition {tp.partition} is in the checkpointed "
                           f"offsets but no longer exists")
                if opts.fail_on_data_loss:
                    raise SourceError(message + "; set failOnDataLoss=false to go on without it")
                log.warning("%s; dropping it (failOnDataLoss=false)", message)
        starts = {tp: pos for tp, pos in starts.items() if tp in states}
        for tp, pos in list(starts.items()):
            if start_beyond_end(pos, states[tp].last):
                message = _recreated_message(tp, pos, states[tp].last)
                if opts.fail_on_data_loss:
                    raise SourceError(message)
                log.warning("%s; reading the new topic from its first entry (failOnDataLoss=false)", message)
                starts[tp] = EARLIEST
            elif possible_data_loss(pos, states[tp].ledgers, self._seen.get(tp)):
                message = _lost_message(tp, pos, states[tp].ledgers[0].ledger_id)
                if opts.fail_on_data_loss:
                    raise SourceError(message)
                log.warning("%s", message)
        ends: dict[TopicPartition, Position] = {}
        for tp in parts:
            begin = starts.get(tp, EARLIEST)
            end = max(states[tp].last, begin)
            if self._target is not None:
                end = max(begin, min(end, self._target.get(tp, begin)))
            ends[tp] = end
        self._latest = {tp: states[tp].last for tp in parts}
        if isinstance(limit, ReadMaxRows) and limit.max_rows > 0:
            ends = rate_limit(starts, ends, {tp: states[tp].ledgers for tp in parts}, limit.max_rows)
        return to_spark(ends)

    def reportLatestOffset(self) -> dict | None:
        """The last entries seen by the latest ``latestOffset`` (for progress)."""
        return to_spark(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> list[MinipulsarPartition]:
        """Input partitions for ``(start, end]``: one per topic partition that
        advanced.  With ``failOnDataLoss=false``, a start whose data may be gone
        reads from the oldest entry kept, and a start after the partition's last
        entry (a recreated topic) from its first."""
        starts, ends = from_spark(start or {}), from_spark(end or {})
        out = []
        for tp, stop in ends.items():
            begin = starts.get(tp, EARLIEST)
            if not self.options.fail_on_data_loss and begin != EARLIEST:
                try:
                    state = self._broker().states([tp], missing_ok=True).get(tp)
                except SourceError:
                    state = None
                if state is not None and (start_beyond_end(begin, state.last) or possible_data_loss(
                        begin, state.ledgers, self._seen.get(tp))):
                    begin = EARLIEST
            if stop <= begin:
                continue
            out.append(_range(self.options, tp, begin, stop))
        return out

    def read(self, partition: InputPartition) -> Iterator:
        """Arrow record batches of one input partition (runs in a worker)."""
        return _read(partition, self.schema)

    def commit(self, end: dict) -> None:
        """Spark finished the batch ending at ``end`` (called one batch late).
        Nothing to do: the checkpoint, not a broker cursor, is the truth."""
        log.debug("committed %s", end)

    def stop(self) -> None:
        """Close the broker connection."""
        if self._lookup is not None:
            self._lookup.close()
            self._lookup = None
