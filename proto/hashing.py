"""Pulsar's key hashes (``org.apache.pulsar.common.util.Murmur3_32Hash`` and
``JavaStringHash``), shared by the client (partition routing, key-based
batching) and the broker (Key_Shared hash ranges), as in pulsar-common."""
from __future__ import annotations

import mmh3

__all__ = ["murmur3_32_hash", "java_string_hash"]

_INT_MAX = 0x7FFFFFFF  # Java Integer.MAX_VALUE


def murmur3_32_hash(key: str | bytes) -> int:
    """Pulsar's ``Murmur3_32Hash.getInstance().makeHash(key)``: MurmurHash3 x86
    32-bit, seed 0, over the UTF-8 bytes of ``key``, with the sign bit cleared
    (``& Integer.MAX_VALUE``).  Returns an int in ``[0, 2**31)``."""
    data = key.encode("utf-8", "replace") if isinstance(key, str) else bytes(key)
    return mmh3.hash(data, 0, signed=False) & _INT_MAX


def java_string_hash(key: str | bytes) -> int:
    """Pulsar's ``JavaStringHash.makeHash(key)``: Java ``String.hashCode()`` (over
    UTF-16 code units, int32 overflow) ``& Integer.MAX_VALUE``.  Bytes are decoded
    as UTF-8 first (like ``new String(bytes, UTF_8)``).  Returns ``[0, 2**31)``."""
    if not isinstance(key, str):
        key = bytes(key).decode("utf-8", "replace")
    units = key.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h & _INT_MAX
