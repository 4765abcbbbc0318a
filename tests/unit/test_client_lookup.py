"""The pure parts of the client's topic lookup (client.lookup, Pulsar's
BinaryProtoLookupService) and of the service URL's host choice
(client.connection_pool.ServiceNameResolver): redirect chains, the
authoritative flag, the redirect limit and loops, proxy-through answers,
brokers without Lookup, the answer cache and its invalidation, one lookup in
flight per topic.  ``LookupService`` is driven by a scripted ``ask`` function
(no gRPC); the real client against real brokers is in
tests/integration/test_client_lookup.py."""
from __future__ import annotations

import asyncio

import pytest

from client.connection_pool import ServiceNameResolver
from client.errors import ConnectError, InvalidConfiguration, ServiceNotReady, Timeout, TopicNotFound
from client.lookup import (DEFAULT_MAX_LOOKUP_REDIRECTS, LookupCache, LookupRedirects, LookupResult, LookupService,
                           LookupStep)
from proto import broker_pb2 as pb
from proto.service_url import parse_service_url

T = "persistent://public/default/t"
CONNECT, REDIRECT = pb.LookupResponse.CONNECT, pb.LookupResponse.REDIRECT


def connect(url: str, proxy: bool = False) -> pb.LookupResponse:
    return pb.LookupResponse(response=CONNECT, broker_service_url=url, proxy_through_service_url=proxy)


def redirect(url: str) -> pb.LookupResponse:
    return pb.LookupResponse(response=REDIRECT, broker_service_url=url, authoritative=True)


# ------------------------------------------------------------------ LookupRedirects
def test_first_step_asks_the_service_url_not_authoritative():
    step = LookupRedirects(T).first_step()
    assert step == LookupStep(None, False)
    assert step.request(T) == pb.LookupRequest(topic=T, authoritative=False)


def test_connect_goes_to_the_named_broker():
    result = LookupRedirects(T).on_answer(connect("minipulsar://b2:7001"), "svc:6600")
    assert result == LookupResult("b2:7001", "minipulsar://b2:7001", False, 0)


def test_proxy_through_keeps_the_connection_that_answered():
    """A standalone broker (or a proxy): its own URL would bypass the proxy, so the
    streams go where the lookup went."""
    result = LookupRedirects(T).on_answer(connect("minipulsar://127.0.0.1:9999", proxy=True), "proxy:1234")
    assert result.target == "proxy:1234" and result.proxy_through_service_url
    assert result.broker_url == "minipulsar://127.0.0.1:9999"


def test_broker_without_lookup_is_proxy_through():
    result = LookupRedirects(T).on_answer(None, "old:6600")
    assert result == LookupResult("old:6600", "minipulsar://old:6600", True, 0)


def test_redirect_chain_is_followed_with_authoritative_requests():
    lr = LookupRedirects(T)
    step = lr.on_answer(redirect("minipulsar://b1:1"), "svc:6600")
    assert step == LookupStep("b1:1", True) and step.request(T).authoritative
    step = lr.on_answer(redirect("minipulsar://b2:2"), "b1:1")
    assert step == LookupStep("b2:2", True)
    result = lr.on_answer(connect("minipulsar://b3:3"), "b2:2")
    assert result == LookupResult("b3:3", "minipulsar://b3:3", False, 2)
    assert lr.chain == ["minipulsar://b1:1", "minipulsar://b2:2"]


def test_proxy_through_after_a_redirect_connects_to_the_redirected_broker():
    lr = LookupRedirects(T)
    lr.on_answer(redirect("minipulsar://b1:1"), "svc:6600")
    result = lr.on_answer(connect("", proxy=True), "b1:1")
    assert result.target == "b1:1" and result.proxy_through_service_url and result.redirects == 1


def test_redirect_limit_is_pulsars_default_and_inclusive():
    assert DEFAULT_MAX_LOOKUP_REDIRECTS == 20
    lr = LookupRedirects(T)
    for i in range(20):
        assert isinstance(lr.on_answer(redirect(f"minipulsar://b{i}:1"), "x:1"), LookupStep)
    with pytest.raises(ServiceNotReady) as e:
        lr.on_answer(redirect("minipulsar://b20:1"), "x:1")
    assert "more than 20 redirects" in str(e.value) and "loop" not in str(e.value)
    assert e.value.retriable


def test_redirect_loop_is_a_clear_retriable_error():
    lr = LookupRedirects(T, max_redirects=3)
    urls = ["minipulsar://a:1", "minipulsar://b:1"] * 2
    for url in urls[:3]:
        lr.on_answer(redirect(url), "x:1")
    with pytest.raises(ServiceNotReady) as e:
        lr.on_answer(redirect(urls[3]), "x:1")
    text = str(e.value)
    assert "more than 3 redirects" in text and "redirect in a loop" in text
    assert "minipulsar://a:1 -> minipulsar://b:1 -> minipulsar://a:1 -> minipulsar://b:1" in text
    assert T in text


