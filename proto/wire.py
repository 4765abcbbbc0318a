"""Hand-written protobuf wire-format helpers for hot paths that skip message objects.

Used where building a protobuf message per item costs more than the item
itself (the bookie client's framed adds, the SDK's single-message metadata);
the output is byte for byte what protobuf writes.
"""
from __future__ import annotations

__all__ = ["encode_varint"]

_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)]


def encode_varint(n: int) -> bytes:
    """Protobuf base-128 varint of ``n`` (an int, 0 <= n < 2**64)."""
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
