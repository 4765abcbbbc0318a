"""Pure producer-side units: service URLs, Backoff, gRPC error mapping,
ProducerConfig, MessageAccumulator (sequence ids, duplicate isolation,
batching, chunking) and PendingQueue (receipts, timeouts, resend)."""
from __future__ import annotations

import random

import grpc
import pytest
from hypothesis import given, settings, strategies as st

from client.batching import PendingMessage, parse_batch
from client.chunking import ChunkedMessageAssembler
from client.compression import CompressionType, decompress
from client.connection import Backoff, DEFAULT_PORT, is_retriable, map_rpc_error, parse_service_url
from client.entry_format import decode_entry
from client.errors import (ConnectError, InvalidConfiguration, MessageTooBig, NotFound, ProducerBusy,
                           ServiceNotReady, Timeout, TopicNotFound, error_from_status)
from client.message_id import MessageId
from client.producer_config import ProducerConfig
from client.producer_state import BatchingType, MessageAccumulator, PendingQueue, ReceiptAction
from client.routing import PartitionsRoutingMode


# ---------------------------------------------------------------- service URLs
@pytest.mark.parametrize("url,host,port", [
    ("minipulsar://localhost:6600", "localhost", 6600),
    ("minipulsar://127.0.0.1:1", "127.0.0.1", 1),
    ("minipulsar://broker-1.example.com", "broker-1.example.com", DEFAULT_PORT),
    ("  minipulsar://h:7000/ ", "h", 7000),
    ("MINIPULSAR://h:7000", "h", 7000),
    ("minipulsar://[::1]:6650", "[::1]", 6650),
])
def test_service_url_ok(url, host, port):
    u = parse_service_url(url)
    assert (u.host, u.port) == (host, port)
    assert u.target == f"{host}:{port}"
    assert str(u) == f"minipulsar://{host}:{port}"


@pytest.mark.parametrize("url,hint", [
    ("pulsar://localhost:6650", "binary protocol"), ("http://h:80", "unsupported scheme"),
    ("localhost:6600", "missing scheme"), ("", "expected"), (None, "expected"),
    ("minipulsar://", "host"), ("minipulsar://h:", "empty port"), ("minipulsar://h:abc", "not a number"),
    ("minipulsar://h:0", "outside"), ("minipulsar://h:70000", "outside"),
    ("minipulsar://h:1/path", "no path"), ("minipulsar://u@h:1", "credentials"), ("minipulsar://[::1", "unclosed"),
    ("minipulsar://h h:1", "bad or missing host"),
    # multi-host URLs: each host checked as a single one, and the list itself
    ("minipulsar://a:1,,b:2", "empty host"), ("minipulsar://a:1,", "empty host"), ("minipulsar://,a:1", "empty host"),
    ("minipulsar://a:1,minipulsar://b:2", "one scheme per URL"), ("minipulsar://a:1,a:1", "listed twice"),
    ("minipulsar://a:1,b:0", "outside"), ("minipulsar://a:1,b:x", "not a number"), ("minipulsar://a:1,b:", "empty port"),
    ("minipulsar://a:1,b b:2", "bad or missing host"), ("minipulsar://a:1,[::1:2", "unclosed"),
    ("minipulsar://a:1,b:2/path", "no path"),
])
def test_service_url_errors_are_clear(url, hint):
    with pytest.raises(InvalidConfiguration) as e:
        parse_service_url(url)
    assert hint in str(e.value)


