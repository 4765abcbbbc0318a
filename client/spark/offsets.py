"""Offsets of the ``minipulsar`` Spark source: pure logic, no I/O.

An offset names, for every topic partition the query reads, the position of
the **last entry covered** (``"ledger:entry"``):

* as a *start* (``startingOffsets``, or the end of the previous micro-batch)
  it is exclusive: reading resumes with the entry after it, like a Pulsar
  Reader's default ``start_message_id``;
* as an *end* (``endingOffsets``, the ``latestOffset`` of a micro-batch) it is
  inclusive: every message of that entry is read, like the id that
  ``get_last_message_id`` returns.

So the end of one batch is literally the start of the next, and an offset
copied from a query's progress can be given back as ``startingOffsets``.
Positions are entry positions: all the messages of a batched entry are read
in the same micro-batch.  ``-1:-1`` (``EARLIEST``) means "nothing read yet".

Spark stores offsets as JSON.  The JSON form (also accepted by the
``startingOffsets``/``endingOffsets`` options, mirroring Spark's Kafka source)
is ``{"<topic>": {"<partition>": "<ledger>:<entry>"}}`` where ``<partition>``
is the partition index, ``"-1"`` for a non-partitioned topic.  In the options a
position may also be ``"earliest"`` or ``"latest"``, and short topic names
(``my-topic``, ``tenant/ns/topic``) are accepted.

The source may write a partition's value as an object with the position and
what a restarted query needs to judge lost data (ledger history is otherwise
only in the driver's memory): ``{"position": "<ledger>:<entry>", "nextLedger":
<id>}`` when the entry is the last one of a closed ledger (the ledger that
followed it: "read to the end of a ledger that retention deleted since" is
then not mistaken for lost entries, see ``possible_data_loss``), and
``"from": "<ledger>:-1"`` on the end of a micro-batch that started at
``earliest`` (the first ledger it planned to read: a re-run of the batch
after a restart fails with ``failOnDataLoss`` if that ledger is gone).  Both
forms are accepted everywhere.

``maxOffsetsPerTrigger`` counts entries (the offsets' unit): a helper here
splits that budget across partitions in proportion to their backlog, knowing
each partition's ledgers (``(ledger_id, entries)`` pairs from the broker's
internal stats).
"""
from __future__ import annotations

import json
import math
from typing import Iterable, Mapping, NamedTuple, Union

from client.errors import InvalidTopicName
from client.topic_name import TopicName

__all__ = ["OffsetError", "Position", "EARLIEST", "TopicPartition", "LedgerInfo", "parse_position",
           "parse_offsets_option", "resolve_offsets", "to_spark", "from_spark", "next_ledgers_from_spark",
           "starts_from_spark", "initial_from_spark", "count_entries", "advance", "rate_limit",
           "possible_data_loss", "update_seen", "partition_topic_name", "parse_bool", "parse_positive_int"]


class OffsetError(ValueError):
    """Bad offsets or options; the message names the option to fix."""


class Position(NamedTuple):
    """An entry position ``(ledger_id, entry_id)``; ordered like Pulsar's
    PositionImpl.  ``(L, -1)`` is "before entry 0 of ledger L"."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


EARLIEST = Position(-1, -1)


class TopicPartition(NamedTuple):
    """A partition of a subscribed topic: the full (parent) topic name and the
    partition index, -1 for a non-partitioned topic."""

    topic: str
    partition: int


class LedgerInfo(NamedTuple):
    """One ledger of a partition's managed ledger: id and number of entries."""

    ledger_id: int
    entries: int


PositionSpec = Union[Position, str]           # a Position, "earliest" or "latest"
OffsetSpec = Union[str, dict]                 # "earliest" | "latest" | {TopicPartition: PositionSpec}


def partition_topic_name(tp: TopicPartition) -> str:
    """The topic to open a Reader on: ``<topic>-partition-N``, or the topic itself
    when ``tp.partition`` is -1."""
    return tp.topic if tp.partition < 0 else f"{tp.topic}-partition-{tp.partition}"


