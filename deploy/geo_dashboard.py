"""``minipulsar geo dashboard``: one live page for every cluster of the geo demo.

    minipulsar geo dashboard [--data-dir DIR] [--port 8070] [--cluster NAME=URL[,URL]]...

Serves the broker's dashboard page (``broker.http.dashboard``) at
``http://<host>:<port>/dashboard``, fed with the snapshots of every cluster:
each second it asks one broker of each cluster (``/dashboard/cluster`` on its web
port; the next broker when it does not answer) while a page is open. Clusters
and their brokers' web URLs come from the topology (``geo up``'s data dir, or
``--topology``), or from ``--cluster`` (any clusters: name and web URLs). With the
demo's TLS, brokers are reached over HTTPS trusting its CA; with ``--auth``, with
its superuser token. Prints ``DASHBOARD_READY port=<port> pid=<pid>`` once serving.
"""
from __future__ import annotations

import asyncio
import os
import ssl
import sys
import time
from pathlib import Path
from typing import Optional

import aiohttp
from aiohttp import web

from broker.http.dashboard import STATIC_FILES, STATIC_DIR, interval_of, page_html, sse_stream
from broker.http.dashboard_model import BrokerMemory

__all__ = ["GeoDashboard", "clusters_from_topology", "parse_cluster_args", "add_dashboard_arguments",
           "cmd_dashboard"]

DEFAULT_PORT = 8070
ASK_TIMEOUT_S = 3.0


class GeoDashboard:
    """Snapshots of several clusters. ``clusters``: ``{name: [web URL, ...]}``; ``token``:
    a bearer token for the brokers (or None); ``ssl_context`` for HTTPS brokers."""

    def __init__(self, clusters: dict[str, list[str]], token: Optional[str] = None,
                 ssl_context: Optional[ssl.SSLContext] = None):
        self.clusters = clusters
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.ssl_context = ssl_context
        self.memory = {name: BrokerMemory() for name in clusters}
        self._preferred = {name: 0 for name in clusters}
        self._session: Optional[aiohttp.ClientSession] = None
        self._last: Optional[dict] = None
        self._last_at = 0.0
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _cluster(self, name: str) -> dict:
        """One cluster's snapshot from the first of its brokers that answers; when none does,
        ``{"name", "error", "brokers": (every broker seen, down), "topics": []}``."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S))
        urls = self.clusters[name]
        start = self._preferred[name]
        error = "no broker web URL"
        for k in range(len(urls)):
            i = (start + k) % len(urls)
            try:
                async with self._session.get(f"{urls[i]}/dashboard/cluster", headers=self.headers,
                                             ssl=self.ssl_context) as r:
                    if r.status != 200:
                        error = f"{urls[i]} answered {r.status}: {(await r.text())[:200]}"
                        continue
                    snap = await r.json()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                error = f"{urls[i]}: {type(exc).__name__} {exc}"
                continue
            self._preferred[name] = i
            snap["brokers"] = self.memory[name].merge(snap["brokers"])
            snap["via"] = urls[i]
            return snap
        return {"name": name, "time_ms": int(time.time() * 1000), "error": error, "leader": None,
                "brokers": self.memory[name].merge([]), "topics": []}

    async def snapshot(self, max_age_s: float = 0.5) -> dict:
        """``{"time_ms", "clusters": [snapshot per cluster]}``; pages open at once share
        one round of questions (answers younger than ``max_age_s`` are reused)."""
        async with self._lock:
            if self._last is not None and time.monotonic() - self._last_at < max_age_s:
                return self._last
            clusters = await asyncio.gather(*(self._cluster(name) for name in self.clusters))
            self._last = {"time_ms": int(time.time() * 1000), "clusters": list(clusters)}
            self._last_at = time.monotonic()
            return self._last


def build_app(dash: GeoDashboard, title: str = "minipulsar · geo") -> web.Application:
    """The page, its static files, ``/dashboard/geo`` (one JSON snapshot) and the events."""
    routes = web.RouteTableDef()

    @routes.get("/")
    async def root(request: web.Request) -> web.Response:
        raise web.HTTPFound("/dashboard")

    @routes.get("/dashboard")
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=page_html(title), content_type="text/html")

    @routes.get("/dashboard/static/{name}")
    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound()
        return web.Response(body=(STATIC_DIR / name).read_bytes(), content_type=STATIC_FILES[name])

    @routes.get("/dashboard/geo")
    async def geo(request: web.Request) -> web.Response:
        return web.json_response(await dash.snapshot())

    @routes.get("/dashboard/events")
    async def events(request: web.Request) -> web.StreamResponse:
        interval = interval_of(request)
        return await sse_stream(request, lambda: dash.snapshot(interval / 2), interval)

    app = web.Application()
    app.add_routes(routes)

    async def close(app: web.Application) -> None:
        await dash.close()
    app.on_cleanup.append(close)
    return app


def clusters_from_topology(topo) -> dict[str, list[str]]:
    """``{cluster: [web URL of each broker with an HTTP port]}`` of a geo topology."""
    scheme = "https" if topo.tls_dir else "http"
    return {c.name: [f"{scheme}://{topo.host}:{b.http_port}" for b in c.brokers if b.http_port > 0]
            for c in topo.clusters}


def parse_cluster_args(values: list[str]) -> dict[str, list[str]]:
    """``["a=http://h:1,http://h:2", ...]`` -> ``{"a": [...]}``; raises ValueError naming a bad one."""
    out: dict[str, list[str]] = {}
    for value in values:
        name, sep, urls = value.partition("=")
        listed = [u.strip().rstrip("/") for u in urls.split(",") if u.strip()]
        if not sep or not name.strip() or not listed or not all(u.startswith(("http://", "https://")) for u in listed):
            raise ValueError(f"--cluster {value!r}: give NAME=http://HOST:PORT[,http://HOST:PORT]")
        out[name.strip()] = listed
    return out


def dashboard_hint(topo, data_dir: str) -> str:
    """The lines ``geo up`` and ``geo demo`` print: each cluster's page on its first
    broker's web port, and the command of the page of all clusters."""
    pages = "  ".join(f"{name}: {urls[0]}/dashboard" for name, urls in clusters_from_topology(topo).items() if urls)
    return (f"dashboards: {pages or '(no broker HTTP port in the topology)'}\n"
            f"  every cluster on one page: minipulsar geo dashboard --data-dir {data_dir}  "
            f"-> http://127.0.0.1:{DEFAULT_PORT}/dashboard")