@pytest.mark.parametrize("url,addresses,normal", [
    ("minipulsar://a:1,b:2", [("a", 1), ("b", 2)], "minipulsar://a:1,b:2"),
    ("minipulsar://a,b", [("a", DEFAULT_PORT), ("b", DEFAULT_PORT)], f"minipulsar://a:{DEFAULT_PORT},b:{DEFAULT_PORT}"),
    (" minipulsar://h1:6600, h2:6601/ ", [("h1", 6600), ("h2", 6601)], "minipulsar://h1:6600,h2:6601"),
    ("minipulsar://[::1]:5,10.0.0.1:6,h", [("[::1]", 5), ("10.0.0.1", 6), ("h", DEFAULT_PORT)],
     f"minipulsar://[::1]:5,10.0.0.1:6,h:{DEFAULT_PORT}"),
])
def test_multi_host_service_url(url, addresses, normal):
    """Pulsar's pulsar://h1:6650,h2:6650: every host, the first one as host/port/target (what
    single-host callers use), str() normalised and round-tripping."""
    u = parse_service_url(url)
    assert list(u.addresses) == addresses and u.is_multi_host
    assert (u.host, u.port) == addresses[0] and u.target == f"{addresses[0][0]}:{addresses[0][1]}"
    assert u.targets == [f"{h}:{p}" for h, p in addresses]
    assert str(u) == normal and parse_service_url(str(u)) == u
    assert [str(h) for h in u.hosts()] == [f"minipulsar://{t}" for t in u.targets]


def test_single_host_service_url_keeps_its_shape():
    u = parse_service_url("minipulsar://h:7")
    assert u.addresses == (("h", 7),) and not u.is_multi_host and u.targets == ["h:7"]
    assert u == type(u)("h", 7) and str(u) == "minipulsar://h:7"


# ---------------------------------------------------------------- Backoff
def test_backoff_doubles_with_jitter_up_to_max():
    b = Backoff(0.1, 30.0, rng=random.Random(1))
    delays = [b.next() for _ in range(12)]
    assert delays[0] == pytest.approx(0.1)
    for i, d in enumerate(delays):
        nominal = min(30.0, 0.1 * 2 ** i)
        assert 0.9 * nominal - 1e-9 <= d <= nominal + 1e-9
    assert delays[-1] >= 27.0
    b.reset()
    assert b.next() == pytest.approx(0.1) and b.attempts == 1


def test_backoff_mandatory_stop_lands_on_the_deadline_once():
    now = [0.0]
    b = Backoff(0.1, 30.0, mandatory_stop=1.0, clock=lambda: now[0], rng=random.Random(0))
    total = 0.0
    hits = []
    for _ in range(8):
        d = b.next()
        total += d
        now[0] = total
        hits.append(total)
    # one delay is cut so that an attempt happens (about) at the 1 s deadline
    assert any(abs(h - 1.0) < 0.1 for h in hits)
    assert b.elapsed() == pytest.approx(total)


def test_backoff_rejects_nonsense():
    with pytest.raises(ValueError):
        Backoff(1.0, 0.5)


# ---------------------------------------------------------------- error mapping
class _FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code,details,cls", [
    (grpc.StatusCode.ALREADY_EXISTS, "ProducerBusy: producer p is already connected", ProducerBusy),
    (grpc.StatusCode.NOT_FOUND, "TopicNotFound: no topic", TopicNotFound),
    (grpc.StatusCode.NOT_FOUND, "NotFound: tenant x", NotFound),
    (grpc.StatusCode.UNAVAILABLE, "ServiceNotReady: loading", ServiceNotReady),
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses", ConnectError),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", Timeout),
    (grpc.StatusCode.CANCELLED, "Cancelled", ConnectError),
])
def test_map_rpc_error(code, details, cls):
    exc = map_rpc_error(_FakeRpcError(code, details), "create producer")
    assert type(exc) is cls
    if ":" in details and details.split(":")[0] == cls.__name__:
        assert exc.message == details.partition(": ")[2]
    else:
        assert "create producer" in exc.message


def test_retriable_classification():
    assert is_retriable(ServiceNotReady()) and is_retriable(ConnectError()) and is_retriable(Timeout())
    assert not is_retriable(TopicNotFound()) and not is_retriable(MessageTooBig())
    assert type(error_from_status("ServiceNotReady", "x")) is ServiceNotReady


