"""The one exception hierarchy of minipulsar, named like the official Pulsar
Python client's ``pulsar.PulsarException`` family, plus the mapping to and from
gRPC status codes used at the edge. Shared by client, broker and tools (as
Pulsar's pulsar-common); the client re-exports it as ``client.errors``.

Servers send an error as a gRPC status whose details start with the class
name (``"TopicNotFound: persistent://public/default/t does not exist"``);
``to_status`` builds that pair and ``error_from_status`` turns it back into
the right exception class on the client.  Pure Python, no grpc import: code
names are plain strings like ``"NOT_FOUND"`` (a ``grpc.StatusCode`` is also
accepted, through its ``.name``).
"""
from __future__ import annotations

__all__ = [
    "PulsarException", "TopicNotFound", "ProducerBusy", "ConsumerBusy", "MessageTooBig",
    "Timeout", "AlreadyClosed", "AuthenticationError", "AuthorizationError", "InvalidTopicName",
    "InvalidConfiguration", "ConnectError", "ProducerQueueIsFull", "CorruptedMessage",
    "ChecksumError", "NotAllowed", "TopicTerminated", "NotFound", "AlreadyExists", "PreconditionFailed",
    "ServiceNotReady", "InvalidArgument", "MetadataSessionLost", "error_from_status", "to_status",
]


class PulsarException(Exception):
    """Base class of every error the minipulsar client raises.

    ``grpc_code`` is the gRPC status code name a server uses for this error,
    ``retriable`` says whether retrying the same operation later can succeed
    (an existing producer/consumer reconnects with backoff on it),
    ``retriable_at_creation`` whether creating a producer/consumer retries on it
    (as Pulsar, ProducerBusy/ConsumerBusy fail a first create at once but are
    retried by a handle that reconnects: the broker may not have seen its old
    stream close yet), ``default_message`` is used when no message is given and
    says what to do. These attributes are the only answer to "retry?" in the SDK.
    """

    grpc_code = "UNKNOWN"
    retriable = False
    retriable_at_creation = False
    default_message = "unexpected error in the Pulsar client or broker; see the broker log"

    def __init__(self, message: str | None = None):
        self.message = message if message else self.default_message
        super().__init__(self.message)


class TopicNotFound(PulsarException):
    """Raised when the topic (or its tenant/namespace) does not exist and the
    broker does not auto-create it."""

    grpc_code = "NOT_FOUND"
    default_message = "topic not found: create it with minipulsar-admin or enable topic auto-creation"


class ProducerBusy(PulsarException):
    """Raised when a producer with the same name is already connected to the
    topic (Pulsar's ProducerBusyException)."""

    grpc_code = "ALREADY_EXISTS"
    retriable = True
    default_message = "a producer with this name is already connected; close it or use another producer name"


class ConsumerBusy(PulsarException):
    """Raised when subscribing to an Exclusive subscription that already has a
    consumer, or with a subscription type different from the existing one."""

    grpc_code = "ALREADY_EXISTS"
    retriable = True
    default_message = ("the subscription already has an exclusive consumer or another type; "
                       "close that consumer, use Shared/Failover, or another subscription name")


class MessageTooBig(PulsarException):
    """Raised when a message (after compression) exceeds the broker's max
    message size and chunking is disabled."""

    grpc_code = "INVALID_ARGUMENT"
    default_message = "message is larger than the broker's max message size; enable chunking or send smaller messages"


class Timeout(PulsarException):
    """Raised when an operation (send, receive, lookup, admin call) did not
    complete within its timeout."""

    grpc_code = "DEADLINE_EXCEEDED"
    retriable = True
    retriable_at_creation = True
    default_message = "operation timed out; check that the broker is reachable, or raise the timeout"


class AlreadyClosed(PulsarException):
    """Raised when using a client, producer, consumer or reader after close()."""

    grpc_code = "FAILED_PRECONDITION"
    default_message = "this client/producer/consumer is already closed; create a new one"


class AuthenticationError(PulsarException):
    """Raised when the broker (or bookie) refuses the credentials: no token, a
    token that is malformed, expired, tampered with or signed with another key
    (Pulsar's AuthenticationException / the Python client's AuthenticationError)."""

    grpc_code = "UNAUTHENTICATED"
    default_message = ("authentication failed: give the client a valid token, e.g. "
                       "Client(url, authentication=AuthenticationToken(token)) or --auth-params token:...")


