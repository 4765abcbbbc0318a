"""PRODUCER / SEND / CLOSE_PRODUCER of one connection (Pulsar's ServerCnx.handleProducer,
handleSend, handleCloseProducer), translated to the service layer: ``topic.add_producer``,
``service.edge_commands.submit_send`` (dedup, ordering after a failed send) and
``topic.remove_producer``.

Receipts go out in send order per producer. A send refused with a retriable error
(storage not available, topic closing, dedup state unknown) is not answered: the
broker closes the producer (CLOSE_PRODUCER) and the client reconnects it and resends
every message not yet receipted, as it does after Pulsar's own broker-initiated close;
a non-retriable refusal is a SEND_ERROR (code ChecksumError, the real reason in its
message) that fails that message only."""
from __future__ import annotations

import collections
import logging
from typing import Optional

from proto import broker_pb2 as pb
from proto.pulsar_wire_pb2 import BaseCommand, ProducerAccessMode, ServerError

from broker.service.edge_commands import open_producer, submit_send
from broker.service.errors import InvalidArgument, ServiceNotReady
from proto.errors import NotAllowed

from .frames import FrameError
from .ids import NO_REQUEST, message_id
from .server_errors import is_retriable, server_error

log = logging.getLogger(__name__)
T = BaseCommand.Type


class EdgeProducer:
    """One producer id of a connection: the service's BrokerProducer, its topic, and
    the sends not answered yet ((sequence_id, highest_sequence_id, future or error))."""

    def __init__(self, commands: "ProducerCommands", producer_id: int, topic, producer):
        self.commands = commands
        self.producer_id = producer_id
        self.topic = topic
        self.producer = producer
        self.pending: collections.deque = collections.deque()
        self.closed = False

    def add(self, seq: int, highest: int, item) -> None:
        """Track one send (its sequence ids and the future of its Position, or the exception that
        refused it); answered in order."""
        conn = self.commands.conn
        conn.send_started()
        self.pending.append((seq, highest, item))
        if hasattr(item, "add_done_callback"):
            item.add_done_callback(lambda _f: self.answer())
        else:
            self.answer()

    def answer(self) -> None:
        """Answer the sends at the head that are done, in send order."""
        conn = self.commands.conn
        while self.pending and not self.closed:
            seq, highest, item = self.pending[0]
            if hasattr(item, "done"):
                if not item.done():
                    return
                exc = item.exception() if not item.cancelled() else ServiceNotReady("cancelled")
            else:
                exc = item
            self.pending.popleft()
            conn.send_finished()
            if exc is None:
                pos = item.result()
                conn.write_command(BaseCommand(type=T.SEND_RECEIPT, send_receipt={
                    "producer_id": self.producer_id, "sequence_id": seq, "highest_sequence_id": highest,
                    "message_id": message_id(pos.ledger_id, pos.entry_id)}))
            elif is_retriable(exc) or self.producer.is_replicator:
                log.info("[%s] producer %s: send %d refused (%s): closing the producer so the client "
                         "resends from it", self.topic.name, self.producer.name, seq, exc)
                self.commands.close_from_broker(self)
                return
            else:
                # ChecksumError is the one code after which the official clients fail just this
                # message (any other SEND_ERROR makes them reconnect and resend it forever); the
                # message names the real refusal (MessageTooBig, InvalidArgument, CorruptedMessage...).
                _, message = server_error(exc)
                code = ServerError.ChecksumError
                conn.write_command(BaseCommand(type=T.SEND_ERROR, send_error={
                    "producer_id": self.producer_id, "sequence_id": seq, "error": code, "message": message}))

    def release(self) -> None:
        """Forget unanswered sends (the client resends them) and leave the topic."""
        self.closed = True
        for _ in range(len(self.pending)):
            self.commands.conn.send_finished()
        self.pending.clear()
        self.producer.closed = True
        self.topic.remove_producer(self.producer)


