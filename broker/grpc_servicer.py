"""The broker's gRPC front door (proto/broker.proto ``PulsarBroker``): streams and
unary calls translated to the transport-neutral BrokerService (the role of
Pulsar's ServerCnx)."""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import Optional

import grpc

from broker.ledger.position import Position
from proto.errors import PulsarException, to_status
from proto.topic_name import TopicName
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc

from .service import admin
from .service.broker_service import BrokerService
from .service.consumer import Consumer, ConsumerWriter
from .service.error_edge import to_pulsar
from .service.errors import InvalidArgument, ServiceNotReady
from .service.resources import check_subscription_name
from .service.edge_commands import apply_ack, apply_redeliver, open_producer, seek_target, submit_send

log = logging.getLogger(__name__)

# The Produce stream yields to the event loop after this many sends of one frame.
YIELD_EVERY_SENDS = 256
# At most this many receipts (or errors) in one ProducerResponse frame.
ANSWERS_PER_FRAME = 1024


async def abort_with(context, exc: BaseException):
    """End the call with the gRPC status for ``exc`` ("ClassName: message"),
    translated at the broker's error edge (``service.error_edge.to_pulsar``)."""
    exc = to_pulsar(exc)
    if not isinstance(exc, PulsarException):
        log.exception("internal error", exc_info=exc)
    code, details = to_status(exc)
    await context.abort(getattr(grpc.StatusCode, code, grpc.StatusCode.INTERNAL), details)


def _status_response(request_id: int, exc: Optional[BaseException]) -> pb.ConsumerResponse:
    if exc is None:
        return pb.ConsumerResponse(success=pb.CommandSuccess(request_id=request_id))
    _, details = to_status(to_pulsar(exc))
    name, _, message = details.partition(": ")
    return pb.ConsumerResponse(error=pb.CommandError(request_id=request_id, error=name, message=message))


