"""One client connection of Pulsar's binary protocol (Pulsar's ``ServerCnx``).

The first frame must be CONNECT (answered CONNECTED with protocol version
min(client, :data:`MAX_PROTOCOL_VERSION`), ``max_message_size`` and no feature flag,
or an AuthenticationError CommandError and the connection closed). Then each frame
is handed to its handler in ``producers`` / ``consumers`` / ``lookups``; handlers that
wait (lookups, subscribe, create producer, seek) run as tasks so one slow command
never delays the sends and acks behind it, while sends, acks and flow permits are
applied in arrival order.

One ordered writer: every answer goes through :meth:`PulsarConnection.write` (the
transport keeps the order); consumer pushes wait on :meth:`drain` (back-pressure
from a slow socket reaches the consumer's writability, and so its dispatcher).
Reading pauses while more than :data:`MAX_PENDING_SENDS` sends of the connection are
being stored (Pulsar's maxPendingPublishRequestsPerConnection). A frame that cannot
be read closes this connection only (logged); the broker keeps serving.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

from proto.pulsar_wire_pb2 import BaseCommand, CommandConnected, FeatureFlags, ServerError

from .frames import FRAME_PADDING, FrameDecoder, FrameError, encode_command, encode_payload_command
from .consumers import ConsumerCommands
from .ids import NO_REQUEST
from .lookups import LookupCommands
from .producers import ProducerCommands
from .server_errors import server_error

log = logging.getLogger(__name__)

T = BaseCommand.Type
#: Highest protocol version answered (v20: topic migration; what Pulsar 3.x brokers answer).
MAX_PROTOCOL_VERSION = 20
#: Sends being stored above which the connection stops reading (count).
MAX_PENDING_SENDS = 1000
#: Seconds without a frame from the client after which the broker pings it; twice that closes.
KEEPALIVE_S = 30.0
SERVER_VERSION = "minipulsar"


class PulsarConnection:
    """Serve one connection (``reader``/``writer``: asyncio streams) for ``service``
    (a BrokerService); ``pulsar_url`` / ``pulsar_url_tls``: this broker's own
    ``pulsar://`` / ``pulsar+ssl://`` URLs (lookup answers). ``await run()`` returns
    when the connection is closed."""

    def __init__(self, service, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 pulsar_url: str, pulsar_url_tls: str = ""):
        self.service = service
        self.reader = reader
        self.writer = writer
        self.pulsar_url = pulsar_url
        self.pulsar_url_tls = pulsar_url_tls
        self.peer = writer.get_extra_info("peername")
        self.max_message_size = service.config.max_message_size
        # What CONNECTED announces: the official clients cut chunks (and check sizes) at this many
        # payload bytes and add their metadata on top, while the broker's limit covers the whole
        # entry (metadata included, with room for replication metadata): keep FRAME_PADDING for it.
        self.client_max_message_size = max(1024, self.max_message_size - FRAME_PADDING)
        self.protocol_version = 0
        self.who = None                      # AuthenticationResult of CONNECT (None: security off)
        self.closed = False
        self.pending_sends = 0
        self._sends_drained = asyncio.Event()
        self._sends_drained.set()
        self._tasks: set[asyncio.Task] = set()
        self._last_read = time.monotonic()
        self.producers = ProducerCommands(self)
        self.consumers = ConsumerCommands(self)
        self.lookups = LookupCommands(self)
        self._handlers = {
            T.PING: lambda cmd, payload: self.write_command(BaseCommand(type=T.PONG, pong={})),
            T.PONG: lambda cmd, payload: None,
            **self.producers.handlers(), **self.consumers.handlers(), **self.lookups.handlers(),
        }

    # ---- security --------------------------------------------------------
    @property
    def security(self):
        """The broker's BrokerSecurity when authentication or authorization is on, else None."""
        security = getattr(self.service, "security", None)
        return security if security is not None and security.enabled else None

    async def check_topic(self, topic: str, action: str, subscription: Optional[str] = None) -> None:
        """Authorize ``action`` ("produce", "consume", "lookup") on ``topic`` for the
        connection's role; raises AuthorizationError (no-op with security off), or
        AuthenticationError when the CONNECT token expired since: the connection is then
        closed after the answer, so the client connects again with a fresh token (we
        announce no auth refresh, as Pulsar's broker does for such clients)."""
        if self.security is None:
            return
        if self.who is not None and self.who.expired():
            from proto.errors import AuthenticationError

            asyncio.get_running_loop().call_later(0.1, self.close, "token expired")
            raise AuthenticationError(f"the token of role {self.who.role} expired; connect again with a new one")
        await self.security.check_topic(self.who, topic, action, subscription)

    # ---- writing ---------------------------------------------------------
    def write_command(self, cmd: BaseCommand) -> None:
        """Queue one simple frame (never blocks; a closed connection drops it)."""
        if not self.closed:
            self.writer.write(encode_command(cmd))

    def write_payload_command(self, cmd: BaseCommand, headers_and_payload: bytes) -> None:
        """Queue one payload frame (MESSAGE)."""
        if not self.closed:
            self.writer.write(encode_payload_command(cmd, headers_and_payload))

    async def drain(self) -> None:
        """Wait until the socket took the frames queued beyond the transport's
        high-water mark (back-pressure); returns at once on a closed connection."""
        if not self.closed:
            try:
                await self.writer.drain()
            except (ConnectionError, RuntimeError):
                self.close("write failed")

    def send_error(self, request_id: int, exc: BaseException) -> None:
        """Answer request ``request_id`` with a CommandError for ``exc``."""
        code, message = server_error(exc)
        self.write_command(BaseCommand(type=T.ERROR, error={"request_id": request_id, "error": code,
                                                            "message": message}))

    def spawn(self, coro) -> asyncio.Task:
        """Run a handler coroutine as a task of this connection (cancelled when it closes)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("[%s] command handler failed", self.peer, exc_info=task.exception())

    # ---- send accounting (read back-pressure) ------------------------------
    def send_started(self) -> None:
        """A send is being stored (count for the read pause)."""
        self.pending_sends += 1
        if self.pending_sends > MAX_PENDING_SENDS:
            self._sends_drained.clear()

    def send_finished(self) -> None:
        """A send was answered or dropped."""
        self.pending_sends -= 1
        if self.pending_sends <= MAX_PENDING_SENDS // 2:
            self._sends_drained.set()

    # ---- lifecycle -------------------------------------------------------
    async def run(self) -> None:
        """Read and serve frames until the client goes, a frame is malformed or the
        broker closes the connection; then release its producers and consumers."""
        decoder = FrameDecoder(self.max_message_size + FRAME_PADDING)
        keepalive = asyncio.ensure_future(self._keepalive())
        try:
            while not self.closed:
                if not self._sends_drained.is_set():
                    await self._sends_drained.wait()
                data = await self.reader.read(256 * 1024)
                if not data:
                    break
                self._last_read = time.monotonic()
                for cmd, payload in decoder.feed(data):
                    if self.protocol_version == 0:
                        await self._connect(cmd)
                    else:
                        self._dispatch(cmd, payload)
                    if self.closed:
                        break
        except FrameError as exc:
            log.warning("[%s] malformed frame, closing this connection: %s", self.peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            keepalive.cancel()
            await self._release()

    def _dispatch(self, cmd: BaseCommand, payload: Optional[bytes]) -> None:
        handler = self._handlers.get(cmd.type)
        if handler is None:
            self._unserved(cmd)
            return
        handler(cmd, payload)

    def _unserved(self, cmd: BaseCommand) -> None:
        """A known command minipulsar does not serve (consumer stats, transactions, topic
        list watchers, broker-only answers): refused with a NotAllowed CommandError when it
        carries a request id (the client fails that request), else ignored; logged either way."""
        from proto.errors import NotAllowed

        name = T.Name(cmd.type)
        field = cmd.DESCRIPTOR.fields_by_number.get(cmd.type)
        sub = getattr(cmd, field.name) if field is not None and cmd.HasField(field.name) else None
        request_id = getattr(sub, "request_id", None) if sub is not None else None
        log.warning("[%s] command %s is not served by minipulsar%s", self.peer, name,
                    "; refused" if request_id is not None else "; ignored")
        if request_id is not None:
            self.send_error(request_id, NotAllowed(f"command {name} is not supported by minipulsar"))

    async def _connect(self, cmd: BaseCommand) -> None:
        if cmd.type != T.CONNECT:
            raise FrameError(f"the first command must be CONNECT, got {T.Name(cmd.type)}")
        c = cmd.connect
        if self.security is not None and self.security.authentication is not None:
            try:
                self.who = self._authenticate(c)
            except Exception as exc:  # noqa: BLE001 - refused: answered, then closed
                log.info("[%s] CONNECT refused: %s", self.peer, exc)
                self.send_error(NO_REQUEST, exc)
                await self.drain()
                self.close("authentication refused")
                return
        self.protocol_version = max(1, min(c.protocol_version, MAX_PROTOCOL_VERSION))
        self.write_command(BaseCommand(type=T.CONNECTED, connected=CommandConnected(
            server_version=SERVER_VERSION, protocol_version=self.protocol_version,
            max_message_size=self.client_max_message_size, feature_flags=FeatureFlags())))
        log.info("[%s] connected: %s, protocol v%d", self.peer, c.client_version, self.protocol_version)

    def _authenticate(self, c):
        from proto.errors import AuthenticationError

        if c.auth_method_name != "token":
            raise AuthenticationError(f"this broker requires token authentication (auth_method_name "
                                      f"'token'), got '{c.auth_method_name or 'none'}'")
        token = c.auth_data.decode("utf-8", "replace").strip()
        if token.startswith("token:"):
            token = token[len("token:"):]
        return self.security.authentication.authenticate([("authorization", f"Bearer {token}")])

    async def _keepalive(self) -> None:
        while not self.closed:
            await asyncio.sleep(KEEPALIVE_S)
            idle = time.monotonic() - self._last_read
            if idle >= 2 * KEEPALIVE_S:
                log.info("[%s] no frame for %.0f s: closing", self.peer, idle)
                self.close("keepalive timeout")
                self.reader.feed_eof()
                return
            if idle >= KEEPALIVE_S:
                self.write_command(BaseCommand(type=T.PING, ping={}))

    def close(self, reason: str) -> None:
        """Close the socket (the read loop then releases everything)."""
        if not self.closed:
            self.closed = True
            log.debug("[%s] closing: %s", self.peer, reason)
            self.writer.close()

    async def _release(self) -> None:
        self.close("connection ended")
        for task in list(self._tasks):
            task.cancel()
        await self.producers.close_all()
        await self.consumers.close_all()


__all__ = ["PulsarConnection", "MAX_PROTOCOL_VERSION", "NO_REQUEST", "ServerError"]
