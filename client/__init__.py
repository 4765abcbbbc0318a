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
from client.auth import Authentication, AuthenticationToken
from client.client import AsyncClient
from client.compression import CompressionType
from client.errors import *  # noqa: F401,F403 - the exception hierarchy
from client.errors import __all__ as _error_names
from client.message_id import MessageId
from client.producer_state import BatchingType
from client.routing import HashingScheme, PartitionsRoutingMode
from client.sync import Client, Producer

from client.consumer_config import (BatchReceivePolicy, ConsumerDeadLetterPolicy, ConsumerType, DeadLetterPolicy,
                                    InitialPosition)
from client.message import Message

__all__ = ["Client", "AsyncClient", "Producer", "AdminClient", "SyncAdminClient", "Authentication",
           "AuthenticationToken", "MessageId", "CompressionType",
           "PartitionsRoutingMode", "HashingScheme", "BatchingType", "ConsumerType", "InitialPosition",
           "ConsumerDeadLetterPolicy", "DeadLetterPolicy", "BatchReceivePolicy", "Message", *_error_names]
