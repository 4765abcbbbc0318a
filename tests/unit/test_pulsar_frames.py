"""Pulsar binary protocol frames (broker.protocols.pulsar.frames) and wire message ids
(ids): the byte layout official clients send, split at any boundary; hostile frames."""
import struct

import pytest

from broker.protocols.pulsar.frames import FRAME_PADDING, FrameDecoder, FrameError, encode_command, \
    encode_payload_command
from broker.protocols.pulsar.ids import acked_indexes, message_id, not_acked_bits, position_of, signed, unsigned
from proto.entry_format import decode_entry, encode_entry
from proto.pulsar_api_pb2 import MessageMetadata
from proto.pulsar_wire_pb2 import BaseCommand, MessageIdData

T = BaseCommand.Type


def _send(seq: int) -> BaseCommand:
    return BaseCommand(type=T.SEND, send={"producer_id": 7, "sequence_id": seq, "num_messages": 1})


def test_simple_frame_layout_is_total_size_command_size_command():
    cmd = BaseCommand(type=T.PING, ping={})
    frame = encode_command(cmd)
    body = cmd.SerializeToString()
    assert frame == struct.pack(">II", 4 + len(body), len(body)) + body


def test_payload_frame_carries_the_entry_as_stored_and_splits_at_any_boundary():
    entry = encode_entry(MessageMetadata(producer_name="p", sequence_id=3, publish_time=1), b"x" * 300)
    frames = encode_payload_command(_send(3), entry) + encode_command(BaseCommand(type=T.PING, ping={})) + \
        encode_payload_command(_send(4), entry)
    for cut in (1, 3, 7, 9, 50, len(frames) - 1):
        decoder = FrameDecoder(1 << 20)
        got = decoder.feed(frames[:cut]) + decoder.feed(frames[cut:])
        assert [(c.type, c.send.sequence_id if c.HasField("send") else None) for c, _ in got] == \
            [(T.SEND, 3), (T.PING, None), (T.SEND, 4)]
        assert got[0][1] == entry and got[1][1] is None
        assert decoder.buffered == 0
    md, payload = decode_entry(got[2][1])          # the CRC32C survived the trip: bytes unchanged
    assert md.sequence_id == 3 and bytes(payload) == b"x" * 300


def test_frame_over_the_bound_is_refused_before_it_is_buffered():
    decoder = FrameDecoder(5 * 1024 * 1024 + FRAME_PADDING)
    with pytest.raises(FrameError, match="outside"):
        decoder.feed(struct.pack(">I", 2**31) + b"\0" * 10)


@pytest.mark.parametrize("frame, match", [
    (struct.pack(">II", 8, 100) + b"\0" * 4, "command size"),             # command larger than its frame
    (struct.pack(">II", 6, 2) + b"\xff\xff", "unparsable"),               # garbage protobuf
    (struct.pack(">II", 6, 2) + b"\x08\x63", "unknown"),                  # type 99: unknown command
    (encode_command(BaseCommand(type=T.SEND)), "without its send"),      # SEND without its command
    (encode_command(BaseCommand(type=T.FLOW, ping={})), "without its flow"),            # another command's field
    (struct.pack(">I", 2), "outside"),                                    # totalSize below 4
])
def test_malformed_frames_raise_frame_error(frame, match):
    with pytest.raises(FrameError, match=match):
        FrameDecoder(1 << 20).feed(frame)


def test_encoding_a_command_without_required_fields_is_refused():
    with pytest.raises(FrameError):
        encode_command(BaseCommand(type=T.SEND_RECEIPT, send_receipt={"producer_id": 1}))


def test_message_ids_are_unsigned_on_the_wire():
    assert unsigned(-1) == 2**64 - 1 and signed(2**64 - 1) == -1 and signed(5) == 5
    earliest = MessageIdData(ledgerId=2**64 - 1, entryId=2**64 - 1)
    assert tuple(position_of(earliest)) == (-1, -1)
    mid = message_id(-1, -1)
    assert (mid.ledgerId, mid.entryId, mid.batch_index) == (2**64 - 1, 2**64 - 1, -1)
    assert message_id(3, 4, 2).batch_index == 2


def test_ack_set_bits_mean_not_yet_acknowledged():
    # a batch of 5 where messages 1 and 3 are acknowledged: bits 0, 2, 4 stay set
    words = [0b10101]
    assert not_acked_bits(words) == {0, 2, 4}
    assert acked_indexes(words, 5) == [1, 3]
    # a word with the sign bit set (Java long) and a second word
    words = [-1, 0b1]
    assert not_acked_bits(words) == set(range(65))
    assert acked_indexes(words, 70) == [65, 66, 67, 68, 69]