def test_retry_is_decided_by_the_exception_attributes_only():
    """One answer to "retry?": ``retriable`` (a handle reconnects) and
    ``retriable_at_creation`` (a first create/subscribe retries), per class."""
    import client.errors as errors
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.PulsarException)]
    for cls in classes:
        assert is_retriable(cls()) is bool(cls.retriable), cls
        assert not cls.retriable_at_creation or cls.retriable, cls  # retried at creation -> retried later too
    assert {c.__name__ for c in classes if c.retriable_at_creation} == {"Timeout", "ConnectError", "ServiceNotReady",
                                                                       "MetadataSessionLost"}
    # Busy: a reconnecting handle retries (the broker may not have seen the old stream close), a first create fails
    assert errors.ProducerBusy.retriable and not errors.ProducerBusy.retriable_at_creation
    assert errors.ConsumerBusy.retriable and not errors.ConsumerBusy.retriable_at_creation
    assert is_retriable(ConnectionResetError()) and not is_retriable(ValueError())


# ---------------------------------------------------------------- ProducerConfig
def test_producer_config_defaults_and_parsing():
    c = ProducerConfig.from_options(compression_type="zstd", batching_type="KeyBased",
                                    message_routing_mode="UseSinglePartition", properties={"a": 1})
    assert c.compression_type is CompressionType.ZSTD and c.batching_type is BatchingType.KeyBased
    assert c.message_routing_mode is PartitionsRoutingMode.UseSinglePartition and c.properties == {"a": "1"}
    d = ProducerConfig.from_options()
    assert d.batching_enabled and d.compression_type is CompressionType.LZ4 and d.send_timeout_millis == 30000


@pytest.mark.parametrize("options", [
    {"compression_type": "SNAPPY"}, {"compression_type": "brotli"}, {"batching_type": "Weird"},
    {"send_timeout_millis": -1}, {"unknown_option": 1}, {"producer_name": ""}, {"initial_sequence_id": -5},
    {"message_routing_mode": PartitionsRoutingMode.CustomPartition},
])
def test_producer_config_rejects(options):
    with pytest.raises(InvalidConfiguration):
        ProducerConfig.from_options(**options)


def test_function_router_switches_to_custom_mode():
    c = ProducerConfig.from_options(message_router=lambda msg, n: 0)
    assert c.message_routing_mode is PartitionsRoutingMode.CustomPartition and c.router_function() is not None


# ---------------------------------------------------------------- MessageAccumulator
def msg(payload=b"x", seq=None, **kw) -> PendingMessage:
    return PendingMessage(payload=payload, sequence_id=seq, **kw)


def acc(**kw) -> MessageAccumulator:
    kw.setdefault("producer_name", "p")
    a = MessageAccumulator(**kw)
    a.init_sequence_ids(-1)
    return a


def entries(ops):
    return [decode_entry(op.entry) for op in ops]


def test_sequence_ids_continue_after_the_brokers_last_or_initial():
    a = MessageAccumulator(producer_name="p")
    a.init_sequence_ids(41)
    assert a.next_sequence_id == 42 and a.last_sequence_id_pushed == 41
    b = MessageAccumulator(producer_name="p")
    b.init_sequence_ids(41, initial_sequence_id=5)
    assert b.next_sequence_id == 6
    m = msg()
    b.add(m)
    assert m.sequence_id == 6


def test_batches_close_on_max_messages_and_carry_first_and_highest_ids():
    a = acc(batching_max_messages=3, compression=CompressionType.LZ4)
    ops = []
    for i in range(7):
        ops += a.add(msg(b"m%d" % i))
    assert [(op.sequence_id, op.highest_sequence_id, op.num_messages) for op in ops] == [(0, 2, 3), (3, 5, 3)]
    ops += a.flush()
    assert ops[-1].sequence_id == 6 and ops[-1].num_messages == 1 and ops[-1].batched
    md, payload = decode_entry(ops[0].entry)
    assert md.compression == CompressionType.LZ4 and md.num_messages_in_batch == 3
    parts = parse_batch(md, decompress(md.compression, payload, md.uncompressed_size))
    assert [p for _, p in parts] == [b"m0", b"m1", b"m2"]
    assert a.last_sequence_id_pushed == 6 and not a.has_batch()


