"""The official Pulsar client (``pulsar-client`` from PyPI, the C++ client) against
REAL minipulsar processes over Pulsar's binary protocol (broker.protocols.pulsar):
every subscription type with batching on and off, every compression type, dedup by
producer name, negative acks, readers, seek, partitioned topics routed like our SDK,
get_last_message_id, mixed traffic with our SDK byte for byte, a malformed frame
(only that connection closes) and a broker kill -9 + restart under a producer with
deduplication (nothing lost, nothing stored twice).

One bookie + one broker (deduplication on) serve the whole module; the kill test
runs last and restarts the broker on the same ports. The client's default operation
timeout (30 s) is kept: no test relies on it firing."""
from __future__ import annotations

import socket
import struct
import threading
import time
import uuid

import pytest

pulsar = pytest.importorskip("pulsar", reason="pulsar-client (the `test` extra) is not installed")

from client import Client as SdkClient  # noqa: E402
from client import CompressionType as SdkCompression  # noqa: E402
from client import ConsumerType as SdkConsumerType  # noqa: E402
from client import InitialPosition as SdkInitialPosition  # noqa: E402
from client import SyncAdminClient  # noqa: E402
import asyncio  # noqa: E402

from proto.hashing import murmur3_32_hash  # noqa: E402
from tests.procs import ProcessTracker, ensure_namespace, start_bookie, start_broker  # noqa: E402

pytestmark = pytest.mark.timeout(240)

RECEIVE_MS = 10_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """{"bookie", "broker"}: a bookie and a broker with deduplication on; the kill test
    replaces "broker" with the restarted process."""
    base = tmp_path_factory.mktemp("pulsar-interop")
    tracker = ProcessTracker()
    conf = base / "broker.toml"
    conf.write_text("broker_deduplication_enabled = true\nmanaged_ledger_default_ensemble_size = 1\n"
                    "managed_ledger_default_write_quorum = 1\nmanaged_ledger_default_ack_quorum = 1\n")
    try:
        bookie = start_bookie(base / "bookie", tracker=tracker)
        broker = start_broker(base / "broker", [f"127.0.0.1:{bookie.port}"], config_file=conf, tracker=tracker)
        asyncio.run(ensure_namespace(broker.service_url))
        yield {"bookie": bookie, "broker": broker, "tracker": tracker}
    finally:
        tracker.kill_all()


@pytest.fixture
def pc(cluster):
    """A pulsar.Client on the broker's Pulsar-protocol port."""
    client = pulsar.Client(cluster["broker"].pulsar_url, operation_timeout_seconds=30)
    try:
        yield client
    finally:
        client.close()


def topic_name(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"


SUB_TYPES = {"Exclusive": pulsar.ConsumerType.Exclusive, "Shared": pulsar.ConsumerType.Shared,
             "Failover": pulsar.ConsumerType.Failover, "KeyShared": pulsar.ConsumerType.KeyShared}


@pytest.mark.parametrize("batching", [True, False], ids=["batching", "no-batching"])
@pytest.mark.parametrize("sub_type", list(SUB_TYPES))
def test_produce_and_consume_on_every_subscription_type(pc, sub_type, batching):
    topic = topic_name(f"types-{sub_type}")
    consumer = pc.subscribe(topic, "sub", consumer_type=SUB_TYPES[sub_type],
                            initial_position=pulsar.InitialPosition.Earliest)
    producer = pc.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=5)
    sent = {}
    for i in range(30):
        data = f"{sub_type}-{i}".encode()
        producer.send_async(data, None, properties={"i": str(i)}, partition_key=f"k{i % 3}")
        sent[data] = (str(i), f"k{i % 3}")
    producer.flush()
    got = {}
    for _ in range(30):
        msg = consumer.receive(RECEIVE_MS)
        got[msg.data()] = (msg.properties()["i"], msg.partition_key())
        consumer.acknowledge(msg)
    assert got == sent
    with pytest.raises(pulsar.Timeout):
        consumer.receive(300)                      # acknowledged: nothing comes back
    producer.close()
    consumer.close()


