"""Frames of Pulsar's binary protocol, pure (no I/O), as Pulsar's ``Commands`` writes
them and its ``PulsarDecoder`` reads them.

Simple command::

    [totalSize: u32 BE][commandSize: u32 BE][BaseCommand: commandSize bytes]

Payload command (SEND, MESSAGE), where totalSize also covers what follows the
command; the rest is exactly minipulsar's stored entry (proto.entry_format)::

    ... [magic 0x0e01: u16][CRC32C: u32][metadataSize: u32][MessageMetadata][payload]

``totalSize`` counts every byte after itself. A frame longer than the largest the
peer allows (Pulsar: ``max_message_size`` + ``Commands.MESSAGE_SIZE_FRAME_PADDING``,
10 KiB) or whose command does not parse is a :class:`FrameError`: the connection is
closed, nothing else is touched.
"""
from __future__ import annotations

import struct
from typing import Optional

from google.protobuf.message import DecodeError, EncodeError

from proto.pulsar_wire_pb2 import BaseCommand

__all__ = ["FRAME_PADDING", "FrameError", "FrameDecoder", "encode_command", "encode_payload_command"]

#: Bytes a frame may exceed max_message_size by (Pulsar's Commands.MESSAGE_SIZE_FRAME_PADDING).
FRAME_PADDING = 10 * 1024
_U32 = struct.Struct(">I")
# BaseCommand's field for each command type carries the type's number (PulsarApi.proto)
_FIELD_OF_TYPE = {f.number: f.name for f in BaseCommand.DESCRIPTOR.fields if f.number > 1}
_EMPTY_OK = {BaseCommand.PING, BaseCommand.PONG}
_U32x2 = struct.Struct(">II")


class FrameError(ValueError):
    """A frame that cannot be read (bad sizes, unparsable or unknown command):
    the connection that sent it is closed."""


def encode_command(cmd: BaseCommand) -> bytes:
    """One simple frame (bytes) carrying ``cmd``. Raises FrameError when ``cmd``
    lacks a required field (a broker bug: never sent half a command)."""
    try:
        body = cmd.SerializeToString()
    except EncodeError as exc:
        raise FrameError(f"cannot encode {BaseCommand.Type.Name(cmd.type)}: {exc}") from None
    return _U32x2.pack(4 + len(body), len(body)) + body


def encode_payload_command(cmd: BaseCommand, headers_and_payload: bytes) -> bytes:
    """One payload frame (bytes): ``cmd`` followed by ``headers_and_payload`` (an
    entry: magic, CRC32C, metadata size, MessageMetadata, payload; sent as stored)."""
    try:
        body = cmd.SerializeToString()
    except EncodeError as exc:
        raise FrameError(f"cannot encode {BaseCommand.Type.Name(cmd.type)}: {exc}") from None
    return b"".join((_U32x2.pack(4 + len(body) + len(headers_and_payload), len(body)), body,
                     headers_and_payload))


class FrameDecoder:
    """Splits a byte stream into ``(BaseCommand, payload or None)`` pairs.

    ``feed(data)`` takes any slice of the stream and returns the frames it completed
    (a list, possibly empty); a partial frame is kept for the next call. At most
    ``max_frame_size`` bytes per frame (totalSize); raises FrameError on a frame
    over it, a command size outside the frame, an unparsable command or a command
    whose ``type`` is unknown. After a FrameError the decoder is unusable."""

    def __init__(self, max_frame_size: int):
        self.max_frame_size = max_frame_size
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes of a partial frame held (count)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[BaseCommand, Optional[bytes]]]:
        """Append ``data``; return every complete frame in order (see the class)."""
        self._buf += data
        frames = []
        buf = self._buf
        offset = 0
        while len(buf) - offset >= 4:
            (total,) = _U32.unpack_from(buf, offset)
            if total > self.max_frame_size or total < 4:
                raise FrameError(f"frame of {total} bytes is outside [4, {self.max_frame_size}]")
            if len(buf) - offset - 4 < total:
                break
            (cmd_size,) = _U32.unpack_from(buf, offset + 4)
            if cmd_size > total - 4:
                raise FrameError(f"command size {cmd_size} exceeds its frame ({total - 4} bytes after it)")
            start = offset + 8
            cmd = BaseCommand()
            try:
                cmd.ParseFromString(bytes(buf[start:start + cmd_size]))
            except (DecodeError, RuntimeError) as exc:
                raise FrameError(f"unparsable command: {exc}") from None
            if not cmd.HasField("type"):
                raise FrameError("command without a known type (an unknown BaseCommand.Type value)")
            field = _FIELD_OF_TYPE.get(cmd.type)
            if field is not None and not cmd.HasField(field) and cmd.type not in _EMPTY_OK:
                raise FrameError(f"{BaseCommand.Type.Name(cmd.type)} without its {field} command")
            if not cmd.IsInitialized():
                missing = ", ".join(cmd.FindInitializationErrors())
                raise FrameError(f"{BaseCommand.Type.Name(cmd.type)} lacks required fields: {missing}")
            rest = total - 4 - cmd_size
            payload = bytes(buf[start + cmd_size:start + cmd_size + rest]) if rest else None
            frames.append((cmd, payload))
            offset += 4 + total
        if offset:
            del buf[:offset]
        return frames