def test_batches_close_on_max_bytes():
    a = acc(batching_max_bytes=10)
    ops = a.add(msg(b"123456")) + a.add(msg(b"123456")) + a.add(msg(b"1234"))
    assert [op.num_messages for op in ops] == [1, 2]  # 6 | 6+4 reaches 10 bytes: full
    assert a.num_batched_messages == 0


def test_possible_duplicates_travel_in_batches_of_their_own():
    a = acc()
    first = a.add(msg(seq=0)) + a.add(msg(seq=1)) + a.add(msg(seq=2)) + a.flush()
    assert [(o.sequence_id, o.highest_sequence_id) for o in first] == [(0, 2)]
    # the application resends 1 and 2 (e.g. after a restart) then new ones
    ops = a.add(msg(seq=1)) + a.add(msg(seq=2)) + a.add(msg(seq=3)) + a.add(msg(seq=4)) + a.flush()
    assert [(o.sequence_id, o.highest_sequence_id) for o in ops] == [(1, 1), (2, 2), (3, 4)]


def test_user_sequence_ids_going_backwards_inside_a_batch_split_it():
    a = acc()
    ops = a.add(msg(seq=10)) + a.add(msg(seq=5)) + a.flush()
    assert [(o.sequence_id, o.highest_sequence_id) for o in ops] == [(10, 10), (5, 5)]


def test_unbatched_and_delayed_messages_are_single_entries_in_order():
    a = acc()
    ops = a.add(msg(b"a")) + a.add(msg(b"late", deliver_at=123)) + a.add(msg(b"b")) + a.flush()
    assert [(o.sequence_id, o.batched) for o in ops] == [(0, True), (1, False), (2, True)]
    md, payload = decode_entry(ops[1].entry)
    assert md.deliver_at_time == 123 and not md.HasField("num_messages_in_batch")
    assert decompress(md.compression, payload, md.uncompressed_size) == b"late"
    b = acc(batching_enabled=False, compression=CompressionType.ZLIB)
    ops = b.add(msg(b"q" * 100, properties={"k": "v"}, partition_key="key", replicate_to=("r1",)))
    md, payload = decode_entry(ops[0].entry)
    assert md.compression == CompressionType.ZLIB and md.uncompressed_size == 100
    assert md.partition_key == "key" and list(md.replicate_to) == ["r1"] and md.properties[0].key == "k"


def test_disable_replication_sets_local_only_and_splits_batches():
    a = acc()
    ops = a.add(msg(b"a")) + a.add(msg(b"b", disable_replication=True)) + a.flush()
    assert [list(md.replicate_to) for md, _ in entries(ops)] == [[], ["__local__"]]


def test_message_too_big_without_chunking_changes_nothing():
    for batching in (True, False):
        a = acc(batching_enabled=batching, max_message_size=10_000, compression=CompressionType.NONE)
        a.add(msg(b"small"))
        with pytest.raises(MessageTooBig):
            a.add(msg(b"z" * 20_000))
        assert a.next_sequence_id == 1
        ops = a.add(msg(b"next")) + a.flush()
        assert ops[-1].highest_sequence_id == 1


def test_compressible_big_message_fits_when_not_batched():
    a = acc(batching_enabled=False, max_message_size=10_000, compression=CompressionType.ZSTD)
    ops = a.add(msg(b"z" * 50_000))
    assert len(ops) == 1 and ops[0].size < 10_000


def test_chunking_splits_under_max_message_size_and_reassembles():
    rng = random.Random(7)
    payload = rng.randbytes(50_000)
    for batching in (True, False):
        a = acc(batching_enabled=batching, chunking_enabled=True, max_message_size=10_000,
                compression=CompressionType.LZ4)
        before = a.add(msg(b"small"))
        ops = before + a.add(msg(payload))
        chunks = [o for o in ops if o.is_chunk]
        assert len(chunks) >= 5 and all(o.size <= 10_000 for o in chunks)
        assert {o.sequence_id for o in chunks} == {1} and chunks[-1].is_last_chunk
        assert not chunks[0].is_last_chunk and all(o.messages is chunks[0].messages for o in chunks)
        assert ops[0].sequence_id == 0  # the open batch went first
        asm = ChunkedMessageAssembler()
        done = None
        for i, o in enumerate(chunks):
            md, data = decode_entry(o.entry)
            done = asm.add(md, data, MessageId(1, i), 0)
        assert done is not None
        assert decompress(md.compression, done.payload, md.uncompressed_size) == payload


