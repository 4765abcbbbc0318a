"""Broker-side errors: the one hierarchy is ``proto.errors`` (shared with the
client, which re-exports it as ``client.errors``); the gRPC edge sends these
with ``proto.errors.to_status`` as ``"ClassName: message"`` and the client
restores the class by name (``error_from_status``).

The admin and broker-state errors the service layer raises, with their gRPC
status (Pulsar's REST status in brackets):

* :class:`NotFound` -- NOT_FOUND [404]: a cluster, tenant, namespace,
  subscription or partitioned topic named does not exist.
* :class:`AlreadyExists` -- ALREADY_EXISTS [409]: creating what exists.
* :class:`InvalidArgument` -- INVALID_ARGUMENT [400]: a malformed
  request (bad name, body field of the wrong type, unknown admin verb).
* :class:`PreconditionFailed` -- FAILED_PRECONDITION [412]: the resource is in
  use (a tenant with namespaces, a subscription with other consumers, fault
  injection off).
* :class:`ServiceNotReady` -- UNAVAILABLE (retriable): the topic is being
  loaded or unloaded, or the bookies are unavailable.
"""
from __future__ import annotations

from proto.errors import AlreadyExists, InvalidArgument, NotFound, PreconditionFailed, ServiceNotReady

__all__ = ["AlreadyExists", "InvalidArgument", "NotFound", "PreconditionFailed", "ServiceNotReady"]
