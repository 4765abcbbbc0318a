"""What every REST resource shares: the caller's identity from ``Authorization:
Bearer <token>``, the admin verb run with the gRPC admin's authorization and
routing, topic verbs redirected (307) to the owner broker's web service URL, and
errors answered as Pulsar's ``{"reason": "..."}`` with its status codes
(``RestException`` / ``ErrorData`` in Pulsar).

Status codes (Pulsar's): 401 no or bad credentials, 403 not authorized, 404 not
found, 409 already exists, 412 precondition failed (a resource in use, a name
that is not valid, an operation the resource does not allow), 400 a malformed
request body, 503 not ready (retry), 500 anything else.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Optional

from aiohttp import web

from broker.ownership.admin_routing import route_admin
from broker.service import admin
from broker.service.error_edge import to_pulsar
from proto.errors import (AlreadyClosed, AlreadyExists, AuthenticationError, AuthorizationError, ConnectError,
                          InvalidArgument, InvalidConfiguration, InvalidTopicName, MessageTooBig, NotAllowed,
                          NotFound, PreconditionFailed, PulsarException, ServiceNotReady, Timeout, TopicNotFound,
                          TopicTerminated)
from proto.topic_name import TopicName

__all__ = ["SERVICE_KEY", "service_of", "authenticate", "run_verb", "json_response", "no_content",
           "read_json", "error_middleware", "status_of", "web_service_url_of"]

log = logging.getLogger(__name__)

SERVICE_KEY = web.AppKey("service", object)
# how long a broker's web service URL read from its load report is reused (s)
WEB_URL_CACHE_TTL_S = 5.0

# exception class -> HTTP status (first match wins; subclasses before their bases)
_STATUS: tuple[tuple[type, int], ...] = (
    (AuthenticationError, 401), (AuthorizationError, 403),
    (TopicNotFound, 404), (NotFound, 404), (AlreadyExists, 409),
    (InvalidTopicName, 412), (PreconditionFailed, 412), (NotAllowed, 412), (TopicTerminated, 412),
    (AlreadyClosed, 412), (InvalidArgument, 400), (InvalidConfiguration, 400), (MessageTooBig, 413),
    (ServiceNotReady, 503), (ConnectError, 503), (Timeout, 504),
)


def status_of(exc: BaseException) -> int:
    """The HTTP status Pulsar's REST API answers for ``exc`` (a ``proto.errors``
    exception after ``to_pulsar``); 500 for anything else."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Answer every error of a handler as ``{"reason": message}`` with its status
    (:func:`status_of`); aiohttp's own HTTP errors (404 of an unknown path, 405)
    get the same body. Unexpected exceptions are logged and answered 500."""
    try:
        return await handler(request)
    except web.HTTPRedirection:
        raise
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"reason": exc.reason}, status=exc.status)
    except Exception as exc:  # noqa: BLE001 - the edge answers every error
        exc = to_pulsar(exc)
        if not isinstance(exc, PulsarException):
            log.exception("REST %s %s failed", request.method, request.path, exc_info=exc)
            return web.json_response({"reason": f"internal error: {type(exc).__name__}: {exc}"}, status=500)
        return web.json_response({"reason": exc.message}, status=status_of(exc))


def service_of(request: web.Request):
    """The ``BrokerService`` behind the app."""
    return request.app[SERVICE_KEY]


def authenticate(request: web.Request):
    """The caller's ``AuthenticationResult`` from ``Authorization: Bearer <token>``
    (None with authentication off); raises AuthenticationError (401)."""
    security = getattr(service_of(request), "security", None)
    if security is None or security.authentication is None:
        return None
    header = request.headers.get("Authorization")
    return security.authentication.authenticate([("authorization", header)] if header is not None else [])


def json_response(value: Any, status: int = 200) -> web.Response:
    """``value`` as a JSON body (keys sorted, unknown types as strings)."""
    return web.Response(text=json.dumps(value, sort_keys=True, default=str), status=status,
                        content_type="application/json")


def no_content() -> web.Response:
    """204, what Pulsar answers to a successful PUT/POST/DELETE without a result."""
    return web.Response(status=204)


async def read_json(request: web.Request, default: Any = None) -> Any:
    """The request's JSON body (``default`` when empty). Raises InvalidArgument (400)
    for a body over ``http_max_request_size`` (Pulsar's httpMaxRequestSize) or one
    that is not JSON."""
    limit = service_of(request).config.http_max_request_size
    if request.content_length is not None and request.content_length > limit:
        raise InvalidArgument(f"the request body has {request.content_length:,} bytes, over "
                              f"http_max_request_size={limit:,}")
    raw = await request.content.read(limit + 1)
    if len(raw) > limit:
        raise InvalidArgument(f"the request body is over http_max_request_size={limit:,} bytes")
    if not raw.strip():
        return default
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"the request body is not JSON: {exc}") from None


def _is_authoritative(request: web.Request) -> bool:
    return request.query.get("authoritative", "false").lower() == "true"


async def web_service_url_of(service, service_url: str) -> Optional[str]:
    """The web service URL (``http(s)://host:port``) of the broker whose service URL
    is ``service_url``, from its load report (Pulsar's ``LocalBrokerData.webServiceUrl``);
    cached :data:`WEB_URL_CACHE_TTL_S`; None when it has not published one."""
    cache = service.__dict__.setdefault("_web_url_cache", {})
    hit = cache.get(service_url)
    if hit is not None and time.monotonic() - hit[1] < WEB_URL_CACHE_TTL_S:
        return hit[0]
    ns = service.namespace_service
    for report in await ns.live_brokers():
        cache[report.service_url] = (getattr(report, "web_service_url", "") or None, time.monotonic())
    hit = cache.get(service_url)
    return hit[0] if hit is not None else None


async def _redirect_target(request: web.Request, method: str, body: dict) -> Optional[str]:
    """The owner's URL for this request when a topic verb should be answered by
    another broker of the cluster (Pulsar's ``validateTopicOwnership``), else None:
    not a broker cluster, not a topic verb, a partitioned topic's fan-out (answered
    here), served here, or asked ``authoritative=true`` (already redirected once:
    answered here through the owner, never a redirect loop)."""
    service = service_of(request)
    ns = getattr(service, "namespace_service", None)
    if ns is None or not method.startswith("topics.") or method in _ANY_BROKER or _is_authoritative(request):
        return None
    tn = TopicName.get(body["topic"])
    if not tn.is_partition and await service.resources.get_partitions(tn.persistence_naming):
        return None
    served, _ = await ns.is_served_here(tn)
    if served:
        return None
    owner = await ns.find_owner(str(tn))
    if owner == service.service_url:
        return None
    web_url = await web_service_url_of(service, owner)
    if not web_url:
        return None                      # an owner without a web port: answered through it (gRPC)
    query = dict(request.query)
    query["authoritative"] = "true"
    return str(request.url.with_scheme(web_url.split("://", 1)[0])
               .with_host(web_url.split("://", 1)[1].rsplit(":", 1)[0])
               .with_port(int(web_url.rsplit(":", 1)[1])).with_query(query))


async def run_verb(request: web.Request, method: str, body: Optional[dict] = None) -> Any:
    """Run admin ``method`` (``broker.service.admin``) with ``body`` for this request:
    authenticate (401), authorize as the gRPC admin does (403), redirect a topic
    verb to its owner (raises ``web.HTTPTemporaryRedirect``, 307), else answer here
    through ``route_admin`` (partitioned topics fan out to the partitions' owners).
    Returns the verb's decoded JSON answer; raises what the verb raised."""
    body = {k: v for k, v in (body or {}).items() if v is not None}
    service = service_of(request)
    who = authenticate(request)
    security = getattr(service, "security", None)
    if security is not None and security.enabled:
        await security.check_admin(who, method, body)
    admin.check_body(method, body)                   # a bad name is a 4xx before any lookup
    location = await _redirect_target(request, method, body)
    if location is not None:
        raise web.HTTPTemporaryRedirect(location)

    async def local(m: str, body_json: str) -> str:
        return await admin.dispatch(service, m, body_json)

    return json.loads(await route_admin(service, method, json.dumps(body), local))


_ANY_BROKER = frozenset({"topics.create", "topics.create_partitioned", "topics.update_partitioned",
                         "topics.partitioned_metadata", "topics.lookup", "topics.list", "topics.list_partitioned",
                         "topics.grant_permission", "topics.revoke_permission",
                         "topics.permissions", "topics.set_replication_clusters"})
