"""The ``minipulsar`` source's streaming reader (``spark.readStream``), after
Spark's Kafka ``MicroBatchStream``.

Spark calls, on the driver (a long-running Python process):
``initialOffset`` once per run when the checkpoint holds no offsets,
``latestOffset(start, limit)`` to plan each micro-batch (Spark writes the
result to the checkpoint's offset log before running the batch),
``partitions(start, end)`` to run it (also to re-run a batch the checkpoint
says was planned but not committed), ``commit(end)`` once a batch is done
and ``stop``.  Workers call ``read`` on pickled copies.

Offsets: ``client.spark.offsets`` (JSON, per partition the last entry
covered; ``nextLedger`` annotations tell a ledger read to its end from lost
data after a restart).

``startingOffsets=latest`` is resolved by the first micro-batch: the initial
offset keeps ``"latest"`` for those partitions, and the batch from it reads
nothing and ends at their last entries.  That end is in the checkpoint
before anything is read, so a restart (even before the batch committed)
starts from the same positions: Kafka's source writes its initial offsets
into the checkpoint for the same reason.  A Python data source gets no
checkpoint directory, so the offset log is the place.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Iterator, Mapping

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from client.spark.input_partitions import (MinipulsarPartition, earliest_starts, lost_message, next_ledgers,
                                           partition_range, read_input_partition, recreated_message)
from client.spark.ledgers import seed_seen
from client.spark.offsets import (EARLIEST, Position, TopicPartition, from_spark, initial_from_spark,
                                  next_ledgers_from_spark, possible_data_loss, rate_limit, resolve_offsets,
                                  start_beyond_end, starts_from_spark, to_spark, update_seen)
from client.spark.options import SourceError, SourceOptions

__all__ = ["MinipulsarStreamReader"]

log = logging.getLogger(__name__)


def _key(offset: Mapping) -> str:
    return json.dumps(offset or {}, sort_keys=True)


def _unchanged_as_given(result: dict, start: Mapping, ends: Mapping[TopicPartition, Position]) -> dict:
    """``result`` with the partitions whose position did not move written
    exactly as in ``start``, unless the new value says more (a ``nextLedger``
    learned since: the ledger closed): Spark compares offsets as JSON and runs
    a micro-batch (empty here) for any change, which is how that knowledge
    gets into the checkpoint; a ``from`` alone is no reason for one."""
    given = from_spark(start) if start else {}
    for tp, end in ends.items():
        if given.get(tp) != end:
            continue
        old = start[tp.topic][str(tp.partition)]
        new = result[tp.topic][str(tp.partition)]
        learned = new.get("nextLedger") if isinstance(new, Mapping) else None
        known = old.get("nextLedger") if isinstance(old, Mapping) else None
        if learned is None or learned == known:
            result[tp.topic][str(tp.partition)] = old
        else:
            result[tp.topic][str(tp.partition)] = {"position": str(end), "nextLedger": learned}
    return result


def _in_spark_runner() -> bool:
    """Whether this is the main thread of Spark's stream-reader process
    (``python -m pyspark.sql.streaming.python_streaming_source_runner``)."""
    import sys
    import threading
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (threading.current_thread() is threading.main_thread()
            and str(getattr(main, "name", "")).endswith("python_streaming_source_runner"))


def _ignore_sigterm() -> None:
    """While the subscriptions are deleted: a second SIGTERM must not cut it
    short (Spark's stream-reader process only)."""
    import signal
    if _in_spark_runner():
        try:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except (ValueError, OSError):
            pass


def _stop_on_sigterm() -> None:
    """Spark stops a Python stream reader's process with SIGTERM (its
    ``PythonStreamingSourceRunner.stop``), which would skip ``stop()``: make
    SIGTERM raise ``SystemExit`` instead, so the runner's ``finally:
    reader.stop()`` runs and deletes the durable subscriptions.  Only in that
    runner process; elsewhere a no-op."""
    import signal
    if not _in_spark_runner():
        return

    def on_term(signum, frame):
        # Spark sends SIGTERM twice (PythonWorkerFactory.stopWorker, then its
        # stop() destroys the same simple worker again): the second one must not
        # cut short the stop() the first one started.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)
    try:
        signal.signal(signal.SIGTERM, on_term)
    except (ValueError, OSError):
        pass


class MinipulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches between checkpointed offsets.

    Lives in a long-running Python process next to the driver; keeps a
    ``BrokerLookup`` (not pickled), per partition the ledgers seen (to tell a
    fully read trimmed ledger from lost data), the partition states of the
    last batch planned (reused by ``partitions``) and, with
    ``durableSubscription``, a ``retention.SubscriptionKeeper``.
    """

    def __init__(self, options: SourceOptions, schema: StructType):
        self.options = options
        self.schema = schema
        self._lookup = None
        self._keeper = None
        self._target: dict[TopicPartition, Position] | None = None   # Trigger.AvailableNow end
        self._seen: dict[TopicPartition, dict[int, int | None]] = {}
        self._latest: dict[TopicPartition, Position] | None = None
        self._planned: tuple[str, dict] | None = None                 # (end offset key, states) of latestOffset
        self._parent_pid = os.getppid()                                # the Spark driver (JVM) that started us

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_lookup"] = state["_keeper"] = state["_planned"] = None
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

    def _seed(self, offset: Mapping, positions: Mapping[TopicPartition, object]) -> None:
        """Learn the ``nextLedger`` annotations of a checkpointed offset."""
        for tp, nxt in next_ledgers_from_spark(offset or {}).items():
            pos = positions.get(tp)
            if isinstance(pos, Position):
                seed_seen(self._seen.setdefault(tp, {}), pos, nxt)

    def _hold(self, starts: Mapping[TopicPartition, Position]) -> None:
        """With ``durableSubscription``: a durable subscription on each partition
        from its start (``retention``)."""
        if not self.options.durable_subscription:
            return
        if self._keeper is None:
            from client.spark.retention import SubscriptionKeeper
            self._keeper = SubscriptionKeeper(self._broker(), self.options.subscription_prefix)
            self._parent_pid = os.getppid()
            _stop_on_sigterm()
        self._keeper.ensure(starts)

    def initialOffset(self) -> dict:
        """Offsets of ``startingOffsets`` (default ``latest``): earliest and
        explicit positions resolved; ``"latest"`` kept for the first micro-batch
        to resolve (see the module doc)."""
        parts, _ = self._snapshot([])
        starts = resolve_offsets(self.options.starting_offsets, parts, {tp: "latest" for tp in parts},
                                 "startingOffsets", unlisted="earliest")
        return to_spark(starts)

    def prepareForTriggerAvailableNow(self) -> None:
        """Record the current last entries: an AvailableNow query stops there."""
        parts, states = self._snapshot([])
        self._target = {tp: states[tp].last for tp in parts}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxOffsetsPerTrigger)`` (entries) when that option is set."""
        n = self.options.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def _resolve_latest(self, spec: Mapping[TopicPartition, object]) -> dict:
        """The first micro-batch from an initial offset with ``"latest"``
        partitions: it ends where it starts, with "latest" resolved to each
        partition's last entry (partitions found since: from their first)."""
        parts, states = self._snapshot([tp for tp in spec])
        resolved = {}
        for tp in parts:
            value = spec.get(tp, EARLIEST)
            resolved[tp] = states[tp].last if value == "latest" else value
        self._latest = {tp: states[tp].last for tp in parts}
        self._hold(resolved)
        result = to_spark(resolved, next_ledgers(resolved, states))
        self._planned = (_key(result), states)
        return result

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """End of the next micro-batch: each partition's last entry (capped by
        the AvailableNow target and ``limit``); new partitions start at the
        beginning.  Raises ``SourceError`` for checkpointed partitions that are
        gone or lost data (``failOnDataLoss``)."""
        opts = self.options
        spec = initial_from_spark(start or {})
        if any(value == "latest" for value in spec.values()):
            return self._resolve_latest(spec)
        starts: dict[TopicPartition, Position] = dict(spec)
        self._seed(start, starts)
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
                message = recreated_message(tp, pos, states[tp].last)
                if opts.fail_on_data_loss:
                    raise SourceError(message)
                log.warning("%s; reading the new topic from its first entry (failOnDataLoss=false)", message)
                starts[tp] = EARLIEST
            elif possible_data_loss(pos, states[tp].ledgers, self._seen.get(tp)):
                message = lost_message(tp, pos, states[tp].ledgers[0].ledger_id)
                if opts.fail_on_data_loss:
                    raise SourceError(message)
                log.warning("%s", message)
        self._hold({tp: starts.get(tp, EARLIEST) for tp in parts})
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
        result = to_spark(ends, next_ledgers(ends, states), earliest_starts(starts, ends, states))
        result = _unchanged_as_given(result, start or {}, ends)
        self._planned = (_key(result), states)
        return result

    def reportLatestOffset(self) -> dict | None:
        """The last entries seen by the latest ``latestOffset`` (for progress)."""
        return to_spark(self._latest) if self._latest else None

    def _states_for(self, end: Mapping, parts: list[TopicPartition]) -> dict:
        """The partition states ``latestOffset`` planned ``end`` with, else fresh ones."""
        if self._planned is not None and self._planned[0] == _key(end):
            return self._planned[1]
        states = self._broker().states(parts, missing_ok=True)
        for tp, st in states.items():
            update_seen(self._seen.setdefault(tp, {}), st.ledgers)
        return states

    def partitions(self, start: dict, end: dict) -> list[MinipulsarPartition]:
        """Input partitions for ``(start, end]``: one per topic partition that
        advanced, with the ledgers holding its range.  A start whose data was
        deleted meanwhile (or after a restart: the batch is re-run from the
        checkpoint; an earliest start counts as the first ledger it planned)
        fails with ``failOnDataLoss``; else it reads from the oldest entry kept,
        and a start after the partition's last entry (a recreated topic) from
        its first.  The first micro-batch of ``latest`` reads nothing."""
        opts = self.options
        spec, ends = initial_from_spark(start or {}), from_spark(end or {})
        planned_from = starts_from_spark(end or {})
        self._seed(start, spec)
        states = self._states_for(end, list(ends))
        out, begins = [], {}
        for tp, stop in ends.items():
            begin = spec.get(tp, EARLIEST)
            if begin == "latest":
                continue                      # the batch that resolves "latest" reads nothing
            if begin == EARLIEST and tp in planned_from:
                begin = planned_from[tp]      # earliest as planned: its first ledger must still be there
            state = states.get(tp)
            if state is not None and begin != EARLIEST:
                if start_beyond_end(begin, state.last):
                    message = recreated_message(tp, begin, state.last)
                    if opts.fail_on_data_loss:
                        raise SourceError(message)
                    log.warning("%s; reading the new topic from its first entry (failOnDataLoss=false)", message)
                    begin = EARLIEST
                elif possible_data_loss(begin, state.ledgers, self._seen.get(tp)):
                    message = lost_message(tp, begin, state.ledgers[0].ledger_id)
                    if opts.fail_on_data_loss:
                        raise SourceError(message)
                    log.warning("%s; reading from the oldest entry kept (failOnDataLoss=false)", message)
                    begin = EARLIEST
            begins[tp] = begin
            if stop <= begin:
                continue
            out.append(partition_range(opts, tp, begin, stop, state.ledgers if state is not None else ()))
        self._hold(begins)
        return out

    def read(self, partition: InputPartition) -> Iterator:
        """Arrow record batches of one input partition (runs in a worker)."""
        return read_input_partition(partition, self.schema)

    def commit(self, end: dict) -> None:
        """Spark finished the batch ending at ``end`` (called one batch late):
        with ``durableSubscription``, acknowledge up to it.  The checkpoint,
        not the subscription, decides what is read."""
        if self._keeper is not None:
            self._keeper.advance(from_spark(end or {}))
        log.debug("committed %s", end)

    def stop(self) -> None:
        """Delete the durable subscriptions (if any) and close the broker
        connection.  Spark's runner calls it on its way out; when the Spark
        driver died (the process that started this one is gone), the durable
        subscriptions are left for the restarted query, holding its data."""
        if self._keeper is not None:
            _ignore_sigterm()
            if os.getppid() != self._parent_pid:
                log.warning("the Spark driver is gone: keeping the durable subscription %s for the restarted "
                            "query; without a restart remove it with: minipulsar-admin topics unsubscribe TOPIC -s %s",
                            self._keeper.name, self._keeper.name)
            else:
                self._keeper.remove()
            self._keeper = None
        if self._lookup is not None:
            self._lookup.close()
            self._lookup = None