def parse_position(text, option: str, where: str = "") -> Position:
    """Parse ``"ledger:entry"`` (or a full message id ``"ledger:entry:partition:-1"``)
    into a ``Position``.  A message id inside a batch (batch index >= 0) is
    refused: offsets are entry positions.  Raises ``OffsetError`` naming
    ``option`` (and ``where``, e.g. the topic partition)."""
    at = f" for {where}" if where else ""
    if isinstance(text, Position):
        return text
    if not isinstance(text, str):
        raise OffsetError(f"option '{option}': position{at} must be a string 'ledger:entry', "
                          f"'earliest' or 'latest', got {text!r}")
    parts = text.strip().split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (2, 4):
        raise OffsetError(f"option '{option}': invalid position {text!r}{at}; expected 'ledger:entry' "
                          f"(e.g. '12:345'), 'earliest' or 'latest'")
    if len(numbers) == 4 and numbers[3] != -1:
        raise OffsetError(f"option '{option}': {text!r}{at} is a message inside a batch entry; offsets are "
                          f"entry positions ('{numbers[0]}:{numbers[1]}' covers the whole entry)")
    ledger_id, entry_id = numbers[0], numbers[1]
    if (ledger_id, entry_id) != tuple(EARLIEST) and (ledger_id < 0 or entry_id < -1):
        raise OffsetError(f"option '{option}': invalid position {text!r}{at}: ledger must be >= 0 and "
                          f"entry >= -1 (or '-1:-1' for the beginning)")
    return Position(ledger_id, entry_id)


def _normalize_topic(name: str, option: str) -> str:
    try:
        tn = TopicName.get(name)
    except InvalidTopicName as exc:
        raise OffsetError(f"option '{option}': {exc}") from None
    if tn.is_partition:
        raise OffsetError(f"option '{option}': give the topic {str(tn.partitioned_topic_name)!r} with "
                          f"partition {tn.partition_index}, not the partition's own name {name!r}")
    return str(tn)


