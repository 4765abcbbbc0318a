"""Topic lookup: which broker serves a topic (Pulsar's ``BinaryProtoLookupService``).

A cluster is several brokers; each topic (each partition) is served by the
broker that owns its namespace bundle.  Any broker answers
``Lookup(topic)`` (``proto/broker.proto``):

- CONNECT with ``broker_service_url`` (``minipulsar://host:port``): open the
  topic's streams there;
- CONNECT with ``proxy_through_service_url``: keep using the connection the
  lookup went through (a standalone broker, a proxy in front of the brokers);
- REDIRECT to ``broker_service_url``: ask that broker again, with
  ``authoritative=true``, at most ``max_redirects`` times in a row (Pulsar's
  ``maxLookupRedirects``, default 20).

A broker without the Lookup RPC (UNIMPLEMENTED) is taken as
``proxy_through_service_url``: it serves every topic itself.

Pure parts, unit-tested without I/O: ``LookupRedirects`` (one lookup's
redirect chain) and ``LookupCache`` (answers per topic).  ``LookupService``
drives them through an ``ask`` function that sends one LookupRequest
(``client.client.AsyncClient`` gives it the service URL's hosts and the
connection pool).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional

from client.connection_pool import target_of
from client.errors import InvalidConfiguration, PulsarException, ServiceNotReady, Timeout
from proto import broker_pb2 as pb

__all__ = ["LookupResult", "LookupStep", "LookupRedirects", "LookupCache", "LookupService",
           "DEFAULT_MAX_LOOKUP_REDIRECTS", "AskLookup"]

log = logging.getLogger(__name__)

DEFAULT_MAX_LOOKUP_REDIRECTS = 20  # Pulsar's maxLookupRedirects


@dataclass(frozen=True)
class LookupResult:
    """Where a topic's streams go (Pulsar's lookup result: logical and physical address).

    ``target``: gRPC target ``"host:port"`` to open the streams on;
    ``broker_url``: the owner's ``minipulsar://host:port`` as the broker named it
    (``minipulsar://<target>`` when it did not); ``proxy_through_service_url``:
    True when the streams go through the connection the lookup used (a
    standalone broker, a proxy, a broker without Lookup), ``target`` then being
    that connection's host; ``redirects``: REDIRECTs followed (int >= 0).
    """

    target: str
    broker_url: str
    proxy_through_service_url: bool = False
    redirects: int = 0


# Longest wait (s) between reconnects while a looked-up owner is unreachable or refuses the
# topic: in a broker cluster that resolves when the dead owner's session expires or the new
# owner has loaded the topic, so an exponential backoff would only add its last step (up to
# one session timeout) to the failover. Reconnects after a failed lookup keep their backoff.
OWNER_MOVING_MAX_DELAY_S = 0.5


def reconnect_delay(delay: float, result: Optional[LookupResult], error: BaseException) -> float:
    """The wait before the next reconnect: ``delay`` (the backoff's, seconds), capped at
    ``OWNER_MOVING_MAX_DELAY_S`` when the lookup named an owner of a broker cluster
    (``result`` not proxy-through) that could not be reached or did not serve the topic
    (``ConnectError`` / ``ServiceNotReady``)."""
    from client.errors import ConnectError, ServiceNotReady

    if result is not None and not result.proxy_through_service_url \
            and isinstance(error, (ConnectError, ServiceNotReady)):
        return min(delay, OWNER_MOVING_MAX_DELAY_S)
    return delay


@dataclass(frozen=True)
class LookupStep:
    """The next LookupRequest of a lookup: send ``LookupRequest(topic, authoritative)``
    to ``target`` (``"host:port"``), or to any live host of the service URL when
    ``target`` is None."""

    target: Optional[str]
    authoritative: bool

    def request(self, topic: str) -> pb.LookupRequest:
        """The ``pb.LookupRequest`` of this step for ``topic``."""
        return pb.LookupRequest(topic=topic, authoritative=self.authoritative)


class LookupRedirects:
    """One lookup of ``topic``, as a pure state machine (no I/O; Pulsar's
    ``BinaryProtoLookupService.findBroker`` recursion).

    ``first_step()`` asks the service URL (not authoritative); each answer goes
    to ``on_answer(answer, via)`` (``via``: the target ``"host:port"`` that
    answered; ``answer`` None when that broker has no Lookup RPC), which returns
    the next ``LookupStep`` (a REDIRECT: ask its ``broker_service_url`` with
    ``authoritative=True``) or the final ``LookupResult``.

    ``max_redirects`` (int >= 1): REDIRECTs followed at most; one more raises
    ``ServiceNotReady`` (retriable: ownership may be moving) listing the chain
    and saying whether it loops.  An answer without a usable URL raises
    ``ServiceNotReady`` too.  ``chain``: the URLs redirected to, in order.
    """

    def __init__(self, topic: str, max_redirects: int = DEFAULT_MAX_LOOKUP_REDIRECTS):
        if not isinstance(max_redirects, int) or isinstance(max_redirects, bool) or max_redirects < 1:
            raise InvalidConfiguration(f"max_lookup_redirects must be an int >= 1, got {max_redirects!r}")
        self.topic = topic
        self.max_redirects = max_redirects
        self.redirects = 0
        self.chain: list[str] = []

    def first_step(self) -> LookupStep:
        """Ask the service URL, not authoritative."""
        return LookupStep(None, False)

    def on_answer(self, answer: Optional[pb.LookupResponse], via: str) -> "LookupStep | LookupResult":
        """Next step or final result for ``answer`` from ``via`` (see the class doc)."""
        if answer is None:  # UNIMPLEMENTED: a broker of before lookups serves every topic itself
            return LookupResult(via, f"minipulsar://{via}", True, self.redirects)
        url = answer.broker_service_url
        if answer.response == pb.LookupResponse.CONNECT:
            if answer.proxy_through_service_url:
                return LookupResult(via, url or f"minipulsar://{via}", True, self.redirects)
            return LookupResult(self._target(url, "CONNECT", via), url, False, self.redirects)
        if answer.response == pb.LookupResponse.REDIRECT:
            target = self._target(url, "REDIRECT", via)
            self.redirects += 1
            self.chain.append(url)
            if self.redirects > self.max_redirects:
                loop = len(set(self.chain)) < len(self.chain)
                raise ServiceNotReady(
                    f"lookup of {self.topic}: more than {self.max_redirects} redirects "
                    f"({' -> '.join(self.chain)})" + ("; the brokers redirect in a loop" if loop else "")
                    + "; ownership of the topic may be moving, the client retries")
            return LookupStep(target, True)
        raise ServiceNotReady(f"lookup of {self.topic}: broker {via} answered an unknown lookup type "
                              f"{answer.response}; look it up again")

    def _target(self, url: str, kind: str, via: str) -> str:
        if not url:
            raise ServiceNotReady(f"lookup of {self.topic}: broker {via} answered {kind} without a broker URL; "
                                  "look it up again")
        try:
            return target_of(url)
        except PulsarException as exc:
            raise ServiceNotReady(f"lookup of {self.topic}: broker {via} answered {kind} with a bad broker URL "
                                  f"{url!r} ({exc}); check the brokers' advertised addresses") from None


class LookupCache:
    """Lookup answers per topic (pure, no I/O): ``get``/``put``/``invalidate``.

    A topic's answer stays until ``invalidate(topic)`` (its stream failed: not
    served there any more, connection lost) or ``clear()``.
    """

    def __init__(self):
        self._results: dict[str, LookupResult] = {}

    def get(self, topic: str) -> Optional[LookupResult]:
        """The cached answer for ``topic``, or None."""
        return self._results.get(topic)

    def put(self, topic: str, result: LookupResult) -> None:
        """Remember ``result`` for ``topic``."""
        self._results[topic] = result

    def invalidate(self, topic: str) -> bool:
        """Forget ``topic``'s answer; True if there was one."""
        return self._results.pop(topic, None) is not None

    def clear(self) -> None:
        """Forget every answer."""
        self._results.clear()

    def __len__(self) -> int:
        return len(self._results)

    def __contains__(self, topic: str) -> bool:
        return topic in self._results


#: ``ask(target, request, timeout_seconds) -> (answer, via)``: send one LookupRequest to
#: ``target`` (None = any live host of the service URL), within ``timeout_seconds``;
#: ``answer`` None when the broker has no Lookup RPC, ``via`` the target that answered.
#: Raises ``PulsarException`` (``ConnectError`` when unreachable, the broker's error).
AskLookup = Callable[[Optional[str], pb.LookupRequest, float],
                     Awaitable[tuple[Optional[pb.LookupResponse], str]]]


class LookupService:
    """Topic lookups with redirects, a cache per topic and one lookup in flight
    per topic (Pulsar's ``BinaryProtoLookupService``; the I/O edge of
    ``LookupRedirects`` and ``LookupCache``).

    ``ask``: see ``AskLookup``; ``timeout_seconds``: bound of one whole lookup
    (every redirect included; Pulsar's operationTimeout); ``max_redirects``:
    see ``LookupRedirects``.  Use from one event loop.
    """

    def __init__(self, ask: AskLookup, timeout_seconds: float,
                 max_redirects: int = DEFAULT_MAX_LOOKUP_REDIRECTS):
        LookupRedirects("", max_redirects)  # validate
        self._ask = ask
        self.timeout_seconds = float(timeout_seconds)
        self.max_redirects = max_redirects
        self.cache = LookupCache()
        self._in_flight: dict[str, asyncio.Future] = {}
        self.lookups = 0  # lookups sent (not answered from the cache), for tests and stats

    async def lookup(self, topic: str) -> LookupResult:
        """Where ``topic``'s streams go: the cached answer, the answer of a lookup
        of ``topic`` already in flight, or a new lookup (cached when it succeeds).

        Raises ``ConnectError`` (no host of the service URL or redirected broker
        could be reached), ``Timeout`` (longer than ``timeout_seconds``),
        ``ServiceNotReady`` (no broker can take the topic yet, too many redirects,
        a bad answer) or the broker's error (``InvalidTopicName``, ...).
        Errors are not cached."""
        cached = self.cache.get(topic)
        if cached is not None:
            return cached
        fut = self._in_flight.get(topic)
        if fut is None:
            fut = asyncio.ensure_future(self._lookup(topic))
            self._in_flight[topic] = fut
            fut.add_done_callback(lambda f, t=topic: self._done(t, f))
        return await asyncio.shield(fut)

    def _done(self, topic: str, fut: asyncio.Future) -> None:
        if self._in_flight.get(topic) is fut:
            del self._in_flight[topic]
            if not fut.cancelled() and fut.exception() is None:
                self.cache.put(topic, fut.result())
        elif not fut.cancelled():
            fut.exception()  # an invalidated lookup: its error is nobody's (retrieved, not logged)

    def invalidate(self, topic: str) -> None:
        """Forget ``topic``'s answer (its stream failed or moved); a lookup of it in
        flight no longer fills the cache, the next ``lookup`` asks again."""
        self.cache.invalidate(topic)
        self._in_flight.pop(topic, None)

    def cached(self, topic: str) -> Optional[LookupResult]:
        """The cached answer for ``topic`` without looking it up (None if none)."""
        return self.cache.get(topic)

    def close(self) -> None:
        """Cancel lookups in flight and forget every answer."""
        for fut in list(self._in_flight.values()):
            fut.cancel()
        self._in_flight.clear()
        self.cache.clear()

    async def _lookup(self, topic: str) -> LookupResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_seconds
        redirects = LookupRedirects(topic, self.max_redirects)
        step: LookupStep | LookupResult = redirects.first_step()
        self.lookups += 1
        while isinstance(step, LookupStep):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise Timeout(f"lookup of {topic} took more than {self.timeout_seconds:g} s "
                              f"({redirects.redirects} redirects)")
            answer, via = await self._ask(step.target, step.request(topic), remaining)
            step = redirects.on_answer(answer, via)
        if step.redirects or not step.proxy_through_service_url:
            log.debug("[%s] lookup: served by %s%s", topic, step.broker_url,
                     f" after {step.redirects} redirects" if step.redirects else "")
        return step