class ProducerCommands:
    """The producers of one PulsarConnection, by producer id."""

    def __init__(self, conn):
        self.conn = conn
        self.producers: dict[int, EdgeProducer] = {}
        self._creating: dict[int, object] = {}

    def handlers(self) -> dict:
        """Command type -> handler(cmd, payload)."""
        return {T.PRODUCER: self.on_producer, T.SEND: self.on_send, T.CLOSE_PRODUCER: self.on_close_producer}

    def on_producer(self, cmd: BaseCommand, payload) -> None:
        """PRODUCER: create the producer (a task); a repeated request for an existing id is answered
        again."""
        p = cmd.producer
        if p.producer_id in self.producers or p.producer_id in self._creating:
            existing = self.producers.get(p.producer_id)
            if existing is not None:  # a retried create of a producer that exists: answer it again
                self._success(p.request_id, existing)
            return
        self._creating[p.producer_id] = p.request_id
        self.conn.spawn(self._create(p))

    async def _create(self, p) -> None:
        conn = self.conn
        try:
            if p.producer_access_mode != ProducerAccessMode.Shared:
                raise NotAllowed(f"producer access mode {ProducerAccessMode.Name(p.producer_access_mode)} is not "
                                 f"supported by minipulsar; use Shared (the default)")
            await conn.check_topic(p.topic, "produce")
            topic = await conn.service.get_topic(p.topic)
            if p.HasField("schema"):
                await conn.lookups.schemas.get_or_create(topic, p.schema)
            name = p.producer_name if p.HasField("producer_name") and p.producer_name else None
            producer = await open_producer(conn.service, topic, name, False, conn.who)
        except Exception as exc:  # noqa: BLE001 - answered to the client
            self._creating.pop(p.producer_id, None)
            conn.send_error(p.request_id, exc)
            return
        if self._creating.pop(p.producer_id, None) is None or conn.closed:
            topic.remove_producer(producer)       # closed while being created
            return
        edge = EdgeProducer(self, p.producer_id, topic, producer)
        producer.on_disconnect = lambda reason: self.close_from_broker(edge)
        self.producers[p.producer_id] = edge
        log.info("[%s] producer %s created over the Pulsar protocol (%s)", topic.name, producer.name, conn.peer)
        self._success(p.request_id, edge)
        if producer.closed:                         # the topic closed meanwhile
            self.close_from_broker(edge)

    def _success(self, request_id: int, edge: EdgeProducer) -> None:
        version = self.conn.lookups.schemas.version_of(edge.topic)
        success = {"request_id": request_id, "producer_name": edge.producer.name,
                   "last_sequence_id": edge.topic.last_sequence_id(edge.producer.name)}
        if version is not None:
            success["schema_version"] = version
        self.conn.write_command(BaseCommand(type=T.PRODUCER_SUCCESS, producer_success=success))

    def on_send(self, cmd: BaseCommand, payload: Optional[bytes]) -> None:
        """SEND: hand the entry to ``edge_commands.submit_send``; a SEND without a message is a
        FrameError (closes the connection); sends of an unknown or closing producer are dropped
        (the client resends them)."""
        s = cmd.send
        if payload is None:
            raise FrameError(f"SEND of producer {s.producer_id} without a message")
        edge = self.producers.get(s.producer_id)
        if edge is None or edge.closed:
            # Sent before our CLOSE_PRODUCER reached the client: it resends after reconnecting.
            log.debug("send for unknown or closed producer %d dropped", s.producer_id)
            return
        send = pb.Send(sequence_id=s.sequence_id, highest_sequence_id=s.highest_sequence_id,
                       num_messages=s.num_messages, headers_and_payload=payload, is_chunk=s.is_chunk,
                       marker=s.marker)
        if s.HasField("txnid_most_bits") or s.HasField("txnid_least_bits"):
            item = NotAllowed("transactions are not supported by minipulsar")
        else:
            item = submit_send(edge.topic, edge.producer, send)
        if item is None:
            return
        edge.add(s.sequence_id, s.highest_sequence_id, item)

    def on_close_producer(self, cmd: BaseCommand, payload) -> None:
        """CLOSE_PRODUCER from the client: release the producer; answered SUCCESS."""
        c = cmd.close_producer
        if self._creating.pop(c.producer_id, None) is not None:
            pass                                     # _create sees it gone and removes the producer
        edge = self.producers.pop(c.producer_id, None)
        if edge is not None:
            edge.release()
            log.info("[%s] producer %s closed by the client", edge.topic.name, edge.producer.name)
        self.conn.write_command(BaseCommand(type=T.SUCCESS, success={"request_id": c.request_id}))

    def close_from_broker(self, edge: EdgeProducer) -> None:
        """Broker-initiated close (unload, failed send, revoked permission): CLOSE_PRODUCER;
        the client reconnects the producer and resends what was not receipted."""
        if self.producers.get(edge.producer_id) is edge:
            del self.producers[edge.producer_id]
            edge.release()
            self.conn.write_command(BaseCommand(type=T.CLOSE_PRODUCER, close_producer={
                "producer_id": edge.producer_id, "request_id": NO_REQUEST}))

    async def close_all(self) -> None:
        """The connection ended: release every producer."""
        self._creating.clear()
        for edge in list(self.producers.values()):
            edge.release()
        self.producers.clear()


__all__ = ["ProducerCommands", "EdgeProducer", "InvalidArgument"]