@pytest.mark.parametrize("compression", ["LZ4", "ZLib", "ZSTD", "SNAPPY"])
def test_every_compression_type_reaches_both_clients(pc, cluster, compression):
    topic = topic_name(f"compress-{compression}")
    producer = pc.create_producer(topic, compression_type=getattr(pulsar.CompressionType, compression),
                                  batching_enabled=True, batching_max_publish_delay_ms=5)
    payloads = [(b"x" * 200 + str(i).encode()) for i in range(20)]
    consumer = pc.subscribe(topic, "official", initial_position=pulsar.InitialPosition.Earliest)
    with SdkClient(cluster["broker"].service_url) as sdk:
        ours = sdk.subscribe(topic, "sdk", initial_position=SdkInitialPosition.Earliest)
        for p in payloads:
            producer.send_async(p, None)
        producer.flush()
        assert [consumer.receive(RECEIVE_MS).data() for _ in payloads] == payloads
        if compression != "SNAPPY":                # our SDK has no SNAPPY codec (it discards such entries)
            assert [ours.receive(timeout_millis=RECEIVE_MS).data() for _ in payloads] == payloads
        ours.close()


def test_sdk_compressed_batches_reach_the_official_client(pc, cluster):
    topic = topic_name("sdk-compress")
    consumer = pc.subscribe(topic, "official", initial_position=pulsar.InitialPosition.Earliest)
    with SdkClient(cluster["broker"].service_url) as sdk:
        for kind in (SdkCompression.LZ4, SdkCompression.ZLIB, SdkCompression.ZSTD):
            producer = sdk.create_producer(topic, compression_type=kind, batching_enabled=True)
            for i in range(3):
                producer.send_async(f"{kind.name}-{i}".encode() * 20, None)
            producer.flush()
            producer.close()
    got = [consumer.receive(RECEIVE_MS).data() for _ in range(9)]
    assert got == [f"{k}-{i}".encode() * 20 for k in ("LZ4", "ZLIB", "ZSTD") for i in range(3)]


def test_mixed_clients_byte_for_byte_with_properties_and_keys(pc, cluster):
    topic = topic_name("mixed")
    official_in = pc.subscribe(topic, "official", initial_position=pulsar.InitialPosition.Earliest)
    with SdkClient(cluster["broker"].service_url) as sdk:
        ours_in = sdk.subscribe(topic, "sdk", initial_position=SdkInitialPosition.Earliest)
        producer = pc.create_producer(topic, batching_enabled=False)
        producer.send(bytes(range(256)), properties={"from": "official", "é": "ü"}, partition_key="key-a",
                      event_timestamp=1_700_000_000_123)
        ours_out = sdk.create_producer(topic, batching_enabled=False)
        ours_out.send(b"\x00sdk\xff", properties={"from": "sdk"}, partition_key="key-b")
        for receive in (lambda: official_in.receive(RECEIVE_MS), lambda: ours_in.receive(timeout_millis=RECEIVE_MS)):
            first, second = receive(), receive()
            assert (first.data(), first.properties(), first.partition_key(), first.event_timestamp()) == \
                (bytes(range(256)), {"from": "official", "é": "ü"}, "key-a", 1_700_000_000_123)
            assert (second.data(), second.properties(), second.partition_key()) == \
                (b"\x00sdk\xff", {"from": "sdk"}, "key-b")
        ours_in.close()


def test_dedup_by_producer_name_continues_the_sequence(pc, cluster):
    topic = topic_name("dedup")
    producer = pc.create_producer(topic, producer_name="dd-1", batching_enabled=False)
    for seq in range(5):
        producer.send(f"m{seq}".encode(), sequence_id=seq)
    producer.close()
    again = pc.create_producer(topic, producer_name="dd-1", batching_enabled=False)
    assert again.last_sequence_id() == 4
    again.send(b"m3-resent", sequence_id=3)            # a duplicate: not stored again
    again.send(b"m5", sequence_id=5)
    again.close()
    reader = pc.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(RECEIVE_MS).data())
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
    reader.close()


