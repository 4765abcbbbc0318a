"""The live dashboard of a broker's cluster on its web port (what Pulsar Manager and
Grafana show, without either): ``/dashboard`` (the page, with its script and style
under ``/dashboard/static/``), ``/dashboard/cluster`` (one snapshot of this broker's
cluster, JSON, see ``dashboard_model``), ``/dashboard/events`` (server-sent events: a
snapshot every ``interval`` seconds, default 1), ``/dashboard/local`` (this broker's
own topics and the bundles it owns now; the broker building a cluster snapshot asks
every live broker for it).

Snapshots are built only while someone asks (a page open, a poller): a closed
dashboard costs the broker nothing. With authentication on, the dashboard needs a
superuser token (as ``brokers list``): ``Authorization: Bearer`` or ``?token=``
(a browser's EventSource cannot send headers).
"""
from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from pathlib import Path
from typing import Optional

import aiohttp
from aiohttp import web

from .dashboard_model import BrokerMemory, broker_row, cluster_snapshot, topic_summary
from .edge import json_response, service_of

__all__ = ["routes", "setup", "STATIC_DIR", "local_topics", "local_view", "build_snapshot"]

log = logging.getLogger(__name__)
routes = web.RouteTableDef()
STATIC_DIR = Path(__file__).with_name("static")
STATIC_FILES = {"dashboard.js": "application/javascript", "dashboard.css": "text/css"}
MEMORY_KEY = web.AppKey("dashboard_memory", BrokerMemory)
SESSION_KEY = web.AppKey("dashboard_session", object)
PEER_TIMEOUT_S = 2.0       # a broker slower than this to give its topics is shown down
MIN_INTERVAL_S = 0.2


def setup(app: web.Application) -> None:
    """Per-app state: the memory of brokers seen, the client session to the peers."""
    app[MEMORY_KEY] = BrokerMemory()

    async def close_session(app: web.Application) -> None:
        session = app.get(SESSION_KEY)
        if session is not None:
            await session.close()
    app.on_cleanup.append(close_session)


def _token_header(request: web.Request) -> dict:
    header = request.headers.get("Authorization")
    if header is None and request.query.get("token"):
        header = f"Bearer {request.query['token']}"
    return {"Authorization": header} if header else {}


async def check_access(request: web.Request) -> None:
    """With security on: the caller must be a superuser (401 / 403 otherwise)."""
    service = service_of(request)
    security = getattr(service, "security", None)
    if security is None or not security.enabled:
        return
    who = None
    if security.authentication is not None:
        header = _token_header(request).get("Authorization")
        who = security.authentication.authenticate([("authorization", header)] if header else [])
    await security.check_admin(who, "brokers.list", {})


def page_html(title: str) -> str:
    """The dashboard page (the same for a broker and ``geo dashboard``)."""
    return (STATIC_DIR / "dashboard.html").read_text().replace("{{title}}", title)


@routes.get("/dashboard")
async def page(request: web.Request) -> web.Response:
    await check_access(request)
    return web.Response(text=page_html(f"minipulsar · {service_of(request).config.cluster_name}"),
                        content_type="text/html")


@routes.get("/dashboard/static/{name}")
async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_FILES:
        raise web.HTTPNotFound()
    return web.Response(body=(STATIC_DIR / name).read_bytes(), content_type=STATIC_FILES[name])


def local_topics(service) -> list[dict]:
    """Summaries of the topics this broker serves (``dashboard_model.topic_summary``)."""
    out = []
    for topic in list(service.topics.values()):
        try:
            out.append(topic_summary(str(topic.name), topic.stats(), service.service_url))
        except Exception as exc:  # noqa: BLE001 - a topic closing under us
            log.debug("stats of %s: %s", topic.name, exc)
    return out


def local_view(service) -> dict:
    """What this broker serves now: ``{"topics": [topic summaries], "bundles": {bundle:
    {"topics": n}} or None}``: the bundles it owns at this moment (Pulsar's owned
    bundles; None for a standalone broker), fresher than its load report, which is
    written every ``load_balancer_report_update_min_interval_millis`` (5 s), so a
    takeover shows within one snapshot."""
    ns = getattr(service, "namespace_service", None)
    bundles = None
    if ns is not None:
        names = [(str(t), str(t).split("://", 1)[-1].rsplit("/", 1)[0]) for t in list(service.topics)]
        bundles = {key: {"topics": sum(1 for t, t_ns in names if t_ns == bundle.namespace and bundle.contains(t))}
                   for key, bundle in list(ns.owned.items())}
    return {"topics": local_topics(service), "bundles": bundles}


