"""Small pieces every process shares (Pulsar's pulsar-common): gRPC channel
options, the event-loop runner, the replicator's source-position sequence id
and the names of the broker's internal cursors.

Imported by the client, the broker, the bookie and the tools; depends on
nothing but the standard library (and uvloop when installed)."""
from __future__ import annotations

import asyncio
from typing import Any, Coroutine

__all__ = ["GRPC_MAX_MESSAGE_BYTES", "grpc_message_size_options", "run_async", "source_sequence_id",
           "source_position", "DEDUP_CURSOR", "REPLICATOR_CURSOR_PREFIX", "INTERNAL_CURSOR_PREFIXES"]

# Largest gRPC message any minipulsar process sends or accepts (bytes): several
# entries of up to 5 MiB per stream message between broker and bookies.
GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Pulsar's internal cursors: deduplication's snapshot cursor and one per
# replicator ("pulsar.repl.<remote cluster>"); not user subscriptions.
DEDUP_CURSOR = "pulsar.dedup"
REPLICATOR_CURSOR_PREFIX = "pulsar.repl."
INTERNAL_CURSOR_PREFIXES = (DEDUP_CURSOR, REPLICATOR_CURSOR_PREFIX)


def grpc_message_size_options(limit: int = GRPC_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """gRPC channel/server options raising both message-size limits to ``limit`` bytes."""
    return [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion on a fresh event loop (uvloop when installed,
    else asyncio's) and return its result; exceptions propagate."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def source_sequence_id(ledger_id: int, entry_id: int) -> int:
    """The replicator's sequence id of a source position, ``ledger << 32 | entry``
    (entry ids below 2**32), used by the remote's deduplication."""
    return (ledger_id << 32) | entry_id


def source_position(sequence_id: int) -> tuple[int, int]:
    """Inverse of ``source_sequence_id``: ``(ledger_id, entry_id)``."""
    return sequence_id >> 32, sequence_id & 0xFFFFFFFF
