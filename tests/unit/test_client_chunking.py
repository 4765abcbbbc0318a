"""client.chunking: producer-side split, consumer-side reassembly as Pulsar's ConsumerImpl."""
import random

import pytest
from hypothesis import given, strategies as st

from client.chunking import (
    ChunkedMessageAssembler, chunk_message, chunk_metadatas, is_chunk, split_into_chunks,
)
from client.compression import compress, decompress
from client.entry_format import decode_entry, encode_entry
from client.message_id import MessageId
from proto.pulsar_api_pb2 import MessageMetadata

PUBLISH_MS = 1_000_000


def base_md(seq=7, producer="prod", **kw):
    return MessageMetadata(producer_name=producer, sequence_id=seq, publish_time=PUBLISH_MS, **kw)


def chunks_of(payload, size, seq=7, first_entry=0, ledger=1, producer="prod"):
    """[(metadata, chunk, MessageId)] as a consumer would receive them."""
    return [(md, chunk, MessageId(ledger, first_entry + i))
            for i, (md, chunk) in enumerate(chunk_message(base_md(seq, producer), payload, size))]


# ---- producer side ----

@given(st.binary(max_size=3000), st.integers(1, 500))
def test_split_joins_back_with_bounded_pieces(payload, size):
    pieces = split_into_chunks(payload, size)
    assert b"".join(pieces) == payload
    assert all(len(p) <= size for p in pieces) and all(pieces[:-1])
    assert len(pieces) == max(1, -(-len(payload) // size))


def test_split_edge_cases():
    assert split_into_chunks(b"", 10) == [b""]
    assert split_into_chunks(b"abcdef", 3) == [b"abc", b"def"]
    assert split_into_chunks(memoryview(b"abcdefg"), 3) == [b"abc", b"def", b"g"]
    with pytest.raises(ValueError):
        split_into_chunks(b"x", 0)


def test_chunk_metadatas_fields():
    base = base_md(seq=42, producer="standalone-0-3", properties=[{"key": "a", "value": "b"}])
    mds = chunk_metadatas(base, 3, 250)
    assert [m.chunk_id for m in mds] == [0, 1, 2]
    for m in mds:
        assert m.uuid == "standalone-0-3-42" and m.num_chunks_from_msg == 3 and m.total_chunk_msg_size == 250
        assert m.sequence_id == 42 and m.properties[0].key == "a" and is_chunk(m)
    assert not base.HasField("uuid")  # input untouched
    assert chunk_metadatas(base, 1, 10) == [base] and not is_chunk(base)
    with pytest.raises(ValueError):
        chunk_metadatas(base, 0, 10)


def test_small_message_is_not_chunked():
    [(md, chunk)] = chunk_message(base_md(), b"tiny", 100)
    assert chunk == b"tiny" and not md.HasField("uuid")


# ---- consumer side ----

def feed(assembler, received, now=PUBLISH_MS):
    results = [assembler.add(md, chunk, mid, now) for md, chunk, mid in received]
    return [r for r in results if r is not None]


@given(st.binary(min_size=2, max_size=4000), st.integers(1, 700))
def test_in_order_reassembly(payload, size):
    received = chunks_of(payload, size)
    if len(received) == 1:  # not chunked at all: nothing for the assembler
        assert received[0][1] == payload and not is_chunk(received[0][0])
        return
    a = ChunkedMessageAssembler()
    done = feed(a, received)
    assert len(done) == 1
    body, ids = done[0]
    assert body == payload and ids == [mid for _, _, mid in received]
    assert len(a) == 0 and a.take_discarded() == ([], [])


def test_completion_happens_only_on_last_chunk():
    received = chunks_of(b"0123456789", 3)
    a = ChunkedMessageAssembler()
    for md, chunk, mid in received[:-1]:
        assert a.add(md, chunk, mid, PUBLISH_MS) is None
    assert len(a) == 1
    assert a.add(*received[-1][:3], PUBLISH_MS).payload == b"0123456789"


@given(st.binary(min_size=20, max_size=400), st.integers(2, 9), st.data())
def test_redelivered_duplicates_are_ignored(payload, size, data):
    received = chunks_of(payload, size)
    stream = []
    for item in received:  # each chunk may arrive again right after (same entry id: redelivery)
        stream.append(item)
        if item[0].chunk_id > 0 and data.draw(st.booleans()):
            stream.append(item)
    a = ChunkedMessageAssembler()
    done = feed(a, stream)
    assert [d.payload for d in done] == [payload]
    assert a.take_discarded() == ([], [])  # redeliveries of the same entries: nothing to ack


def test_resent_duplicate_chunks_are_acked():
    # Pulsar's example: chunk ids 0,1,2,1,2,3 with distinct entries: chunk-4 and chunk-5 are acked
    md = chunk_metadatas(base_md(), 4, 8)
    parts = [b"aa", b"bb", b"cc", b"dd"]
    a = ChunkedMessageAssembler()
    order = [(0, 1), (1, 2), (2, 3), (1, 4), (2, 5), (3, 6)]
    done = feed(a, [(md[c], parts[c], MessageId(1, e)) for c, e in order])
    assert [d.payload for d in done] == [b"aabbccdd"]
    assert done[0].message_ids == [MessageId(1, 1), MessageId(1, 2), MessageId(1, 3), MessageId(1, 6)]
    assert a.take_discarded() == ([MessageId(1, 4), MessageId(1, 5)], [])


def test_first_chunk_again_from_redelivery_restarts_without_acks():
    received = chunks_of(b"abcdefghi", 3)
    a = ChunkedMessageAssembler()
    feed(a, received[:2])
    done = feed(a, received)  # redelivered from chunk 0: same entries
    assert [d.payload for d in done] == [b"abcdefghi"]
    assert a.take_discarded() == ([], [])


def test_first_chunk_again_from_resend_acks_the_stale_copy():
    stale = chunks_of(b"abcdefghi", 3, first_entry=10)
    fresh = chunks_of(b"abcdefghi", 3, first_entry=20)
    a = ChunkedMessageAssembler()
    feed(a, stale[:2])
    done = feed(a, fresh)
    assert done[0].message_ids == [MessageId(1, 20), MessageId(1, 21), MessageId(1, 22)]
    assert a.take_discarded() == ([MessageId(1, 10), MessageId(1, 11)], [])


def test_gap_discards_the_message():
    received = chunks_of(b"abcdefghijkl", 3)  # 4 chunks
    a = ChunkedMessageAssembler()
    assert feed(a, [received[0], received[2]]) == []
    assert len(a) == 0
    assert a.take_discarded() == ([], [MessageId(1, 0), MessageId(1, 2)])  # redeliver; no ack hole
    assert feed(a, [received[3]]) == []  # later chunks without a first chunk are discarded too
    assert a.take_discarded() == ([], [MessageId(1, 3)])


def test_orphan_chunk_older_than_expiry_is_acked():
    received = chunks_of(b"abcdef", 2)
    a = ChunkedMessageAssembler(expire_incomplete_chunked_message_ms=1000)
    a.add(*received[1][:3], now_ms=PUBLISH_MS + 1001)
    assert a.take_discarded() == ([MessageId(1, 1)], [])


def test_interleaved_messages_assemble_independently():
    one = chunks_of(b"first-message", 4, seq=1, first_entry=0)
    two = chunks_of(b"second-message", 4, seq=2, first_entry=100)
    stream = [x for pair in zip(one, two) for x in pair] + one[len(two):] + two[len(one):]
    done = feed(ChunkedMessageAssembler(), stream)
    assert sorted(d.payload for d in done) == [b"first-message", b"second-message"]


@pytest.mark.parametrize("auto_ack", [False, True])
def test_full_queue_drops_the_oldest(auto_ack):
    a = ChunkedMessageAssembler(max_pending_chunked_messages=2, auto_ack_oldest_chunked_message_on_queue_full=auto_ack)
    msgs = [chunks_of(b"x" * 9, 3, seq=s, first_entry=10 * s) for s in range(3)]
    for m in msgs:
        feed(a, m[:2])
    assert len(a) == 2
    dropped = [MessageId(1, 0), MessageId(1, 1)]
    assert a.take_discarded() == ((dropped, []) if auto_ack else ([], dropped))
    assert feed(a, msgs[0][2:]) == []  # the dropped one cannot complete any more
    assert [d.payload for d in feed(a, msgs[1][2:] + msgs[2][2:])] == [b"x" * 9, b"x" * 9]


def test_unlimited_pending_when_max_is_not_positive():
    a = ChunkedMessageAssembler(max_pending_chunked_messages=0)
    for s in range(50):
        feed(a, chunks_of(b"yy", 1, seq=s, first_entry=10 * s)[:1])
    assert len(a) == 50


def test_expire_incomplete_messages():
    a = ChunkedMessageAssembler(expire_incomplete_chunked_message_ms=100)
    old = chunks_of(b"abcdef", 2, seq=1, first_entry=0)
    new = chunks_of(b"ghijkl", 2, seq=2, first_entry=10)
    a.add(*old[0][:3], now_ms=0)
    a.add(*new[0][:3], now_ms=50)
    assert a.expire(100) == []
    assert a.expire(101) == [MessageId(1, 0)]
    assert len(a) == 1
    assert a.expire(151) == [MessageId(1, 10)] and len(a) == 0
    assert ChunkedMessageAssembler(expire_incomplete_chunked_message_ms=0).expire(10**12) == []


def test_clear_returns_pending_ids():
    a = ChunkedMessageAssembler()
    feed(a, chunks_of(b"abcdef", 2)[:2])
    assert a.clear() == [MessageId(1, 0), MessageId(1, 1)] and len(a) == 0


def test_chunk_contradicting_its_first_chunk_is_corrupt():
    received = chunks_of(b"abcdef", 2)
    bad = MessageMetadata()
    bad.CopyFrom(received[1][0])
    bad.total_chunk_msg_size = 999
    a = ChunkedMessageAssembler()
    feed(a, [received[0], (bad, received[1][1], received[1][2])])
    assert len(a) == 0 and a.take_discarded() == ([MessageId(1, 0), MessageId(1, 1)], [])


def test_oversized_chunk_is_corrupt():
    received = chunks_of(b"abcdef", 2)
    a = ChunkedMessageAssembler()
    feed(a, [received[0], (received[1][0], b"too long!", received[1][2])])
    assert a.take_discarded()[0] == [MessageId(1, 0), MessageId(1, 1)]


def test_non_chunk_is_rejected():
    with pytest.raises(ValueError, match="not a chunk"):
        ChunkedMessageAssembler().add(base_md(), b"x", MessageId(1, 1), 0)


def test_end_to_end_compress_chunk_store_reassemble_decompress():
    original = random.Random(0).randbytes(20_000) * 3  # compresses to several 1000-byte chunks
    compressed = compress("ZSTD", original)
    meta = base_md(seq=3, compression=3, uncompressed_size=len(original))
    entries = [encode_entry(md, chunk) for md, chunk in chunk_message(meta, compressed, 1000)]
    a = ChunkedMessageAssembler()
    done = None
    for entry_id, entry in enumerate(entries):
        md, body = decode_entry(entry)
        done = a.add(md, body, MessageId(5, entry_id), PUBLISH_MS) or done
    assert done is not None and len(done.message_ids) == len(entries)
    assert decompress(md.compression, done.payload, md.uncompressed_size) == original


def test_redelivered_last_chunk_after_completion_is_ignored():
    received = chunks_of(b"abcdefghi", 3)
    a = ChunkedMessageAssembler()
    assert len(feed(a, received)) == 1
    assert feed(a, received[1:]) == []  # chunks 1 and 2 again, same entries
    assert a.take_discarded() == ([], []) and len(a) == 0
    assert len(feed(a, received)) == 1  # a full redelivery is a new delivery