def test_negative_ack_redelivers_with_a_redelivery_count(pc):
    topic = topic_name("nack")
    consumer = pc.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                            negative_ack_redelivery_delay_ms=100)
    producer = pc.create_producer(topic, batching_enabled=False)
    producer.send(b"again")
    first = consumer.receive(RECEIVE_MS)
    assert first.redelivery_count() == 0
    consumer.negative_acknowledge(first)
    second = consumer.receive(RECEIVE_MS)
    assert (second.data(), second.redelivery_count()) == (b"again", 1)
    consumer.acknowledge(second)


def test_readers_from_earliest_latest_and_a_message_id(pc):
    topic = topic_name("reader")
    producer = pc.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(5)]
    earliest = pc.create_reader(topic, pulsar.MessageId.earliest)
    assert [earliest.read_next(RECEIVE_MS).data() for _ in range(5)] == [f"m{i}".encode() for i in range(5)]
    latest = pc.create_reader(topic, pulsar.MessageId.latest)
    after = pc.create_reader(topic, ids[2])
    inclusive = pc.create_reader(topic, ids[2], start_message_id_inclusive=True)
    producer.send(b"m5")
    assert latest.read_next(RECEIVE_MS).data() == b"m5"
    assert [after.read_next(RECEIVE_MS).data() for _ in range(3)] == [b"m3", b"m4", b"m5"]
    assert inclusive.read_next(RECEIVE_MS).data() == b"m2"
    for r in (earliest, latest, after, inclusive):
        r.close()


def test_seek_by_message_id_and_by_time(pc):
    topic = topic_name("seek")
    consumer = pc.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = pc.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(3)]
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    ids += [producer.send(f"m{i}".encode()) for i in range(3, 6)]
    for _ in range(6):
        consumer.acknowledge(consumer.receive(RECEIVE_MS))
    consumer.seek(ids[1])
    # the broker resets the cursor to m1 (inclusive, as Pulsar's resetCursor); the C++ client
    # then skips its seek id itself unless the consumer is start-message-id-inclusive
    assert consumer.receive(RECEIVE_MS).data() == b"m2"
    consumer.seek(middle_ms)
    assert consumer.receive(RECEIVE_MS).data() == b"m3"


def test_partitioned_topic_routes_a_key_like_our_sdk(pc, cluster):
    topic = topic_name("parts")
    with SyncAdminClient(cluster["broker"].service_url) as admin:
        admin.create_partitioned_topic(topic, 4)
    # Pulsar's Murmur3_32Hash routing (our SDK's default, the Java client's hashingScheme option): the
    # Python client cannot select it (its C++ default is BoostHash), so it takes it as a message_router
    official = pc.create_producer(topic, batching_enabled=False,
                                  message_router=lambda msg, n: murmur3_32_hash(msg.partition_key()) % n)
    keys = [f"user-{i}" for i in range(12)]
    with SdkClient(cluster["broker"].service_url) as sdk:
        ours = sdk.create_producer(topic, batching_enabled=False)
        for key in keys:
            theirs_pid = official.send(b"o", partition_key=key).partition()
            ours_pid = ours.send(b"s", partition_key=key).partition
            assert theirs_pid == ours_pid, key
        assert len({official.send(b"o", partition_key=k).partition() for k in keys}) > 1
    consumer = pc.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
    assert len([consumer.receive(RECEIVE_MS) for _ in range(36)]) == 36


def test_get_last_message_id_names_the_last_batch_message(pc):
    topic = topic_name("last")
    consumer = pc.subscribe(topic, "sub")
    producer = pc.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
    for i in range(4):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    last = consumer.get_last_message_id()
    got = [consumer.receive(RECEIVE_MS).message_id() for _ in range(4)]
    assert (last.ledger_id(), last.entry_id(), last.batch_index()) == \
        (got[-1].ledger_id(), got[-1].entry_id(), got[-1].batch_index())
    assert got[-1].batch_index() == 3


