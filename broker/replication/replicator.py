"""One replicator per (topic, remote cluster) (Pulsar's ``PersistentReplicator``).

* A durable cursor ``pulsar.repl.<remote>`` on the local topic marks what was
  replicated.
* An internal producer to the remote broker (raw Produce stream, producer name
  ``pulsar.repl.<local>``, ``is_replicator``) sends whole entries: the payload
  is not touched, only ``replicated_from`` and the source position are set in
  the metadata (``with_metadata``).
* Per entry (PersistentReplicator.readEntriesComplete + replicateEntries):
  unparsable -> logged and skipped; ``replicated_from`` set -> not forwarded
  (loop prevention); ``replicate_to`` excluding the remote -> skipped; older
  than the namespace message TTL -> skipped (expired). Skipped entries are
  acknowledged on the cursor.
* Reads are bounded by producer permits (queue of
  ``replication_producer_queue_size``; reading resumes below 90%) and by the
  dispatch rate (msgs/s and bytes/s).
* At most ``max_batches_in_flight`` SendBatches wait for receipts; entries
  written meanwhile go out together in the next one (Nagle-like, no timer).
  A trickle of entries then costs one write, one receipt and one remote bookie
  group commit per batch instead of per entry, which keeps the replication
  lag low when the brokers and bookies are busy.
* On a send receipt the position is deleted from the cursor; on any error the
  producer is closed, the cursor rewinds to its mark-delete position and the
  producer reconnects with exponential backoff.

Exactly once, beyond Pulsar: each Send's sequence id is the source position
``ledger_id << 32 | entry_id``, and the remote always deduplicates replicator
producers (``MessageDeduplication``), durably, so re-sent entries after
rewinds, reconnects or restarts are dropped there (answered -1:-1). The
remote stops accepting a replicator stream's sends after a failed one, so a
later entry is never stored before an earlier failed one (Pulsar #26113).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from typing import TYPE_CHECKING, Optional

import grpc

from broker.ledger.position import Entry, Position
from broker.replication.markers import is_marker
from broker.replication.remote_lookup import lookup_remote_owner
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.channels import ChannelSecurity, open_channel
from proto.common import REPLICATOR_CURSOR_PREFIX, grpc_message_size_options, source_sequence_id
from proto.entry_format import peek_metadata, with_metadata
from proto.errors import CorruptedMessage
from proto.tls_errors import describe_tls_failure
from proto.service_url import parse_service_url

if TYPE_CHECKING:
    from broker.service.topic import PersistentTopic

log = logging.getLogger(__name__)

REPL_CURSOR_PREFIX = REPLICATOR_CURSOR_PREFIX
GRPC_OPTIONS = [*grpc_message_size_options(),
                # reconnect to a restarted remote within a second (gRPC's default backoff
                # grows to 120 s); the connect timeout (min_reconnect_backoff_ms) stays 20 s
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000)]
# Longest wait between two replicator sessions (seconds); a remote that becomes
# READY meanwhile ends the wait at once.
MAX_RETRY_BACKOFF_S = 30.0


def position_sequence_id(pos: Position) -> int:
    """The replicator's sequence id of a source position: ``ledger << 32 | entry``."""
    return source_sequence_id(pos.ledger_id, pos.entry_id)


def target(url: str) -> str:
    """``minipulsar://host:port`` -> the gRPC target ``host:port``; raises
    ``InvalidConfiguration`` for a bad URL (cluster URLs are checked when registered)."""
    return parse_service_url(url).target


class RateLimiter:
    """Messages/s and bytes/s limits over fixed 1-second windows (a counter per window, not a
    token bucket; Pulsar's DispatchRateLimiter for replicators); a limit <= 0 = unlimited."""

    def __init__(self, msgs_per_s: float = 0, bytes_per_s: float = 0):
        self.msgs_per_s = msgs_per_s
        self.bytes_per_s = bytes_per_s
        self._window_start = time.monotonic()
        self._msgs = 0
        self._bytes = 0

    async def acquire(self, msgs: int, nbytes: int) -> None:
        """Wait until the current 1-second window is under both limits, then count ``msgs``
        messages and ``nbytes`` bytes in it (one call may overshoot a limit; the next waits
        for a new window). Pulsar's dispatchThrottlingRatePerReplicatorInMsg / InByte."""
        if self.msgs_per_s <= 0 and self.bytes_per_s <= 0:
            return
        while True:
            now = time.monotonic()
            if now - self._window_start >= 1.0:
                self._window_start, self._msgs, self._bytes = now, 0, 0
            over_m = self.msgs_per_s > 0 and self._msgs >= self.msgs_per_s
            over_b = self.bytes_per_s > 0 and self._bytes >= self.bytes_per_s
            if not (over_m or over_b):
                self._msgs += msgs
                self._bytes += nbytes
                return
            await asyncio.sleep(max(0.001, self._window_start + 1.0 - now))


