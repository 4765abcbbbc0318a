"""Exceptions of the broker as Pulsar's ``ServerError`` codes (what ServerCnx sends in
CommandError / CommandSendError / the error fields of lookup answers), so the
official client retries what it should (ServiceNotReady, TooManyRequests,
MetadataError, PersistenceError: reconnect or look up again) and fails with the
matching exception otherwise. Every exception first goes through the broker's one
error edge, ``broker.service.error_edge.to_pulsar``."""
from __future__ import annotations

import logging

from proto import errors as e
from proto.pulsar_wire_pb2 import ServerError

from broker.service.error_edge import to_pulsar

from .schemas import IncompatibleSchema

log = logging.getLogger(__name__)

# most specific first: ChecksumError is a CorruptedMessage
_CODES: list[tuple[type, int]] = [
    (IncompatibleSchema, ServerError.IncompatibleSchema),
    (e.TopicNotFound, ServerError.TopicNotFound),
    (e.ProducerBusy, ServerError.ProducerBusy),
    (e.ConsumerBusy, ServerError.ConsumerBusy),
    (e.AuthenticationError, ServerError.AuthenticationError),
    (e.AuthorizationError, ServerError.AuthorizationError),
    (e.InvalidTopicName, ServerError.InvalidTopicName),
    (e.ChecksumError, ServerError.ChecksumError),
    (e.CorruptedMessage, ServerError.ChecksumError),
    (e.TopicTerminated, ServerError.TopicTerminatedError),
    (e.ServiceNotReady, ServerError.ServiceNotReady),
    (e.Timeout, ServerError.ServiceNotReady),
    (e.NotFound, ServerError.TopicNotFound),
    (e.NotAllowed, ServerError.NotAllowedError),
    (e.MessageTooBig, ServerError.NotAllowedError),
    (e.PreconditionFailed, ServerError.NotAllowedError),
    (e.InvalidArgument, ServerError.NotAllowedError),
    (e.AlreadyExists, ServerError.NotAllowedError),
]


def server_error(exc: BaseException) -> tuple[int, str]:
    """``(ServerError code, message)`` for ``exc``; an exception the broker does not
    translate (a bug) is logged with its traceback and sent as UnknownError."""
    exc = to_pulsar(exc)
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code, f"{type(exc).__name__}: {exc}"
    if isinstance(exc, e.PulsarException):
        return (ServerError.ServiceNotReady if exc.retriable else ServerError.UnknownError,
                f"{type(exc).__name__}: {exc}")
    log.error("internal error answered as UnknownError", exc_info=exc)
    return ServerError.UnknownError, f"{type(exc).__name__}: {exc}"


def is_retriable(exc: BaseException) -> bool:
    """Whether the client should retry (reconnect) after ``exc`` (its ``retriable``)."""
    return bool(getattr(to_pulsar(exc), "retriable", False))
