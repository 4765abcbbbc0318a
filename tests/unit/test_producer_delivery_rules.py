"""Producer delivery rules, pure units (no I/O):

- KeyBased batches are sent so that broker deduplication keeps every one of
  them (Pulsar #15413), checked against the broker's own dedup state machine;
- what a dropped duplicate resolves with (``is_duplicate``);
- chunks leave room for the metadata a geo-replicator adds (Pulsar's
  ProducerImpl subtracts the metadata size from the max message size);
- after a reconnect, pending sends the broker already stored are not sent again
  (``PendingQueue.drop_stored``), a refused one is.
"""
from __future__ import annotations

import random

import pytest

from broker.service.dedup import DedupStatus, MessageDeduplication
from client.batching import PendingMessage, parse_batch
from client.chunking import (REPLICATION_METADATA_RESERVE, ChunkedMessageAssembler, chunk_metadata_size,
                             max_chunk_payload_size)
from client.compression import CompressionType, decompress
from client.entry_format import HEADER_SIZE, decode_entry, with_metadata
from client.message_id import MessageId
from client.producer_state import (BatchingType, MessageAccumulator, OpSendMsg, PendingQueue,
                                   is_duplicate, key_batches_in_send_order)
from proto.pulsar_api_pb2 import MessageMetadata


def msg(payload=b"x", seq=None, **kw) -> PendingMessage:
    return PendingMessage(payload=payload, sequence_id=seq, **kw)


def acc(**kw) -> MessageAccumulator:
    kw.setdefault("producer_name", "p")
    a = MessageAccumulator(**kw)
    a.init_sequence_ids(-1)
    return a


def broker_accepts_all(ops, dedup: MessageDeduplication | None = None, name: str = "p") -> list[DedupStatus]:
    """Run ops through the broker's dedup check (as broker/service/topic.py does
    per Send) and record each as persisted; returns the statuses."""
    dedup = dedup or MessageDeduplication(enabled=True)
    out = []
    for op in ops:
        send = op.to_proto()
        highest = max(send.sequence_id, send.highest_sequence_id)
        status = dedup.check(name, send.sequence_id, highest)
        out.append(status)
        if status is DedupStatus.NOT_DUP:
            dedup.record_persisted(name, highest)
    return out


# ---------------------------------------------------------------- case 1: KeyBased + dedup
def test_key_based_batches_are_all_kept_by_broker_dedup():
    """2,000 messages round robin over 4 keys: every key batch must pass the
    broker's dedup check.  Before: sent as [lowest, highest] ordered by lowest,
    key B's batch (1..1997) came after key A's (0..1996) and was a duplicate."""
    a = acc(batching_type=BatchingType.KeyBased, batching_max_messages=1000, batching_max_bytes=0)
    ops = []
    for i in range(2000):
        ops += a.add(msg(b"m-%d" % i, partition_key=f"key-{i % 4}"))
    ops += a.flush()
    assert sum(op.num_messages for op in ops) == 2000 and len(ops) == 8
    assert broker_accepts_all(ops) == [DedupStatus.NOT_DUP] * len(ops)
    for prev, op in zip(ops, ops[1:]):
        assert op.sequence_id > prev.highest_sequence_id
    for op in ops:  # each send under its batch's highest id; the entry keeps its own range
        md, payload = decode_entry(op.entry)
        seqs = [m.sequence_id for m in op.messages]
        assert op.sequence_id == op.highest_sequence_id == max(seqs)
        assert (md.sequence_id, md.highest_sequence_id) == (min(seqs), max(seqs))
        assert len({m.partition_key for m in op.messages}) == 1
        data = decompress(md.compression, payload, md.uncompressed_size)
        assert [smm.sequence_id for smm, _ in parse_batch(md, data)] == seqs


def test_key_based_resend_of_a_stored_batch_is_still_a_duplicate():
    a = acc(batching_type=BatchingType.KeyBased)
    for i in range(12):
        a.add(msg(partition_key="abc"[i % 3]))
    ops = a.flush()
    dedup = MessageDeduplication(enabled=True)
    assert broker_accepts_all(ops, dedup) == [DedupStatus.NOT_DUP] * 3
    assert broker_accepts_all(ops, dedup) == [DedupStatus.DUP] * 3  # a resend after a lost receipt


