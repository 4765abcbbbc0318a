"""Client-side redelivery triggers, sans-I/O (the consumer calls them with the
current time in ms and sends ``RedeliverUnacknowledged`` for what expires).

- ``UnAckedMessageTracker``: ack timeout (Pulsar's UnAckedMessageTracker): a
  message handed to the application and not acknowledged within
  ``ack_timeout_ms`` is redelivered.
- ``NegativeAcksTracker``: negative acks (Pulsar's NegativeAcksTracker): a
  negatively acknowledged message is redelivered after
  ``negative_ack_redelivery_delay_ms``.

Both keep message ids in insertion order (= deadline order, the delay being
fixed), so expiry is O(expired).  Each id maps to the entry positions to
redeliver (one, or every chunk's for a chunked message).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from client.message_id import MessageId

__all__ = ["UnAckedMessageTracker", "NegativeAcksTracker", "MIN_ACK_TIMEOUT_MS"]

MIN_ACK_TIMEOUT_MS = 1000  # Pulsar's ConsumerBuilderImpl.MIN_ACK_TIMEOUT_MILLIS


def _positions(message_id: MessageId, positions: Iterable[MessageId] | None) -> tuple[MessageId, ...]:
    return tuple(positions) if positions else (message_id.entry_id_only(),)


class _DeadlineTracker:
    def __init__(self, delay_ms: int):
        if delay_ms < 0:
            raise ValueError(f"delay must be >= 0 ms, got {delay_ms}")
        self.delay_ms = delay_ms
        self._items: OrderedDict[MessageId, tuple[int, tuple[MessageId, ...]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, message_id: MessageId) -> bool:
        return message_id in self._items

    def add(self, message_id: MessageId, now_ms: int, positions: Iterable[MessageId] | None = None) -> None:
        """Track ``message_id`` from ``now_ms`` (ms); re-adding restarts its delay.
        ``positions``: entry ids to redeliver (default: the message's entry)."""
        self._items.pop(message_id, None)
        self._items[message_id] = (now_ms + self.delay_ms, _positions(message_id, positions))

    def remove(self, message_id: MessageId) -> bool:
        """Stop tracking ``message_id``; True if it was tracked."""
        return self._items.pop(message_id, None) is not None

    def next_deadline_ms(self) -> int | None:
        """Earliest expiry time (ms), None if nothing is tracked."""
        if not self._items:
            return None
        return next(iter(self._items.values()))[0]

    def expired(self, now_ms: int) -> list[MessageId]:
        """Remove the ids whose deadline is <= ``now_ms`` and return their entry
        positions, each entry once, in order of expiry."""
        out: dict[MessageId, None] = {}
        while self._items:
            mid, (deadline, positions) = next(iter(self._items.items()))
            if deadline > now_ms:
                break
            del self._items[mid]
            for p in positions:
                out[p] = None
        return list(out)

    def clear(self) -> None:
        """Forget everything (seek, redeliver-all, close)."""
        self._items.clear()


class UnAckedMessageTracker(_DeadlineTracker):
    """Ack timeout (Pulsar's UnAckedMessageTracker).  ``ack_timeout_ms``: ms
    (Pulsar requires >= 1000; ``create_consumer`` checks).  The consumer adds a
    message when the application receives it and removes it on ack/nack."""

    def __init__(self, ack_timeout_ms: int):
        super().__init__(ack_timeout_ms)

    def remove_up_to(self, message_id: MessageId) -> int:
        """Cumulative ack: stop tracking every id <= ``message_id``; returns how many."""
        gone = [m for m in self._items if m <= message_id]
        for m in gone:
            del self._items[m]
        return len(gone)


class NegativeAcksTracker(_DeadlineTracker):
    """Negative acks (Pulsar's NegativeAcksTracker): ``delay_ms`` =
    ``negative_ack_redelivery_delay_ms``."""
