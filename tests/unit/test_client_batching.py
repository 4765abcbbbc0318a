"""client.batching: BatchMessageContainerImpl-style batches and their parsing."""
import struct

import pytest
from hypothesis import given, strategies as st

from client.batching import (
    LOCAL_ONLY, BatchMessageContainer, KeyBasedBatchMessageContainer, PendingMessage, is_batched,
    message_metadata, parse_batch, iter_batch,
)
from client.compression import CompressionType, decompress
from client.entry_format import decode_entry, encode_entry
from client.errors import CorruptedMessage, InvalidConfiguration
from proto.pulsar_api_pb2 import MessageMetadata, SingleMessageMetadata


def msg(seq, payload=b"x", **kw):
    return PendingMessage(payload=payload, sequence_id=seq, **kw)


message_fields = st.fixed_dictionaries({
    "payload": st.binary(max_size=300),
    "properties": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    "partition_key": st.none() | st.text(max_size=10),
    "ordering_key": st.none() | st.binary(max_size=10),
    "event_time": st.integers(0, 2**50),
})
COMPRESSIONS = [CompressionType.NONE, CompressionType.LZ4, CompressionType.ZLIB, CompressionType.ZSTD]


def unpack(metadata, payload):
    return parse_batch(metadata, decompress(metadata.compression, payload, metadata.uncompressed_size))


@pytest.mark.parametrize("compression", COMPRESSIONS)
@given(fields=st.lists(message_fields, min_size=1, max_size=20), first_seq=st.integers(0, 2**40))
def test_build_parse_round_trip(compression, fields, first_seq):
    container = BatchMessageContainer(max_messages=0, max_bytes=0)
    messages = [PendingMessage(sequence_id=first_seq + i, callback=i, **f) for i, f in enumerate(fields)]
    for m in messages:
        container.add(m)
    metadata, payload, built = container.build("prod", compression, publish_time_ms=1234)
    assert container.is_empty() and built == messages
    assert metadata.producer_name == "prod" and metadata.publish_time == 1234
    assert metadata.sequence_id == first_seq and metadata.highest_sequence_id == first_seq + len(fields) - 1
    assert metadata.num_messages_in_batch == len(fields) and is_batched(metadata)
    assert metadata.compression == compression.value
    assert metadata.HasField("compression") == (compression is not CompressionType.NONE)
    parsed = unpack(metadata, payload)
    assert len(parsed) == len(messages)
    for (smm, body), m in zip(parsed, messages):
        assert body == m.payload and smm.payload_size == len(m.payload)
        assert smm.sequence_id == m.sequence_id
        assert {p.key: p.value for p in smm.properties} == m.properties
        assert (smm.partition_key if smm.HasField("partition_key") else None) == m.partition_key
        assert (smm.ordering_key if smm.HasField("ordering_key") else None) == m.ordering_key
        assert smm.event_time == m.event_time


def test_payload_layout_is_size_metadata_payload_per_message():
    container = BatchMessageContainer()
    container.add(msg(5, b"hello", properties={"a": "b"}))
    container.add(msg(6, b"!"))
    metadata, payload, _ = container.build("p")
    smm1 = SingleMessageMetadata(payload_size=5, sequence_id=5)
    smm1.properties.add(key="a", value="b")
    smm2 = SingleMessageMetadata(payload_size=1, sequence_id=6)
    expected = b"".join(struct.pack(">I", len(s)) + s + p for s, p in
                        ((smm1.SerializeToString(), b"hello"), (smm2.SerializeToString(), b"!")))
    assert payload == expected
    assert metadata.uncompressed_size == len(expected)


def test_batch_travels_through_an_entry():
    container = BatchMessageContainer()
    for i in range(10):
        container.add(msg(i, f"m{i}".encode()))
    metadata, payload, _ = container.build("p", "ZSTD", 99)
    back_md, body = decode_entry(encode_entry(metadata, payload))
    assert [p for _, p in unpack(back_md, body)] == [f"m{i}".encode() for i in range(10)]


def test_limits_like_batch_message_container_impl():
    c = BatchMessageContainer(max_messages=3, max_bytes=10)
    assert c.has_space(1000)  # empty batch: anything fits, a batch of one
    assert not c.add(msg(1, b"aaaa"))
    assert c.has_space(6) and not c.has_space(7)
    assert not c.add(msg(2, b"bbbb"))
    assert c.num_messages == 2 and c.num_bytes == 8
    assert c.add(msg(3, b"c"))  # third message: count limit reached
    assert c.is_full() and not c.has_space(0)


def test_byte_limit_makes_the_batch_full():
    c = BatchMessageContainer(max_messages=100, max_bytes=10)
    assert c.add(msg(1, b"x" * 10))
    big = BatchMessageContainer(max_messages=100, max_bytes=10)
    assert big.add(msg(1, b"y" * 50))  # oversized message: batch of one, full at once