class AuthorizationError(PulsarException):
    """Raised when the credentials are missing, invalid, or lack the permission
    for the tenant/namespace/topic."""

    grpc_code = "PERMISSION_DENIED"
    default_message = "not authorized: check the client's token and the namespace permissions"


class InvalidTopicName(PulsarException):
    """Raised for a malformed topic name (expected
    ``persistent://tenant/namespace/topic`` or a short name)."""

    grpc_code = "INVALID_ARGUMENT"
    default_message = "invalid topic name: use persistent://tenant/namespace/topic or a short name"


class InvalidConfiguration(PulsarException):
    """Raised for an invalid or unsupported client/producer/consumer setting
    (for example SNAPPY compression, or a bad service URL)."""

    grpc_code = "INVALID_ARGUMENT"
    default_message = "invalid configuration: check the client/producer/consumer settings"


class ConnectError(PulsarException):
    """Raised when the broker cannot be reached or the connection dropped."""

    grpc_code = "UNAVAILABLE"
    retriable = True
    retriable_at_creation = True
    default_message = "cannot connect to the broker; check the service URL and that the broker is running"


class ProducerQueueIsFull(PulsarException):
    """Raised by send when the producer's pending queue is full and
    block_if_queue_full is off."""

    grpc_code = "RESOURCE_EXHAUSTED"
    retriable = True
    default_message = ("producer queue is full; wait for pending sends, raise max_pending_messages, "
                       "or enable block_if_queue_full")


class CorruptedMessage(PulsarException):
    """Raised when entry bytes cannot be decoded: truncated data, bad magic
    number, unparsable metadata or batch, or undecompressable payload."""

    grpc_code = "DATA_LOSS"
    default_message = "corrupted message: the entry bytes cannot be decoded"


class ChecksumError(CorruptedMessage):
    """Raised when an entry's CRC32C checksum does not match its bytes (a
    CorruptedMessage whose cause is known)."""

    grpc_code = "DATA_LOSS"
    default_message = "checksum mismatch: the message was corrupted in transit or in storage"


class NotAllowed(PulsarException):
    """Raised for an operation the subscription or topic does not allow, e.g. a
    cumulative ack on a Shared or Key_Shared subscription."""

    grpc_code = "FAILED_PRECONDITION"
    default_message = "operation not allowed here (e.g. cumulative ack on Shared/Key_Shared); use individual acks"


class TopicTerminated(PulsarException):
    """Raised when publishing to a topic that was terminated: it accepts no more
    messages."""

    grpc_code = "FAILED_PRECONDITION"
    default_message = "topic is terminated and accepts no more messages; publish to another topic"


_BY_NAME: dict[str, type[PulsarException]] = {
    cls.__name__: cls
    for cls in (PulsarException, TopicNotFound, ProducerBusy, ConsumerBusy, MessageTooBig, Timeout,
                AlreadyClosed, AuthenticationError, AuthorizationError, InvalidTopicName, InvalidConfiguration, ConnectError,
                ProducerQueueIsFull, CorruptedMessage, ChecksumError, NotAllowed, TopicTerminated)
}

# Only unambiguous status codes map to a class on their own (e.g. a gRPC-level
# DEADLINE_EXCEEDED or UNAVAILABLE that no minipulsar server produced).
# RESOURCE_EXHAUSTED is what grpc itself reports for a frame above its size limit.
_BY_CODE: dict[str, type[PulsarException]] = {
    "NOT_FOUND": TopicNotFound,
    "DEADLINE_EXCEEDED": Timeout,
    "UNAVAILABLE": ConnectError,
    "PERMISSION_DENIED": AuthorizationError,
    "UNAUTHENTICATED": AuthorizationError,
    "RESOURCE_EXHAUSTED": MessageTooBig,
    "DATA_LOSS": CorruptedMessage,
}


# Details of INTERNAL / UNKNOWN statuses that gRPC's transport itself reports when a
# connection or stream breaks (seen during broker restarts and unloads).
_TRANSPORT_DETAILS = ("Internal error from Core", "RST_STREAM", "Stream removed", "Socket closed",
                      "GOAWAY", "Connection reset")


def _code_name(code) -> str:
    name = getattr(code, "name", code)
    name = str(name or "")
    return name.rsplit(".", 1)[-1].upper()  # "StatusCode.NOT_FOUND" -> "NOT_FOUND"


