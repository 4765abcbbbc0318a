"""On-disk format of a bookie's journal: file header, records, and the journal mark.

BookKeeper concepts: the bookie *Journal* is a sequence of append-only journal files
(``<journal dir>/<file id as 16 hex digits>.txn``, ids increasing, as BookKeeper's
``JournalChannel``), each a header followed by length-prefixed records; the *last log
mark* (``lastLogMark``, a ``LogMark`` of journal file id + offset) says up to where
ledger storage holds everything the journal holds, so replay at start begins there and
files wholly behind it are deleted. Pure format logic; the file I/O is in
:mod:`bookie.journal_file`.

File header (:func:`encode_header`): ``MAGIC`` (4 bytes ``b"MPJL"``), version (u32,
``FORMAT_VERSION``), file id (u64), instance id length (u16) and the bookie's cookie
instance id (UTF-8): a journal file of another bookie instance (a formatted data dir
next to an old journal directory) is recognised and never replayed.

Record (:func:`encode_record`), all integers big-endian: body length (u32, >= 1),
CRC32C of the body (u32), body = type (u8) + fields:

* ``REC_ADD`` (1): ledger id (i64), entry id (i64), has-crc (u8), crc32c (u32, the
  writer's checksum of the payload as stored, 0 if none), payload (the rest);
* ``REC_LEDGER`` (2): the ledger record as written to table ``ledgers``: ledger id
  (i64), fenced (u8), lac (i64), last entry id (i64), master key (the rest). A fence
  is a ``REC_LEDGER`` record with fenced = 1; a ledger created by its first add too;
* ``REC_DELETE`` (3): ledger id (i64).

Replay applies records in file order, idempotently (an entry already stored is kept,
a record row is set, a delete of a missing ledger does nothing). The preallocated,
zero-filled rest of a file reads as body length 0: the end of the file's records. A
record whose length runs past the end of the data or whose CRC does not match is a
*torn* record (a write cut by ``kill -9`` or power loss): replay of that file ends
there (:func:`scan_records` reports it; it never raises).

The journal mark (:func:`encode_mark`): file id (u64), offset (u64), CRC32C of those
16 bytes (u32).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from crc32c import crc32c

__all__ = ["MAGIC", "FORMAT_VERSION", "REC_ADD", "REC_LEDGER", "REC_DELETE", "RECORD_HEADER_BYTES",
           "MAX_RECORD_BYTES", "JournalFormatError", "JournalHeader", "ScanResult", "encode_header",
           "parse_header", "encode_add", "encode_adds_into", "encode_ledger", "encode_delete", "encode_record", "decode_body",
           "scan_records", "encode_mark", "decode_mark", "file_name", "file_id_of", "MARK_BYTES"]

MAGIC = b"MPJL"
FORMAT_VERSION = 1
REC_ADD = 1
REC_LEDGER = 2
REC_DELETE = 3
RECORD_HEADER_BYTES = 8          # body length (u32) + CRC32C (u32)
MAX_RECORD_BYTES = 1 << 30       # a larger length is garbage, not a record
MARK_BYTES = 20
FILE_SUFFIX = ".txn"             # BookKeeper's journal file suffix

_HEAD = struct.Struct(">4sIQH")
_REC = struct.Struct(">II")
_ADD = struct.Struct(">BqqBI")
_LEDGER = struct.Struct(">BqBqq")
_DELETE = struct.Struct(">Bq")
_MARK = struct.Struct(">QQ")


class JournalFormatError(ValueError):
    """A journal file header or mark that cannot be parsed (wrong magic, version, size or CRC)."""


class JournalHeader(NamedTuple):
    """A parsed file header: ``file_id`` (int), ``instance_id`` (str), ``length`` (bytes
    of the header: where the first record starts)."""

    file_id: int
    instance_id: str
    length: int


class ScanResult(NamedTuple):
    """End of a :func:`scan_records` pass: ``end`` (offset after the last good record),
    ``torn`` (None, or why the record at ``end`` was refused: the file's tail was torn)."""

    end: int
    torn: str | None


def encode_header(file_id: int, instance_id: str) -> bytes:
    """The header of journal file ``file_id`` (u64) of bookie instance ``instance_id``.
    Raises ``struct.error`` for an id out of range."""
    iid = instance_id.encode()
    return _HEAD.pack(MAGIC, FORMAT_VERSION, file_id, len(iid)) + iid


def parse_header(buf: bytes) -> JournalHeader:
    """Parse the header at the start of ``buf`` (a journal file's first bytes). Raises
    :class:`JournalFormatError` when it is not a journal file of this format."""
    if len(buf) < _HEAD.size:
        raise JournalFormatError(f"journal file header truncated ({len(buf)} bytes)")
    magic, version, file_id, n = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        raise JournalFormatError(f"not a journal file (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise JournalFormatError(f"journal format version {version} is not supported (only {FORMAT_VERSION})")
    if len(buf) < _HEAD.size + n:
        raise JournalFormatError("journal file header truncated (instance id)")
    return JournalHeader(file_id, buf[_HEAD.size:_HEAD.size + n].decode(errors="replace"), _HEAD.size + n)


def encode_record(body: bytes) -> bytes:
    """Frame one record body: length (u32), CRC32C (u32), body."""
    return _REC.pack(len(body), crc32c(body)) + body


def encode_add(ledger_id: int, entry_id: int, payload: bytes, crc: int | None) -> bytes:
    """A framed ``REC_ADD`` record: entry ``(ledger_id, entry_id)`` with ``payload``
    (bytes) and the writer's CRC32C of it (``crc``; None when it sent none)."""
    body = _ADD.pack(REC_ADD, ledger_id, entry_id, 0 if crc is None else 1, crc or 0) + bytes(payload)
    return encode_record(body)


def encode_adds_into(parts: list, rows) -> None:
    """Append the framed ``REC_ADD`` records of ``rows`` (``entries`` rows ``(ledger_id,
    entry_id, payload, crc32c or None)``) to ``parts`` as pieces to ``b"".join`` (the
    same bytes as :func:`encode_add`, without copying the payloads twice: the group
    commit's hot path)."""
    add_pack, rec_pack = _ADD.pack, _REC.pack
    for ledger_id, entry_id, payload, crc in rows:
        head = add_pack(REC_ADD, ledger_id, entry_id, 0 if crc is None else 1, crc or 0)
        parts.append(rec_pack(len(head) + len(payload), crc32c(payload, crc32c(head))))
        parts.append(head)
        parts.append(payload)


def encode_ledger(row: tuple) -> bytes:
    """A framed ``REC_LEDGER`` record from a ``ledgers`` row ``(ledger_id, master_key,
    fenced 0/1, lac, last_entry_id)`` (``bookie.ledger_records._Ledger.row``)."""
    ledger_id, key, fenced, lac, last = row
    return encode_record(_LEDGER.pack(REC_LEDGER, ledger_id, int(bool(fenced)), lac, last) + bytes(key))


def encode_delete(ledger_id: int) -> bytes:
    """A framed ``REC_DELETE`` record of ``ledger_id``."""
    return encode_record(_DELETE.pack(REC_DELETE, ledger_id))


def decode_body(body: bytes) -> tuple:
    """Decode a record body (CRC already checked) to ``("add", ledger_id, entry_id,
    payload bytes, crc or None)``, ``("ledger", (ledger_id, master_key, fenced, lac,
    last_entry_id))`` or ``("delete", ledger_id)``. Raises :class:`JournalFormatError`
    for an unknown type or a short body."""
    kind = body[0] if body else -1
    try:
        if kind == REC_ADD:
            _, lid, eid, has_crc, crc = _ADD.unpack_from(body, 0)
            return ("add", lid, eid, bytes(body[_ADD.size:]), crc if has_crc else None)
        if kind == REC_LEDGER:
            _, lid, fenced, lac, last = _LEDGER.unpack_from(body, 0)
            return ("ledger", (lid, bytes(body[_LEDGER.size:]), fenced, lac, last))
        if kind == REC_DELETE:
            return ("delete", _DELETE.unpack_from(body, 0)[1])
    except struct.error as exc:
        raise JournalFormatError(f"journal record of type {kind} is too short ({len(body)} bytes)") from exc
    raise JournalFormatError(f"unknown journal record type {kind}")


def scan_records(buf: bytes | memoryview, start: int, result: list | None = None) -> Iterator[tuple]:
    """Yield ``(offset after the record, decoded record)`` for each good record of ``buf``
    from offset ``start`` (see :func:`decode_body`), stopping at a zero length (the
    preallocated rest) or at the end of ``buf``. A torn record (length past the end,
    CRC mismatch, undecodable body) also ends the scan; then, and always at the end,
    a :class:`ScanResult` is appended to ``result`` (when given). Never raises."""
    view = memoryview(buf)
    pos, size, torn = start, len(view), None
    while pos + RECORD_HEADER_BYTES <= size:
        length, crc = _REC.unpack_from(view, pos)
        if length == 0:
            if crc != 0:
                torn = f"record at offset {pos}: zero length with a non-zero checksum"
            break
        if length > MAX_RECORD_BYTES or pos + RECORD_HEADER_BYTES + length > size:
            torn = f"record at offset {pos}: length {length} runs past the end of the file ({size} bytes)"
            break
        body = view[pos + RECORD_HEADER_BYTES:pos + RECORD_HEADER_BYTES + length]
        if crc32c(body) != crc:
            torn = f"record at offset {pos}: checksum mismatch"
            break
        try:
            record = decode_body(body)
        except JournalFormatError as exc:
            torn = f"record at offset {pos}: {exc}"
            break
        pos += RECORD_HEADER_BYTES + length
        yield pos, record
    else:
        if 0 < size - pos and any(view[pos:size]):
            torn = f"record at offset {pos}: {size - pos} trailing bytes, shorter than a record header"
    if result is not None:
        result.append(ScanResult(pos, torn))


def encode_mark(file_id: int, offset: int) -> bytes:
    """The journal mark (``lastLogMark``): file id, offset, CRC32C (20 bytes)."""
    raw = _MARK.pack(file_id, offset)
    return raw + struct.pack(">I", crc32c(raw))


def decode_mark(buf: bytes) -> tuple[int, int]:
    """``(file id, offset)`` of an encoded mark. Raises :class:`JournalFormatError` for a
    wrong size or checksum."""
    if len(buf) != MARK_BYTES:
        raise JournalFormatError(f"journal mark has {len(buf)} bytes, expected {MARK_BYTES}")
    raw, (crc,) = buf[:16], struct.unpack(">I", buf[16:])
    if crc32c(raw) != crc:
        raise JournalFormatError("journal mark checksum mismatch")
    return _MARK.unpack(raw)


def file_name(file_id: int) -> str:
    """Name of journal file ``file_id``: 16 hex digits + ``.txn`` (sorts by id)."""
    return f"{file_id:016x}{FILE_SUFFIX}"


def file_id_of(name: str) -> int | None:
    """The file id of a journal file name, or None for any other name."""
    if not name.endswith(FILE_SUFFIX) or len(name) != 16 + len(FILE_SUFFIX):
        return None
    try:
        return int(name[:16], 16)
    except ValueError:
        return None