def test_key_based_batching_groups_by_key():
    a = acc(batching_type=BatchingType.KeyBased)
    for key in ["a", "b", "a", None, "b"]:
        a.add(msg(key.encode() if key else b"-", partition_key=key))
    ops = a.flush()
    assert sorted(o.num_messages for o in ops) == [1, 2, 2]
    assert all(o.batched for o in ops)


def test_batch_cap_under_max_message_size():
    a = acc(batching_max_bytes=10_000_000, max_message_size=1000)
    ops = []
    for _ in range(20):
        ops += a.add(msg(b"y" * 100))
    ops += a.flush()
    assert all(o.size <= 1000 for o in ops)
    assert [m.sequence_id for o in ops for m in o.messages] == list(range(20))


def test_batch_due_uses_monotonic_clock():
    now = [1000.0]
    a = MessageAccumulator(producer_name="p", mono_clock_ms=lambda: now[0])
    a.init_sequence_ids(-1)
    assert not a.batch_due(10)
    a.add(msg())
    now[0] += 9
    assert not a.batch_due(10)
    now[0] += 1
    assert a.batch_due(10)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=40),
       st.integers(1, 5))
def test_every_message_goes_out_once_in_order(plan, max_messages):
    """Property: whatever mix of delayed / batched messages and batch limits,
    every message is in exactly one op, ops are in sequence-id order and
    possible duplicates never share an op."""
    a = acc(batching_max_messages=max_messages)
    ops = []
    for size, delayed in plan:
        ops += a.add(msg(b"p" * size, deliver_at=1 if delayed else None))
    ops += a.flush()
    seqs = [m.sequence_id for o in ops for m in o.messages]
    assert seqs == list(range(len(plan)))
    assert all(o.num_messages <= max_messages for o in ops)


# ---------------------------------------------------------------- PendingQueue
def queue_with(a, payloads):
    q = PendingQueue()
    for p in payloads:
        q.extend(a.add(msg(p)))
    q.extend(a.flush())
    return q


def test_receipts_complete_in_order_and_ids_carry_batch_index():
    a = acc(batching_max_messages=2)
    q = queue_with(a, [b"1", b"2", b"3"])
    assert len(q) == 2 and [op.sequence_id for op in q.take_unsent(1 << 20)] == [0, 2]
    action, op = q.on_receipt(0, 1)
    assert action is ReceiptAction.COMPLETE
    assert op.message_ids(7, 3, 2) == [MessageId(7, 3, 2, 0, 2), MessageId(7, 3, 2, 1, 2)]
    assert op.message_ids(7, 3, 2)[1].batch_size == 2
    assert op.message_ids(-1, -1, 2) == [MessageId(-1, -1)] * 2
    assert q.on_receipt(0, 1) == (ReceiptAction.IGNORE, None)   # old / timed out
    assert q.on_receipt(5, 5) == (ReceiptAction.RECONNECT, None)  # ahead of the head
    action, op = q.on_receipt(2, 2)
    assert action is ReceiptAction.COMPLETE and op.message_ids(1, 1, -1) == [MessageId(1, 1, -1, 0, 1)]
    assert not q


def test_unbatched_ids_have_no_batch_index():
    a = acc(batching_enabled=False)
    q = queue_with(a, [b"1"])
    _, op = q.on_receipt(0, 0)
    assert op.message_ids(4, 5, -1) == [MessageId(4, 5)]