def error_from_status(code_name, message: str) -> PulsarException:
    """Build the client exception for a gRPC error.

    ``code_name``: a status code name (``"NOT_FOUND"``, ``"StatusCode.NOT_FOUND"``
    or a ``grpc.StatusCode``), or directly an error class name (``"ProducerBusy"``).
    ``message``: the status details; when they start with ``"<ClassName>: "``
    (as ``to_status`` writes them) that class wins and the prefix is stripped.
    INTERNAL / UNKNOWN statuses with gRPC's own transport details ("Internal
    error from Core", "Stream removed", RST_STREAM, ...) are a ``ConnectError``
    (retriable: the producer or consumer reconnects). Falls back to the code's
    usual class, else to ``PulsarException``. Never raises.
    """
    message = message or ""
    head, sep, rest = message.partition(": ")
    if sep and head in _BY_NAME:
        return _BY_NAME[head](rest)
    if message in _BY_NAME:  # details are just the class name
        return _BY_NAME[message]()
    raw = str(getattr(code_name, "name", code_name) or "")
    if raw in _BY_NAME:
        return _BY_NAME[raw](message)
    if _code_name(code_name) in ("INTERNAL", "UNKNOWN") and any(t in message for t in _TRANSPORT_DETAILS):
        # gRPC's transport, not a broker (whose statuses carry "<ClassName>: "): the
        # connection broke (stream reset, server going away); reconnect as Pulsar does.
        return ConnectError(f"connection broken ({_code_name(code_name)}: {message})")
    cls = _BY_CODE.get(_code_name(code_name), PulsarException)
    if cls is PulsarException and message:
        return PulsarException(f"{_code_name(code_name) or 'UNKNOWN'}: {message}")
    return cls(message)


def to_status(exc: BaseException) -> tuple[str, str]:
    """Return ``(grpc_code_name, details)`` for sending ``exc`` as a gRPC status.

    Details are ``"<ClassName>: <message>"`` so ``error_from_status`` restores
    the exact class. Non-PulsarException errors become ``("INTERNAL", "PulsarException: ...")``
    so servers never leak arbitrary exception types.
    """
    if isinstance(exc, PulsarException):
        return exc.grpc_code, f"{type(exc).__name__}: {exc.message}"
    return "INTERNAL", f"PulsarException: {type(exc).__name__}: {exc}"


# ---- admin and broker-state errors ----

class NotFound(PulsarException):
    """Raised by admin calls when the cluster, tenant, namespace, subscription
    or other resource named in the request does not exist."""

    grpc_code = "NOT_FOUND"
    default_message = "resource not found: check the name, or create it first with minipulsar-admin"


class AlreadyExists(PulsarException):
    """Raised by admin calls creating a cluster, tenant, namespace or topic that
    already exists."""

    grpc_code = "ALREADY_EXISTS"
    default_message = "resource already exists: use another name, or delete it first"


class PreconditionFailed(PulsarException):
    """Raised by admin calls whose precondition does not hold, e.g. deleting a
    tenant that still has namespaces or a topic that still has subscribers."""

    grpc_code = "FAILED_PRECONDITION"
    default_message = "precondition failed: the resource is in use or in the wrong state; see the message"


class ServiceNotReady(PulsarException):
    """Raised when the broker cannot serve the request right now (topic being
    loaded or unloaded, bookies unavailable); the client retries with backoff."""

    grpc_code = "UNAVAILABLE"
    retriable = True
    retriable_at_creation = True
    default_message = "broker not ready for this topic; the client retries, or retry later"


class InvalidArgument(PulsarException):
    """Raised for a malformed request (admin body with a missing field or a
    wrong type, unknown admin verb)."""

    grpc_code = "INVALID_ARGUMENT"
    default_message = "invalid request: check the command's arguments"


class MetadataSessionLost(ServiceNotReady):
    """A broker of a cluster that lost (or cannot reach) its metadata store session answers
    lookups with this (Pulsar's ServiceNotReady from a broker whose metadata store is not
    available): it cannot tell who owns a topic, another broker of the service URL can.
    ``try_another_host``: the client asks the next host of the service URL at once."""

    try_another_host = True
    default_message = "this broker lost its metadata store session; ask another broker of the cluster"


_BY_NAME.update({cls.__name__: cls for cls in (NotFound, AlreadyExists, PreconditionFailed, ServiceNotReady,
                                               InvalidArgument, MetadataSessionLost)})