class Replicator:
    """Replicates one local topic to ``remote_cluster`` at ``remote_url`` (Pulsar's PersistentReplicator).

    ``queue_size``: max entries sent and not yet receipted (replicationProducerQueueSize);
    ``dispatch_rate``: (msgs/s, bytes/s) limits, <= 0 = unlimited; ``mark_delete_rate_limit``:
    max persists/s of the ``pulsar.repl.<remote>`` cursor (0 = persist every receipt at once);
    ``max_batches_in_flight``: SendBatches awaiting receipts before the next one is sent (count).
    """

    def __init__(self, topic: "PersistentTopic", local_cluster: str, remote_cluster: str, remote_url: str,
                 queue_size: int = 1000, dispatch_rate: tuple[float, float] = (0, 0),
                 mark_delete_rate_limit: float = 0.0, max_batches_in_flight: int = 1,
                 security: Optional[ChannelSecurity] = None):
        self.topic = topic
        self.security = security            # proto.channels.ChannelSecurity of the links to the remote
        self.local_cluster = local_cluster
        self.remote_cluster = remote_cluster
        self.remote_url = remote_url
        self.queue_size = queue_size
        self.mark_delete_rate_limit = mark_delete_rate_limit
        self.max_batches_in_flight = max_batches_in_flight
        self.max_entries_per_batch = 500
        self.limiter = RateLimiter(*dispatch_rate)
        self.cursor = None
        self.connected = False
        self.msg_out_counter = 0
        self.bytes_out_counter = 0
        self.msg_expired_counter = 0
        self._task: Optional[asyncio.Task] = None
        self._closed = False
        self._channel = None                # the channel of the current session's remote broker
        self._channels: dict[str, grpc.aio.Channel] = {}   # host:port -> channel
        self._last_rate_time = time.monotonic()
        self._last_rate_counters = (0, 0)
        self._rates = (0.0, 0.0)
        self._oldest_pending_publish_ms: Optional[int] = None
        self.log_prefix = f"[{topic.name}][{local_cluster} -> {remote_cluster}]"

    @property
    def cursor_name(self) -> str:
        """The local replication cursor's name, ``pulsar.repl.<remote cluster>`` (as Pulsar's)."""
        return REPL_CURSOR_PREFIX + self.remote_cluster

    async def start(self) -> None:
        """Open the durable cursor ``cursor_name`` (created at the earliest position), set its
        mark_delete_rate_limit and start the replication task, which reconnects on errors.
        Raises what opening the cursor raises."""
        self.cursor = await self.topic.ml.open_cursor(self.cursor_name, initial_position="earliest")
        self.cursor.mark_delete_rate_limit = self.mark_delete_rate_limit
        self._task = asyncio.create_task(self._run())
        log.info("%s replicator started", self.log_prefix)

    async def close(self, delete_cursor: bool = False) -> None:
        """Stop replicating (and drop the cursor when the remote was removed)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if delete_cursor and not self.topic.ml.is_closed:
            await self.topic.ml.delete_cursor(self.cursor_name)
        self.connected = False

    # ---- main loop ------------------------------------------------------
    async def _run(self) -> None:
        backoff = 0.1
        while not self._closed:
            try:
                await self._replicate_session()
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.connected:
                    backoff = 0.1       # a session was up: this is a new outage, start the backoff over
                hint = describe_tls_failure(exc.details() or "", self.security is not None and self.security.tls,
                                            self.remote_url) if isinstance(exc, grpc.aio.AioRpcError) else None
                log.warning("%s replication interrupted: %s; rewinding and retrying within %.1fs",
                            self.log_prefix, (hint + " (broker_client_tls_* settings, the cluster's "
                                              "service_url_tls)") if hint else exc, backoff)
            self.connected = False
            self.cursor.rewind()
            if self._closed:
                return
            await self._wait_before_retry(backoff * (0.8 + 0.4 * random.random()))
            backoff = min(backoff * 2, MAX_RETRY_BACKOFF_S)

    async def _wait_before_retry(self, delay_s: float) -> None:
        """Sleep ``delay_s`` seconds, or less when the remote's channel was not
        connected and becomes READY meanwhile (a restarted remote is served at
        once instead of after the backoff)."""
        channel = self._channel
        if channel is None or channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            await asyncio.sleep(delay_s)     # connected, yet refused: a plain backoff
            return
        try:
            await asyncio.wait_for(channel.channel_ready(), delay_s)
        except (asyncio.TimeoutError, grpc.aio.AioRpcError):
            pass

    def _open_channel(self, host: str):
        """The pooled channel to one remote broker ``host:port``."""
        channel = self._channels.get(host)
        if channel is None:
            channel = self._channels[host] = open_channel(host, GRPC_OPTIONS, self.security)
        return channel

    async def _replicate_session(self) -> None:
        # the remote cluster may be several brokers: look the topic up (any live host answers),
        # then produce to its owner; a session that fails looks it up again
        owner = await lookup_remote_owner(self.remote_url, str(self.topic.name), self._open_channel)
        self._channel = self._open_channel(owner)
        stub = broker_pb2_grpc.PulsarBrokerStub(self._channel)
        call = stub.Produce()
        await call.write(pb.ProducerRequest(create=pb.CreateProducer(
            topic=str(self.topic.name), producer_name=REPL_CURSOR_PREFIX + self.local_cluster, is_replicator=True)))
        first = await call.read()
        if first is grpc.aio.EOF or not first.HasField("success"):
            raise ConnectionError("remote did not accept the replicator producer")
        self.connected = True
        log.info("%s replicator producer connected", self.log_prefix)
        in_flight: collections.deque[tuple[Position, int]] = collections.deque()   # (position, publish_time)
        space = asyncio.Event()
        space.set()
        failure: list[BaseException] = []
        batch_ends: collections.deque[int] = collections.deque()  # entries sent so far at each batch's end
        counts = [0, 0]  # entries sent, entries receipted
        batch_done = asyncio.Event()
        batch_done.set()

        async def receipts():
            """Read the remote's answers: delete receipted positions from the cursor and free queue
            and batch room; EOF, a send_error or a receipt that is not for the oldest entry in
            flight ends the session (stored in ``failure``)."""
            try:
                while True:
                    resp = await call.read()
                    if resp is grpc.aio.EOF:
                        raise ConnectionError("remote closed the replicator stream")
                    if resp.HasField("send_error") or resp.HasField("send_errors"):
                        e = resp.send_error if resp.HasField("send_error") else resp.send_errors.errors[0]
                        raise ConnectionError(f"remote refused entry with sequence id {e.sequence_id}: "
                                              f"{e.error}: {e.message}")
                    done = []
                    for r in resp.receipts.receipts:
                        pos, _ = in_flight.popleft()
                        if position_sequence_id(pos) != r.sequence_id:
                            raise ConnectionError(f"receipt for {r.sequence_id} does not match head {pos}")
                        done.append(pos)
                    if done:
                        self.cursor.delete_nowait(done)
                        counts[1] += len(done)
                        while batch_ends and batch_ends[0] <= counts[1]:
                            batch_ends.popleft()
                        if len(batch_ends) < self.max_batches_in_flight:
                            batch_done.set()
                    self._oldest_pending_publish_ms = in_flight[0][1] if in_flight else None
                    if len(in_flight) < self.queue_size * 0.9:
                        space.set()
            except BaseException as exc:  # noqa: BLE001 - surface to the session
                failure.append(exc)
                space.set()
                batch_done.set()

        receipt_task = asyncio.create_task(receipts())
        try:
            while not self._closed:
                if failure:
                    raise failure[0]
                if len(in_flight) >= self.queue_size:
                    space.clear()
                    await space.wait()
                    continue
                if len(batch_ends) >= self.max_batches_in_flight:
                    batch_done.clear()
                    await batch_done.wait()
                    continue
                n = min(self.max_entries_per_batch, self.queue_size - len(in_flight))
                entries = await self.cursor.read_entries_or_wait(n, timeout=0.5)
                if failure:
                    raise failure[0]
                sends = []
                skipped: list[Position] = []
                for entry in entries:
                    prepared = self._prepare(entry)
                    if prepared is None:
                        skipped.append(entry.position)
                        continue
                    data, publish_time, n_msgs = prepared
                    await self.limiter.acquire(n_msgs, len(data))
                    seq = position_sequence_id(entry.position)
                    sends.append(pb.Send(sequence_id=seq, highest_sequence_id=seq, num_messages=n_msgs,
                                         headers_and_payload=data))
                    in_flight.append((entry.position, publish_time))
                    self.msg_out_counter += n_msgs
                    self.bytes_out_counter += len(data)
                if skipped:
                    self.cursor.delete_nowait(skipped)
                if sends:
                    if self._oldest_pending_publish_ms is None:
                        self._oldest_pending_publish_ms = in_flight[0][1]
                    counts[0] += len(sends)
                    batch_ends.append(counts[0])
                    await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=sends)))
        finally:
            receipt_task.cancel()
            call.cancel()
            self._oldest_pending_publish_ms = None

    def _prepare(self, entry: Entry) -> Optional[tuple[bytes, int, int]]:
        """Apply the per-entry rules; returns (entry bytes to send, publish time ms,
        message count) or None when the entry is not to be replicated."""
        try:
            md = peek_metadata(entry.data)
        except CorruptedMessage as exc:
            log.error("%s skipping unparsable entry %s: %s", self.log_prefix, entry.position, exc)
            return None
        if md.HasField("replicated_from"):
            # Never forwarded (loop prevention); markers from this replicator's
            # remote drive the replicated-subscription protocol here.
            if is_marker(md) and md.replicated_from == self.remote_cluster:
                self.topic.received_replicated_marker(self.remote_cluster, entry, md)
            return None
        if md.replicate_to and self.remote_cluster not in md.replicate_to:
            return None
        if not is_marker(md):
            ttl = self.topic.message_ttl_seconds
            if ttl > 0 and md.publish_time and md.publish_time < (time.time() - ttl) * 1000:
                self.msg_expired_counter += 1
                return None
        elif not self.topic.on_replicated_marker(self, entry, md):
            return None
        local, pos = self.local_cluster, entry.position

        def mark(m):
            """Stamp the MessageMetadata ``m`` with its origin: ``replicated_from`` and the source position."""
            m.replicated_from = local
            m.replicated_source_ledger_id = pos.ledger_id
            m.replicated_source_entry_id = pos.entry_id

        try:
            data = with_metadata(entry.data, mark)
        except CorruptedMessage as exc:
            log.error("%s skipping corrupt entry %s: %s", self.log_prefix, entry.position, exc)
            return None
        n = md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 1
        return data, md.publish_time, max(1, n)

    # ---- figures --------------------------------------------------------
    def stats(self) -> dict:
        """ReplicatorStats with Pulsar's names."""
        now = time.monotonic()
        elapsed = now - self._last_rate_time
        if elapsed >= 1.0:
            m, b = self.msg_out_counter, self.bytes_out_counter
            self._rates = ((m - self._last_rate_counters[0]) / elapsed, (b - self._last_rate_counters[1]) / elapsed)
            self._last_rate_time, self._last_rate_counters = now, (m, b)
        backlog = self.cursor.number_of_entries_in_backlog() if self.cursor is not None else 0
        delay = 0.0
        if self._oldest_pending_publish_ms:
            delay = max(0.0, time.time() - self._oldest_pending_publish_ms / 1000.0)
        return {"replicationBacklog": backlog, "msgRateOut": self._rates[0], "msgThroughputOut": self._rates[1],
                "msgOutCounter": self.msg_out_counter, "msgExpiredCounter": self.msg_expired_counter,
                "replicationDelayInSeconds": delay, "connected": self.connected,
                "remoteServiceUrl": self.remote_url}
