"""A fault-injecting TCP proxy for tests (asyncio, loopback).

Point a client at ``proxy.service_url`` instead of the broker's: every TCP
connection it opens is forwarded to the target, and the test can break the
path on purpose:

- ``cut()``: abort every open connection at once (both sides see a reset),
  as a network failure or a broker crash looks to the client;
- ``hold()`` / ``release()``: stop / resume forwarding on every connection,
  new ones included, without closing anything: what is written meanwhile sits
  in socket buffers, so the sender believes it was sent (a stalled link, a
  stream broken before anyone noticed);
- ``refuse(True)``: abort new connections as soon as they are accepted (the
  broker looks down) until ``refuse(False)``;
- ``delay_s = 0.2``: forward every chunk, both directions, that much later (a
  slow link; order kept), until set back to 0;
- ``await flap(down_s, up_s, times)``: cut and refuse for ``down_s``, forward
  for ``up_s``, ``times`` times (a flapping link);
- ``cut_after_bytes(n)``: forward ``n`` more client bytes, then reset every
  connection (a stream cut in the middle of a message).

Runs on the test's event loop: ``proxy = await TcpProxy("127.0.0.1", port).start()``,
``await proxy.close()`` at the end. ``ThreadedTcpProxy`` runs one on its own event loop in a
daemon thread, for links that must work while the test's code blocks (a broker process
started synchronously through a proxy to its etcd): ``p = ThreadedTcpProxy(host, port)``,
``p.hold()``, ``p.release()``, ``p.close()``.
"""
from __future__ import annotations

import asyncio
import collections
import logging

__all__ = ["TcpProxy", "ThreadedTcpProxy"]

log = logging.getLogger(__name__)


