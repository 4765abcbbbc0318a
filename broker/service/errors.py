"""Broker-side errors: the client's hierarchy (``client.errors``) is the one
hierarchy; the gRPC edge sends these with ``to_status`` as
``"ClassName: message"`` and the client restores the class by name."""
from __future__ import annotations

from proto.errors import AlreadyExists, InvalidArgument, NotFound, PreconditionFailed, ServiceNotReady

__all__ = ["AlreadyExists", "InvalidArgument", "NotFound", "PreconditionFailed", "ServiceNotReady"]
