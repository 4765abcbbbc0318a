"""The ``minipulsar`` Spark source at the edges of a range, against a real
standalone cluster and local[2] Spark (issue 22, cases 1, 4 and 6):

* a range boundary between the chunks of a chunked message, with another
  producer's message between them, loses nothing and repeats nothing (batch
  reads split there, a stream with one entry per micro-batch);
* a range whose tail holds only leftover chunks ends at once (no wait for
  ``readTimeoutMs``), and a Reader's subscription shows in topic stats;
* a batch read whose start is after its end fails like Kafka's.

Chunks are written on the raw Produce stream to control the entry order.
"""
from __future__ import annotations

import json
import time
import uuid

import grpc
import pytest

from client import Client, MessageId, SyncAdminClient
from client.entry_format import encode_entry
from client.sync import LoopThread
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.pulsar_api_pb2 import MessageMetadata
from tests.spark.fixtures import requires_spark, spark_session, unique_topic

pytestmark = [requires_spark, pytest.mark.timeout(300)]

# what the old code waited for before failing a range that receives nothing
READ_TIMEOUT_MS = "20000"


@pytest.fixture(scope="module", autouse=True)
def spark():
    # first, before this module opens any client: starting the JVM forks this process
    return spark_session()


@pytest.fixture(scope="module")
def url(standalone):
    return standalone.service_url


@pytest.fixture(scope="module")
def client(url):
    c = Client(url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def admin(url):
    a = SyncAdminClient(url)
    yield a
    a.close()


class RawProducer:
    """One producer on the raw Produce stream: ``send(payload)`` stores one
    entry (a whole message, or one chunk with ``chunk=(uuid, id, count, total)``)
    and returns its ``(ledger, entry)``."""

    def __init__(self, url: str, topic: str, name: str):
        self.lt = LoopThread(f"raw-{name}")
        self.topic, self.name, self.seq = topic, name, 0
        self.lt.run(self._open(url.split("://", 1)[1]))

    async def _open(self, address):
        self.channel = grpc.aio.insecure_channel(address)
        self.call = broker_pb2_grpc.PulsarBrokerStub(self.channel).Produce()
        await self.call.write(pb.ProducerRequest(create=pb.CreateProducer(topic=self.topic, producer_name=self.name)))
        first = await self.call.read()
        assert first.HasField("success"), first

    def send(self, payload: bytes, chunk=None) -> tuple[int, int]:
        md = MessageMetadata(producer_name=self.name, sequence_id=self.seq, publish_time=int(time.time() * 1000))
        if chunk is not None:
            md.uuid, md.chunk_id, md.num_chunks_from_msg, md.total_chunk_msg_size = chunk
        data = encode_entry(md, payload)
        self.seq += 1
        return self.lt.run(self._send(self.seq - 1, data))

    async def _send(self, seq, data):
        await self.call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=[
            pb.Send(sequence_id=seq, highest_sequence_id=seq, num_messages=1, headers_and_payload=data)])))
        while True:
            resp = await self.call.read()
            if resp.HasField("receipts"):
                r = resp.receipts.receipts[0]
                return r.message_id.ledger_id, r.message_id.entry_id
            assert not resp.HasField("error"), resp

    def close(self):
        async def close():
            self.call.cancel()
            await self.channel.close()
        self.lt.run(close())
        self.lt.stop()


def interleaved_chunks(url, topic) -> dict:
    """Entries: m0 (producer b), chunk 0 of message X (producer a), m1 (b),
    chunks 1 and 2 of X (a), m2 (b).  Returns the positions by name."""
    a, b = RawProducer(url, topic, "a"), RawProducer(url, topic, "b")
    parts = [b"X-part-0|", b"X-part-1|", b"X-part-2"]
    total, uid = sum(map(len, parts)), f"a-{uuid.uuid4().hex[:6]}"
    try:
        pos = {"m0": b.send(b"m0"), "c0": a.send(parts[0], (uid, 0, 3, total)), "m1": b.send(b"m1"),
               "c1": a.send(parts[1], (uid, 1, 3, total)), "c2": a.send(parts[2], (uid, 2, 3, total)),
               "m2": b.send(b"m2")}
    finally:
        a.close()
        b.close()
    return pos


def _offsets(topic, position) -> str:
    return json.dumps({topic: {"-1": f"{position[0]}:{position[1]}"}})


