"""Payload compression codecs, as Pulsar's CompressionCodecProvider.

- LZ4: LZ4 *block* format without a size header (Pulsar's CompressionCodecLZ4;
  the uncompressed size travels in ``MessageMetadata.uncompressed_size``);
- ZLIB: zlib stream (Pulsar's CompressionCodecZLib, java.util.zip.Deflater);
- ZSTD: a zstd frame, level 3 (Pulsar's CompressionCodecZstd);
- SNAPPY: not supported, raises ``InvalidConfiguration``.
"""
from __future__ import annotations

import enum
import zlib

import lz4.block
import zstandard

from client.errors import CorruptedMessage, InvalidConfiguration
from proto import pulsar_api_pb2

__all__ = ["CompressionType", "compress", "decompress"]

ZSTD_LEVEL = 3  # Pulsar's CompressionCodecZstd.ZSTD_COMPRESSION_LEVEL


class CompressionType(enum.IntEnum):
    """Compression of an entry's payload; values are PulsarApi.proto's
    ``CompressionType`` numbers (stored in ``MessageMetadata.compression``)."""

    NONE = 0
    LZ4 = 1
    ZLIB = 2
    ZSTD = 3
    SNAPPY = 4

    @classmethod
    def parse(cls, value: "CompressionType | int | str") -> "CompressionType":
        """Accept an enum member, its proto number or its name (any case, e.g.
        from a config file).  Raises ``InvalidConfiguration`` otherwise."""
        if isinstance(value, CompressionType):
            return value
        try:
            if isinstance(value, str):
                return cls[value.strip().upper()]
            return cls(value)
        except (KeyError, ValueError):
            names = ", ".join(m.name for m in cls)
            raise InvalidConfiguration(f"unknown compression type {value!r}; use one of {names}") from None


for _member in CompressionType:  # keep the enum and the proto in lock-step
    assert pulsar_api_pb2.CompressionType.Value(_member.name) == _member.value, _member

_UNSUPPORTED = "SNAPPY is not supported, use LZ4/ZSTD"


def compress(kind: CompressionType | int | str, data: bytes | memoryview) -> bytes:
    """Compress ``data`` with codec ``kind``; returns the compressed bytes.

    Raises ``InvalidConfiguration`` for SNAPPY or an unknown type.
    """
    kind = CompressionType.parse(kind)
    if kind is CompressionType.NONE:
        return bytes(data)
    if kind is CompressionType.LZ4:
        return lz4.block.compress(data, store_size=False)
    if kind is CompressionType.ZLIB:
        return zlib.compress(data)
    if kind is CompressionType.ZSTD:
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
    raise InvalidConfiguration(_UNSUPPORTED)


def decompress(kind: CompressionType | int | str, data: bytes | memoryview, uncompressed_size: int) -> bytes:
    """Decompress ``data`` that was compressed with ``kind`` into exactly
    ``uncompressed_size`` bytes (from ``MessageMetadata.uncompressed_size``).

    For NONE the data is returned as is (size not checked: Pulsar does not set
    it on every uncompressed entry).  Never produces more than
    ``uncompressed_size`` bytes (no decompression bombs).  Raises
    ``CorruptedMessage`` when the data is corrupt or does not decompress to that
    size, or the type is unknown; ``InvalidConfiguration`` for SNAPPY.
    """
    try:
        kind = CompressionType.parse(kind)
    except InvalidConfiguration:  # a number in the metadata that no codec has
        raise CorruptedMessage(f"corrupted message: unknown compression type {kind!r}") from None
    if kind is CompressionType.NONE:
        return bytes(data)
    if kind is CompressionType.SNAPPY:
        raise InvalidConfiguration(_UNSUPPORTED)
    if not isinstance(uncompressed_size, int) or uncompressed_size < 0:
        raise CorruptedMessage(f"corrupted message: invalid uncompressed size {uncompressed_size!r}")
    try:
        if kind is CompressionType.LZ4:
            out = lz4.block.decompress(data, uncompressed_size=uncompressed_size)
        elif kind is CompressionType.ZLIB:
            d = zlib.decompressobj()
            # one byte more than announced reveals a longer stream without inflating a bomb
            out = d.decompress(data, uncompressed_size + 1)
            if not d.eof or d.unused_data:
                raise CorruptedMessage(f"corrupted message: ZLIB stream is truncated, longer than "
                                       f"{uncompressed_size} bytes, or followed by garbage")
        else:  # ZSTD
            declared = zstandard.frame_content_size(data)
            if declared not in (-1, uncompressed_size):  # -1: size not in the frame header
                raise CorruptedMessage(f"corrupted message: ZSTD frame declares {declared} bytes, "
                                       f"expected {uncompressed_size}")
            # max_output_size=0 would mean unlimited
            out = zstandard.ZstdDecompressor().decompress(data, max_output_size=max(uncompressed_size, 1))
    except (lz4.block.LZ4BlockError, zlib.error, zstandard.ZstdError, ValueError) as e:
        raise CorruptedMessage(f"corrupted message: cannot decompress {kind.name} payload: {e}") from None
    if len(out) != uncompressed_size:
        raise CorruptedMessage(f"corrupted message: {kind.name} payload decompressed to {len(out)} bytes, "
                               f"expected {uncompressed_size}")
    return out