@routes.get("/dashboard/local")
async def local(request: web.Request) -> web.Response:
    await check_access(request)
    return json_response(local_view(service_of(request)))


def _client_ssl(config) -> Optional[ssl.SSLContext]:
    if not config.tls_enabled:
        return None
    ctx = ssl.create_default_context(cafile=config.tls_trust_certs_file_path or None)
    if config.tls_certificate_file_path:
        ctx.load_cert_chain(config.tls_certificate_file_path, config.tls_key_file_path)
    return ctx


async def _peer_view(app: web.Application, web_url: str, headers: dict, config) -> dict:
    session = app.get(SESSION_KEY)
    if session is None:
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S))
        app[SESSION_KEY] = session
    async with session.get(f"{web_url}/dashboard/local", headers=headers, ssl=_client_ssl(config)) as r:
        if r.status != 200:
            raise RuntimeError(f"{web_url} answered {r.status}")
        view = await r.json()
        return {"topics": view, "bundles": None} if isinstance(view, list) else view   # a broker of before


async def build_snapshot(request: web.Request) -> dict:
    """This broker's cluster now: brokers from their load reports (this broker alone when
    standalone), each live broker's topics and owned bundles (``local_view``, asked in
    parallel; one that does not answer in PEER_TIMEOUT_S is shown down, with the bundles of
    its last load report), brokers seen before and gone marked down."""
    service = service_of(request)
    ns = getattr(service, "namespace_service", None)
    if ns is None:
        report = {"service_url": service.service_url, "web_service_url": service.web_service_url,
                  "topics": len(service.topics), "cpu": _own_cpu(service),
                  "msg_rate_in": sum(r.get("msgRateIn", 0.0) for r in service.rates.values()),
                  "msg_rate_out": sum(s.get("msgRateOut", 0.0) for r in service.rates.values()
                                      for s in r.get("subs", {}).values()),
                  "bundles": {}}
        reports, leader = [report], service.service_url
    else:
        reports, leader = [r.to_json() for r in await ns.live_brokers()], await ns.leader_url()
    headers = _token_header(request)

    async def view_of(report: dict) -> dict:
        if report["service_url"] == service.service_url:
            return local_view(service)
        return await _peer_view(request.app, report.get("web_service_url", ""), headers, service.config)

    answers = await asyncio.gather(*(view_of(r) for r in reports), return_exceptions=True)
    topics, unreachable, rows = [], [], []
    for report, answer in zip(reports, answers):
        if isinstance(answer, BaseException):
            unreachable.append(report["service_url"].split("://", 1)[-1])
        else:
            topics.extend(answer["topics"])
            if answer.get("bundles") is not None:
                report = dict(report, bundles=answer["bundles"])
        rows.append(broker_row(report, leader))
    brokers = request.app[MEMORY_KEY].merge(rows, unreachable)
    return cluster_snapshot(service.config.cluster_name, int(time.time() * 1000), brokers, topics)


def _own_cpu(service) -> float:
    """% of one core this process used since the previous call (standalone brokers have no load report)."""
    now, cpu = time.monotonic(), time.process_time()
    last = service.__dict__.get("_dashboard_cpu", (now, cpu))
    service.__dict__["_dashboard_cpu"] = (now, cpu)
    return round(100.0 * (cpu - last[1]) / max(1e-3, now - last[0]), 1)


@routes.get("/dashboard/cluster")
async def cluster(request: web.Request) -> web.Response:
    await check_access(request)
    return json_response(await build_snapshot(request))


def interval_of(request: web.Request) -> float:
    """The ``interval`` query parameter (s, at least MIN_INTERVAL_S; default 1)."""
    try:
        return max(MIN_INTERVAL_S, float(request.query.get("interval", "1")))
    except ValueError:
        return 1.0


async def sse_stream(request: web.Request, produce, interval_s: float) -> web.StreamResponse:
    """Server-sent events: ``data: <produce()'s JSON>`` every ``interval_s`` until the client
    goes away (shared with ``geo dashboard``)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    try:
        while True:
            started = time.monotonic()
            try:
                payload = await produce()
            except Exception as exc:  # noqa: BLE001 - say it on the page, keep streaming
                payload = {"error": f"{type(exc).__name__}: {exc}"}
            await resp.write(f"data: {json.dumps(payload, default=str)}\n\n".encode())
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    except ConnectionResetError:
        pass
    return resp


@routes.get("/dashboard/events")
async def events(request: web.Request) -> web.StreamResponse:
    await check_access(request)

    async def produce() -> dict:
        return {"time_ms": int(time.time() * 1000), "clusters": [await build_snapshot(request)]}
    return await sse_stream(request, produce, interval_of(request))