def test_non_positive_limits_mean_unlimited():
    c = BatchMessageContainer(max_messages=0, max_bytes=-1)
    for i in range(5000):
        assert not c.add(msg(i, b"z" * 100))
    assert c.has_space(10**9)


def test_sequence_ids_must_increase_within_a_batch():
    c = BatchMessageContainer()
    c.add(msg(5))
    with pytest.raises(ValueError, match="duplicates"):
        c.add(msg(5))
    with pytest.raises(ValueError):
        c.add(msg(4))


def test_delayed_messages_are_never_batched():
    c = BatchMessageContainer()
    delayed = msg(1, deliver_at=10_000)
    assert not c.is_compatible(delayed) and not c.can_add(delayed)
    with pytest.raises(ValueError, match="deliver_at"):
        c.add(delayed)


def test_replication_targets_are_per_batch():
    c = BatchMessageContainer()
    c.add(msg(1, replicate_to=("us", "eu")))
    assert c.can_add(msg(2, replicate_to=("us", "eu")))
    assert not c.can_add(msg(2, replicate_to=("us",)))
    assert not c.can_add(msg(2, disable_replication=True))
    with pytest.raises(ValueError, match="replication"):
        c.add(msg(2))
    metadata, _, _ = c.build("p")
    assert list(metadata.replicate_to) == ["us", "eu"]
    c.add(msg(3, disable_replication=True))
    assert list(c.build("p")[0].replicate_to) == [LOCAL_ONLY]


def test_build_empty_and_bad_compression():
    c = BatchMessageContainer()
    with pytest.raises(ValueError, match="empty"):
        c.build("p")
    c.add(msg(1))
    with pytest.raises(InvalidConfiguration, match="SNAPPY"):
        c.build("p", CompressionType.SNAPPY)


def test_clear_returns_messages_for_failing_their_callbacks():
    c = BatchMessageContainer()
    c.add(msg(1, callback="cb1"))
    c.add(msg(2, callback="cb2"))
    assert [m.callback for m in c.clear()] == ["cb1", "cb2"]
    assert c.is_empty() and c.num_bytes == 0


def test_message_metadata_for_unbatched_sends():
    m = msg(9, b"p", properties={"k": "v"}, partition_key="pk", ordering_key=b"ok", event_time=5,
            deliver_at=777, replicate_to=("eu",))
    md = message_metadata(m, "prod", 1000)
    assert (md.producer_name, md.sequence_id, md.publish_time) == ("prod", 9, 1000)
    assert md.partition_key == "pk" and md.ordering_key == b"ok" and md.event_time == 5
    assert md.deliver_at_time == 777 and list(md.replicate_to) == ["eu"]
    assert {p.key: p.value for p in md.properties} == {"k": "v"}
    assert not is_batched(md)
    plain = message_metadata(msg(1), "prod", 1)
    assert not plain.HasField("partition_key") and not plain.HasField("deliver_at_time")


# ---- parse_batch on bad input ----

def _batch(n=3):
    c = BatchMessageContainer()
    for i in range(n):
        c.add(msg(i, b"payload-%d" % i))
    return c.build("p")[:2]


PARSERS = pytest.mark.parametrize("parse", [parse_batch, iter_batch], ids=["parse_batch", "iter_batch"])


@PARSERS
def test_parse_every_truncation_is_corruption(parse):
    metadata, payload = _batch()
    for cut in range(len(payload)):
        with pytest.raises(CorruptedMessage):
            parse(metadata, payload[:cut])


@PARSERS
def test_parse_trailing_bytes_is_corruption(parse):
    metadata, payload = _batch()
    with pytest.raises(CorruptedMessage, match="trailing"):
        parse(metadata, payload + b"\x00")


@PARSERS
@pytest.mark.parametrize("count", [0, -1, 2, 4, 10**6])
def test_parse_wrong_count_is_corruption(parse, count):
    metadata, payload = _batch(3)
    metadata.num_messages_in_batch = count
    with pytest.raises(CorruptedMessage, match="corrupted batch"):
        parse(metadata, payload)


@PARSERS
def test_parse_garbage_single_metadata(parse):
    metadata = MessageMetadata(producer_name="p", sequence_id=0, publish_time=0, num_messages_in_batch=1)
    with pytest.raises(CorruptedMessage, match="unparsable SingleMessageMetadata"):
        parse(metadata, struct.pack(">I", 3) + b"\xff\xff\xff")
    no_size = SingleMessageMetadata(sequence_id=1).SerializePartialToString()
    with pytest.raises(CorruptedMessage, match="payload_size"):
        parse(metadata, struct.pack(">I", len(no_size)) + no_size)
    negative = b"\x18" + b"\xff" * 9 + b"\x01"  # payload_size -1 as protobuf writes an int32
    with pytest.raises(CorruptedMessage):
        parse(metadata, struct.pack(">I", len(negative)) + negative)