def test_key_based_split_batches_stay_in_send_order():
    """Key batches too large for one entry are split; the halves keep the rule."""
    a = acc(batching_type=BatchingType.KeyBased, batching_max_messages=0, batching_max_bytes=0,
            max_message_size=4096)
    ops = []
    rng = random.Random(7)
    for i in range(400):
        ops += a.add(msg(bytes(rng.randrange(256) for _ in range(40)), partition_key=f"k{rng.randrange(5)}"))
    ops += a.flush()
    assert sum(op.num_messages for op in ops) == 400
    assert all(op.size <= 4096 - REPLICATION_METADATA_RESERVE for op in ops)
    assert broker_accepts_all(ops) == [DedupStatus.NOT_DUP] * len(ops)


def test_key_batches_in_send_order_sorts_by_highest():
    def op(lo, hi):
        return OpSendMsg(lo, hi, hi - lo + 1, b"", [], batched=True)
    ordered = key_batches_in_send_order([op(0, 8), op(1, 9), op(2, 6)])
    assert [(o.sequence_id, o.highest_sequence_id) for o in ordered] == [(6, 6), (8, 8), (9, 9)]


def test_default_batching_still_sends_lowest_and_highest():
    a = acc(batching_max_messages=10)
    ops = []
    for _ in range(25):
        ops += a.add(msg())
    ops += a.flush()
    assert [(o.sequence_id, o.highest_sequence_id) for o in ops] == [(0, 9), (10, 19), (20, 24)]


# ---------------------------------------------------------------- case 2: duplicates
def test_is_duplicate():
    assert is_duplicate(MessageId(-1, -1))
    assert is_duplicate(MessageId(-1, -1, 3))
    assert not is_duplicate(MessageId(0, 0)) and not is_duplicate(MessageId(5, 7, 1, 2, 3))
    assert not is_duplicate(None)
    from client.producer import is_duplicate as exported
    assert exported is is_duplicate


# ---------------------------------------------------------------- case 3: chunks and replication
def replicated(entry: bytes, cluster: str) -> bytes:
    """What the replicator does to an entry before sending it to a remote
    (broker/replication/replicator.py ``_prepare``)."""
    def mark(m):
        m.replicated_from = cluster
        m.replicated_source_ledger_id = (1 << 63) - 1
        m.replicated_source_entry_id = (1 << 63) - 1
    return with_metadata(entry, mark)


@pytest.mark.parametrize("compression", [CompressionType.NONE, CompressionType.LZ4])
def test_chunks_fit_the_max_message_size_after_replication_metadata(compression):
    """Every chunk entry stays under the broker's max message size once the
    replicator has added replicated_from (a long cluster name) and the source
    ledger/entry ids.  Before: chunks were sized with ~15 bytes to spare, a
    replicated chunk was refused by the remote (MessageTooBig)."""
    max_size = 64 * 1024
    a = acc(producer_name="producer-" + "n" * 120, chunking_enabled=True, max_message_size=max_size,
            compression=compression)
    payload = random.Random(3).randbytes(700_000)
    m = msg(payload, properties={"k%d" % i: "v" * 20 for i in range(10)}, partition_key="key-1",
            event_time=1_700_000_000_000)
    ops = a.add(m)
    assert len(ops) > 5 and all(op.is_chunk for op in ops)
    cluster = "cluster-" + "x" * 400
    asm = ChunkedMessageAssembler()
    done = None
    for i, op in enumerate(ops):
        remote = replicated(op.entry, cluster)
        assert len(remote) <= max_size, f"chunk {i}: {len(remote)} bytes after replication > {max_size}"
        assert op.size <= max_size - REPLICATION_METADATA_RESERVE
        md, data = decode_entry(remote)
        done = asm.add(md, data, MessageId(1, i), 0)
    assert done is not None
    assert decompress(md.compression, done.payload, md.uncompressed_size) == payload


def test_chunk_payload_size_accounts_for_the_chunk_metadata():
    md = MessageMetadata(producer_name="p" * 50, sequence_id=3, publish_time=1)
    for k in range(5):
        md.properties.add(key="key%d" % k, value="value" * 10)
    size = max_chunk_payload_size(md, 100_000)
    assert size == 100_000 - REPLICATION_METADATA_RESERVE - HEADER_SIZE - chunk_metadata_size(md)
    assert chunk_metadata_size(md) > md.ByteSize() + 50  # uuid and the chunk fields
    assert max_chunk_payload_size(md, 100_000, reserve=0) == size + REPLICATION_METADATA_RESERVE


