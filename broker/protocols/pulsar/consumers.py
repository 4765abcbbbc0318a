"""SUBSCRIBE / FLOW / ACK / REDELIVER_UNACKNOWLEDGED_MESSAGES / SEEK / UNSUBSCRIBE /
CLOSE_CONSUMER / GET_LAST_MESSAGE_ID of one connection (Pulsar's ServerCnx consumer
handlers), translated to the service layer: ``topic.subscribe`` with a service
``Consumer`` whose ``ConsumerWriter`` (channel writability) is drained into MESSAGE
frames by one pump task per consumer, ``subscription.flow``,
``service.edge_commands.apply_ack`` / ``apply_redeliver`` / ``seek_target`` and
``subscription.reset_cursor``. After a seek the consumer is closed from the broker
(CLOSE_CONSUMER) and the client subscribes again, as Pulsar's resetCursor does."""
from __future__ import annotations

import logging
from typing import Optional

from broker.ledger.position import Position
from broker.service.consumer import Consumer, ConsumerWriter
from broker.service.edge_commands import apply_ack, apply_ack_in_order, apply_redeliver, seek_target
from broker.service.resources import check_subscription_name
from proto import broker_pb2 as pb
from proto.errors import NotAllowed, ServiceNotReady
from proto.pulsar_wire_pb2 import BaseCommand, CommandAck, CommandSubscribe, KeySharedMode

from .ids import NO_REQUEST, acked_indexes, message_id, not_acked_bits, position_of, signed
from .server_errors import server_error

log = logging.getLogger(__name__)
T = BaseCommand.Type


class EdgeConsumer:
    """One consumer id of a connection: the service Consumer, its subscription and
    the pump task writing its frames."""

    def __init__(self, commands: "ConsumerCommands", consumer_id: int, topic, subscription, consumer: Consumer,
                 writer: ConsumerWriter):
        self.commands = commands
        self.consumer_id = consumer_id
        self.topic = topic
        self.subscription = subscription
        self.consumer = consumer
        self.writer = writer
        self.closing = False          # the client closed it / unsubscribed: no CLOSE_CONSUMER
        self.pump = None

    async def run_pump(self) -> None:
        """Translate the consumer's queued responses into frames, waiting on the socket
        (so the writer's buffered bytes, and with them dispatch, follow the socket)."""
        conn = self.commands.conn
        while True:
            response = await self.writer.queue.get()
            if response is None:
                break
            kind = response.WhichOneof("response")
            if kind == "messages":
                batch = response.messages
                for entry in batch.entries:
                    msg = {"consumer_id": self.consumer_id,
                           "message_id": message_id(entry.position.ledger_id, entry.position.entry_id),
                           "redelivery_count": entry.redelivery_count}
                    if entry.ack_set:
                        msg["ack_set"] = list(entry.ack_set)
                    if batch.consumer_epoch:
                        msg["consumer_epoch"] = batch.consumer_epoch
                    conn.write_payload_command(BaseCommand(type=T.MESSAGE, message=msg), entry.headers_and_payload)
            elif kind == "active_change":
                conn.write_command(BaseCommand(type=T.ACTIVE_CONSUMER_CHANGE, active_consumer_change={
                    "consumer_id": self.consumer_id, "is_active": response.active_change.is_active}))
            elif kind == "end_of_topic":
                conn.write_command(BaseCommand(type=T.REACHED_END_OF_TOPIC,
                                               reachedEndOfTopic={"consumer_id": self.consumer_id}))
            self.consumer.frames_written += 1
            await conn.drain()
        if not self.closing:
            self.commands.close_from_broker(self)


