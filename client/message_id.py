"""Message ids, as Pulsar's MessageIdImpl / BatchMessageIdImpl.

A message id is ``(ledger_id, entry_id, partition, batch_index)``, plus the
batch size for messages that came out of a batch.  Serialized form is
PulsarApi.proto's ``MessageIdData`` (``proto.pulsar_api_pb2.MessageIdData``);
string form is Pulsar's ``"ledger:entry:partition:batch_index"``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

from google.protobuf.message import DecodeError

from proto.pulsar_api_pb2 import MessageIdData

__all__ = ["MessageId", "ChunkMessageId", "chunk_message_ids"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
_U64 = (1 << 64) - 1


def _signed64(value: int) -> int:
    """uint64 on the wire -> Java long (so -1 round trips as in Pulsar)."""
    return value - (1 << 64) if value > _INT64_MAX else value


@functools.total_ordering
@dataclass(frozen=True, slots=True, eq=False)
class MessageId:
    """Immutable id of a message (Pulsar's MessageIdImpl / BatchMessageIdImpl).

    - ``ledger_id``, ``entry_id``: the entry's position (int64; -1 for earliest,
      2**63-1 for latest);
    - ``partition``: partition index, -1 for a non-partitioned topic;
    - ``batch_index``: index inside the batch, -1 if the entry is not a batch;
    - ``batch_size``: number of messages in that batch (count), 0 if unknown or
      not batched.  Not part of equality, as in Pulsar.

    Ordered by ``(ledger_id, entry_id, batch_index)`` (partition breaks ties so
    that ordering agrees with equality).  Raises ``ValueError`` on out-of-range
    fields.
    """

    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1
    batch_size: int = 0

    earliest: ClassVar["MessageId"]
    latest: ClassVar["MessageId"]

    def __post_init__(self):
        for name in ("ledger_id", "entry_id", "partition", "batch_index", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"MessageId.{name} must be an int, got {value!r}")
        if not (_INT64_MIN <= self.ledger_id <= _INT64_MAX and _INT64_MIN <= self.entry_id <= _INT64_MAX):
            raise ValueError(f"MessageId ledger/entry out of int64 range: {self.ledger_id}:{self.entry_id}")
        if not -1 <= self.partition <= _INT32_MAX:
            raise ValueError(f"MessageId.partition must be -1 or a partition index, got {self.partition}")
        if not -1 <= self.batch_index <= _INT32_MAX:
            raise ValueError(f"MessageId.batch_index must be -1 or an index, got {self.batch_index}")
        if not 0 <= self.batch_size <= _INT32_MAX:
            raise ValueError(f"MessageId.batch_size must be >= 0, got {self.batch_size}")

    @classmethod
    def _trusted(cls, ledger_id: int, entry_id: int, partition: int = -1, batch_index: int = -1,
                 batch_size: int = 0) -> "MessageId":
        """Internal fast constructor for ids the client builds itself from broker
        positions (receipts, received entries): no range checks.  Fields as the
        constructor's; the caller guarantees they are in range."""
        mid = _new(cls)
        _set_ledger(mid, ledger_id)
        _set_entry(mid, entry_id)
        _set_partition(mid, partition)
        _set_batch_index(mid, batch_index)
        _set_batch_size(mid, batch_size)
        return mid

    # -- identity and order -------------------------------------------------
    def _key(self) -> tuple[int, int, int, int]:
        return (self.ledger_id, self.entry_id, self.batch_index, self.partition)

    def __eq__(self, other):
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other):
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self):
        return hash(self._key())

    @property
    def is_batched(self) -> bool:
        """True if this id points to one message inside a batch entry."""
        return self.batch_index >= 0

    def entry_id_only(self) -> "MessageId":
        """The id of the whole entry (batch_index -1, batch_size 0), e.g. to
        acknowledge or redeliver the entry a batched message came from."""
        return MessageId(self.ledger_id, self.entry_id, self.partition)

    # -- string form -----------------------------------------------------------
    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.partition}:{self.batch_index}"

    @classmethod
    def parse(cls, text: str) -> "MessageId":
        """Parse Pulsar's string form ``"ledger:entry[:partition[:batch_index]]"``.

        Raises ``ValueError`` with the offending text when it is malformed.
        """
        parts = str(text).strip().split(":")
        if not 2 <= len(parts) <= 4:
            raise ValueError(f"invalid message id {text!r}: expected 'ledger:entry[:partition[:batch_index]]'")
        try:
            numbers = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"invalid message id {text!r}: fields must be integers") from None
        return cls(*numbers)

    # -- MessageIdData ---------------------------------------------------------
    def to_proto(self) -> MessageIdData:
        """This id as a ``MessageIdData`` (fields set as Pulsar's toByteArray:
        partition only if >= 0, batch_index only if != -1, batch_size only if > 0)."""
        data = MessageIdData(ledgerId=self.ledger_id & _U64, entryId=self.entry_id & _U64)
        if self.partition >= 0:
            data.partition = self.partition
        if self.batch_index != -1:
            data.batch_index = self.batch_index
        if self.batch_size > 0:
            data.batch_size = self.batch_size
        return data

    @classmethod
    def from_proto(cls, data: MessageIdData) -> "MessageId":
        """Build from a ``MessageIdData``; raises ``ValueError`` if it is incomplete
        or out of range."""
        if not data.IsInitialized():
            raise ValueError("invalid MessageIdData: ledgerId and entryId are required")
        try:
            return cls(_signed64(data.ledgerId), _signed64(data.entryId), data.partition,
                       data.batch_index, data.batch_size if data.HasField("batch_size") else 0)
        except ValueError as e:
            raise ValueError(f"invalid MessageIdData: {e}") from None

    def serialize(self) -> bytes:
        """Bytes of the ``MessageIdData`` (as Pulsar's MessageId.toByteArray)."""
        return self.to_proto().SerializeToString()

    @classmethod
    def deserialize(cls, data: bytes) -> "MessageId":
        """Inverse of ``serialize`` (as Pulsar's MessageId.fromByteArray).

        Raises ``ValueError`` when ``data`` is not a serialized message id.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"cannot deserialize a MessageId from {type(data).__name__}; expected bytes")
        if len(data) == 0:
            raise ValueError("cannot deserialize a MessageId from empty bytes")
        msg = MessageIdData()
        try:
            msg.ParseFromString(bytes(data))
        except DecodeError as e:
            raise ValueError(f"bytes are not a serialized MessageId (MessageIdData): {e}") from None
        return cls.from_proto(msg)


@dataclass(frozen=True, slots=True, eq=False)
class ChunkMessageId(MessageId):
    """Id of a chunked message (Pulsar's ChunkMessageIdImpl): the position
    fields are those of its LAST chunk, ``first_chunk_message_id`` is the id of
    its first chunk, and ``chunk_message_ids`` the ids of every chunk in chunk
    order (in memory only; Pulsar keeps them in the consumer's
    unAckedChunkedMessageIdSequenceMap).  Acknowledging this id acknowledges
    every chunk's entry, so the chunks leave the backlog together.

    Equality, order and hash are ``MessageId``'s (the last chunk's), so it
    equals the id the producer returned; serialized it is the last chunk's id.
    """

    first_chunk_message_id: MessageId | None = None
    chunk_message_ids: tuple = ()

    @property
    def last_chunk_message_id(self) -> MessageId:
        """The last chunk's id as a plain ``MessageId``."""
        return MessageId(self.ledger_id, self.entry_id, self.partition, self.batch_index, self.batch_size)


def chunk_message_ids(message_id: MessageId) -> tuple:
    """Every chunk's id if ``message_id`` names a chunked message (a
    ``ChunkMessageId`` or a multi-topic one), else ``()``."""
    return getattr(message_id, "chunk_message_ids", ())


_new = object.__new__
_set_ledger = MessageId.ledger_id.__set__  # slot descriptors: frozen only guards __setattr__
_set_entry = MessageId.entry_id.__set__
_set_partition = MessageId.partition.__set__
_set_batch_index = MessageId.batch_index.__set__
_set_batch_size = MessageId.batch_size.__set__

MessageId.earliest = MessageId(-1, -1)
MessageId.latest = MessageId(_INT64_MAX, _INT64_MAX)