def test_malformed_frame_closes_only_that_connection(pc, cluster):
    topic = topic_name("hostile")
    producer = pc.create_producer(topic, batching_enabled=False)
    producer.send(b"before")
    port = cluster["broker"].pulsar_port
    for garbage in (struct.pack(">I", 2**31) + b"\0" * 16, struct.pack(">II", 6, 2) + b"\xff\xff",
                    b"GET / HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(garbage)
            s.settimeout(10)
            assert s.recv(1024) == b""            # the broker closed this connection
    producer.send(b"after")                         # the other connection is untouched
    consumer = pc.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    assert [consumer.receive(RECEIVE_MS).data() for _ in range(2)] == [b"before", b"after"]


def test_broker_kill_and_restart_loses_nothing_and_stores_nothing_twice(cluster):
    """Last: kill -9 the broker under a named producer sending without pause, restart it on
    the same ports; the client reconnects and resends, dedup drops what was stored."""
    broker = cluster["broker"]
    topic = topic_name("kill")
    client = pulsar.Client(broker.pulsar_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, producer_name="survivor", batching_enabled=True,
                                          batching_max_publish_delay_ms=2, send_timeout_millis=0)
        results: dict[int, object] = {}
        lock = threading.Lock()

        def done(i):
            def callback(res, msg_id):
                with lock:
                    results[i] = res
            return callback

        total = 600
        for i in range(total):
            producer.send_async(f"m{i}".encode(), done(i))
            if i == 200:
                broker.kill()
                broker = broker.restart()
                cluster["broker"] = broker
            if i % 50 == 0:
                time.sleep(0.01)
        producer.flush()
        assert all(r == pulsar.Result.Ok for r in results.values()) and len(results) == total
        producer.close()
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(RECEIVE_MS).data())
        assert got == [f"m{i}".encode() for i in range(total)]
    finally:
        client.close()


def test_chunked_message_is_stored_and_reassembled(pc, cluster):
    topic = topic_name("chunks")
    consumer = pc.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = pc.create_producer(topic, batching_enabled=False, chunking_enabled=True)
    big = bytes(range(256)) * 30_000                   # 7.68 MB: over max_message_size (5 MiB)
    producer.send(big)
    producer.send(b"small")
    first = consumer.receive(RECEIVE_MS)
    assert first.data() == big
    assert consumer.receive(RECEIVE_MS).data() == b"small"
    with SdkClient(cluster["broker"].service_url) as sdk:          # our SDK reassembles the same chunks
        ours = sdk.subscribe(topic, "sdk", initial_position=SdkInitialPosition.Earliest)
        assert ours.receive(timeout_millis=RECEIVE_MS).data() == big
        ours.close()


def test_dead_letter_topic_after_max_redeliveries(pc):
    """(The client's ack timeout, at least 10 s in the C++ client, redelivers through the same
    REDELIVER_UNACKNOWLEDGED_MESSAGES command as the negative acks here.)"""
    topic = topic_name("dlq")
    dlq = topic + "-DLQ"
    dead = pc.subscribe(dlq, "dead", initial_position=pulsar.InitialPosition.Earliest)
    consumer = pc.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                            negative_ack_redelivery_delay_ms=50,
                            dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2,
                                                                                dead_letter_topic=dlq))
    producer = pc.create_producer(topic, batching_enabled=False)
    producer.send(b"poison", properties={"p": "1"})
    counts = []
    for _ in range(3):
        msg = consumer.receive(RECEIVE_MS)
        counts.append(msg.redelivery_count())
        consumer.negative_acknowledge(msg)
    assert counts == [0, 1, 2]
    letter = dead.receive(RECEIVE_MS)
    assert (letter.data(), letter.properties()["p"]) == (b"poison", "1")


def test_multi_topic_and_regex_subscriptions(pc):
    base = f"persistent://public/default/multi-{uuid.uuid4().hex[:6]}"
    topics = [f"{base}-a", f"{base}-b"]
    for t in topics:
        pc.create_producer(t, batching_enabled=False).send(t.encode())
    listed = pc.subscribe(topics, "list", initial_position=pulsar.InitialPosition.Earliest)
    assert sorted(listed.receive(RECEIVE_MS).data() for _ in topics) == sorted(t.encode() for t in topics)
    import re
    pattern = pc.subscribe(re.compile(re.escape(base) + "-.*"), "regex",
                           initial_position=pulsar.InitialPosition.Earliest)
    assert sorted(pattern.receive(RECEIVE_MS).data() for _ in topics) == sorted(t.encode() for t in topics)


