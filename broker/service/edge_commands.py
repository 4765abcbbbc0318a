"""The command rules every wire edge shares (Pulsar's ServerCnx handlers, minus the
wire): storing a send in order, applying an ack, a redelivery request and a seek.
The gRPC servicer (broker/grpc_servicer.py) and the Pulsar binary protocol edge
(broker/protocols/pulsar/) both call these, so dedup, acknowledgment, PIP-84 epoch
and redelivery rules cannot differ between the two wire protocols."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Optional, Union

from broker.ledger.position import Position
from proto import broker_pb2 as pb

from .consumer import Consumer
from .errors import InvalidArgument, ServiceNotReady
from .seek import find_position_by_publish_time

log = logging.getLogger(__name__)

#: ``reply(request_id, error)``: answer an acknowledgment (error None = success).
Reply = Callable[[int, Optional[BaseException]], None]


async def open_producer(service, topic, name: Optional[str], is_replicator: bool, who):
    """Register a producer of ``topic`` for the caller ``who`` (its
    AuthenticationResult; None with authentication off), both wire edges' handleProducer
    after the produce permission was checked. The replicator identity (``pulsar.repl.``
    name, ``is_replicator``) needs a role that may replicate
    (``security.replication_rules.check_producer_identity``: AuthorizationError);
    then ``topic.add_producer`` (ProducerBusy, ServiceNotReady). The producer keeps
    ``auth`` (re-checked by BrokerSecurity.sweep) and what ``publish`` checks per entry:
    ``origin_checked`` (authentication on: only replicators set ``replicated_from``)
    and ``allowed_clusters`` (with authorization on, the tenant's allowed clusters
    bounding a client's ``replicate_to``; None: not checked)."""
    from broker.security.replication_rules import check_producer_identity

    security = getattr(service, "security", None)
    enabled = security is not None and security.enabled
    check_producer_identity(name, is_replicator, None if who is None else who.role,
                            security.may_replicate(who) if enabled else True)
    allowed = None
    if enabled and security.authorization is not None and not is_replicator:
        try:
            info = await service.resources.get_tenant(topic.name.tenant)
            allowed = frozenset(info.get("allowed_clusters") or ())
        except Exception:  # noqa: BLE001 - no tenant (auto-created topic of a deleted tenant): nothing allowed
            allowed = frozenset()
    producer = topic.add_producer(name, is_replicator)
    producer.auth = who
    producer.origin_checked = enabled and security.checks_origin
    producer.allowed_clusters = allowed
    return producer


def submit_send(topic, producer, send: pb.Send) -> Union["asyncio.Future[Position]", BaseException, None]:
    """Hand one Send (one entry) of ``producer`` to ``topic.publish``; returns the
    future of its Position (Position(-1, -1) for a duplicate), the exception that
    refused it (without traceback), or None when the producer is closing (nothing
    stored: the client resends after reconnecting).

    Once a send failed with a retriable error, every later send of this producer
    connection is refused with ServiceNotReady and not stored, so that a later send
    never lands before an earlier one the client resends (with dedup the resend would
    be dropped as a duplicate of the later one: loss; a replicator would break
    exactly-once, Pulsar #26113)."""
    if producer.closed:
        return None
    if producer.failed:
        return ServiceNotReady("an earlier send on this stream failed; reconnect and resend from it")
    try:
        return topic.publish(producer, send)
    except Exception as exc:  # noqa: BLE001 - answered to the client as its send's error
        producer.failed = producer.is_replicator or getattr(exc, "retriable", False)
        # Without its traceback: a frame of many bad sends would keep every traceback alive.
        return exc.with_traceback(None)


def apply_ack(subscription, consumer: Consumer, ack: pb.Ack, reply: Reply) -> None:
    """Apply an Ack and answer it through ``reply`` (success once durable, an error
    at once) when it carries a request id; an error is answered even without one
    (request id 0). Short acks are applied here; long ones (see
    Subscription.needs_async_ack) and any ack while earlier long commands of this
    consumer are still applied run in the consumer's ordered background work; when
    that work is full the ack is refused with ServiceNotReady (retriable)."""
    try:
        inline = not consumer.ordered_busy() and not subscription.needs_async_ack(consumer, ack)
        if inline:
            _answer(ack, subscription.acknowledge(consumer, ack), reply)
            return
    except Exception as exc:  # noqa: BLE001 - answered to the client
        reply(ack.request_id, exc)
        return

    async def job() -> None:
        await apply_ack_in_order(subscription, consumer, ack, reply)

    if not consumer.run_ordered(job):
        reply(ack.request_id, ServiceNotReady(
            f"too many acknowledgments of consumer {consumer.name} are still being applied; send it again"))


def _answer(ack: pb.Ack, done, reply: Reply) -> None:
    if ack.request_id:
        fut = asyncio.ensure_future(done)
        fut.add_done_callback(lambda f: reply(
            ack.request_id, f.exception() if not f.cancelled() else InvalidArgument("cancelled")))
    else:
        asyncio.ensure_future(done).add_done_callback(lambda f: f.cancelled() or f.exception())


async def apply_ack_in_order(subscription, consumer: Consumer, ack: pb.Ack, reply: Reply) -> None:
    """Apply ``ack`` of any length now (``Subscription.acknowledge_async``) and answer it
    as :func:`apply_ack` does; for a job already running in the consumer's ordered work
    (Consumer.run_ordered), where an edge first had to read something for the ack."""
    try:
        done = await subscription.acknowledge_async(consumer, ack)
    except Exception as exc:  # noqa: BLE001 - answered to the client
        reply(ack.request_id, exc)
        return
    _answer(ack, done, reply)


def apply_redeliver(subscription, consumer: Consumer, redeliver: pb.RedeliverUnacknowledged) -> None:
    """As Pulsar's ServerCnx.handleRedeliverUnacknowledged: positions only on
    individual-ack subscriptions (Shared, Key_Shared), and of those only the ones
    pending for this consumer; otherwise everything unacknowledged of the consumer,
    after raising its epoch (PIP-84) so that what it pushes from now on is told
    apart from frames already on the way.

    A list longer than ``subscription.CHUNK`` positions, or any redelivery while
    earlier long commands of this consumer are still applied, runs in the
    consumer's ordered background work (chunks, yielding to the event loop, in the
    order sent); when that work is full the command is dropped (logged: the
    positions stay pending and come back when the consumer goes)."""
    from .subscription import CHUNK

    def redeliver_all() -> None:
        consumer.set_epoch(redeliver.consumer_epoch)
        dispatcher = subscription.dispatcher
        if dispatcher is not None and not dispatcher.accepts_redeliver_all(consumer):
            return  # Failover: only the active consumer can ask for a resend (Pulsar)
        subscription.redeliver_unacknowledged(consumer, [])

    with_positions = bool(redeliver.positions) and subscription.sub_type in (pb.Shared, pb.Key_Shared)
    if not consumer.ordered_busy() and (not with_positions or len(redeliver.positions) <= CHUNK):
        if with_positions:
            subscription.redeliver_unacknowledged(consumer, redeliver.positions)
        else:
            redeliver_all()
        return

    async def job() -> None:
        if with_positions:
            await subscription.redeliver_unacknowledged_async(consumer, redeliver.positions)
        else:
            redeliver_all()

    if not consumer.run_ordered(job):
        log.warning("[%s][%s] consumer %s: too many commands waiting; RedeliverUnacknowledged of %d "
                    "position(s) dropped", subscription.topic.name, subscription.name, consumer.name,
                    len(redeliver.positions))


async def seek_target(topic, message_id: Optional[Position], publish_time: Optional[int]) -> Position:
    """The position a Seek resets a subscription to: the first entry published at or
    after ``publish_time`` (ms since epoch) when given, else ``message_id``; a
    negative ledger id (earliest) means the topic's first position."""
    if publish_time is not None:
        return await find_position_by_publish_time(topic.ml, publish_time)
    if message_id is None or message_id.ledger_id < 0:
        return topic.ml.first_position()
    return message_id