def parse_offsets_option(value: str | None, option: str, default: str,
                         keywords: Iterable[str] = ("earliest", "latest")) -> OffsetSpec:
    """Parse the ``startingOffsets``/``endingOffsets`` option.

    ``value``: None (-> ``default``), one of ``keywords`` (case-insensitive) or
    JSON ``{"topic": {"partition": "ledger:entry" | "earliest" | "latest"}}``.
    Returns the keyword or ``{TopicPartition: Position | "earliest" | "latest"}``
    with full topic names.  Raises ``OffsetError`` naming ``option``.
    """
    keywords = tuple(keywords)
    if value is None or not str(value).strip():
        return default
    text = str(value).strip()
    if text.lower() in keywords:
        return text.lower()
    if not text.startswith("{"):
        raise OffsetError(f"option '{option}': expected {' or '.join(repr(k) for k in keywords)} or JSON like "
                          f"{{\"persistent://public/default/t\": {{\"0\": \"12:345\"}}}}, got {text!r}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OffsetError(f"option '{option}': invalid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise OffsetError(f"option '{option}': JSON must map each topic to {{\"partition\": \"ledger:entry\"}}")
    out: dict[TopicPartition, PositionSpec] = {}
    for topic, partitions in data.items():
        full = _normalize_topic(topic, option)
        for key, pos in partitions.items():
            try:
                index = int(key)
            except (TypeError, ValueError):
                index = -2
            if index < -1:
                raise OffsetError(f"option '{option}': partition {key!r} of {full} must be an index "
                                  f"('0', '1', ...; '-1' for a non-partitioned topic)")
            where = f"{full} partition {index}"
            if isinstance(pos, Mapping) and "position" in pos:
                pos = pos["position"]          # a value copied from a checkpoint (see the module doc)
            if isinstance(pos, str) and pos.strip().lower() in keywords:
                out[TopicPartition(full, index)] = pos.strip().lower()
            elif isinstance(pos, str) and pos.strip().lower() in ("earliest", "latest"):
                raise OffsetError(f"option '{option}': {pos!r} is not allowed here ({where})")
            else:
                out[TopicPartition(full, index)] = parse_position(pos, option, where)
    return out


def resolve_offsets(spec: OffsetSpec, partitions: Iterable[TopicPartition],
                    latest: Mapping[TopicPartition, Position], option: str,
                    unlisted: str = "earliest") -> dict[TopicPartition, Position]:
    """Turn a parsed option into concrete positions for ``partitions``.

    ``latest``: each partition's last entry (``EARLIEST`` when empty);
    partitions missing from a JSON spec get ``unlisted``.  A JSON spec naming a
    topic or partition that is not read raises ``OffsetError`` naming
    ``option``.
    """
    partitions = list(partitions)
    wanted = set(partitions)

    def concrete(tp: TopicPartition, value: PositionSpec) -> Position:
        if value == "earliest":
            return EARLIEST
        if value == "latest":
            return latest[tp]
        return value

    if isinstance(spec, str):
        return {tp: concrete(tp, spec) for tp in partitions}
    topics = {tp.topic for tp in partitions}
    for tp in spec:
        if tp.topic not in topics:
            raise OffsetError(f"option '{option}': topic {tp.topic} is not one of the topics read "
                              f"({', '.join(sorted(topics)) or 'none'})")
        if tp not in wanted:
            have = sorted(p.partition for p in partitions if p.topic == tp.topic)
            kind = (f"has partitions 0..{max(have)}" if have and have[0] >= 0 else "is not partitioned (use '-1')")
            raise OffsetError(f"option '{option}': partition {tp.partition} of {tp.topic} does not exist "
                              f"(the topic {kind})")
    return {tp: concrete(tp, spec.get(tp, unlisted)) for tp in partitions}


def to_spark(offsets: Mapping[TopicPartition, Position], next_ledgers: Mapping[TopicPartition, int] | None = None,
             starts: Mapping[TopicPartition, Position] | None = None) -> dict[str, dict]:
    """``{TopicPartition: Position}`` -> the JSON-able dict Spark checkpoints
    (``{"topic": {"partition": "ledger:entry"}}``), keys sorted.  A partition
    in ``next_ledgers`` (its position is the last entry of a closed ledger;
    the value is the id of the ledger after it) or in ``starts`` (the batch
    ending here started at earliest, resolved to that position) is written as
    ``{"position": "ledger:entry", "nextLedger": id, "from": "ledger:-1"}``
    (see the module doc)."""
    out: dict[str, dict] = {}
    for tp in sorted(offsets):
        value: object = str(offsets[tp])
        extra = {}
        if next_ledgers and next_ledgers.get(tp) is not None:
            extra["nextLedger"] = int(next_ledgers[tp])
        if starts and starts.get(tp) is not None:
            extra["from"] = str(starts[tp])
        if extra:
            value = {"position": value, **extra}
        out.setdefault(tp.topic, {})[str(tp.partition)] = value
    return out


def _spark_items(data, option: str):
    """``(TopicPartition, raw value)`` of a checkpointed offset (dict or JSON string)."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise OffsetError(f"{option}: invalid JSON ({exc.msg})") from None
    if not isinstance(data, Mapping):
        raise OffsetError(f"{option}: expected an object, got {type(data).__name__}")
    for topic, partitions in data.items():
        if not isinstance(partitions, Mapping):
            raise OffsetError(f"{option}: topic {topic!r} must map partitions to positions")
        for key, pos in partitions.items():
            try:
                index = int(key)
            except (TypeError, ValueError):
                raise OffsetError(f"{option}: invalid partition {key!r} of {topic}") from None
            yield TopicPartition(topic, index), pos


def from_spark(data: Mapping, option: str = "checkpointed offsets") -> dict[TopicPartition, Position]:
    """Inverse of ``to_spark`` (also accepts a JSON string; ``nextLedger``
    annotations are dropped: see ``next_ledgers_from_spark``).  Raises
    ``OffsetError`` naming ``option`` on a malformed value."""
    out: dict[TopicPartition, Position] = {}
    for tp, pos in _spark_items(data, option):
        if isinstance(pos, Mapping):
            pos = pos.get("position")
        out[tp] = parse_position(pos, option, f"{tp.topic} partition {tp.partition}")
    return out


def next_ledgers_from_spark(data: Mapping, option: str = "checkpointed offsets") -> dict[TopicPartition, int]:
    """The ``nextLedger`` annotations of a checkpointed offset: ``{TopicPartition:
    ledger id}`` for the partitions whose position is the last entry of a closed
    ledger.  Raises ``OffsetError`` like ``from_spark``."""
    out: dict[TopicPartition, int] = {}
    for tp, pos in _spark_items(data, option):
        if isinstance(pos, Mapping) and pos.get("nextLedger") is not None:
            try:
                out[tp] = int(pos["nextLedger"])
            except (TypeError, ValueError):
                raise OffsetError(f"{option}: invalid nextLedger {pos['nextLedger']!r} of {tp.topic} partition "
                                  f"{tp.partition}") from None
    return out


def starts_from_spark(data: Mapping, option: str = "checkpointed offsets") -> dict[TopicPartition, Position]:
    """The ``from`` annotations of a checkpointed end offset: ``{TopicPartition:
    Position}`` for the partitions whose micro-batch started at earliest.
    Raises ``OffsetError`` like ``from_spark``."""
    out: dict[TopicPartition, Position] = {}
    for tp, pos in _spark_items(data, option):
        if isinstance(pos, Mapping) and pos.get("from") is not None:
            out[tp] = parse_position(pos["from"], option, f"{tp.topic} partition {tp.partition} (from)")
    return out


def initial_from_spark(data: Mapping, option: str = "initial offsets") -> dict[TopicPartition, "Position | str"]:
    """Like ``from_spark``, but a partition may also be ``"latest"``: the
    streaming source's initial offset before "latest" is resolved (by the
    first micro-batch, whose end the checkpoint keeps; see ``source``)."""
    out: dict[TopicPartition, Position | str] = {}
    for tp, pos in _spark_items(data, option):
        if isinstance(pos, str) and pos.strip().lower() == "latest":
            out[tp] = "latest"
        else:
            out[tp] = from_spark({tp.topic: {str(tp.partition): pos}}, option)[tp]
    return out


def _sorted_ledgers(ledgers: Iterable[LedgerInfo]) -> list[LedgerInfo]:
    return sorted((LedgerInfo(int(lid), int(n)) for lid, n in ledgers), key=lambda li: li.ledger_id)


def count_entries(after: Position, upto: Position, ledgers: Iterable[LedgerInfo]) -> int:
    """Number of entries ``p`` with ``after < p <= upto`` among ``ledgers``
    (``(ledger_id, entries)``; entries of a ledger are ``0..entries-1``)."""
    total = 0
    for lid, n in _sorted_ledgers(ledgers):
        if n <= 0 or lid < after.ledger_id or lid > upto.ledger_id:
            continue
        first = after.entry_id + 1 if lid == after.ledger_id else 0
        last = min(n - 1, upto.entry_id) if lid == upto.ledger_id else n - 1
        if last >= first:
            total += last - first + 1
    return total


def advance(after: Position, n: int, ledgers: Iterable[LedgerInfo], upto: Position | None = None) -> Position:
    """The position of the ``n``-th entry after ``after`` (exclusive), never past
    ``upto`` nor past the last known entry; ``after`` itself when ``n <= 0`` or
    nothing follows."""
    result = after
    if n <= 0:
        return result
    for lid, count in _sorted_ledgers(ledgers):
        if count <= 0 or lid < after.ledger_id:
            continue
        first = after.entry_id + 1 if lid == after.ledger_id else 0
        last = count - 1
        if upto is not None:
            if lid > upto.ledger_id:
                break
            if lid == upto.ledger_id:
                last = min(last, upto.entry_id)
        available = last - first + 1
        if available <= 0:
            continue
        if n <= available:
            return Position(lid, first + n - 1)
        n -= available
        result = Position(lid, last)
    return result


def rate_limit(starts: Mapping[TopicPartition, Position], ends: Mapping[TopicPartition, Position],
               ledgers: Mapping[TopicPartition, Iterable[LedgerInfo]], max_entries: int) -> dict[TopicPartition, Position]:
    """Cap a micro-batch at about ``max_entries`` entries (``maxOffsetsPerTrigger``).

    Like Spark's Kafka source: each partition gets a share proportional to its
    backlog (rounded down, but at least one entry when it has a backlog, so
    the query always progresses).  Partitions missing from ``starts`` start at
    ``EARLIEST``.  Returns the new ends (each between its start and end).
    """
    if max_entries <= 0:
        raise ValueError("max_entries must be > 0")
    backlog = {tp: count_entries(starts.get(tp, EARLIEST), end, ledgers.get(tp, ())) for tp, end in ends.items()}
    total = sum(backlog.values())
    if total <= max_entries:
        return dict(ends)
    out: dict[TopicPartition, Position] = {}
    for tp, end in ends.items():
        start = starts.get(tp, EARLIEST)
        size = backlog[tp]
        if size == 0:
            out[tp] = end
            continue
        share = max_entries * size / total
        take = min(size, math.ceil(share) if share < 1 else math.floor(share))
        out[tp] = advance(start, take, ledgers.get(tp, ()), end)
    return out


def possible_data_loss(start: Position, ledgers: Iterable[LedgerInfo],
                       seen: Mapping[int, int | None] | None = None) -> bool:
    """Whether entries after ``start`` may have been deleted (retention trimmed
    the ledger it points into) before being read.

    ``ledgers``: the partition's current ledgers (oldest retained first).
    ``seen``: ledgers observed earlier, ``{ledger_id: entries}`` for ledgers
    seen closed (final size) and ``{ledger_id: None}`` for one seen open; it
    tells "read to the end of a trimmed ledger" (no loss) from "trimmed unread
    entries".  When unsure, answers True (possible loss).
    """
    if start == EARLIEST:
        return False
    current = _sorted_ledgers(ledgers)
    if not current or start.ledger_id >= current[0].ledger_id:
        return False
    first = current[0].ledger_id
    seen = dict(seen or {})
    size = seen.get(start.ledger_id)
    if size is None or size - 1 > start.entry_id:
        return True
    later = sorted(lid for lid in seen if lid > start.ledger_id)
    if not later:
        return True  # never saw start's successor: a ledger may have come and gone
    for lid in later:
        if lid >= first:
            return False
        if seen[lid] is None or seen[lid] > 0:
            return True  # a trimmed ledger held (or may have held) entries
    return True


def start_beyond_end(start: Position, last: Position) -> bool:
    """Whether a checkpointed ``start`` (the last entry read) lies after the
    partition's ``last`` entry (``EARLIEST`` when empty).

    Positions never go back within one topic (retention trims the head, not
    the tail), so this means the topic was deleted and recreated with ledger
    ids starting over (e.g. ``geo down --purge`` wiped the metadata store): the
    checkpoint belongs to an earlier incarnation, and resuming at ``start``
    would silently skip the new topic's entries up to it.
    """
    return start != EARLIEST and start > last


def update_seen(seen: dict[int, int | None], ledgers: Iterable[LedgerInfo], limit: int = 1000) -> None:
    """Record a snapshot of a partition's ledgers into ``seen`` (see
    ``possible_data_loss``): every ledger but the last is closed (final size),
    the last one may still grow (None unless already known closed).  Keeps at
    most ``limit`` ledgers (the newest)."""
    current = _sorted_ledgers(ledgers)
    for i, (lid, n) in enumerate(current):
        if i < len(current) - 1:
            seen[lid] = n
        else:
            seen.setdefault(lid, None)
    if len(seen) > limit:
        for lid in sorted(seen)[:len(seen) - limit]:
            del seen[lid]


def parse_bool(value, option: str, default: bool) -> bool:
    """``"true"``/``"false"`` (any case) -> bool; None -> ``default``.  Raises
    ``OffsetError`` naming ``option``."""
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OffsetError(f"option '{option}': expected true or false, got {value!r}")


def parse_positive_int(value, option: str, default: int | None) -> int | None:
    """A positive integer option; None -> ``default``.  Raises ``OffsetError``."""
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number <= 0:
        raise OffsetError(f"option '{option}': expected a positive integer, got {value!r}")
    return number
