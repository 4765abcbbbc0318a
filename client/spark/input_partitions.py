"""Input partitions of the ``minipulsar`` Spark source, shared by the batch
reader (``client.spark.source``) and the streaming reader
(``client.spark.stream``): Spark's ``InputPartition`` for one topic
partition's range of entries (as Spark's Kafka source plans one
``KafkaSourceRDDPartition`` per topic partition's offset range), reading it
in a worker, the ``from`` / ``nextLedger`` annotations of planned offsets,
and the ``failOnDataLoss`` texts.

Its own module so that ``source`` and ``stream`` both import it and
``stream`` does not import ``source`` (which creates the stream reader).
"""
from __future__ import annotations

from typing import Iterator

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from client.spark.ledgers import next_ledger_after, plan_ledgers
from client.spark.offsets import EARLIEST, Position, TopicPartition
from client.spark.options import SourceOptions
from client.spark.partition_reader import PartitionRange, read_partition

__all__ = ["MinipulsarPartition", "arrow_schema", "read_input_partition", "partition_range", "earliest_starts",
           "next_ledgers", "recreated_message", "lost_message"]


class MinipulsarPartition(InputPartition):
    """One Spark input partition: a ``PartitionRange`` (picklable)."""

    def __init__(self, value: PartitionRange):
        super().__init__(value)


def arrow_schema(schema: StructType):
    """The Arrow schema of Spark ``schema`` (timestamps in UTC): what ``read_input_partition`` yields record batches of."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone="UTC")


def read_input_partition(partition: InputPartition, schema: StructType) -> Iterator:
    """Arrow record batches of one input partition (a ``DataSourceReader.read``, in a
    worker): ``partition_reader.read_partition`` of its ``PartitionRange``; nothing for
    Spark's placeholder partition.  Raises what ``read_partition`` raises (``SourceError``)."""
    value = getattr(partition, "value", None)
    if not isinstance(value, PartitionRange):
        return iter(())   # Spark's placeholder partition when there is nothing to read
    return read_partition(value, arrow_schema(schema))


def partition_range(options: SourceOptions, tp: TopicPartition, start: Position, end: Position,
                    ledgers=()) -> MinipulsarPartition:
    """The input partition reading ``(start, end]`` of ``tp`` with ``options``' reader
    settings; ``ledgers``: the partition's ``LedgerInfo``s, planned down to those holding
    the range (``ledgers.plan_ledgers``)."""
    return MinipulsarPartition(PartitionRange(
        service_url=options.service_url, tp=tp, start=start, end=end, fail_on_data_loss=options.fail_on_data_loss,
        poll_timeout_ms=options.poll_timeout_ms, read_timeout_ms=options.read_timeout_ms,
        operation_timeout_ms=options.operation_timeout_ms, receiver_queue_size=options.receiver_queue_size,
        ledgers=plan_ledgers(start, end, ledgers)))


def earliest_starts(starts, ends, states) -> dict[TopicPartition, Position]:
    """For the partitions whose batch starts at earliest and reads something:
    "before entry 0 of the first ledger holding entries" (``(ledger, -1)``),
    recorded with the end (``offsets.to_spark``'s ``from``)."""
    out = {}
    for tp, end in ends.items():
        state = states.get(tp)
        if starts.get(tp, EARLIEST) != EARLIEST or end == EARLIEST or state is None:
            continue
        first = next((li.ledger_id for li in state.ledgers if li.entries > 0), None)
        if first is not None and first <= end.ledger_id:
            out[tp] = Position(first, -1)
    return out


def next_ledgers(ends, states) -> dict[TopicPartition, int]:
    """The ``nextLedger`` annotation of each end that is the last entry of a closed ledger."""
    out = {}
    for tp, end in ends.items():
        state = states.get(tp)
        nxt = next_ledger_after(end, state.ledgers) if state is not None else None
        if nxt is not None:
            out[tp] = nxt
    return out


def recreated_message(tp: TopicPartition, start: Position, last: Position) -> str:
    """``failOnDataLoss`` text: checkpointed ``start`` is after the partition's ``last`` entry."""
    return (f"option 'failOnDataLoss': the checkpointed position {start} of {tp.topic} partition {tp.partition} "
            f"is after its last entry {last if last != EARLIEST else '(none: the topic is empty)'}, so the topic was "
            f"deleted and recreated since the checkpoint was written and resuming would skip its entries up to "
            f"{start}; delete the checkpoint directory to start over from startingOffsets, or set "
            f"failOnDataLoss=false to read the new topic from its first entry")


def lost_message(tp: TopicPartition, start: Position, first_ledger: int) -> str:
    """``failOnDataLoss`` text: entries after ``start`` may be gone (oldest ledger kept: ``first_ledger``)."""
    return (f"option 'failOnDataLoss': entries of {tp.topic} partition {tp.partition} after {start} may have "
            f"been deleted before being read (the oldest ledger kept is now {first_ledger}); Readers do not hold "
            f"data, so set a retention policy on the namespace; set failOnDataLoss=false to continue from the "
            f"oldest entry kept")