def add_dashboard_arguments(p) -> None:
    """The ``geo dashboard`` flags (besides ``--topology`` / ``--data-dir``)."""
    p.add_argument("--host", default="127.0.0.1", help="address to serve the page on (default 127.0.0.1; "
                                                       "0.0.0.0 in a container)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port of the page (default {DEFAULT_PORT}; 0: any)")
    p.add_argument("--cluster", action="append", default=[], metavar="NAME=URL[,URL]",
                   help="a cluster and its brokers' web URLs (repeat; default: the topology's)")
    p.add_argument("--token-file", help="bearer token for the brokers (default with geo up --auth: its admin token)")
    p.add_argument("--tls-dir", metavar="DIR", help="reach the brokers over HTTPS trusting DIR's CA (containers; "
                                                    "geo up --tls data dirs need nothing)")


async def serve(dash: GeoDashboard, host: str, port: int) -> None:
    """Serve until SIGTERM / SIGINT; prints the URL and the DASHBOARD_READY line."""
    import signal

    runner = web.AppRunner(build_app(dash), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    print(f"geo dashboard: http://{shown}:{bound}/dashboard ({', '.join(dash.clusters)}; Ctrl-C stops)", flush=True)
    print(f"DASHBOARD_READY port={bound} pid={os.getpid()}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def cmd_dashboard(args) -> int:
    """``geo dashboard``: see the module doc."""
    from deploy.geo import resolve_topology

    token, ctx = None, None
    if args.cluster:
        try:
            clusters = parse_cluster_args(args.cluster)
        except ValueError as exc:
            print(f"geo dashboard: {exc}", file=sys.stderr)
            return 2
    else:
        from deploy.geo_containers import _with_tls_dir
        topo = _with_tls_dir(resolve_topology(args.topology, Path(args.data_dir).resolve()), args.tls_dir)
        clusters = clusters_from_topology(topo)
        if topo.tls_dir:
            ctx = ssl.create_default_context(cafile=topo.tls_ca_file)
        if topo.auth_dir and not args.token_file:
            token = (Path(topo.auth_dir) / "admin.token").read_text().strip()
    if args.token_file:
        token = Path(args.token_file).read_text().strip()
    asyncio.run(serve(GeoDashboard(clusters, token, ctx), args.host, args.port))
    return 0
