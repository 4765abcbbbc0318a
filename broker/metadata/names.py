"""Names inside metadata paths (Pulsar's ``org.apache.pulsar.common.util.Codec``).

A metadata path is '/'-separated (``/managed-ledgers/<tenant>/<ns>/persistent/<topic>/<cursor>``),
so a name a user chooses that becomes one path segment -- a cursor, i.e. a
subscription name -- is URL-encoded first, as Pulsar does for cursor names
(``Codec.encode``), and decoded when the segment is read back
(``get_children``). Without it a subscription named ``a/b`` was stored at
``.../<topic>/a/b`` and, after the topic's next load, showed up as a phantom
subscription ``a`` at 0:0 holding the backlog.

Encoding: UTF-8, then every byte except ASCII letters, digits and ``_.-~`` as
``%XX`` (RFC 3986 percent-encoding; Java's URLEncoder differs only in writing
a space as ``+``). Decoding turns ``%XX`` back and leaves everything else,
``+`` included, as it is, so a segment stored raw before encoding existed
decodes to its own name unless it holds a ``%XX`` sequence; a cursor recovered
from such a segment keeps using it (``ManagedCursor.path_segment``).
Pure functions, no I/O.
"""
from __future__ import annotations

from urllib.parse import quote, unquote

__all__ = ["encode_path_segment", "decode_path_segment", "ml_path"]


def ml_path(name: str) -> str:
    """Metadata path of a managed ledger (``/managed-ledgers/<name>``, Pulsar's
    layout); ``name`` like ``tenant/ns/persistent/topic``. Its cursors are the
    children ``<ml_path>/<encode_path_segment(cursor name)>``."""
    return f"/managed-ledgers/{name}"


def encode_path_segment(name: str) -> str:
    """Percent-encode ``name`` (str, any characters) into one metadata path
    segment: only ASCII letters, digits, ``_.-~`` and ``%`` remain, so never a
    '/' or a control character, and non-empty for a non-empty name.
    Raises TypeError for a non-str, UnicodeEncodeError for a lone surrogate."""
    if not isinstance(name, str):
        raise TypeError(f"a name must be a str, got {type(name).__name__}")
    return quote(name, safe="", encoding="utf-8", errors="strict")


def decode_path_segment(segment: str) -> str:
    """Inverse of :func:`encode_path_segment`: ``%XX`` sequences decoded (as
    UTF-8), everything else unchanged. Raises TypeError for a non-str."""
    if not isinstance(segment, str):
        raise TypeError(f"a path segment must be a str, got {type(segment).__name__}")
    return unquote(segment, encoding="utf-8", errors="replace")