def test_json_and_avro_schemas_round_trip(pc):
    from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String

    class Flight(Record):
        carrier = String()
        delay = Integer()

    for kind, schema in (("json", JsonSchema(Flight)), ("avro", AvroSchema(Flight))):
        topic = topic_name(f"schema-{kind}")
        consumer = pc.subscribe(topic, "s", schema=schema, initial_position=pulsar.InitialPosition.Earliest)
        producer = pc.create_producer(topic, schema=schema)
        producer.send(Flight(carrier="UA", delay=7))
        value = consumer.receive(RECEIVE_MS).value()
        assert (value.carrier, value.delay) == ("UA", 7)
        producer.close()
        consumer.close()


def test_schema_registry_refuses_an_incompatible_schema(pc):
    from pulsar.schema import Integer, JsonSchema, Record, String

    def v1():
        class Flight(Record):
            carrier = String()
        return Flight

    def v2():
        class Flight(Record):           # adds an optional (nullable) field: FULL compatible
            carrier = String()
            gate = String()
        return Flight

    def bad():
        class Flight(Record):           # drops carrier, adds a required field
            delay = Integer(required=True)
        return Flight

    topic = topic_name("schema-compat")
    pc.create_producer(topic, schema=JsonSchema(v1())).close()
    pc.create_producer(topic, schema=JsonSchema(v2())).close()
    with pytest.raises(pulsar.PulsarException) as info:
        pc.create_producer(topic, schema=JsonSchema(bad()))
    assert "IncompatibleSchema" in type(info.value).__name__, info.value


def test_readme_snippet_runs_against_a_real_broker(cluster):
    """README's "Using the official Pulsar clients" snippet, its URL pointed at this broker."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split("## Using the official Pulsar clients", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "pulsar://127.0.0.1:6650" in code
    code = code.replace("pulsar://127.0.0.1:6650", cluster["broker"].pulsar_url)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "b'hello from pulsar-client' {'k': 'v'}" in proc.stdout


def test_batch_index_acks_redeliver_only_the_unacknowledged_messages(pc):
    """ACK ack_set (set bit = not acknowledged) applied to the cursor, and MESSAGE ack_set
    on redelivery: a new consumer gets only the batch's unacknowledged messages."""
    topic = topic_name("batch-index")
    first = pc.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, batch_index_ack_enabled=True)
    producer = pc.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
    for i in range(10):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    got = [first.receive(RECEIVE_MS) for _ in range(10)]
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) == 1   # one batch
    for m in got[::2]:
        first.acknowledge(m)
    first.close()                                       # flushes the grouped acks
    second = pc.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, batch_index_ack_enabled=True)
    again = sorted(second.receive(RECEIVE_MS).data() for _ in range(5))
    assert again == [f"m{i}".encode() for i in range(1, 10, 2)]
    with pytest.raises(pulsar.Timeout):
        second.receive(500)


def test_an_unserved_command_is_refused_by_request_id_and_the_connection_stays(cluster):
    from broker.protocols.pulsar.frames import FrameDecoder, encode_command
    from proto.pulsar_wire_pb2 import BaseCommand, ServerError

    def read_one(s, decoder):
        while True:
            frames = decoder.feed(s.recv(65536))
            if frames:
                return frames[0][0]

    with socket.create_connection(("127.0.0.1", cluster["broker"].pulsar_port), timeout=10) as s:
        decoder = FrameDecoder(1 << 20)
        s.sendall(encode_command(BaseCommand(type=BaseCommand.CONNECT,
                                             connect={"client_version": "raw", "protocol_version": 20})))
        connected = read_one(s, decoder)
        assert connected.type == BaseCommand.CONNECTED and connected.connected.protocol_version == 20
        s.sendall(encode_command(BaseCommand(type=BaseCommand.CONSUMER_STATS,
                                             consumerStats={"request_id": 7, "consumer_id": 1})))
        refused = read_one(s, decoder)
        assert (refused.type, refused.error.request_id, refused.error.error) == \
            (BaseCommand.ERROR, 7, ServerError.NotAllowedError)
        s.sendall(encode_command(BaseCommand(type=BaseCommand.PING, ping={})))
        assert read_one(s, decoder).type == BaseCommand.PONG


