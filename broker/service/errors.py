"""Broker-side errors. They extend the client's hierarchy (``client.errors``) so
the gRPC edge sends them with ``to_status`` as ``"ClassName: message"`` and the
client restores the class by name (or by status code for names it lacks)."""
from __future__ import annotations

from client.errors import PulsarException


class NotFound(PulsarException):
    """A cluster, tenant, namespace, topic or subscription does not exist."""

    grpc_code = "NOT_FOUND"
    default_message = "the resource does not exist; create it first (minipulsar-admin ... create)"


class AlreadyExists(PulsarException):
    """Creating something that exists already."""

    grpc_code = "ALREADY_EXISTS"
    default_message = "the resource exists already"


class PreconditionFailed(PulsarException):
    """The request conflicts with the current state (e.g. deleting a non-empty namespace)."""

    grpc_code = "FAILED_PRECONDITION"
    default_message = "the request conflicts with the current state"


class InvalidArgument(PulsarException):
    """Malformed admin input (bad JSON, missing field, wrong type)."""

    grpc_code = "INVALID_ARGUMENT"
    default_message = "invalid request; check the command's arguments"


class ServiceNotReady(PulsarException):
    """Temporary state (topic loading, dedup state unknown): retry the operation."""

    grpc_code = "UNAVAILABLE"
    retriable = True
    default_message = "the broker is not ready for this yet; retry"