def test_take_unsent_coalesces_up_to_max_bytes_and_resends_after_reconnect():
    a = acc(batching_enabled=False, compression=CompressionType.NONE)
    q = queue_with(a, [b"a" * 100] * 5)
    first = q.take_unsent(250)
    assert len(first) == 2 and q.num_unsent == 3
    assert len(q.take_unsent(10)) == 1  # always at least one
    q.on_receipt(0, 0)
    assert q.num_sent == 2
    q.mark_all_unsent()
    assert [op.sequence_id for op in q.take_unsent(1 << 20)] == [1, 2, 3, 4]


def test_expire_removes_only_old_ops_and_whole_chunked_messages():
    now = [0.0]
    a = MessageAccumulator(producer_name="p", batching_enabled=False, chunking_enabled=True,
                           max_message_size=4096, compression=CompressionType.NONE, mono_clock_ms=lambda: now[0])
    a.init_sequence_ids(-1)
    q = PendingQueue()
    q.extend(a.add(msg(random.Random(1).randbytes(10_000))))
    n_chunks = len(q)
    assert n_chunks >= 3
    now[0] = 500
    q.extend(a.add(msg(b"later")))
    assert q.expire(600, 1000) == []
    q.on_receipt(0, 0)  # first chunk persisted
    expired = q.expire(1000, 1000)
    assert len(expired) == n_chunks - 1 and {o.sequence_id for o in expired} == {0}
    assert [op.sequence_id for op in q] == [1]
    assert q.expire(10_000, 0) == []  # timeout disabled


def test_pop_sequence_takes_all_chunks_of_the_head_message():
    a = acc(batching_enabled=False, chunking_enabled=True, max_message_size=4096, compression=CompressionType.NONE)
    q = PendingQueue()
    q.extend(a.add(msg(b"c" * 9000)))
    q.extend(a.add(msg(b"d")))
    assert q.pop_sequence(1) == []
    assert {o.sequence_id for o in q.pop_sequence(0)} == {0}
    assert [o.sequence_id for o in q] == [1]


_plain_or_not = st.fixed_dictionaries({
    "size": st.sampled_from([1, 100, 200]),
    "seq": st.none() | st.integers(0, 40),
    "kind": st.sampled_from(["plain", "plain", "plain", "props", "local", "key", "delayed"]),
    "pushed": st.sampled_from([False, False, False, True]),
})


@settings(max_examples=200)
@given(steps=st.lists(_plain_or_not, max_size=40), max_messages=st.integers(1, 6))
def test_fast_path_of_add_builds_the_same_entries_as_the_general_path(steps, max_messages):
    """MessageAccumulator._add_plain is only a shortcut: with it disabled, the same
    sends give byte-identical entries, sequence ids and dedup marks."""
    fast = acc(batching_max_messages=max_messages, batching_max_bytes=250,
               wall_clock_ms=lambda: 7, mono_clock_ms=lambda: 7)
    slow = acc(batching_max_messages=max_messages, batching_max_bytes=250,
               wall_clock_ms=lambda: 7, mono_clock_ms=lambda: 7)
    slow._plain_batching = False
    out = {id(fast): [], id(slow): []}
    for step in steps:
        for a in (fast, slow):
            kw = {"props": {"properties": {"k": "v"}}, "local": {"disable_replication": True},
                  "key": {"partition_key": "pk"}, "delayed": {"deliver_at": 10}}.get(step["kind"], {})
            ops = a.add(msg(b"p" * step["size"], step["seq"], **kw))
            if step["pushed"]:
                ops += a.flush()
            for op in ops:
                a.last_sequence_id_pushed = max(a.last_sequence_id_pushed, op.highest_sequence_id)
            out[id(a)] += [(op.sequence_id, op.highest_sequence_id, op.num_messages, op.entry, op.batched)
                           for op in ops]
    out[id(fast)] += [(op.sequence_id, op.highest_sequence_id, op.num_messages, op.entry, op.batched)
                      for op in fast.flush()]
    out[id(slow)] += [(op.sequence_id, op.highest_sequence_id, op.num_messages, op.entry, op.batched)
                      for op in slow.flush()]
    assert out[id(fast)] == out[id(slow)]
    assert fast.next_sequence_id == slow.next_sequence_id
