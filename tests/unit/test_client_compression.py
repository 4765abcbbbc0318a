"""client.compression: Pulsar's codecs (LZ4 block, ZLIB, ZSTD), corrupt input handling."""
import zlib

import lz4.block
import pytest
import zstandard
from hypothesis import given, strategies as st

from client.compression import CompressionType, compress, decompress
from client.errors import CorruptedMessage, InvalidConfiguration
from proto import pulsar_api_pb2

SUPPORTED = [CompressionType.NONE, CompressionType.LZ4, CompressionType.ZLIB, CompressionType.ZSTD]
COMPRESSING = SUPPORTED[1:]
payloads = st.one_of(st.binary(max_size=5000), st.binary(max_size=50).map(lambda b: b * 40))


def test_values_match_pulsar_api_proto():
    for member in CompressionType:
        assert pulsar_api_pb2.CompressionType.Value(member.name) == member.value
    assert [m.name for m in CompressionType] == ["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"]


@pytest.mark.parametrize("value,expected", [
    ("lz4", CompressionType.LZ4), (" ZSTD ", CompressionType.ZSTD), (2, CompressionType.ZLIB),
    (CompressionType.NONE, CompressionType.NONE),
])
def test_parse(value, expected):
    assert CompressionType.parse(value) is expected


@pytest.mark.parametrize("value", ["gzip", 9, -1, ""])
def test_parse_unknown(value):
    with pytest.raises(InvalidConfiguration, match="unknown compression"):
        CompressionType.parse(value)


@pytest.mark.parametrize("kind", SUPPORTED)
@given(data=payloads)
def test_round_trip(kind, data):
    packed = compress(kind, data)
    assert isinstance(packed, bytes)
    assert decompress(kind, packed, len(data)) == data
    assert decompress(kind.value, memoryview(packed), len(data)) == data


def test_lz4_is_block_format_without_size_header():
    data = b"pulsar " * 100
    packed = compress(CompressionType.LZ4, data)
    assert packed == lz4.block.compress(data, store_size=False)
    assert lz4.block.decompress(packed, uncompressed_size=len(data)) == data


def test_zlib_is_a_zlib_stream_and_zstd_a_frame():
    data = b"pulsar " * 100
    assert zlib.decompress(compress("ZLIB", data)) == data
    packed = compress("ZSTD", data)
    assert zstandard.frame_content_size(packed) == len(data)
    assert zstandard.ZstdDecompressor().decompress(packed) == data


def test_compression_actually_shrinks_repetitive_data():
    data = b"a" * 10_000
    for kind in COMPRESSING:
        assert len(compress(kind, data)) < 200


def test_decompress_data_from_other_writers():
    data = b"interop " * 50
    assert decompress("ZLIB", zlib.compress(data, 9), len(data)) == data
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert decompress("ZSTD", no_size, len(data)) == data


def test_snappy_is_rejected_with_advice():
    with pytest.raises(InvalidConfiguration, match="SNAPPY is not supported, use LZ4/ZSTD"):
        compress(CompressionType.SNAPPY, b"x")
    with pytest.raises(InvalidConfiguration, match="SNAPPY"):
        decompress("SNAPPY", b"x", 1)


def test_unknown_type_in_metadata_is_corruption():
    with pytest.raises(CorruptedMessage, match="unknown compression type 9"):
        decompress(9, b"x", 1)


def test_none_returns_data_unchanged():
    assert decompress(CompressionType.NONE, memoryview(b"abc"), 0) == b"abc"


@pytest.mark.parametrize("kind", COMPRESSING)
def test_garbage_is_corruption(kind):
    with pytest.raises(CorruptedMessage, match=kind.name):
        decompress(kind, b"\x12\x34garbage\xff\xff\xff\xff", 100)


@pytest.mark.parametrize("kind", COMPRESSING)
@pytest.mark.parametrize("delta", [-1, 1, 1000])
def test_wrong_uncompressed_size_is_corruption(kind, delta):
    data = b"0123456789" * 30
    with pytest.raises(CorruptedMessage):
        decompress(kind, compress(kind, data), len(data) + delta)


@pytest.mark.parametrize("kind", COMPRESSING)
def test_truncated_is_corruption(kind):
    data = bytes(range(256)) * 8
    packed = compress(kind, data)
    for cut in (1, len(packed) // 2, len(packed) - 1):
        with pytest.raises(CorruptedMessage):
            decompress(kind, packed[:cut], len(data))


def test_zlib_trailing_garbage_is_corruption():
    data = b"abc" * 10
    with pytest.raises(CorruptedMessage, match="ZLIB"):
        decompress("ZLIB", compress("ZLIB", data) + b"junk", len(data))


@pytest.mark.parametrize("kind", COMPRESSING)
def test_bomb_is_stopped_at_announced_size(kind):
    bomb = compress(kind, b"\x00" * 5_000_000)
    with pytest.raises(CorruptedMessage):
        decompress(kind, bomb, 10)


def test_negative_size_is_corruption():
    with pytest.raises(CorruptedMessage, match="uncompressed size"):
        decompress("LZ4", compress("LZ4", b"x"), -1)


@pytest.mark.parametrize("kind", COMPRESSING)
@given(junk=st.binary(max_size=300), size=st.integers(0, 2000))
def test_random_input_only_ever_raises_corrupted_message(kind, junk, size):
    try:
        out = decompress(kind, junk, size)
    except CorruptedMessage:
        return
    assert len(out) == size