class PulsarBrokerServicer(broker_pb2_grpc.PulsarBrokerServicer):
    """The ``PulsarBroker`` service of proto/broker.proto over a BrokerService (the role
    of Pulsar's ServerCnx); an error ends a call with ``abort_with``'s status."""

    def __init__(self, service: BrokerService):
        self.service = service

    # ---- security (broker.security.broker_security.BrokerSecurity on the service) ----
    async def _authorize_topic(self, context, topic: str, action: str, subscription: Optional[str] = None):
        """The caller's AuthenticationResult (None with security off) once it may
        ``action`` ("produce", "consume", "lookup") on ``topic``; raises
        AuthenticationError / AuthorizationError."""
        security = getattr(self.service, "security", None)
        if security is None or not security.enabled:
            return None
        who = security.authenticate(context)
        await security.check_topic(who, topic, action, subscription)
        return who

    # ---- producers ------------------------------------------------------
    async def Produce(self, request_iterator, context):
        """Producer stream (Pulsar's ServerCnx.handleProducer / handleSend): ``create`` first, answered
        ProducerSuccess; then SendBatch frames, answered in send order (ReceiptBatch, SendError(Batch)).
        Ends with INVALID_ARGUMENT (no ``create``), the create's status (NOT_FOUND, ALREADY_EXISTS
        ProducerBusy...), a retriable send error's after its SendError, or UNAVAILABLE (topic closed)."""
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("create"):
            await abort_with(context, InvalidArgument("the first message of a Produce stream must be 'create'"))
        create = first.create
        try:
            who = await self._authorize_topic(context, create.topic, "produce")
            topic = await self.service.get_topic(create.topic)
            # the replicator identity is reserved; auth re-checked by BrokerSecurity.sweep
            producer = await open_producer(self.service, topic, create.producer_name, create.is_replicator, who)
        except Exception as exc:
            await abort_with(context, exc)
            return
        log.info("[%s] producer %s created (topic instance %x, %s)", topic.name, producer.name, id(topic),
                 context.peer())
        try:
            await context.write(pb.ProducerResponse(success=pb.ProducerSuccess(
                producer_name=producer.name, last_sequence_id=topic.last_sequence_id(producer.name),
                max_message_size=self.service.config.max_message_size, topic=str(topic.name))))
            await self._produce_loop(context, topic, producer)
        finally:
            topic.remove_producer(producer)
            log.info("[%s] producer %s removed (topic instance %x)", topic.name, producer.name, id(topic))

    async def _produce_loop(self, context, topic, producer) -> None:
        pending: collections.deque = collections.deque()
        loop = asyncio.get_running_loop()
        wake: list = [None]  # the future the loop below awaits, if any (plain futures: no tasks per entry)

        def signal(_=None) -> None:
            w = wake[0]
            if w is not None and not w.done():
                w.set_result(None)

        async def reader():
            while True:
                req = await context.read()
                if req is grpc.aio.EOF:
                    return
                if not req.HasField("sends"):
                    continue
                for i, send in enumerate(req.sends.sends):
                    if i and i % YIELD_EVERY_SENDS == 0:
                        await asyncio.sleep(0)  # a frame of many sends never stalls other clients
                    item = submit_send(topic, producer, send)
                    if item is None:
                        continue                       # disconnecting: the client resends after reconnecting
                    pending.append((send, item))
                signal()

        def disconnect(reason: BaseException) -> None:
            # The topic closes (unload, delete, fenced ledger): answer what is in flight,
            # then end the stream so the client looks the topic up again.
            pending.append((None, reason))
            signal()

        producer.on_disconnect = disconnect
        if producer.closed:  # the topic closed while ProducerSuccess was being written
            disconnect(ServiceNotReady(f"topic {topic.name} was unloaded or deleted on this broker; "
                                       f"look it up again"))
        reader_task = asyncio.create_task(reader())
        reader_task.add_done_callback(signal)
        try:
            while True:
                if not pending:
                    if reader_task.done():
                        reader_task.result()
                        return
                    wake[0] = loop.create_future()
                    try:
                        await wake[0]
                    finally:
                        wake[0] = None
                    continue
                head = pending[0][1]
                if isinstance(head, asyncio.Future) and not head.done():
                    wake[0] = loop.create_future()
                    head.add_done_callback(signal)
                    try:
                        await wake[0]
                    finally:
                        wake[0] = None
                    continue
                # Answers go out in send order: consecutive receipts in one ReceiptBatch,
                # consecutive non-retriable errors in one SendErrorBatch (up to
                # ANSWERS_PER_FRAME each), so a frame of many bad sends costs a few writes.
                receipts: list = []
                errors: list = []

                async def flush() -> None:
                    nonlocal receipts, errors
                    if receipts:
                        await context.write(pb.ProducerResponse(receipts=pb.ReceiptBatch(receipts=receipts)))
                        receipts = []
                    if len(errors) == 1:
                        await context.write(pb.ProducerResponse(send_error=errors[0]))
                    elif errors:
                        await context.write(pb.ProducerResponse(send_errors=pb.SendErrorBatch(errors=errors)))
                    errors = []

                while pending:
                    send, item = pending[0]
                    if isinstance(item, asyncio.Future):
                        if not item.done():
                            break
                        exc = item.exception()
                    else:
                        exc = item
                    pending.popleft()
                    if send is None:                   # disconnect() after everything before it
                        await flush()
                        await abort_with(context, exc)
                        return
                    if exc is None:
                        if errors:
                            await flush()
                        pos = item.result()
                        receipts.append(pb.SendReceipt(
                            sequence_id=send.sequence_id, highest_sequence_id=send.highest_sequence_id,
                            message_id=pb.Position(ledger_id=pos.ledger_id, entry_id=pos.entry_id)))
                        if len(receipts) >= ANSWERS_PER_FRAME:
                            await flush()
                        continue
                    if receipts:
                        await flush()
                    _, details = to_status(to_pulsar(exc))
                    name, _, message = details.partition(": ")
                    errors.append(pb.SendError(sequence_id=send.sequence_id, error=name, message=message))
                    if getattr(exc, "retriable", False) or producer.is_replicator:
                        # Keep the order: the client reconnects and resends from this message on.
                        await flush()
                        await abort_with(context, exc)
                        return
                    if len(errors) >= ANSWERS_PER_FRAME:
                        await flush()
                await flush()
        finally:
            reader_task.cancel()

    # ---- consumers ------------------------------------------------------
    async def Consume(self, request_iterator, context):
        """Consumer stream (Pulsar's ServerCnx.handleSubscribe): ``subscribe`` first (answered
        SubscribeSuccess), then flow/ack/redeliver/seek/unsubscribe; pushes MessageBatch, ActiveConsumerChange,
        CommandSuccess/Error. Ends with INVALID_ARGUMENT (no ``subscribe``, empty subscription name),
        the subscribe's status (NOT_FOUND, ALREADY_EXISTS ConsumerBusy...), or UNAVAILABLE (topic closed)."""
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("subscribe"):
            await abort_with(context, InvalidArgument("the first message of a Consume stream must be 'subscribe'"))
        sub = first.subscribe
        if not sub.subscription:
            await abort_with(context, InvalidArgument("subscription name is empty"))
        writer = ConsumerWriter()
        consumer = Consumer(sub.consumer_name or f"consumer-{id(writer) & 0xffffff:x}", sub.priority_level,
                            writer.send, self.service.config.max_unacked_messages_per_consumer, writer=writer)
        consumer.on_disconnect = writer.close
        try:
            check_subscription_name(sub.subscription)
            consumer.auth = await self._authorize_topic(context, sub.topic, "consume", sub.subscription)
            topic = await self.service.get_topic(sub.topic)
            subscription = await topic.subscribe(sub, consumer)
        except Exception as exc:
            await abort_with(context, exc)
            return
        log.info("[%s][%s] consumer %s subscribed (%s)", topic.name, sub.subscription, consumer.name, context.peer())
        reader_task = None
        try:
            # Inside the try: a client that went away meanwhile (the write fails or the
            # call is cancelled) must not leave its consumer attached, or an Exclusive
            # subscription answers ConsumerBusy to every later subscribe.
            await context.write(pb.ConsumerResponse(subscribed=pb.SubscribeSuccess(
                consumer_name=consumer.name, topic=str(topic.name))))
            reader_task = asyncio.create_task(self._consumer_reader(context, topic, subscription, consumer, writer))
            while True:
                response = await writer.queue.get()
                if response is None:
                    break
                await context.write(response)
                consumer.frames_written += 1
            if consumer.closed and topic.closed:
                await abort_with(context, ServiceNotReady(
                    f"topic {topic.name} was unloaded or deleted on this broker; look it up again"))
            if getattr(consumer, "disconnect_error", None) is not None:  # BrokerSecurity: expired / revoked
                await abort_with(context, consumer.disconnect_error)
        finally:
            if reader_task is not None:
                reader_task.cancel()
            subscription.remove_consumer(consumer)
            log.info("[%s][%s] consumer %s removed", topic.name, sub.subscription, consumer.name)
            if not subscription.durable:
                await subscription.close()

    async def _consumer_reader(self, context, topic, subscription, consumer: Consumer, writer: ConsumerWriter):
        try:
            while True:
                req = await context.read()
                if req is grpc.aio.EOF:
                    break
                kind = req.WhichOneof("request")
                if kind == "flow":
                    subscription.flow(consumer, req.flow.permits)
                elif kind == "ack":
                    self._ack(subscription, consumer, req.ack, writer)
                elif kind == "redeliver":
                    self._redeliver(subscription, consumer, req.redeliver)
                elif kind == "seek":
                    try:
                        by_time = req.seek.WhichOneof("target") == "publish_time"
                        m = req.seek.message_id
                        pos = await seek_target(topic, None if by_time else Position(m.ledger_id, m.entry_id),
                                                req.seek.publish_time if by_time else None)
                        request_id = req.seek.request_id
                        await subscription.reset_cursor(
                            pos, before_resume=lambda: writer.send(_status_response(request_id, None)))
                    except Exception as exc:
                        writer.send(_status_response(req.seek.request_id, exc))
                elif kind == "unsubscribe":
                    # Removing the subscription disconnects its consumers; this one's stream
                    # ends here instead, after the answer (else the client never gets it).
                    hook, consumer.on_disconnect = getattr(consumer, "on_disconnect", None), None
                    try:
                        if subscription.durable:
                            await subscription.unsubscribe(consumer)
                        writer.send(_status_response(req.unsubscribe.request_id, None))
                        writer.close()
                        return
                    except Exception as exc:
                        consumer.on_disconnect = hook
                        writer.send(_status_response(req.unsubscribe.request_id, exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("consumer stream reader ended: %s", exc)
        writer.close()

    @staticmethod
    def _redeliver(subscription, consumer: Consumer, redeliver: pb.RedeliverUnacknowledged) -> None:
        """RedeliverUnacknowledged: ``service.edge_commands.apply_redeliver``."""
        apply_redeliver(subscription, consumer, redeliver)

    def _ack(self, subscription, consumer, ack: pb.Ack, writer: ConsumerWriter) -> None:
        """An Ack (``service.edge_commands.apply_ack``), answered with CommandSuccess /
        CommandError on the consumer's stream."""
        apply_ack(subscription, consumer, ack,
                  lambda request_id, exc: writer.send(_status_response(request_id, exc)))

    # ---- lookup / admin ---------------------------------------------------
    async def GetPartitionedTopicMetadata(self, request, context):
        """Partition count of a topic, 0 when not partitioned (Pulsar's
        CommandPartitionedTopicMetadata); INVALID_ARGUMENT for an invalid topic name."""
        try:
            TopicName.get(request.topic)
            await self._authorize_topic(context, request.topic, "lookup")
            return pb.PartitionedTopicMetadata(partitions=await self.service.partitions_of(request.topic))
        except Exception as exc:
            await abort_with(context, exc)

    async def GetLastMessageId(self, request, context):
        """Last and first entry of a topic, -1:-1 when empty (Pulsar's CommandGetLastMessageId);
        loads (or auto-creates) the topic: NOT_FOUND when it does not exist and cannot be created."""
        try:
            await self._authorize_topic(context, request.topic, "lookup")
            owner = await self._owner_elsewhere(request.topic)
            if owner is not None:  # a broker cluster: the owner answers (its entries, its LAC)
                from proto.broker_pb2_grpc import PulsarBrokerStub
                stub = PulsarBrokerStub(self.service.namespace_service.channel_to(owner))
                try:
                    return await stub.GetLastMessageId(request, timeout=30)
                except grpc.aio.AioRpcError as exc:
                    from proto.errors import error_from_status
                    raise error_from_status(exc.code(), exc.details() or "") from None
            topic = await self.service.get_topic(request.topic)
            ml = topic.ml
            last = await topic.last_message_position()
            first = ml.first_position() if last.entry_id >= 0 else Position(-1, -1)
            return pb.LastMessageIdResponse(
                last_message_id=pb.Position(ledger_id=last.ledger_id, entry_id=last.entry_id),
                first_message_id=pb.Position(ledger_id=first.ledger_id, entry_id=first.entry_id))
        except Exception as exc:
            await abort_with(context, exc)

    async def _owner_elsewhere(self, topic: str) -> Optional[str]:
        """In a broker cluster, the service URL of the topic's owner when it is another
        broker (assigning the bundle if unowned); None when this broker serves it or is
        standalone."""
        ns = self.service.namespace_service
        if ns is None:
            return None
        served, _ = await ns.is_served_here(TopicName.get(topic))
        if served:
            return None
        owner = await ns.find_owner(str(TopicName.get(topic)))
        return None if owner == self.service.service_url else owner

    async def GetTopicsOfNamespace(self, request, context):
        """Every persistent topic of ``tenant/namespace``, partitions listed individually
        (Pulsar's CommandGetTopicsOfNamespace); NOT_FOUND when the namespace does not exist."""
        try:
            security = getattr(self.service, "security", None)
            if security is not None and security.enabled:
                await security.check_namespace_read(security.authenticate(context), request.namespace)
            return pb.TopicList(topics=await self.service.list_topics(request.namespace))
        except Exception as exc:
            await abort_with(context, exc)

    async def Lookup(self, request, context):
        """Which broker serves ``request.topic`` (Pulsar's CommandLookupTopic): CONNECT with the
        owner's service URL, or REDIRECT to the broker that will decide (``BrokerService.lookup``).
        A standalone broker answers CONNECT with ``proxy_through_service_url``. INVALID_ARGUMENT
        for an invalid topic name; UNAVAILABLE (ServiceNotReady) while no broker can take it."""
        try:
            TopicName.get(request.topic)
            await self._authorize_topic(context, request.topic, "lookup")
            answer = await self.service.lookup(request.topic, request.authoritative)
            return pb.LookupResponse(
                response=pb.LookupResponse.REDIRECT if answer.redirect else pb.LookupResponse.CONNECT,
                broker_service_url=answer.broker_service_url, authoritative=answer.authoritative,
                proxy_through_service_url=answer.proxy_through_service_url)
        except Exception as exc:
            await abort_with(context, exc)

    async def Admin(self, request, context):
        """One admin verb (``method``, e.g. "topics.stats") with a JSON body, answered in JSON
        (``service.admin.dispatch``; Pulsar's REST admin API); its errors end the call with their status."""
        try:
            from broker.ownership.admin_routing import route_admin

            security = getattr(self.service, "security", None)
            if security is not None and security.enabled:
                import json
                try:  # a body over http_max_request_size or not JSON: the verb reports it to a superuser
                    too_big = len(request.body_json) > self.service.config.http_max_request_size
                    body = json.loads(request.body_json) if request.body_json and not too_big else {}
                except (ValueError, RecursionError):
                    body = {}
                await security.check_admin(security.authenticate(context), request.method,
                                           body if isinstance(body, dict) else {})

            async def local(method: str, body_json: str) -> str:
                return await admin.dispatch(self.service, method, body_json)

            return pb.AdminResponse(body_json=await route_admin(self.service, request.method, request.body_json,
                                                                local))
        except Exception as exc:
            await abort_with(context, exc)
