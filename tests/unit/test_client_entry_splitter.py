"""client.entry_splitter: pushed entries -> messages (batches, ack sets,
compression, chunks, corrupt entries, markers, start filter)."""
from client.ack_grouping import AcknowledgmentsGroupingTracker
from client.batching import BatchMessageContainer, PendingMessage, message_metadata
from client.chunking import chunk_message
from client.compression import CompressionType, compress
from client.entry_format import encode_entry
from client.entry_splitter import EntrySplitter, StartFilter
from client.message import TopicMessageId
from client.message_id import MessageId
from proto import broker_pb2 as pb
from proto.pulsar_api_pb2 import MessageMetadata

TOPIC = "persistent://public/default/t"


def single(payload=b"hello", seq=1, compression=CompressionType.NONE, **kw):
    msg = PendingMessage(payload, seq, **kw)
    md = message_metadata(msg, "prod", 1234)
    if compression is not CompressionType.NONE:
        md.compression = compression.value
        md.uncompressed_size = len(payload)
    return encode_entry(md, compress(compression, payload))


def batch(payloads, compression=CompressionType.NONE, **kw):
    c = BatchMessageContainer()
    for i, p in enumerate(payloads):
        c.add(PendingMessage(p, 10 + i, properties={"i": str(i)}, partition_key=f"k{i}", **kw))
    md, payload, _ = c.build("prod", compression, 777)
    return encode_entry(md, payload)


def entry(data, ledger=1, entry_id=0, redelivery=0, ack_set=()):
    return pb.EntryMessage(position=pb.Position(ledger_id=ledger, entry_id=entry_id), headers_and_payload=data,
                           redelivery_count=redelivery, ack_set=list(ack_set))


def test_single_message_fields():
    s = EntrySplitter(TOPIC)
    data = single(b"abc", seq=5, properties={"a": "b"}, partition_key="pk", ordering_key=b"ok", event_time=99)
    r = s.split(entry(data, 3, 4, redelivery=2), now_ms=0)
    assert (r.ack, r.redeliver, r.skipped) == ([], [], 0)
    (m,) = r.messages
    assert m.data() == b"abc" and m.message_id() == MessageId(3, 4) and m.message_id().batch_index == -1
    assert m.properties() == {"a": "b"} and m.partition_key() == "pk" and m.ordering_key() == b"ok"
    assert (m.event_timestamp(), m.publish_timestamp(), m.redelivery_count(), m.sequence_id()) == (99, 1234, 2, 5)
    assert m.producer_name() == "prod" and m.topic_name() == TOPIC


def test_compressed_single_and_batch():
    s = EntrySplitter(TOPIC)
    for kind in (CompressionType.LZ4, CompressionType.ZLIB, CompressionType.ZSTD):
        assert s.split(entry(single(b"x" * 500, compression=kind)), 0).messages[0].data() == b"x" * 500
        msgs = s.split(entry(batch([b"a" * 100, b"b" * 100], kind)), 0).messages
        assert [m.data() for m in msgs] == [b"a" * 100, b"b" * 100]


def test_batch_split_with_ids_and_partition():
    tracker = AcknowledgmentsGroupingTracker()
    s = EntrySplitter(TOPIC + "-partition-2", partition=2, tracker=tracker)
    r = s.split(entry(batch([b"a", b"b", b"c"]), 5, 6), 0)
    assert [m.data() for m in r.messages] == [b"a", b"b", b"c"]
    assert [m.message_id() for m in r.messages] == [MessageId(5, 6, 2, i, 3) for i in range(3)]
    assert [m.message_id().batch_size for m in r.messages] == [3, 3, 3]
    assert [m.properties()["i"] for m in r.messages] == ["0", "1", "2"]
    assert [m.sequence_id() for m in r.messages] == [10, 11, 12] and r.messages[1].partition_key() == "k1"
    assert tracker.acker_of(r.messages[0].message_id()).outstanding == 3  # registered for BatchMessageAcker


def test_batch_skips_indexes_already_acknowledged():
    tracker = AcknowledgmentsGroupingTracker()
    s = EntrySplitter(TOPIC, tracker=tracker)
    r = s.split(entry(batch([b"a", b"b", b"c", b"d"]), ack_set=[0b1010]), 0)  # set bit = not yet acknowledged
    assert [m.data() for m in r.messages] == [b"b", b"d"] and r.skipped == 2
    acker = tracker.acker_of(r.messages[0].message_id())
    assert acker.outstanding == 2
    tracker.add_individual(r.messages[0].message_id(), 0)
    tracker.add_individual(r.messages[1].message_id(), 0)
    assert [(p.ledger_id, p.entry_id) for p in tracker.flush()[0].positions] == [(1, 0)]


