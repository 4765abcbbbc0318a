"""The streaming source's optional durable subscription (option
``durableSubscription``), as StreamNative's pulsar-spark connector keeps one.

A Reader's non-durable cursor does not hold data: retention deletes the
ledgers nobody durable still needs, read or not (``failOnDataLoss`` then
reports the loss).  With the option on, the driver keeps one durable
subscription per topic partition, named by ``subscriptionPrefix`` (default
``spark-<random>``):

* created at the start of the first micro-batch the query plans for the
  partition (everything after it unacknowledged), or moved there when a
  subscription of that name is left by an earlier run;
* moved to each batch's end when Spark commits the batch (``commit``), so
  retention may delete what the query has processed, and only that;
* deleted when the query stops.  A driver that dies leaves it behind, still
  holding the data after the last commit: a query restarted with the same
  ``subscriptionPrefix`` takes it over (moved to its checkpoint); otherwise
  ``minipulsar-admin topics subscriptions TOPIC`` lists it and
  ``minipulsar-admin topics unsubscribe TOPIC -s NAME`` removes it.

The subscription does not decide what is read: the checkpoint does.
"""
from __future__ import annotations

import logging
import uuid
from typing import Mapping

from client.spark.offsets import Position, TopicPartition

__all__ = ["SubscriptionKeeper"]

log = logging.getLogger(__name__)


class SubscriptionKeeper:
    """Durable subscriptions named ``name`` (default ``spark-<random>``) on the
    partitions a streaming query reads, through ``lookup`` (a
    ``lookup.BrokerLookup``).  Methods are blocking; broker errors of
    ``ensure``/``advance`` propagate as ``SourceError``/``PulsarException``."""

    def __init__(self, lookup, name: str | None = None):
        self.lookup = lookup
        self.name = name or f"spark-{uuid.uuid4().hex[:8]}"
        self.held: dict[TopicPartition, Position] = {}

    def ensure(self, starts: Mapping[TopicPartition, Position]) -> None:
        """Hold every partition of ``starts`` that is not held yet, from its
        start (exclusive)."""
        for tp, start in starts.items():
            if tp in self.held:
                continue
            created = self.lookup.create_subscription(tp, self.name, start)
            self.held[tp] = start
            log.info("%s durable subscription %s on %s partition %d at %s", "created" if created else "moved",
                     self.name, tp.topic, tp.partition, start)

    def advance(self, ends: Mapping[TopicPartition, Position]) -> None:
        """Acknowledge up to each committed end (forward only)."""
        for tp, end in ends.items():
            if tp in self.held and end > self.held[tp]:
                self.lookup.move_subscription(tp, self.name, end)
                self.held[tp] = end

    def remove(self) -> None:
        """Delete the subscriptions held (best effort: a failure is logged with
        the admin command that removes the leftover)."""
        for tp in list(self.held):
            try:
                self.lookup.remove_subscription(tp, self.name)
            except Exception as exc:  # noqa: BLE001 - stopping anyway
                log.warning("could not delete the durable subscription %s of %s partition %d (%s); remove it "
                            "with: minipulsar-admin topics unsubscribe %s -s %s", self.name, tp.topic,
                            tp.partition, exc, tp.topic, self.name)
            self.held.pop(tp, None)
