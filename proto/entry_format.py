"""Entry bytes: Pulsar's ``headersAndPayload`` with a CRC32C checksum.

Layout (as ``Commands.serializeMetadataAndPayload(ChecksumType.Crc32c, ...)``)::

    [magic 0x0e01: 2 bytes BE][crc32c: 4 bytes BE][metadata size: 4 bytes BE]
    [MessageMetadata: metadata size bytes][payload: rest]

The CRC32C covers everything after the checksum field (metadata size,
metadata and payload).  The payload is the (compressed) message or batch.

Shared by client and broker (pulsar-common); depends only on ``proto`` and ``crc32c``;
the client re-exports it as ``client.entry_format``.
"""
from __future__ import annotations

import struct
from typing import Callable

import crc32c
from google.protobuf.message import DecodeError, EncodeError

from proto.errors import ChecksumError, CorruptedMessage
from proto.pulsar_api_pb2 import MessageMetadata

__all__ = ["MAGIC_CRC32C", "HEADER_SIZE", "encode_entry", "decode_entry", "peek_metadata",
           "with_metadata", "verify_checksum"]

MAGIC_CRC32C = 0x0E01
_MAGIC_AND_CRC = struct.Struct(">HI")  # magic (u16), checksum (u32)
_SIZE = struct.Struct(">I")
HEADER_SIZE = _MAGIC_AND_CRC.size + _SIZE.size  # 10 bytes before the metadata

Buffer = bytes | bytearray | memoryview


def encode_entry(metadata: MessageMetadata, payload: Buffer) -> bytes:
    """Serialize ``metadata`` + ``payload`` (bytes) into entry bytes.

    Returns ``10 + len(metadata) + len(payload)`` bytes.  Raises ``ValueError``
    if ``metadata`` lacks a required field (producer_name, sequence_id,
    publish_time).
    """
    try:
        meta = metadata.SerializeToString()
    except EncodeError as e:
        raise ValueError(f"cannot encode entry, MessageMetadata is incomplete: {e}") from None
    size = _SIZE.pack(len(meta))
    checksum = crc32c.crc32c(payload, crc32c.crc32c(meta, crc32c.crc32c(size)))
    return b"".join((_MAGIC_AND_CRC.pack(MAGIC_CRC32C, checksum), size, meta, payload))


def _parse_header(data: Buffer) -> tuple[memoryview, int, int]:
    """Check magic and sizes; return (view, stored checksum, payload offset)."""
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    if len(view) < HEADER_SIZE:
        raise CorruptedMessage(f"corrupted entry: truncated, {len(view)} bytes is shorter than the "
                               f"{HEADER_SIZE}-byte header (magic, checksum, metadata size)")
    magic, checksum = _MAGIC_AND_CRC.unpack_from(view, 0)
    if magic != MAGIC_CRC32C:
        raise CorruptedMessage(f"corrupted entry: bad magic number 0x{magic:04x}, expected 0x{MAGIC_CRC32C:04x} "
                               "(not a minipulsar/Pulsar entry with CRC32C checksum)")
    (meta_size,) = _SIZE.unpack_from(view, _MAGIC_AND_CRC.size)
    if meta_size > len(view) - HEADER_SIZE:
        raise CorruptedMessage(f"corrupted entry: truncated, metadata size {meta_size} exceeds the "
                               f"{len(view) - HEADER_SIZE} bytes after the header")
    return view, checksum, HEADER_SIZE + meta_size


def _parse_metadata(view: memoryview, end: int) -> MessageMetadata:
    metadata = MessageMetadata()
    try:
        metadata.ParseFromString(view[HEADER_SIZE:end])
    except DecodeError as e:
        raise CorruptedMessage(f"corrupted entry: unparsable MessageMetadata: {e}") from None
    if not metadata.IsInitialized():
        missing = ", ".join(metadata.FindInitializationErrors())
        raise CorruptedMessage(f"corrupted entry: MessageMetadata lacks required fields: {missing}")
    return metadata


def _check(view: memoryview, stored: int) -> None:
    actual = crc32c.crc32c(view[_MAGIC_AND_CRC.size:])
    if actual != stored:
        raise ChecksumError(f"corrupted entry: checksum mismatch, stored 0x{stored:08x}, "
                            f"computed 0x{actual:08x} over {len(view) - _MAGIC_AND_CRC.size} bytes")


def verify_checksum(data: Buffer) -> None:
    """Check magic, sizes and CRC32C of entry bytes without parsing metadata.

    Raises ``ChecksumError`` on mismatch, ``CorruptedMessage`` on bad framing.
    """
    view, stored, _ = _parse_header(data)
    _check(view, stored)


def decode_entry(data: Buffer) -> tuple[MessageMetadata, memoryview]:
    """Verify and split entry bytes into ``(MessageMetadata, payload)``.

    The payload is a zero-copy ``memoryview`` into ``data`` (call ``bytes()``
    on it to keep it independently).  Raises ``ChecksumError`` (a
    ``CorruptedMessage``) on checksum mismatch and ``CorruptedMessage`` when
    the bytes are truncated, have a bad magic number or unparsable metadata.
    """
    view, stored, offset = _parse_header(data)
    _check(view, stored)
    return _parse_metadata(view, offset), view[offset:]


def peek_metadata(data: Buffer) -> MessageMetadata:
    """Parse only the metadata of entry bytes, skipping the checksum (cheap;
    for the broker's dispatch/replication decisions, like Pulsar's
    ``Commands.peekMessageMetadata``).  Raises ``CorruptedMessage`` on bad framing
    or unparsable metadata.
    """
    view, _, offset = _parse_header(data)
    return _parse_metadata(view, offset)


def with_metadata(data: Buffer, mutate: Callable[[MessageMetadata], MessageMetadata | None]) -> bytes:
    """Re-encode entry bytes with changed metadata and the SAME payload bytes.

    ``mutate`` receives the decoded metadata and changes it in place (or returns
    a replacement).  The checksum is verified first, so corruption is never
    hidden behind a fresh checksum.  Used by the replicator to set
    ``replicated_from`` without touching the payload.  Raises like
    ``decode_entry``; ``ValueError`` if the mutated metadata is incomplete.
    """
    metadata, payload = decode_entry(data)
    replaced = mutate(metadata)
    if replaced is not None:
        metadata = replaced
    return encode_entry(metadata, payload)
