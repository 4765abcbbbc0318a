"""client.entry_format: Pulsar's [0x0e01][crc32c][size][MessageMetadata][payload]."""
import struct

import crc32c
import pytest
from hypothesis import given, strategies as st

from client.entry_format import (
    HEADER_SIZE, MAGIC_CRC32C, decode_entry, encode_entry, peek_metadata, verify_checksum, with_metadata,
)
from client.errors import ChecksumError, CorruptedMessage
from proto.pulsar_api_pb2 import MessageMetadata


def md(**kw):
    base = dict(producer_name="prod-1", sequence_id=7, publish_time=1_700_000_000_000)
    base.update(kw)
    return MessageMetadata(**base)


metadatas = st.builds(
    md, producer_name=st.text(max_size=20), sequence_id=st.integers(0, 2**64 - 1),
    publish_time=st.integers(0, 2**63), partition_key=st.text(max_size=10),
    num_messages_in_batch=st.integers(1, 1000), replicate_to=st.lists(st.text(max_size=5), max_size=3),
)


def test_layout_is_pulsars_headers_and_payload():
    meta, payload = md(), b"hello"
    data = encode_entry(meta, payload)
    raw_meta = meta.SerializeToString()
    assert data[:2] == b"\x0e\x01" and MAGIC_CRC32C == 0x0E01
    body = struct.pack(">I", len(raw_meta)) + raw_meta + payload
    assert data[6:] == body
    assert data[2:6] == struct.pack(">I", crc32c.crc32c(body))  # CRC32C over everything after it, big endian
    assert len(data) == HEADER_SIZE + len(raw_meta) + len(payload)


@given(metadatas, st.binary(max_size=2000))
def test_round_trip(meta, payload):
    data = encode_entry(meta, payload)
    back, body = decode_entry(data)
    assert back == meta and bytes(body) == payload
    assert peek_metadata(data) == meta
    verify_checksum(data)


def test_payload_is_zero_copy_view():
    data = encode_entry(md(), b"x" * 100)
    _, body = decode_entry(data)
    assert isinstance(body, memoryview) and body.obj is data


def test_accepts_bytearray_and_memoryview():
    data = encode_entry(md(), b"abc")
    assert bytes(decode_entry(bytearray(data))[1]) == b"abc"
    assert bytes(decode_entry(memoryview(data))[1]) == b"abc"
    assert encode_entry(md(), memoryview(b"abc")) == data


@given(st.binary(min_size=1, max_size=200), st.data())
def test_any_flipped_byte_after_magic_is_detected(payload, data):
    entry = bytearray(encode_entry(md(), payload))
    pos = data.draw(st.integers(2, len(entry) - 1))
    entry[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptedMessage):  # ChecksumError, or framing error if the size field broke
        decode_entry(bytes(entry))


def test_flipped_payload_byte_is_a_checksum_error():
    entry = bytearray(encode_entry(md(), b"payload"))
    entry[-1] ^= 1
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        decode_entry(bytes(entry))
    with pytest.raises(ChecksumError):
        verify_checksum(bytes(entry))


def test_bad_magic():
    entry = bytearray(encode_entry(md(), b"p"))
    entry[0:2] = b"\x0e\x02"
    with pytest.raises(CorruptedMessage, match="bad magic") as info:
        decode_entry(bytes(entry))
    assert not isinstance(info.value, ChecksumError)


def test_every_truncation_is_detected():
    entry = encode_entry(md(partition_key="k"), b"some payload")
    for n in range(len(entry)):
        with pytest.raises(CorruptedMessage):
            decode_entry(entry[:n])


@pytest.mark.parametrize("n", [0, 1, 6, 9])
def test_shorter_than_header_says_truncated(n):
    with pytest.raises(CorruptedMessage, match="truncated"):
        decode_entry(encode_entry(md(), b"")[:n])


def test_metadata_size_beyond_data_says_truncated():
    entry = bytearray(encode_entry(md(), b""))
    entry[6:10] = struct.pack(">I", 10_000)
    with pytest.raises(CorruptedMessage, match="truncated"):
        peek_metadata(bytes(entry))


def _frame(raw_meta: bytes, payload: bytes = b"") -> bytes:
    body = struct.pack(">I", len(raw_meta)) + raw_meta + payload
    return struct.pack(">HI", 0x0E01, crc32c.crc32c(body)) + body


def test_unparsable_metadata_with_valid_checksum():
    with pytest.raises(CorruptedMessage, match="unparsable MessageMetadata") as info:
        decode_entry(_frame(b"\xff\xff\xff"))
    assert not isinstance(info.value, ChecksumError)


def test_metadata_missing_required_fields():
    with pytest.raises(CorruptedMessage, match="required fields.*publish_time"):
        decode_entry(_frame(MessageMetadata(producer_name="p", sequence_id=1).SerializePartialToString()))


def test_peek_skips_checksum_but_not_framing():
    entry = bytearray(encode_entry(md(sequence_id=42), b"payload"))
    entry[-1] ^= 0xFF  # corrupt payload: peek does not care
    assert peek_metadata(bytes(entry)).sequence_id == 42
    with pytest.raises(CorruptedMessage):
        peek_metadata(b"\x00\x00" + bytes(entry[2:]))


def test_encode_incomplete_metadata_is_a_value_error():
    with pytest.raises(ValueError, match="incomplete"):
        encode_entry(MessageMetadata(producer_name="p"), b"")


def test_with_metadata_keeps_payload_bytes():
    payload = bytes(range(256)) * 4
    original = encode_entry(md(), payload)

    def mark(m):
        m.replicated_from = "us-east"

    replicated = with_metadata(original, mark)
    meta, body = decode_entry(replicated)
    assert meta.replicated_from == "us-east" and meta.sequence_id == 7
    assert bytes(body) == payload
    assert replicated.endswith(payload)


def test_with_metadata_accepts_a_returned_replacement():
    out = with_metadata(encode_entry(md(), b"p"), lambda m: md(producer_name="other"))
    assert decode_entry(out)[0].producer_name == "other"


def test_with_metadata_refuses_to_relabel_corrupt_entries():
    entry = bytearray(encode_entry(md(), b"payload"))
    entry[-2] ^= 4
    with pytest.raises(ChecksumError):
        with_metadata(bytes(entry), lambda m: None)
