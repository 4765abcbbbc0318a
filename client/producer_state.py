"""The producer's pure state machines (no I/O, no asyncio), unit-tested directly;
one import place for both halves:

- ``client.message_accumulator``: ``MessageAccumulator`` (sequence ids,
  batching, compression, chunking; Pulsar's ProducerImpl send path and batch
  containers, aiokafka's RecordAccumulator), ``BatchingType``,
  ``make_message``, ``key_batches_in_send_order``;
- ``client.pending_queue``: ``OpSendMsg``, ``PendingQueue`` (Pulsar's
  ``pendingMessages`` and ``ackReceived``), ``ReceiptAction``,
  ``SendCompletion``, ``SendCallback``, ``is_duplicate`` (the sender side).

Every name is re-exported here, where it has always been imported from.
"""
from __future__ import annotations

from client.chunking import REPLICATION_METADATA_RESERVE
from client.message_accumulator import (DEFAULT_MAX_MESSAGE_SIZE, BatchingType, MessageAccumulator,
                                        key_batches_in_send_order, make_message)
from client.pending_queue import (OpSendMsg, PendingQueue, ReceiptAction, SendCallback, SendCompletion,
                                  is_duplicate)

__all__ = ["BatchingType", "OpSendMsg", "MessageAccumulator", "PendingQueue", "ReceiptAction",
           "SendCompletion", "SendCallback", "make_message", "DEFAULT_MAX_MESSAGE_SIZE", "is_duplicate",
           "key_batches_in_send_order", "REPLICATION_METADATA_RESERVE"]