# ---- the hand-written fast paths agree with protobuf ----

@given(payload=st.binary(max_size=300), seq=st.integers(0, 2**63 - 1), event_time=st.integers(0, 2**63 - 1))
def test_hand_encoded_single_metadata_is_what_protobuf_writes(payload, seq, event_time):
    from client.batching import _single_metadata
    expected = SingleMessageMetadata(payload_size=len(payload), sequence_id=seq)
    if event_time:
        expected.event_time = event_time
    assert _single_metadata(msg(seq, payload, event_time=event_time)) == expected.SerializeToString()


@pytest.mark.parametrize("compression", [CompressionType.NONE, CompressionType.LZ4])
@given(fields=st.lists(message_fields, min_size=1, max_size=20), first_seq=st.integers(0, 2**40))
def test_iter_batch_agrees_with_parse_batch(compression, fields, first_seq):
    container = BatchMessageContainer(max_messages=0, max_bytes=0)
    for i, f in enumerate(fields):
        container.add(PendingMessage(sequence_id=first_seq + i, **f))
    metadata, payload, messages = container.build("prod", compression)
    data = decompress(metadata.compression, payload, metadata.uncompressed_size)
    fast = iter_batch(metadata, data)
    slow = parse_batch(metadata, data)
    assert len(fast) == len(slow) == len(messages)
    for (body, seq, event_time, smm), (ref, ref_body), m in zip(fast, slow, messages):
        assert body == ref_body == m.payload
        assert seq == ref.sequence_id == m.sequence_id and event_time == ref.event_time == m.event_time
        plain = not m.properties and m.partition_key is None and m.ordering_key is None
        assert (smm is None) == plain  # protobuf only parses what the fast path cannot
        if smm is not None:
            assert smm == ref


def test_iter_batch_falls_back_to_protobuf_for_unknown_fields_and_null_values():
    smm = SingleMessageMetadata(payload_size=0, sequence_id=5, null_value=True, compacted_out=False)
    raw = smm.SerializeToString()
    metadata = MessageMetadata(producer_name="p", sequence_id=5, publish_time=0, num_messages_in_batch=1)
    [(body, seq, _, parsed)] = iter_batch(metadata, struct.pack(">I", len(raw)) + raw)
    assert body == b"" and seq == 5 and parsed is not None and parsed.null_value


@given(st.binary(max_size=200), st.integers(1, 5))
def test_parse_random_bytes_only_raise_corrupted_message_and_both_parsers_agree(junk, count):
    metadata = MessageMetadata(producer_name="p", sequence_id=0, publish_time=0, num_messages_in_batch=count)
    try:
        fast = iter_batch(metadata, junk)
    except CorruptedMessage:
        with pytest.raises(CorruptedMessage):
            parse_batch(metadata, junk)
        return
    slow = parse_batch(metadata, junk)
    assert len(fast) == count
    assert [f[0] for f in fast] == [b for _, b in slow]


# ---- key-based container (Key_Shared) ----

def test_key_based_groups_by_ordering_key_then_partition_key():
    c = KeyBasedBatchMessageContainer()
    c.add(msg(1, b"a", partition_key="A"))
    c.add(msg(2, b"b", partition_key="B"))
    c.add(msg(3, b"c", partition_key="A"))
    c.add(msg(4, b"d", partition_key="B", ordering_key=b"A"))  # ordering key wins, but differs from pkey "A"
    c.add(msg(5, b"e"))
    c.add(msg(6, b"f"))
    assert c.num_messages == 6 and c.num_bytes == 6 and c.num_batches == 4
    batches = c.build_all("p", "LZ4", 10)
    assert c.is_empty() and c.num_batches == 0
    groups = [[m.sequence_id for m in messages] for _, _, messages in batches]
    assert groups == [[1, 3], [2], [4], [5, 6]]  # ordered by lowest sequence id
    for metadata, payload, messages in batches:
        assert metadata.sequence_id == messages[0].sequence_id
        assert metadata.highest_sequence_id == messages[-1].sequence_id
        assert [p for _, p in unpack(metadata, payload)] == [m.payload for m in messages]


def test_key_based_limits_apply_to_totals():
    c = KeyBasedBatchMessageContainer(max_messages=3, max_bytes=100)
    assert not c.add(msg(1, partition_key="a"))
    assert not c.add(msg(2, partition_key="b"))
    assert c.add(msg(3, partition_key="c"))
    assert not c.has_space(1)
    c.clear()
    assert c.has_space(1000) and c.build_all("p") == []


def test_key_based_rejects_delayed_and_keeps_clear_order():
    c = KeyBasedBatchMessageContainer()
    assert not c.can_add(msg(1, deliver_at=5))
    c.add(msg(2, partition_key="b"))
    c.add(msg(3, partition_key="a"))
    c.add(msg(4, partition_key="b"))
    assert [m.sequence_id for m in c.clear()] == [2, 3, 4]