def test_duplicates_of_pending_acks_are_skipped():
    tracker = AcknowledgmentsGroupingTracker()
    s = EntrySplitter(TOPIC, tracker=tracker)
    tracker.add_cumulative(MessageId(1, 5), 0)
    assert s.split(entry(single(), 1, 5), 0).skipped == 1
    assert len(s.split(entry(single(), 1, 6), 0).messages) == 1


def test_start_filter_inside_batch():
    s = EntrySplitter(TOPIC)
    s.start_filter = StartFilter(1, 0, 2)
    r = s.split(entry(batch([b"a", b"b", b"c", b"d"])), 0)
    assert [m.data() for m in r.messages] == [b"c", b"d"] and r.skipped == 2
    assert len(s.split(entry(batch([b"a", b"b"]), 1, 1), 0).messages) == 2  # other entries untouched


def test_topic_message_ids_for_multi_topic_consumers():
    s = EntrySplitter("persistent://public/default/x", topic_in_ids=True)
    mid = s.split(entry(single()), 0).messages[0].message_id()
    assert isinstance(mid, TopicMessageId) and mid.topic == "persistent://public/default/x"


def test_corrupted_entries_are_acked_not_delivered():
    s = EntrySplitter(TOPIC)
    good = bytearray(single(b"payload"))
    good[-1] ^= 0xFF  # checksum mismatch
    r = s.split(entry(bytes(good), 2, 9), 0)
    assert r.messages == [] and r.ack == [MessageId(2, 9)] and r.skipped == 1
    assert s.split(entry(b"garbage", 2, 10), 0).ack == [MessageId(2, 10)]
    md = MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, compression=CompressionType.LZ4.value,
                         uncompressed_size=100)
    r = s.split(entry(encode_entry(md, b"not lz4 at all"), 2, 11), 0)  # undecompressable
    assert r.ack == [MessageId(2, 11)] and r.messages == []
    md = MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=3)
    assert s.split(entry(encode_entry(md, b"\x00\x00"), 2, 12), 0).ack == [MessageId(2, 12)]  # bad batch


def test_markers_are_acked_not_delivered():
    s = EntrySplitter(TOPIC)
    md = MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, marker_type=10)
    r = s.split(entry(encode_entry(md, b"m"), 1, 3), 0)
    assert r.messages == [] and r.ack == [MessageId(1, 3)]


def test_chunked_message_reassembled_and_decompressed():
    payload = bytes(range(256)) * 40
    md = MessageMetadata(producer_name="prod", sequence_id=3, publish_time=50,
                         compression=CompressionType.ZLIB.value, uncompressed_size=len(payload))
    md.properties.add(key="big", value="yes")
    compressed = compress(CompressionType.ZLIB, payload)
    chunks = chunk_message(md, compressed, 100)
    assert len(chunks) > 2
    s = EntrySplitter(TOPIC)
    skipped = 0
    for i, (cmd, data) in enumerate(chunks):
        r = s.split(entry(encode_entry(cmd, data), 4, i), now_ms=10)
        skipped += r.skipped
    assert skipped == len(chunks) - 1  # permits of the chunks that carried no message
    (m,) = r.messages
    assert m.data() == payload and m.properties() == {"big": "yes"}
    assert m.message_id() == MessageId(4, len(chunks) - 1)  # the last chunk's id, as ChunkMessageIdImpl
    assert m._entry_positions() == tuple(MessageId(4, i) for i in range(len(chunks)))


def test_chunk_out_of_order_goes_to_redeliver():
    md = MessageMetadata(producer_name="prod", sequence_id=3, publish_time=0)
    chunks = chunk_message(md, b"z" * 300, 100)
    s = EntrySplitter(TOPIC, expire_time_of_incomplete_chunked_message_ms=0)
    s.split(entry(encode_entry(*chunks[0]), 4, 0), 0)
    r = s.split(entry(encode_entry(*chunks[2]), 4, 2), 0)  # chunk 1 missing
    assert r.messages == [] and set(r.redeliver) == {MessageId(4, 0), MessageId(4, 2)}
    assert s.clear() == []