@pytest.mark.parametrize("answer,hint", [
    (connect(""), "CONNECT without a broker URL"), (redirect(""), "REDIRECT without a broker URL"),
    (connect("pulsar://b:6650"), "bad broker URL"), (redirect("minipulsar://b:0"), "bad broker URL"),
    (pb.LookupResponse(response=7, broker_service_url="minipulsar://b:1"), "unknown lookup type"),
])
def test_unusable_answers_are_retriable_errors(answer, hint):
    with pytest.raises(ServiceNotReady) as e:
        LookupRedirects(T).on_answer(answer, "svc:1")
    assert hint in str(e.value) and "svc:1" in str(e.value)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "20", True])
def test_max_redirects_must_be_a_positive_int(bad):
    with pytest.raises(InvalidConfiguration, match="max_lookup_redirects"):
        LookupRedirects(T, bad)


# ------------------------------------------------------------------ LookupCache
def test_cache_put_get_invalidate_clear():
    cache = LookupCache()
    r = LookupResult("b:1", "minipulsar://b:1")
    assert cache.get(T) is None and T not in cache
    cache.put(T, r)
    assert cache.get(T) is r and T in cache and len(cache) == 1
    assert cache.invalidate(T) and not cache.invalidate(T)
    cache.put(T, r)
    cache.put(T + "2", r)
    cache.clear()
    assert len(cache) == 0


# ------------------------------------------------------------------ LookupService (scripted ask)
class ScriptedAsk:
    """``ask`` answering from ``script[(target, topic)]``: a list of answers
    (LookupResponse, None = UNIMPLEMENTED, or an exception to raise) consumed in
    order, the last one repeating.  Records every (target, topic, authoritative)."""

    def __init__(self, script: dict, service_host: str = "svc:6600", delay: float = 0.0):
        self.script = {k: list(v) for k, v in script.items()}
        self.service_host = service_host
        self.delay = delay
        self.asked: list[tuple] = []

    async def __call__(self, target, request, timeout):
        self.asked.append((target, request.topic, request.authoritative))
        if self.delay:
            await asyncio.sleep(self.delay)
        answers = self.script[(target, request.topic)]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer, target or self.service_host


async def test_service_follows_redirects_and_caches_the_answer():
    ask = ScriptedAsk({(None, T): [redirect("minipulsar://b1:1")],
                       ("b1:1", T): [redirect("minipulsar://b2:2")],
                       ("b2:2", T): [connect("minipulsar://b2:2")]})
    service = LookupService(ask, timeout_seconds=5)
    result = await service.lookup(T)
    assert result == LookupResult("b2:2", "minipulsar://b2:2", False, 2)
    assert ask.asked == [(None, T, False), ("b1:1", T, True), ("b2:2", T, True)]
    assert await service.lookup(T) is result and len(ask.asked) == 3   # from the cache
    assert service.cached(T) is result and service.lookups == 1


async def test_invalidate_makes_the_next_lookup_ask_again():
    ask = ScriptedAsk({(None, T): [connect("minipulsar://b1:1"), connect("minipulsar://b2:2")]})
    service = LookupService(ask, timeout_seconds=5)
    assert (await service.lookup(T)).target == "b1:1"
    service.invalidate(T)
    assert service.cached(T) is None
    assert (await service.lookup(T)).target == "b2:2"
    assert len(ask.asked) == 2


async def test_errors_are_not_cached():
    ask = ScriptedAsk({(None, T): [ConnectError("refused"), ServiceNotReady("no owner yet"),
                                   connect("minipulsar://b:1")]})
    service = LookupService(ask, timeout_seconds=5)
    with pytest.raises(ConnectError):
        await service.lookup(T)
    with pytest.raises(ServiceNotReady):
        await service.lookup(T)
    assert (await service.lookup(T)).target == "b:1"


async def test_the_brokers_error_propagates():
    ask = ScriptedAsk({(None, T): [TopicNotFound("no namespace")]})
    with pytest.raises(TopicNotFound, match="no namespace"):
        await LookupService(ask, timeout_seconds=5).lookup(T)


async def test_redirected_broker_without_lookup_serves_the_topic():
    ask = ScriptedAsk({(None, T): [redirect("minipulsar://old:1")], ("old:1", T): [None]})
    result = await LookupService(ask, timeout_seconds=5).lookup(T)
    assert result == LookupResult("old:1", "minipulsar://old:1", True, 1)