def test_cumulative_ack_unsubscribe_and_failover(pc, cluster):
    topic = topic_name("cumulative")
    producer = pc.create_producer(topic, batching_enabled=False)
    consumer = pc.subscribe(topic, "cum", consumer_type=pulsar.ConsumerType.Exclusive,
                            initial_position=pulsar.InitialPosition.Earliest)
    for i in range(10):
        producer.send(f"m{i}".encode())
    got = [consumer.receive(RECEIVE_MS) for _ in range(10)]
    consumer.acknowledge_cumulative(got[5])
    consumer.close()
    consumer = pc.subscribe(topic, "cum", consumer_type=pulsar.ConsumerType.Exclusive)
    assert [consumer.receive(RECEIVE_MS).data() for _ in range(4)] == [f"m{i}".encode() for i in range(6, 10)]
    consumer.unsubscribe()
    with SyncAdminClient(cluster["broker"].service_url) as admin:
        assert "cum" not in admin.get_stats(topic)["subscriptions"]
    # Failover: one active consumer gets everything; when it goes, the other takes over
    first = pc.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a",
                         initial_position=pulsar.InitialPosition.Earliest)
    second = pc.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b",
                          initial_position=pulsar.InitialPosition.Earliest)
    active, standby = (first, second) if first.receive(RECEIVE_MS).data() == b"m0" else (second, first)
    with pytest.raises(pulsar.Timeout):
        standby.receive(300)
    active.close()
    assert standby.receive(RECEIVE_MS).data() == b"m0"           # not acknowledged: the standby gets it


def test_unsupported_options_are_refused_clearly(pc):
    topic = topic_name("refused")
    with pytest.raises(pulsar.PulsarException) as info:
        pc.subscribe(topic, "compacted", is_read_compacted=True)
    assert "NotAllowed" in type(info.value).__name__, info.value
    with pytest.raises(pulsar.PulsarException) as info:
        pc.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    assert "NotAllowed" in type(info.value).__name__, info.value
    pc.create_producer(topic).send(b"the defaults work")


class MutingProxy:
    """A TCP proxy (threads) in front of the broker's Pulsar port whose broker -> client
    direction can be muted: what the broker sends meanwhile (receipts) is dropped."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.mute = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            self.sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_broker: bool) -> None:
        try:
            src.settimeout(None)
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not (from_broker and self.mute.is_set()):
                    dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.server.close()
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass


def test_persisted_but_unreceipted_sends_are_resent_after_kill_and_stored_once(cluster):
    """The receipts of 50 persisted sends never reach the client (muted), the broker is
    killed -9 and restarted: the client reconnects, resends all 50 with the same sequence
    ids, and dedup (same producer name) stores none of them twice. Without dedup this
    stores 100 (deterministic: every resend is of a stored message)."""
    broker = cluster["broker"]
    proxy = MutingProxy(broker.pulsar_port)
    topic = topic_name("unreceipted")
    client = pulsar.Client(f"pulsar://127.0.0.1:{proxy.port}", operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, producer_name="resender", batching_enabled=False,
                                          send_timeout_millis=0)
        producer.send(b"first")                          # connected through the proxy
        proxy.mute.set()
        results: list = []
        for i in range(50):
            producer.send_async(f"m{i}".encode(), lambda res, _mid: results.append(res))
        with SyncAdminClient(broker.service_url) as admin:   # all 50 are stored, none receipted
            deadline = time.monotonic() + 20
            while admin.get_stats(topic)["msgInCounter"] < 51 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert admin.get_stats(topic)["msgInCounter"] == 51
        assert results == []
        broker.kill()
        broker = broker.restart()
        cluster["broker"] = broker
        proxy.target_port = broker.pulsar_port            # same port: restart(same_port=True)
        proxy.mute.clear()
        producer.flush()
        assert results == [pulsar.Result.Ok] * 50
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(RECEIVE_MS).data())
        assert got == [b"first"] + [f"m{i}".encode() for i in range(50)]
    finally:
        client.close()
        proxy.close()
