"""client.message_id: Pulsar's MessageIdImpl/BatchMessageIdImpl semantics."""
import dataclasses

import pytest
from hypothesis import given, strategies as st

from client.message_id import MessageId
from proto.pulsar_api_pb2 import MessageIdData

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
message_ids = st.builds(MessageId, INT64, INT64, st.integers(-1, 1 << 20), st.integers(-1, 1 << 20),
                        st.integers(0, 1 << 20))


def test_earliest_and_latest():
    assert (MessageId.earliest.ledger_id, MessageId.earliest.entry_id) == (-1, -1)
    assert (MessageId.latest.ledger_id, MessageId.latest.entry_id) == (2**63 - 1, 2**63 - 1)
    assert MessageId.earliest < MessageId(0, 0) < MessageId(5, 7, 2, 3) < MessageId.latest


def test_defaults_and_string_form():
    mid = MessageId(3, 4)
    assert (mid.partition, mid.batch_index, mid.batch_size) == (-1, -1, 0)
    assert str(mid) == "3:4:-1:-1"
    assert str(MessageId(3, 4, 2, 7, 10)) == "3:4:2:7"


@pytest.mark.parametrize("text,expected", [
    ("3:4", MessageId(3, 4)), ("3:4:2", MessageId(3, 4, 2)), ("3:4:2:7", MessageId(3, 4, 2, 7)),
    (" -1:-1:-1:-1 ", MessageId.earliest),
])
def test_parse(text, expected):
    assert MessageId.parse(text) == expected


@pytest.mark.parametrize("text", ["", "3", "a:b", "1:2:3:4:5", "1:2:-5", "1::2", "1.5:2"])
def test_parse_rejects_malformed(text):
    with pytest.raises(ValueError, match="message id|MessageId"):
        MessageId.parse(text)


@given(message_ids)
def test_string_round_trip(mid):
    back = MessageId.parse(str(mid))
    assert back == mid


@given(message_ids)
def test_serialize_round_trip(mid):
    back = MessageId.deserialize(mid.serialize())
    assert back == mid and back.batch_size == mid.batch_size


def test_wire_form_matches_pulsar_message_id_data():
    assert MessageId(1, 2).serialize() == b"\x08\x01\x10\x02"  # only ledgerId and entryId
    data = MessageIdData()
    data.ParseFromString(MessageId(7, 8, 3, 5, 10).serialize())
    assert (data.ledgerId, data.entryId, data.partition, data.batch_index, data.batch_size) == (7, 8, 3, 5, 10)
    # -1 travels as uint64 two's complement, as Java writes a long into uint64
    data.ParseFromString(MessageId.earliest.serialize())
    assert data.ledgerId == 2**64 - 1 and not data.HasField("partition")


def test_deserialize_bytes_written_by_another_client():
    data = MessageIdData(ledgerId=10, entryId=20, partition=1, batch_index=2, batch_size=5)
    assert MessageId.deserialize(data.SerializeToString()) == MessageId(10, 20, 1, 2, 5)
    assert MessageId.deserialize(bytearray(data.SerializeToString())).batch_size == 5


@pytest.mark.parametrize("bad", [b"", b"\xff\xff", b"\x08\x01", b"\x10\x01", b"garbage!"])
def test_deserialize_bad_bytes_raises_value_error(bad):
    with pytest.raises(ValueError, match="MessageId"):
        MessageId.deserialize(bad)


def test_deserialize_rejects_non_bytes():
    with pytest.raises(ValueError, match="expected bytes"):
        MessageId.deserialize("1:2")


def test_equality_ignores_batch_size_and_hash_agrees():
    a, b = MessageId(1, 2, 0, 3, 10), MessageId(1, 2, 0, 3, 0)
    assert a == b and hash(a) == hash(b)
    assert MessageId(1, 2, 0) != MessageId(1, 2, 1)
    assert len({a, b, MessageId(1, 2, 0, 4)}) == 2
    assert MessageId(1, 2) != "1:2:-1:-1"


def test_ordering_is_ledger_entry_batch_index():
    ids = [MessageId(2, 0), MessageId(1, 5, -1, 1), MessageId(1, 5), MessageId(1, 5, -1, 0), MessageId(0, 9)]
    assert sorted(ids) == [MessageId(0, 9), MessageId(1, 5), MessageId(1, 5, -1, 0), MessageId(1, 5, -1, 1),
                           MessageId(2, 0)]
    assert MessageId(1, 1) <= MessageId(1, 1) and MessageId(1, 2) >= MessageId(1, 1)


@given(message_ids, message_ids)
def test_order_is_total_and_consistent_with_equality(a, b):
    assert (a < b) + (a == b) + (a > b) == 1


def test_immutable():
    mid = MessageId(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mid.ledger_id = 5


@pytest.mark.parametrize("args", [(2**63, 0), (0, -(2**63) - 1), (1, 2, -2), (1, 2, 0, -2), (1, 2, 0, 0, -1),
                                  ("1", 2), (1.0, 2), (True, 2)])
def test_invalid_fields_rejected(args):
    with pytest.raises(ValueError):
        MessageId(*args)


def test_entry_id_only_and_is_batched():
    mid = MessageId(4, 5, 1, 2, 3)
    assert mid.is_batched and not mid.entry_id_only().is_batched
    assert mid.entry_id_only() == MessageId(4, 5, 1)


def test_an_inclusive_start_at_a_chunked_message_begins_at_its_first_chunk():
    """Pulsar #16154: a Reader or seek "at" a ChunkMessageId (whose position is its
    last chunk's) must begin at the first chunk, or the message is never read."""
    from client.consumer_impl import first_chunk_of
    from client.message_id import ChunkMessageId
    first = MessageId(9, 5, 2)
    chunked = ChunkMessageId(9, 8, 2, first_chunk_message_id=first,
                             chunk_message_ids=(first, MessageId(9, 7, 2), MessageId(9, 8, 2)))
    assert first_chunk_of(chunked, 2) == MessageId(9, 5, 2)
    plain = MessageId(9, 8, 2)
    assert first_chunk_of(plain, 2) is plain
    one_chunk = ChunkMessageId(9, 8, 2, first_chunk_message_id=MessageId(9, 8, 2))
    assert first_chunk_of(one_chunk, 2) is one_chunk
    assert first_chunk_of(None, 2) is None
