"""``/admin/v2/persistent/{tenant}/{namespace}[/{topic}[/...]]`` (Pulsar's
``PersistentTopicsBase``): list, ``partitioned``; create (PUT), delete;
``partitions`` (PUT create partitioned, POST grow, GET metadata, DELETE);
``stats``, ``partitioned-stats``, ``internalStats``, ``subscriptions``,
``subscription/{s}`` (PUT create, DELETE), ``.../resetcursor[/{timestamp}]``,
``.../skip/{n}``, ``.../skip_all``, ``lastMessageId``, ``unload``. A verb on a
topic another broker of the cluster owns is redirected there (307, with
``authoritative=true``), as Pulsar's ``validateTopicOwnership`` does."""
from __future__ import annotations

from aiohttp import web

from proto.errors import InvalidArgument

from .edge import json_response, no_content, read_json, run_verb

routes = web.RouteTableDef()
NS = "/admin/v2/persistent/{tenant}/{namespace}"
T = NS + "/{topic}"
SUB = T + "/subscription/{subscription}"


def _ns(request: web.Request) -> str:
    return f"{request.match_info['tenant']}/{request.match_info['namespace']}"


def _topic(request: web.Request) -> str:
    return f"persistent://{_ns(request)}/{request.match_info['topic']}"


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


def _message_id(body) -> str:
    """``"ledger:entry"`` of Pulsar's MessageIdImpl JSON (``{"ledgerId", "entryId"}``)."""
    if not isinstance(body, dict) or not all(isinstance(body.get(k), int) and not isinstance(body.get(k), bool)
                                             for k in ("ledgerId", "entryId")):
        raise InvalidArgument('the body must be a MessageId: {"ledgerId": N, "entryId": N}')
    return f"{body['ledgerId']}:{body['entryId']}"


def _count(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument(f"{what} must be an integer, got {text!r}") from None


@routes.get(NS)
async def list_topics(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "topics.list", {"namespace": _ns(request)}))


@routes.get(NS + "/partitioned")
async def list_partitioned(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "topics.list_partitioned", {"namespace": _ns(request)}))


@routes.put(T)
async def create_topic(request: web.Request) -> web.Response:
    await run_verb(request, "topics.create", {"topic": _topic(request)})
    return no_content()


@routes.delete(T)
async def delete_topic(request: web.Request) -> web.Response:
    await run_verb(request, "topics.delete", {"topic": _topic(request), "force": _flag(request, "force")})
    return no_content()


@routes.put(T + "/partitions")
async def create_partitioned(request: web.Request) -> web.Response:
    await run_verb(request, "topics.create_partitioned", {"topic": _topic(request),
                                                          "partitions": await read_json(request)})
    return no_content()


@routes.post(T + "/partitions")
async def update_partitioned(request: web.Request) -> web.Response:
    await run_verb(request, "topics.update_partitioned", {"topic": _topic(request),
                                                          "partitions": await read_json(request)})
    return no_content()


@routes.get(T + "/partitions")
async def partitioned_metadata(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "topics.partitioned_metadata", {"topic": _topic(request)}))


@routes.delete(T + "/partitions")
async def delete_partitioned(request: web.Request) -> web.Response:
    await run_verb(request, "topics.delete", {"topic": _topic(request), "force": _flag(request, "force")})
    return no_content()


@routes.get(T + "/stats")
@routes.get(T + "/partitioned-stats")
async def stats(request: web.Request) -> web.Response:
    """TopicStats (of a partitioned topic: the partitions' merged, ``partitions`` each)."""
    return json_response(await run_verb(request, "topics.stats", {"topic": _topic(request)}))


@routes.get(T + "/internalStats")
async def internal_stats(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "topics.internal_stats", {"topic": _topic(request)}))


@routes.get(T + "/subscriptions")
async def subscriptions(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "topics.subscriptions", {"topic": _topic(request)}))


@routes.get(T + "/lastMessageId")
async def last_message_id(request: web.Request) -> web.Response:
    return json_response(await run_verb(request, "topics.last_message_id", {"topic": _topic(request)}))


@routes.put(T + "/unload")
async def unload(request: web.Request) -> web.Response:
    await run_verb(request, "topics.unload", {"topic": _topic(request)})
    return no_content()


# ---- subscriptions -------------------------------------------------------------------
def _sub(request: web.Request) -> dict:
    return {"topic": _topic(request), "subscription": request.match_info["subscription"]}


@routes.put(SUB)
async def create_subscription(request: web.Request) -> web.Response:
    """Body: a MessageId to start at (absent: latest)."""
    body = await read_json(request)
    await run_verb(request, "topics.create_subscription",
                   {**_sub(request), "message_id": None if body is None else _message_id(body)})
    return no_content()


@routes.delete(SUB)
async def delete_subscription(request: web.Request) -> web.Response:
    await run_verb(request, "topics.unsubscribe", _sub(request))
    return no_content()


@routes.post(SUB + "/resetcursor/{timestamp}")
async def reset_cursor_to_time(request: web.Request) -> web.Response:
    await run_verb(request, "topics.reset_cursor",
                   {**_sub(request), "timestamp_ms": _count(request.match_info["timestamp"], "timestamp")})
    return no_content()


@routes.post(SUB + "/resetcursor")
async def reset_cursor_to_message(request: web.Request) -> web.Response:
    await run_verb(request, "topics.reset_cursor", {**_sub(request), "message_id": _message_id(await read_json(request)),
                                                    "is_excluded": _flag(request, "isExcluded")})
    return no_content()


@routes.post(SUB + "/skip/{count}")
async def skip(request: web.Request) -> web.Response:
    await run_verb(request, "topics.skip", {**_sub(request), "count": _count(request.match_info["count"], "count")})
    return no_content()


@routes.post(SUB + "/skip_all")
async def skip_all(request: web.Request) -> web.Response:
    await run_verb(request, "topics.skip", _sub(request))
    return no_content()