class ConsumerCommands:
    """The consumers of one PulsarConnection, by consumer id."""

    def __init__(self, conn):
        self.conn = conn
        self.consumers: dict[int, EdgeConsumer] = {}
        self._subscribing: dict[int, int] = {}

    def handlers(self) -> dict:
        """Command type -> handler(cmd, payload)."""
        return {T.SUBSCRIBE: self.on_subscribe, T.FLOW: self.on_flow, T.ACK: self.on_ack,
                T.REDELIVER_UNACKNOWLEDGED_MESSAGES: self.on_redeliver, T.SEEK: self.on_seek,
                T.UNSUBSCRIBE: self.on_unsubscribe, T.CLOSE_CONSUMER: self.on_close_consumer,
                T.GET_LAST_MESSAGE_ID: self.on_get_last_message_id}

    # ---- subscribe ---------------------------------------------------------
    def on_subscribe(self, cmd: BaseCommand, payload) -> None:
        """SUBSCRIBE: create or recover the subscription (a task); answered SUCCESS, or ERROR with
        the ServerError of the refusal (read_compacted, STICKY Key_Shared ranges, authorization,
        unknown topic...)."""
        s = cmd.subscribe
        if s.consumer_id in self.consumers:
            self.conn.write_command(BaseCommand(type=T.SUCCESS, success={"request_id": s.request_id}))
            return
        if s.consumer_id in self._subscribing:
            return
        self._subscribing[s.consumer_id] = s.request_id
        self.conn.spawn(self._subscribe(s))

    @staticmethod
    def to_service(s: CommandSubscribe) -> pb.Subscribe:
        """The service's Subscribe for a wire SUBSCRIBE (same sub type and initial
        position numbers). A reader's start id (not earliest/latest) starts at its
        entry inclusive: the official clients drop what precedes their start id
        themselves (the start entry too unless the reader is inclusive, and a
        batch's earlier messages), and send the same id for both."""
        sub = pb.Subscribe(topic=s.topic, subscription=s.subscription, sub_type=s.subType,
                           consumer_name=s.consumer_name, priority_level=s.priority_level,
                           initial_position=s.initialPosition, durable=s.durable,
                           replicate_subscription_state=s.replicate_subscription_state)
        if not s.durable and s.HasField("start_message_id"):
            pos = position_of(s.start_message_id)
            sub.start_message_id.ledger_id = pos.ledger_id
            sub.start_message_id.entry_id = pos.entry_id
            sub.start_message_id_inclusive = pos.ledger_id >= 0 and pos.entry_id >= 0 and \
                pos.ledger_id < (1 << 63) - 1
        return sub

    async def _subscribe(self, s: CommandSubscribe) -> None:
        conn = self.conn
        writer = ConsumerWriter()
        consumer = Consumer(s.consumer_name or f"consumer-{id(writer) & 0xffffff:x}", s.priority_level,
                            writer.send, conn.service.config.max_unacked_messages_per_consumer, writer=writer)
        consumer.on_disconnect = writer.close
        try:
            if s.read_compacted:
                raise NotAllowed("read_compacted is not supported by minipulsar (no topic compaction)")
            if s.HasField("keySharedMeta") and s.keySharedMeta.keySharedMode != KeySharedMode.AUTO_SPLIT:
                raise NotAllowed("Key_Shared STICKY hash ranges are not supported; use AUTO_SPLIT (the default)")
            check_subscription_name(s.subscription)
            await conn.check_topic(s.topic, "consume", s.subscription)
            consumer.auth = conn.who
            topic = await conn.service.get_topic(s.topic, create=s.force_topic_creation)
            if s.HasField("schema"):
                await conn.lookups.schemas.get_or_create(topic, s.schema)
            if s.HasField("consumer_epoch"):
                consumer.set_epoch(s.consumer_epoch)
            subscription = await topic.subscribe(self.to_service(s), consumer)
        except Exception as exc:  # noqa: BLE001 - answered to the client
            self._subscribing.pop(s.consumer_id, None)
            conn.send_error(s.request_id, exc)
            return
        edge = EdgeConsumer(self, s.consumer_id, topic, subscription, consumer, writer)
        if self._subscribing.pop(s.consumer_id, None) is None or conn.closed:
            edge.closing = True
            await self._detach(edge)            # closed while subscribing
            return
        self.consumers[s.consumer_id] = edge
        conn.write_command(BaseCommand(type=T.SUCCESS, success={"request_id": s.request_id}))
        log.info("[%s][%s] consumer %s subscribed over the Pulsar protocol (%s)", topic.name, s.subscription,
                 consumer.name, conn.peer)
        edge.pump = conn.spawn(edge.run_pump())

    # ---- flow, acks, redelivery -----------------------------------------------
    def on_flow(self, cmd: BaseCommand, payload) -> None:
        """FLOW: ``messagePermits`` more messages for the consumer (clamped by the service
        Consumer)."""
        edge = self.consumers.get(cmd.flow.consumer_id)
        if edge is not None:
            edge.subscription.flow(edge.consumer, cmd.flow.messagePermits)

    def on_ack(self, cmd: BaseCommand, payload) -> None:
        """ACK: message ids to service AckPositions (a batch ack set, set bit = not acknowledged,
        becomes the acknowledged batch indexes) applied by ``edge_commands.apply_ack``;
        ACK_RESPONSE when the ack carries a request id."""
        a = cmd.ack
        edge = self.consumers.get(a.consumer_id)
        request_id = a.request_id if a.HasField("request_id") else 0
        if edge is None:
            if request_id:
                self._ack_response(a.consumer_id, request_id, NotAllowed(f"consumer {a.consumer_id} is not connected"))
            return
        reply = lambda rid, exc: self._ack_response(a.consumer_id, rid, exc)  # noqa: E731
        sizes: dict = {}
        unknown = [position_of(mid) for mid in a.message_id if mid.ack_set and not
                   (mid.HasField("batch_size") and mid.batch_size > 0) and
                   edge.subscription.known_batch_size(position_of(mid), edge.consumer) is None]
        if not unknown:
            ack = self._to_service_ack(a, edge, request_id, sizes)
            if ack is not None:
                apply_ack(edge.subscription, edge.consumer, ack, reply)
            return

        async def job() -> None:
            # A batch ack set of an entry whose size the broker does not know (delivered to an
            # earlier connection of the consumer): read the sizes first, in the consumer's order.
            try:
                for pos in unknown:
                    sizes[pos] = await edge.subscription.read_batch_size(pos)
            except Exception as exc:  # noqa: BLE001 - answered to the client
                reply(request_id, exc)
                return
            ack = self._to_service_ack(a, edge, request_id, sizes)
            if ack is not None:
                await apply_ack_in_order(edge.subscription, edge.consumer, ack, reply)

        if not edge.consumer.run_ordered(job):
            reply(request_id, ServiceNotReady(f"too many acknowledgments of consumer {edge.consumer.name} are "
                                              f"still being applied; send it again"))

    def _to_service_ack(self, a, edge: EdgeConsumer, request_id: int, sizes: dict) -> Optional[pb.Ack]:
        """The service Ack of wire ACK ``a`` (None when nothing is left to apply: answered here).
        ``sizes``: batch sizes read for entries the broker did not know."""
        ack = pb.Ack(ack_type=pb.Cumulative if a.ack_type == CommandAck.Cumulative else pb.Individual,
                     request_id=request_id)
        for mid in a.message_id:
            pos = position_of(mid)
            ap = ack.positions.add(ledger_id=pos.ledger_id, entry_id=pos.entry_id)
            if mid.ack_set:
                size = mid.batch_size if mid.HasField("batch_size") and mid.batch_size > 0 else \
                    (sizes.get(pos) or edge.subscription.known_batch_size(pos, edge.consumer))
                if size is None:
                    size = 64 * len(mid.ack_set)
                indexes = acked_indexes(mid.ack_set, size)
                if a.ack_type == CommandAck.Cumulative:
                    # Cumulative up to a batch index: clear bits [0, i] (the first set bit ends them).
                    pending = not_acked_bits(mid.ack_set)
                    upto = (min(pending) if pending else size) - 1
                    indexes = list(range(upto + 1))
                if not indexes:
                    del ack.positions[-1]
                    continue
                if len(indexes) < size:
                    ap.batch_size = size
                    ap.batch_indexes.extend(indexes)
        if not ack.positions:
            if request_id:
                self._ack_response(a.consumer_id, request_id, None)
            return None
        return ack

    def _ack_response(self, consumer_id: int, request_id: int, exc: Optional[BaseException]) -> None:
        if exc is None and not request_id:
            return
        if exc is not None and not request_id:
            log.info("consumer %d: acknowledgment refused: %s", consumer_id, exc)
            return
        response = {"consumer_id": consumer_id, "request_id": request_id}
        if exc is not None:
            response["error"], response["message"] = server_error(exc)
        self.conn.write_command(BaseCommand(type=T.ACK_RESPONSE, ackResponse=response))

    def on_redeliver(self, cmd: BaseCommand, payload) -> None:
        """REDELIVER_UNACKNOWLEDGED_MESSAGES: ``edge_commands.apply_redeliver`` with the ids and the
        PIP-84 consumer epoch."""
        r = cmd.redeliverUnacknowledgedMessages
        edge = self.consumers.get(r.consumer_id)
        if edge is None:
            return
        redeliver = pb.RedeliverUnacknowledged(consumer_epoch=r.consumer_epoch)
        for mid in r.message_ids:
            pos = position_of(mid)
            redeliver.positions.add(ledger_id=pos.ledger_id, entry_id=pos.entry_id)
        apply_redeliver(edge.subscription, edge.consumer, redeliver)

    # ---- seek, unsubscribe, close ---------------------------------------------
    def on_seek(self, cmd: BaseCommand, payload) -> None:
        """SEEK by message id or publish time (a task): answered SUCCESS then the consumer is closed
        from the broker, or ERROR."""
        s = cmd.seek
        edge = self.consumers.get(s.consumer_id)
        if edge is None:
            self.conn.send_error(s.request_id, NotAllowed(f"consumer {s.consumer_id} is not connected"))
            return
        self.conn.spawn(self._seek(edge, s))

    async def _seek(self, edge: EdgeConsumer, s) -> None:
        conn = self.conn
        try:
            by_time = s.HasField("message_publish_time")
            target = None if by_time or not s.HasField("message_id") else position_of(s.message_id)
            pos = await seek_target(edge.topic, target, s.message_publish_time if by_time else None)
            if not edge.subscription.durable:
                raise NotAllowed("seek on a reader: create a new reader at the message id instead")
            await edge.subscription.reset_cursor(pos)
        except Exception as exc:  # noqa: BLE001 - answered to the client
            conn.send_error(s.request_id, exc)
            return
        conn.write_command(BaseCommand(type=T.SUCCESS, success={"request_id": s.request_id}))
        # As Pulsar's resetCursor: the consumer is disconnected and subscribes again.
        self.close_from_broker(edge)

    def on_unsubscribe(self, cmd: BaseCommand, payload) -> None:
        """UNSUBSCRIBE (a task): delete the durable subscription (PreconditionFailed while others
        are connected); answered SUCCESS or ERROR."""
        u = cmd.unsubscribe
        edge = self.consumers.get(u.consumer_id)
        if edge is None:
            self.conn.send_error(u.request_id, NotAllowed(f"consumer {u.consumer_id} is not connected"))
            return
        self.conn.spawn(self._unsubscribe(edge, u.request_id))

    async def _unsubscribe(self, edge: EdgeConsumer, request_id: int) -> None:
        hook, edge.consumer.on_disconnect = edge.consumer.on_disconnect, None
        edge.closing = True
        try:
            if edge.subscription.durable:
                await edge.subscription.unsubscribe(edge.consumer)
        except Exception as exc:  # noqa: BLE001 - answered to the client
            edge.closing = False
            edge.consumer.on_disconnect = hook
            self.conn.send_error(request_id, exc)
            return
        self.conn.write_command(BaseCommand(type=T.SUCCESS, success={"request_id": request_id}))
        if self.consumers.get(edge.consumer_id) is edge:
            del self.consumers[edge.consumer_id]
        await self._detach(edge)

    def on_close_consumer(self, cmd: BaseCommand, payload) -> None:
        """CLOSE_CONSUMER from the client: detach the consumer (its pending messages go back to the
        subscription); answered SUCCESS."""
        c = cmd.close_consumer
        self._subscribing.pop(c.consumer_id, None)
        edge = self.consumers.pop(c.consumer_id, None)
        if edge is not None:
            edge.closing = True
            self.conn.spawn(self._detach(edge))
        self.conn.write_command(BaseCommand(type=T.SUCCESS, success={"request_id": c.request_id}))

    async def _detach(self, edge: EdgeConsumer) -> None:
        if edge.pump is not None:
            edge.pump.cancel()
        edge.subscription.remove_consumer(edge.consumer)
        if not edge.subscription.durable:
            await edge.subscription.close()

    def close_from_broker(self, edge: EdgeConsumer) -> None:
        """Broker-initiated close (unload, seek, revoked permission): CLOSE_CONSUMER; the
        client subscribes again (after a fresh lookup)."""
        if self.consumers.get(edge.consumer_id) is edge:
            del self.consumers[edge.consumer_id]
            edge.closing = True
            self.conn.write_command(BaseCommand(type=T.CLOSE_CONSUMER, close_consumer={
                "consumer_id": edge.consumer_id, "request_id": NO_REQUEST}))
            self.conn.spawn(self._detach(edge))

    # ---- last message id ---------------------------------------------------------
    def on_get_last_message_id(self, cmd: BaseCommand, payload) -> None:
        """GET_LAST_MESSAGE_ID of the consumer's topic (a task)."""
        g = cmd.getLastMessageId
        edge = self.consumers.get(g.consumer_id)
        if edge is None:
            self.conn.send_error(g.request_id, NotAllowed(f"consumer {g.consumer_id} is not connected"))
            return
        self.conn.spawn(self._last_message_id(edge, g.request_id))

    async def _last_message_id(self, edge: EdgeConsumer, request_id: int) -> None:
        """Pulsar's handleGetLastMessageId: the last entry with the batch index of its last
        message, and the subscription's mark-delete position."""
        try:
            last = await edge.topic.last_message_position()
            batch_index = -1
            if last.entry_id >= 0:
                size = await edge.subscription.read_batch_size(last)
                batch_index = size - 1 if size > 1 else -1
            md = edge.subscription.cursor.mark_delete_position
        except Exception as exc:  # noqa: BLE001 - answered to the client
            self.conn.send_error(request_id, exc)
            return
        self.conn.write_command(BaseCommand(type=T.GET_LAST_MESSAGE_ID_RESPONSE, getLastMessageIdResponse={
            "request_id": request_id, "last_message_id": message_id(last.ledger_id, last.entry_id, batch_index),
            "consumer_mark_delete_position": message_id(md.ledger_id, md.entry_id)}))

    async def close_all(self) -> None:
        """The connection ended: detach every consumer (their pending messages go to the
        subscription's other consumers, or come back when the client returns)."""
        self._subscribing.clear()
        edges = list(self.consumers.values())
        self.consumers.clear()
        for edge in edges:
            edge.closing = True
            await self._detach(edge)


__all__ = ["ConsumerCommands", "EdgeConsumer", "Position", "signed"]
