"""Options of the ``minipulsar`` Spark source (pure parsing, no I/O).

Names mirror Spark's Kafka source where one exists:

==========================  ==========================================================
option                      meaning
==========================  ==========================================================
``service_url``             broker, ``minipulsar://host:port`` (required; also
                            ``serviceUrl``/``service.url``)
``topics``                  comma-separated topics (``persistent://t/ns/x`` or short)
``topicsPattern``           a regex over the full names of one namespace's topics,
                            ``persistent://tenant/ns/<regex>`` (exactly one of
                            ``topics``/``topicsPattern``)
``startingOffsets``         ``earliest``, ``latest`` or JSON (see ``offsets``);
                            default ``earliest`` for batch, ``latest`` for streaming
``endingOffsets``           batch only: ``latest`` (default) or JSON
``failOnDataLoss``          ``true`` (default): fail when data the query still has to
                            read is gone (trimmed ledgers, deleted partitions) or
                            the checkpoint is ahead of a topic's last entry (a
                            recreated topic); ``false``: warn and go on (a recreated
                            topic from its first entry)
``maxOffsetsPerTrigger``    streaming: at most about this many entries per
                            micro-batch (a batched entry holds several messages)
``pollTimeoutMs``           wait for a message before checking for the range's end
                            (ms, default 200)
``readTimeoutMs``           fail a read that gets nothing for this long (ms,
                            default 120000)
``operationTimeoutMs``      broker lookups and connection (ms, default 30000)
``receiverQueueSize``       Reader prefetch (messages, default 1000)
``durableSubscription``     streaming: ``true`` keeps a durable subscription on every
                            partition at the last committed offset (pulsar-spark's
                            cursor), so retention keeps what the query has not read;
                            removed when the query stops (default ``false``)
``subscriptionPrefix``      name of that subscription (default ``spark-<random>``, new
                            for every start of the query; give one to reuse it)
==========================  ==========================================================
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from client.spark.offsets import OffsetError, parse_bool, parse_offsets_option, parse_positive_int
from client.topic_name import TopicName

__all__ = ["SourceOptions", "SourceError", "KNOWN_OPTIONS"]


class SourceError(OffsetError):
    """A clear error of the minipulsar Spark source; the message names the
    option to fix (``option 'topics': ...``)."""


_ALIASES = {"serviceurl": "service_url", "service.url": "service_url", "service_url": "service_url",
            "topic": "topics", "topics": "topics", "topicspattern": "topicsPattern",
            "startingoffsets": "startingOffsets", "endingoffsets": "endingOffsets",
            "failondataloss": "failOnDataLoss", "maxoffsetspertrigger": "maxOffsetsPerTrigger",
            "polltimeoutms": "pollTimeoutMs", "readtimeoutms": "readTimeoutMs",
            "operationtimeoutms": "operationTimeoutMs", "receiverqueuesize": "receiverQueueSize",
            "durablesubscription": "durableSubscription", "subscriptionprefix": "subscriptionPrefix"}
KNOWN_OPTIONS = tuple(sorted(set(_ALIASES.values())))
# options Spark itself may pass along with the user's
_IGNORED = {"path"}


@dataclass(frozen=True)
class SourceOptions:
    """Parsed, validated source options (see the module doc).  Build with
    ``SourceOptions.parse(options, streaming)``; plain data, picklable."""

    service_url: str
    topics: tuple[str, ...] = ()
    topics_pattern: str | None = None
    starting_offsets: object = "earliest"   # "earliest" | "latest" | {TopicPartition: spec}
    ending_offsets: object = "latest"
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    poll_timeout_ms: int = 200
    read_timeout_ms: int = 120_000
    operation_timeout_ms: int = 30_000
    receiver_queue_size: int = 1000
    durable_subscription: bool = False
    subscription_prefix: str | None = None
    raw: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def pattern_namespace(self) -> str | None:
        """``tenant/ns`` of ``topicsPattern`` (None without a pattern)."""
        if self.topics_pattern is None:
            return None
        return _split_pattern(self.topics_pattern)[0]

    @property
    def pattern_regex(self) -> "re.Pattern | None":
        """The compiled ``topicsPattern`` (matched against full topic names)."""
        if self.topics_pattern is None:
            return None
        return _split_pattern(self.topics_pattern)[1]

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> "SourceOptions":
        """Validate Spark's option map (see ``_parse``); every error is a ``SourceError``."""
        try:
            return cls._parse(options, streaming)
        except SourceError:
            raise
        except OffsetError as exc:
            raise SourceError(str(exc)) from None

    @classmethod
    def _parse(cls, options: Mapping[str, str], streaming: bool) -> "SourceOptions":
        """Validate Spark's option map (keys case-insensitive).  Raises
        ``SourceError`` naming the option: unknown option, missing
        ``service_url``, neither or both of ``topics``/``topicsPattern``, bad
        topic names or offsets, ``endingOffsets`` in a streaming query, bad numbers."""
        opts: dict[str, str] = {}
        for key, value in dict(options or {}).items():
            name = _ALIASES.get(str(key).lower())
            if name is None:
                if str(key).lower() in _IGNORED:
                    continue
                raise SourceError(f"unknown option {key!r} for format minipulsar; known options: "
                                  f"{', '.join(KNOWN_OPTIONS)}")
            opts[name] = value
        url = (opts.get("service_url") or "").strip()
        if not url:
            raise SourceError("option 'service_url' is required, e.g. .option('service_url', "
                              "'minipulsar://localhost:6600')")
        from client.connection import parse_service_url
        from client.errors import InvalidConfiguration
        try:
            parse_service_url(url)
        except InvalidConfiguration as exc:
            raise SourceError(f"option 'service_url': {exc}") from None
        topics_text, pattern = opts.get("topics"), opts.get("topicsPattern")
        if bool(topics_text and topics_text.strip()) == bool(pattern and pattern.strip()):
            raise SourceError("give exactly one of the options 'topics' (comma-separated names) or "
                              "'topicsPattern' (persistent://tenant/ns/<regex>)")
        topics: tuple[str, ...] = ()
        if topics_text and topics_text.strip():
            names = []
            for raw in topics_text.split(","):
                if not raw.strip():
                    continue
                try:
                    tn = TopicName.get(raw.strip())
                except Exception as exc:  # InvalidTopicName
                    raise SourceError(f"option 'topics': {exc}") from None
                if tn.is_partition:
                    raise SourceError(f"option 'topics': {raw.strip()!r} is one partition; give the topic "
                                      f"{str(tn.partitioned_topic_name)!r} (all its partitions are read)")
                if str(tn) not in names:
                    names.append(str(tn))
            topics = tuple(names)
        else:
            pattern = pattern.strip()
            _split_pattern(pattern)  # validate
        if streaming and opts.get("endingOffsets") is not None:
            raise SourceError("option 'endingOffsets' is for batch queries (spark.read) only; a streaming "
                              "query runs until stopped (use trigger(availableNow=True) to stop at the end)")
        for name in ("maxOffsetsPerTrigger", "durableSubscription", "subscriptionPrefix"):
            if not streaming and opts.get(name) is not None:
                raise SourceError(f"option '{name}' is for streaming queries only")
        prefix = opts.get("subscriptionPrefix")
        if prefix is not None:
            prefix = prefix.strip()
            if not prefix or "/" in prefix or prefix.startswith("pulsar.") or any(ord(c) < 32 for c in prefix):
                raise SourceError(f"option 'subscriptionPrefix': {opts.get('subscriptionPrefix')!r} is not a "
                                  f"valid subscription name (non-empty, no '/', not starting with 'pulsar.')")
        if prefix is not None and not parse_bool(opts.get("durableSubscription"), "durableSubscription", False):
            raise SourceError("option 'subscriptionPrefix' names the durable subscription: it needs "
                              "option 'durableSubscription' set to true")
        starting = parse_offsets_option(opts.get("startingOffsets"), "startingOffsets",
                                        "latest" if streaming else "earliest")
        ending = parse_offsets_option(opts.get("endingOffsets"), "endingOffsets", "latest", keywords=("latest",))
        return cls(
            service_url=url, topics=topics, topics_pattern=pattern if not topics else None,
            starting_offsets=starting, ending_offsets=ending,
            fail_on_data_loss=parse_bool(opts.get("failOnDataLoss"), "failOnDataLoss", True),
            max_offsets_per_trigger=parse_positive_int(opts.get("maxOffsetsPerTrigger"), "maxOffsetsPerTrigger",
                                                       None),
            poll_timeout_ms=parse_positive_int(opts.get("pollTimeoutMs"), "pollTimeoutMs", 200),
            read_timeout_ms=parse_positive_int(opts.get("readTimeoutMs"), "readTimeoutMs", 120_000),
            operation_timeout_ms=parse_positive_int(opts.get("operationTimeoutMs"), "operationTimeoutMs", 30_000),
            receiver_queue_size=parse_positive_int(opts.get("receiverQueueSize"), "receiverQueueSize", 1000),
            durable_subscription=parse_bool(opts.get("durableSubscription"), "durableSubscription", False),
            subscription_prefix=prefix, raw=dict(opts))


def _split_pattern(pattern: str) -> tuple[str, "re.Pattern"]:
    """``persistent://tenant/ns/<regex>`` (or ``tenant/ns/<regex>``) ->
    (``tenant/ns``, regex compiled over full names).  Raises ``SourceError``."""
    text = pattern
    if "://" in text:
        domain, _, text = text.partition("://")
        if domain != "persistent":
            raise SourceError(f"option 'topicsPattern': only persistent:// topics exist, got {pattern!r}")
    parts = text.split("/", 2)
    if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2]:
        raise SourceError(f"option 'topicsPattern': expected persistent://tenant/namespace/<regex>, "
                          f"got {pattern!r}")
    tenant, ns, regex = parts
    if any(ch in tenant + ns for ch in "*?[](){}|+\\^$"):
        raise SourceError(f"option 'topicsPattern': the tenant and namespace must be literal "
                          f"(only the topic part is a regex), got {pattern!r}")
    try:
        compiled = re.compile(f"persistent://{re.escape(tenant)}/{re.escape(ns)}/(?:{regex})")
    except re.error as exc:
        raise SourceError(f"option 'topicsPattern': invalid regex {regex!r}: {exc}") from None
    return f"{tenant}/{ns}", compiled