def test_message_just_under_the_limit_is_chunked_when_chunking_is_on():
    """With chunking on, an entry in the last REPLICATION_METADATA_RESERVE bytes
    under the limit is chunked (it would not fit once replicated); with
    chunking off it is still sent whole, as before."""
    max_size = 32 * 1024
    body = b"z" * (max_size - 200)
    on = acc(chunking_enabled=True, max_message_size=max_size, compression=CompressionType.NONE)
    ops = on.add(msg(body))
    assert len(ops) == 2 and all(op.size <= max_size - REPLICATION_METADATA_RESERVE for op in ops)
    off = acc(chunking_enabled=False, max_message_size=max_size, compression=CompressionType.NONE,
              batching_enabled=False)
    ops = off.add(msg(body))
    assert len(ops) == 1 and not ops[0].is_chunk and ops[0].size <= max_size


def test_batches_leave_room_for_replication_metadata():
    """Guard: batch entries also fit once replicated (a batch over the limit
    less the reserve is split)."""
    max_size = 16 * 1024
    a = acc(batching_max_bytes=0, batching_max_messages=0, max_message_size=max_size,
            compression=CompressionType.NONE)
    ops = []
    for i in range(300):
        ops += a.add(msg(b"q" * 150, properties={"i": str(i)}))
    ops += a.flush()
    assert len(ops) > 1 and all(len(replicated(op.entry, "c" * 400)) <= max_size for op in ops)
    assert [m.sequence_id for op in ops for m in op.messages] == list(range(300))


# ---------------------------------------------------------------- case 4: reconnect
def queue_of(ops, written: int) -> PendingQueue:
    q = PendingQueue()
    q.extend(ops)
    q.take_unsent(1 << 30) if written == len(ops) else [q.take_unsent(0) for _ in range(written)]
    q.mark_all_unsent()
    return q


def plain(seq, hi=None):
    return OpSendMsg(seq, seq if hi is None else hi, 1, b"x" * 10, [msg(seq=seq)])


def chunks(seq, n):
    shared = [msg(seq=seq)]
    return [OpSendMsg(seq, seq, 1, b"c", shared, chunk_id=i, num_chunks=n) for i in range(n)]


def test_drop_stored_takes_written_messages_up_to_the_last_sequence_id():
    ops = [plain(0), plain(1, 3)] + chunks(4, 3) + [plain(5), plain(6)]
    q = queue_of(ops, written=6)  # plain 5 written, plain 6 not
    dropped = q.drop_stored(4)
    assert dropped == ops[:5] and list(q) == ops[5:]
    assert q.drop_stored(10) == [ops[5]]  # 5 was written; 6 never was
    assert list(q) == [ops[6]]


def test_drop_stored_keeps_a_chunked_message_whose_last_chunk_is_not_stored():
    ops = chunks(7, 4)
    q = queue_of(ops, written=4)
    assert q.drop_stored(6) == [] and len(q) == 4
    assert q.drop_stored(7) == ops and len(q) == 0


def test_drop_stored_keeps_refused_sends():
    """A refused message stays (its latest transmission stored nothing); stored
    messages after it are still dropped (the broker went on after refusing)."""
    ops = [plain(0), plain(1)] + chunks(2, 3) + [plain(3), plain(4)]
    q = queue_of(ops, written=len(ops) - 1)
    assert q.mark_refused(2) == 3  # all chunks of message 2
    assert q.mark_refused(2) == 0  # once per transmission
    assert q.drop_stored(3) == ops[:2] + [ops[5]]
    assert list(q) == ops[2:5] + [ops[6]] and q.num_unsent == 4
    assert [o.refusals for o in ops[2:5]] == [1, 1, 1]
    q.take_unsent(1 << 30)  # written again: no longer refused
    q.mark_all_unsent()
    assert q.drop_stored(4) == ops[2:5] + [ops[6]] and len(q) == 0


def test_lost_as_duplicate_only_after_refusals_only():
    op = plain(3)
    q = queue_of([op], written=1)
    assert not op.lost_as_duplicate  # an application's repeated id: a duplicate
    q.mark_refused(3)
    q.take_unsent(1 << 30)
    assert op.lost_as_duplicate  # refused, then -1:-1: never stored
    q.mark_all_unsent()
    q.take_unsent(1 << 30)  # a transmission not refused (the stream broke): it may be stored
    assert not op.lost_as_duplicate


def test_drop_stored_stops_at_out_of_order_application_ids():
    ops = [plain(10), plain(5), plain(11)]
    q = queue_of(ops, written=3)
    assert q.drop_stored(11) == [ops[0]] and list(q) == ops[1:]


def test_drop_stored_nothing_when_the_broker_has_nothing():
    ops = [plain(0)] + chunks(1, 2)
    q = queue_of(ops, written=3)
    assert q.drop_stored(-1) == [] and len(q) == 3
