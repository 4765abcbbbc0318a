"""minipulsar client SDK, with the official pulsar-client Python names.

Synchronous (like ``import pulsar``)::

    from client import Client
    client = Client("minipulsar://localhost:6600")
    producer = client.create_producer("my-topic")
    producer.send(b"hello")
    client.close()

Asyncio: ``AsyncClient`` (same methods, awaitable).  Admin: ``AdminClient``
(asyncio) and ``SyncAdminClient``.
"""
from __future__ import annotations

import proto.grpc_defaults  # noqa: F401 - before anything imports grpc (see that module)
from client.admin import AdminClient, SyncAdminClient
from client.client import AsyncClient
from client.compression import CompressionType
from client.errors import *  # noqa: F401,F403 - the exception hierarchy
from client.errors import __all__ as _error_names
from client.message_id import MessageId
from client.producer_state import BatchingType
from client.routing import HashingScheme, PartitionsRoutingMode
from client.sync import Client, Producer

# Consumer-side names live in modules written alongside this one; they are
# imported on first use so that this package imports even while they change.
_LAZY = {
    "ConsumerType": ("client.consumer", "client.consumer_config"),
    "InitialPosition": ("client.consumer", "client.consumer_config"),
    "ConsumerDeadLetterPolicy": ("client.consumer", "client.consumer_config"),
    "DeadLetterPolicy": ("client.consumer", "client.consumer_config"),
    "BatchReceivePolicy": ("client.consumer", "client.consumer_config"),
    "Message": ("client.message",),
}

__all__ = ["Client", "AsyncClient", "Producer", "AdminClient", "SyncAdminClient", "MessageId", "CompressionType",
           "PartitionsRoutingMode", "HashingScheme", "BatchingType", "ConsumerType", "InitialPosition",
           *_error_names]


def __getattr__(name: str):
    import importlib
    for module_name in _LAZY.get(name, ()):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, name):
            value = getattr(module, name)
            globals()[name] = value
            return value
    raise AttributeError(f"module 'client' has no attribute {name!r}")
