"""Consumer of several topics or partitions (Pulsar's MultiTopicsConsumerImpl
and PatternMultiTopicsConsumerImpl): one ``ConsumerImpl`` per topic partition,
all feeding one receive queue.

- a partitioned topic: one child per partition; message ids carry the
  partition index (and the partition's name, as ``TopicMessageId``);
- a list of topics: each expanded the same way;
- a pattern: the namespace's topics (partitions listed individually) whose
  parent name matches, rediscovered every ``pattern_auto_discovery_period``
  seconds (new topics subscribed, vanished ones closed).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import re

from client.consumer_base import ConsumerBase
from client.consumer_config import ConsumerConfig
from client.consumer_impl import ConsumerImpl, random_consumer_name
from client.dead_letter import DeadLetterPublisher
from client.errors import AlreadyClosed, InvalidConfiguration, PulsarException
from client.message_id import MessageId
from client.receiver_queue import ReceiverQueue
from client.topic_name import TopicName

__all__ = ["MultiTopicsConsumer", "pattern_namespace", "topics_matching"]

log = logging.getLogger(__name__)
MAX_TOTAL_RECEIVER_QUEUE_SIZE_ACROSS_PARTITIONS = 50000  # Pulsar's default


def _strip_scheme(text: str) -> str:
    return text.split("://", 1)[1] if "://" in text else text


def pattern_namespace(pattern: re.Pattern) -> tuple[str, re.Pattern]:
    """``(tenant/namespace, regex over 'tenant/namespace/topic')`` of a topics
    pattern.  A pattern without a namespace (``"orders-.*"``) means
    ``public/default``.  Raises ``InvalidConfiguration`` for a pattern whose
    namespace part is itself a regex."""
    text = _strip_scheme(pattern.pattern)
    parts = text.split("/")
    if len(parts) == 1:
        text = f"public/default/{text}"
        parts = text.split("/")
    if len(parts) < 3 or not re.fullmatch(r"[-=:.\w]+", parts[0]) or not re.fullmatch(r"[-=:.\w]+", parts[1]):
        raise InvalidConfiguration(f"topics pattern {pattern.pattern!r} must look like "
                                   f"'persistent://tenant/namespace/<regex>'")
    return f"{parts[0]}/{parts[1]}", re.compile(text, pattern.flags)


def topics_matching(topics: list[str], regex: re.Pattern) -> list[str]:
    """The names in ``topics`` (full names, partitions individually) whose
    partitioned-parent name (without ``persistent://``) fully matches
    ``regex``, sorted (Pulsar's TopicList.filterTopics)."""
    out = []
    for t in topics:
        try:
            name = TopicName.get(t)
        except PulsarException:
            continue
        if regex.fullmatch(_strip_scheme(str(name.partitioned_topic_name))):
            out.append(str(name))
    return sorted(set(out))


class MultiTopicsConsumer(ConsumerBase):
    """Same API as ``Consumer`` over several topics/partitions; built by ``create_consumer``.

    ``topics``: full topic names (partitioned ones are expanded), or
    ``pattern``: a compiled regex (see ``pattern_namespace``).
    """

    def __init__(self, client, conf: ConsumerConfig, topics: list[str] | None = None,
                 pattern: re.Pattern | None = None):
        super().__init__(client, conf)
        if (topics is None) == (pattern is None):
            raise InvalidConfiguration("give either topics or a pattern")
        self._topics = topics
        self._pattern = pattern
        self._namespace, self._regex = pattern_namespace(pattern) if pattern is not None else (None, None)
        self._queue = ReceiverQueue()
        self._children: dict[str, ConsumerImpl] = {}
        self._dead_letters: dict[str, DeadLetterPublisher] = {}
        self._name = conf.consumer_name or random_consumer_name()
        self._discovery_task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    # -- children ------------------------------------------------------------------------
    async def _expand(self, topic: str) -> list[str]:
        name = TopicName.get(topic)
        if name.is_partition:
            return [str(name)]
        n = await self._client.get_partitioned_topic_metadata(str(name))
        return [str(name.partition(i)) for i in range(n)] if n > 0 else [str(name)]

    async def _discover(self) -> list[str]:
        return topics_matching(await self._client.get_topics_of_namespace(self._namespace), self._regex)

    def _child_conf(self, count: int) -> ConsumerConfig:
        size = max(1, min(self._conf.receiver_queue_size,
                          MAX_TOTAL_RECEIVER_QUEUE_SIZE_ACROSS_PARTITIONS // max(1, count)))
        return dataclasses.replace(self._conf, receiver_queue_size=size, consumer_name=self._name)

    async def _add(self, names: list[str], total: int) -> None:
        conf = self._child_conf(total)
        created = []
        for name in names:
            dead_letter = None
            if conf.dead_letter_policy is not None:
                parent = str(TopicName.get(name).partitioned_topic_name)
                dead_letter = self._dead_letters.get(parent)
                if dead_letter is None:
                    dead_letter = self._dead_letters[parent] = DeadLetterPublisher(
                        self._client, conf.dead_letter_policy, parent, conf.subscription_name)
            created.append(ConsumerImpl(self._client, name, conf, partition=TopicName.get(name).partition_index,
                                        queue=self._queue, topic_in_ids=True, dead_letter=dead_letter,
                                        on_failed=self._child_failed))
        results = await asyncio.gather(*(c.start() for c in created), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(c.close(flush=False) for c, r in zip(created, results)
                                   if not isinstance(r, BaseException)), return_exceptions=True)
            raise errors[0]
        for c in created:
            self._children[c.topic] = c

    def _child_failed(self, child: ConsumerImpl, exc: PulsarException) -> None:
        log.error("[%s] consumer of %s stopped: %s", self._conf.subscription_name, child.topic, exc)
        if self._pattern is None and all(c.failed is not None for c in self._children.values()):
            self._queue.close(exc)

    async def _start(self) -> None:
        if self._pattern is not None:
            names = await self._discover()
        else:
            names = [n for t in self._topics for n in await self._expand(t)]
        await self._add(list(dict.fromkeys(names)), len(names))
        if self._pattern is not None:
            self._discovery_task = asyncio.get_running_loop().create_task(self._discovery_loop())

    async def _discovery_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._conf.pattern_auto_discovery_period)
            try:
                await self.recheck_topics()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - try again next period
                log.warning("[%s] topics discovery for %s failed: %s", self._conf.subscription_name,
                            self._pattern.pattern, e)

    async def recheck_topics(self) -> None:
        """Pattern consumers: subscribe to new matching topics and close the
        consumers of topics that vanished (run periodically; callable directly)."""
        if self._pattern is None or self._closed:
            return
        async with self._lock:
            found = set(await self._discover())
            new = sorted(found - set(self._children))
            gone = set(self._children) - found
            for name in gone:
                await self._children.pop(name).close()
            if new:
                log.info("[%s] pattern %s: subscribing to %s", self._conf.subscription_name, self._pattern.pattern, new)
                await self._add(new, len(found))

    def _impls(self) -> list:
        return list(self._children.values())

    def _impl_for_id(self, mid: MessageId) -> ConsumerImpl:
        topic = getattr(mid, "topic", "")
        if topic and topic in self._children:
            return self._children[topic]
        if mid.partition >= 0:
            matches = [c for c in self._children.values() if c.partition == mid.partition]
            if len(matches) == 1:
                return matches[0]
        raise InvalidConfiguration(f"cannot tell which topic message id {mid} belongs to; acknowledge the "
                                   f"Message or the message id it carries (a TopicMessageId)")

    # -- API -------------------------------------------------------------------------------
    def topic(self) -> str:
        """The pattern, or the topic names joined with ',' (partitioned topics by their parent name)."""
        if self._pattern is not None:
            return self._pattern.pattern
        return ",".join(self._topics)

    def topics(self) -> list[str]:
        """Names of the topics/partitions currently consumed, sorted."""
        return sorted(self._children)

    def consumer_name(self) -> str:
        """The name shared by every child consumer."""
        return self._name

    def is_active(self) -> bool:
        """True if the broker dispatches to this consumer on at least one partition."""
        return any(c.active for c in self._children.values())

    async def seek(self, target: MessageId | int) -> None:
        """A publish time (ms) or ``MessageId.earliest``/``latest``: every
        child; a message id: the child it belongs to.  Raises like
        ``Consumer.seek`` and ``InvalidConfiguration`` for an id of no child."""
        if self._closed:
            raise AlreadyClosed("consumer is closed")
        if isinstance(target, MessageId) and target not in (MessageId.earliest, MessageId.latest):
            await self._impl_for_id(target).seek(target)
            return
        await asyncio.gather(*(c.seek(target) for c in self._children.values()))

    async def unsubscribe(self) -> None:
        """Unsubscribe every child, then close."""
        if self._closed:
            raise AlreadyClosed("consumer is closed")
        await asyncio.gather(*(c.unsubscribe() for c in self._children.values()))
        await self.close()

    async def close(self) -> None:
        """Close every child (flushing acks) and the dead-letter producers.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._client._unregister(self)
        except Exception:  # noqa: BLE001
            pass
        if self._discovery_task is not None:
            self._discovery_task.cancel()
        await asyncio.gather(*(c.close() for c in self._children.values()), return_exceptions=True)
        self._queue.close()
        for dl in self._dead_letters.values():
            await dl.close()