class _Side(asyncio.Protocol):
    """One socket of a proxied connection; forwards what it reads to its peer."""

    def __init__(self, conn: "_Connection"):
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.peer: "_Side | None" = None
        self._early: list[bytes] = []  # client bytes read before the upstream socket exists
        self._delayed: collections.deque = collections.deque()   # (due loop time, bytes) while delay_s > 0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.conn.closed:          # refused (or cut) before the socket was set up: reset it now
            transport.abort()
            return
        if self.conn.proxy.held:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self._early.append(data)
            return
        proxy = self.conn.proxy
        if self is self.conn.client and proxy._cut_budget is not None:
            if len(data) >= proxy._cut_budget:
                peer.transport.write(data[:proxy._cut_budget])
                proxy._cut_budget = None
                asyncio.get_running_loop().call_soon(proxy.cut)
                return
            proxy._cut_budget -= len(data)
        if proxy.delay_s > 0 or self._delayed:
            self._delay(data)
            return
        peer.transport.write(data)

    def _delay(self, data: bytes) -> None:
        """Forward ``data`` ``delay_s`` from now, after what is already delayed (order kept)."""
        loop = asyncio.get_running_loop()
        self._delayed.append((loop.time() + self.conn.proxy.delay_s, data))
        if self._timer is None:
            self._timer = loop.call_at(self._delayed[0][0], self._flush_delayed)

    def _flush_delayed(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        peer = self.peer
        while self._delayed and self._delayed[0][0] <= loop.time():
            _, data = self._delayed.popleft()
            if peer is not None and peer.transport is not None and not peer.transport.is_closing():
                peer.transport.write(data)
        if self._delayed:
            self._timer = loop.call_at(self._delayed[0][0], self._flush_delayed)

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._delayed.clear()
        self.conn.close()


class _Connection:
    """A client socket and its upstream socket."""

    def __init__(self, proxy: "TcpProxy"):
        self.proxy = proxy
        self.client = _Side(self)
        self.upstream = _Side(self)
        self.client.peer, self.upstream.peer = self.upstream, self.client
        self.closed = False

    async def open_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: self.upstream, self.proxy.target_host, self.proxy.target_port)
        except OSError as e:
            log.debug("proxy: upstream connect failed: %s", e)
            self.abort()
            return
        if self.closed:
            self.upstream.transport.abort()
            return
        for data in self.client._early:
            self.upstream.transport.write(data)
        self.client._early.clear()

    def pause(self) -> None:
        for side in (self.client, self.upstream):
            if side.transport is not None and not side.transport.is_closing():
                side.transport.pause_reading()

    def resume(self) -> None:
        for side in (self.client, self.upstream):
            if side.transport is not None and not side.transport.is_closing():
                side.transport.resume_reading()

    def abort(self) -> None:
        """Reset both sockets (no FIN: RST, as a crashed peer or a cut link)."""
        self.closed = True
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.abort()
        self.proxy._connections.discard(self)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()
        self.proxy._connections.discard(self)


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` (``port`` 0 = any free one) to
    ``target_host:target_port``; see the module doc for the faults."""

    def __init__(self, target_host: str, target_port: int, port: int = 0):
        self.target_host = target_host
        self.target_port = target_port
        self._listen_port = port
        self.port: int | None = None
        self.held = False
        self.refusing = False
        self.cuts = 0
        self.accepted = 0
        self.delay_s = 0.0
        self._cut_budget: int | None = None
        self._connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    @classmethod
    def to_service_url(cls, service_url: str) -> "TcpProxy":
        """A proxy (not started) in front of ``minipulsar://host:port``."""
        host, port = service_url.split("://", 1)[1].rsplit(":", 1)
        return cls(host, int(port))

    async def start(self) -> "TcpProxy":
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, "127.0.0.1", self._listen_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def service_url(self) -> str:
        return f"minipulsar://127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        """Connections currently open through the proxy."""
        return len(self._connections)

    def _accept(self) -> asyncio.Protocol:
        conn = _Connection(self)
        self.accepted += 1
        if self.refusing:
            loop = asyncio.get_running_loop()
            loop.call_soon(conn.abort)
            return conn.client
        self._connections.add(conn)
        task = asyncio.get_running_loop().create_task(conn.open_upstream())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return conn.client

    # -- faults ----------------------------------------------------------------------
    def cut(self) -> int:
        """Reset every open connection; returns how many were cut."""
        conns = list(self._connections)
        for conn in conns:
            conn.abort()
        self.cuts += 1
        return len(conns)

    def hold(self) -> None:
        """Stop forwarding (both directions, new connections too); nothing is closed."""
        self.held = True
        for conn in list(self._connections):
            conn.pause()

    def release(self) -> None:
        """Resume forwarding after ``hold``."""
        self.held = False
        for conn in list(self._connections):
            conn.resume()

    def refuse(self, refusing: bool = True) -> None:
        """While True, new connections are reset as soon as they are accepted."""
        self.refusing = refusing

    async def flap(self, down_s: float, up_s: float, times: int, on_down=None) -> None:
        """A flapping link: ``times`` x (cut every connection and refuse new ones for
        ``down_s`` seconds, then forward for ``up_s`` seconds). ``on_down()``, if given,
        is called at each cut."""
        for _ in range(times):
            if on_down is not None:
                on_down()
            self.cut()
            self.refuse(True)
            await asyncio.sleep(down_s)
            self.refuse(False)
            await asyncio.sleep(up_s)

    def cut_after_bytes(self, n: int) -> None:
        """Forward ``n`` more bytes from clients, then reset every connection (a stream
        cut mid-message when ``n`` ends inside one)."""
        self._cut_budget = n

    async def close(self) -> None:
        """Stop listening and reset every connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self._connections):
            conn.abort()
        for task in list(self._tasks):
            task.cancel()
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> "TcpProxy":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()


class ThreadedTcpProxy:
    """A started ``TcpProxy`` on its own event loop in a daemon thread; the fault methods
    (``hold``, ``release``, ``cut``, ``refuse``) are called from any thread and take effect
    before they return. ``address`` / ``port`` as ``TcpProxy``'s."""

    def __init__(self, target_host: str, target_port: int):
        import threading

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._thread.start()
        self.proxy = self._run(TcpProxy(target_host, target_port).start())

    def _run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _call(self, fn, *args):
        async def call():
            return fn(*args)
        return self._run(call())

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def address(self) -> str:
        return self.proxy.address

    def hold(self) -> None:
        self._call(self.proxy.hold)

    def release(self) -> None:
        self._call(self.proxy.release)

    def cut(self) -> int:
        return self._call(self.proxy.cut)

    def refuse(self, refusing: bool = True) -> None:
        self._call(self.proxy.refuse, refusing)

    def close(self) -> None:
        """Close the proxy (resetting its connections) and stop its thread. Idempotent."""
        if self._loop.is_closed():
            return
        try:
            self._run(self.proxy.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()