async def test_a_redirect_loop_fails_after_max_redirects():
    ask = ScriptedAsk({(None, T): [redirect("minipulsar://a:1")], ("a:1", T): [redirect("minipulsar://b:1")],
                       ("b:1", T): [redirect("minipulsar://a:1")]})
    service = LookupService(ask, timeout_seconds=5, max_redirects=5)
    with pytest.raises(ServiceNotReady, match="redirect in a loop"):
        await service.lookup(T)
    assert len(ask.asked) == 6 and all(auth for _, _, auth in ask.asked[1:])
    assert service.cached(T) is None


async def test_concurrent_lookups_of_one_topic_share_one_request():
    ask = ScriptedAsk({(None, T): [connect("minipulsar://b:1")], (None, T + "2"): [connect("minipulsar://c:1")]},
                      delay=0.05)
    service = LookupService(ask, timeout_seconds=5)
    results = await asyncio.gather(*(service.lookup(T) for _ in range(5)), service.lookup(T + "2"))
    assert {r.target for r in results[:5]} == {"b:1"} and results[5].target == "c:1"
    assert len(ask.asked) == 2


async def test_invalidate_during_a_lookup_keeps_its_answer_out_of_the_cache():
    ask = ScriptedAsk({(None, T): [connect("minipulsar://stale:1"), connect("minipulsar://fresh:1")]}, delay=0.05)
    service = LookupService(ask, timeout_seconds=5)
    first = asyncio.ensure_future(service.lookup(T))
    await asyncio.sleep(0.01)
    service.invalidate(T)             # e.g. the stream that asked failed meanwhile
    assert (await first).target == "stale:1"
    assert service.cached(T) is None
    assert (await service.lookup(T)).target == "fresh:1"


async def test_a_cancelled_caller_does_not_cancel_the_shared_lookup():
    ask = ScriptedAsk({(None, T): [connect("minipulsar://b:1")]}, delay=0.05)
    service = LookupService(ask, timeout_seconds=5)
    waiter = asyncio.ensure_future(service.lookup(T))
    other = asyncio.ensure_future(service.lookup(T))
    await asyncio.sleep(0.01)
    waiter.cancel()
    assert (await other).target == "b:1"
    assert service.cached(T).target == "b:1" and len(ask.asked) == 1


async def test_the_whole_lookup_is_bounded_by_the_timeout():
    ask = ScriptedAsk({(None, T): [redirect("minipulsar://a:1")], ("a:1", T): [redirect("minipulsar://a:1")]},
                      delay=0.03)
    with pytest.raises(Timeout, match="lookup of .* took more than 0.1 s"):
        await LookupService(ask, timeout_seconds=0.1).lookup(T)


# ------------------------------------------------------------------ ServiceNameResolver
def test_resolver_sticks_to_a_live_host_and_moves_on_when_it_fails():
    resolver = ServiceNameResolver(parse_service_url("minipulsar://a:1,b:2,c:3"))
    assert resolver.current == "a:1" and resolver.candidates() == ["a:1", "b:2", "c:3"]
    resolver.mark_failed("a:1")
    assert resolver.current == "b:2" and resolver.candidates() == ["b:2", "c:3", "a:1"]
    resolver.mark_failed("a:1")           # not current: nothing changes
    assert resolver.current == "b:2"
    resolver.mark_failed("b:2")
    resolver.mark_failed("c:3")           # wraps around
    assert resolver.current == "a:1"
    resolver.mark_ok("c:3")
    assert resolver.current == "c:3"
    resolver.mark_ok("z:9")               # unknown: ignored
    assert resolver.current == "c:3"


def test_resolver_of_a_single_host_url():
    resolver = ServiceNameResolver(parse_service_url("minipulsar://h:7"))
    resolver.mark_failed("h:7")
    assert resolver.current == "h:7" and resolver.candidates() == ["h:7"]


def test_reconnect_delay_is_capped_only_while_a_cluster_owner_moves():
    from client.errors import ConnectError, ServiceNotReady, TopicNotFound
    from client.lookup import OWNER_MOVING_MAX_DELAY_S, LookupResult, reconnect_delay

    owner = LookupResult(target="127.0.0.1:1", broker_url="minipulsar://127.0.0.1:1")
    standalone = LookupResult(target="127.0.0.1:1", broker_url="minipulsar://127.0.0.1:1",
                              proxy_through_service_url=True)
    assert reconnect_delay(6.4, owner, ConnectError("refused")) == OWNER_MOVING_MAX_DELAY_S
    assert reconnect_delay(6.4, owner, ServiceNotReady("not served here")) == OWNER_MOVING_MAX_DELAY_S
    assert reconnect_delay(0.1, owner, ConnectError("refused")) == 0.1
    # a standalone, a failed lookup, another error: the backoff as it is
    assert reconnect_delay(6.4, standalone, ConnectError("refused")) == 6.4
    assert reconnect_delay(6.4, None, ConnectError("no broker answers")) == 6.4
    assert reconnect_delay(6.4, owner, TopicNotFound("gone")) == 6.4
    assert reconnect_delay(6.4, owner, None) == 6.4