def _batch(spark, url, topic, **options):
    reader = (spark.read.format("minipulsar").option("service_url", url).option("topics", topic)
              .option("readTimeoutMs", READ_TIMEOUT_MS))
    for key, value in options.items():
        reader = reader.option(key, value)
    return sorted(r.value for r in reader.load().select("value").collect())


WHOLE = sorted([b"m0", b"m1", b"m2", b"X-part-0|X-part-1|X-part-2"])


def test_batch_reads_split_between_the_chunks_of_a_message_lose_nothing(spark, url):
    topic = unique_topic("spark-chunk-split")
    pos = interleaved_chunks(url, topic)
    assert pos["c0"] < pos["m1"] < pos["c1"]           # another producer's message between the chunks

    for boundary in ("c0", "c1"):
        first = _batch(spark, url, topic, endingOffsets=_offsets(topic, pos[boundary]))
        rest = _batch(spark, url, topic, startingOffsets=_offsets(topic, pos[boundary]))
        assert sorted(first + rest) == WHOLE, (boundary, first, rest)
    # the chunked message belongs to the range of its first chunk
    assert b"X-part-0|X-part-1|X-part-2" in _batch(spark, url, topic, endingOffsets=_offsets(topic, pos["c0"]))


def test_stream_with_one_entry_per_batch_reads_a_chunked_message_once(spark, url, tmp_path):
    topic = unique_topic("spark-chunk-stream")
    interleaved_chunks(url, topic)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (spark.readStream.format("minipulsar").option("service_url", url).option("topics", topic)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "1")
             .option("readTimeoutMs", READ_TIMEOUT_MS).load()
             .selectExpr("value", "message_id").writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert query.awaitTermination(240), "the AvailableNow query did not finish"
    assert query.exception() is None
    assert len(query.recentProgress) >= 6                 # one entry per micro-batch
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.value for r in rows) == WHOLE
    assert len({r.message_id for r in rows}) == 4


def test_a_range_of_leftover_chunks_ends_without_waiting_for_the_read_timeout(spark, url):
    topic = unique_topic("spark-chunk-tail")
    a = RawProducer(url, topic, "a")
    try:
        c0 = a.send(b"p0", ("u-tail", 0, 3, 6))
        a.send(b"p1", ("u-tail", 1, 3, 6))
        a.send(b"p2", ("u-tail", 2, 3, 6))
    finally:
        a.close()
    # (c0, latest]: only chunks 1 and 2, whose message belongs to the range of chunk 0
    assert _batch(spark, url, topic, startingOffsets=_offsets(topic, c0)) == []
    assert _batch(spark, url, topic) == [b"p0p1p2"]


def test_reader_subscriptions_are_listed_in_topic_stats(client, admin):
    topic = unique_topic("spark-reader-stats")
    producer = client.create_producer(topic)
    producer.send(b"x")
    producer.close()
    reader = client.create_reader(topic, MessageId.earliest)
    try:
        assert reader.read_next(10_000).data() == b"x"
        subs = admin.get_stats(topic)["subscriptions"]
        name = reader.subscription_name()
        assert name in subs, subs
        assert subs[name]["isDurable"] is False and len(subs[name]["consumers"]) == 1
    finally:
        reader.close()
    deadline = time.monotonic() + 30
    while name in admin.get_stats(topic)["subscriptions"]:
        assert time.monotonic() < deadline, "the closed reader's subscription is still listed"
        time.sleep(0.1)


def test_batch_start_after_end_fails_naming_the_option(spark, url, client):
    topic = unique_topic("spark-start-after-end")
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(5)]
    producer.close()
    with pytest.raises(Exception) as excinfo:
        _batch(spark, url, topic, startingOffsets=_offsets(topic, (ids[3].ledger_id, ids[3].entry_id)),
               endingOffsets=_offsets(topic, (ids[1].ledger_id, ids[1].entry_id)))
    text = str(excinfo.value)
    assert "option 'startingOffsets'" in text and "after its endingOffsets" in text, text[:600]
    # start == end is an empty range, not an error
    same = _offsets(topic, (ids[1].ledger_id, ids[1].entry_id))
    assert _batch(spark, url, topic, startingOffsets=same, endingOffsets=same) == []
