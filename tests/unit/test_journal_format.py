"""The bookie journal's on-disk format (bookie.journal_format) and its file writer and
reader (bookie.journal_file) without a bookie: records round-trip, torn tails end a scan
without an exception, the mark is atomic and checksummed, files roll and are deleted only
behind the mark."""
from __future__ import annotations

import os

import pytest

from bookie import journal_file
from bookie import journal_format as jf


def _records() -> list[bytes]:
    return [jf.encode_ledger((7, b"key", 0, -1, -1)),
            jf.encode_add(7, 0, b"payload-0", 0x12345678),
            jf.encode_add(7, 1, b"", None),
            jf.encode_ledger((7, b"key", 1, 0, 1)),
            jf.encode_delete(7)]


def _scan(buf: bytes, start: int = 0):
    result: list = []
    records = [r for _, r in jf.scan_records(buf, start, result)]
    return records, result[0]


def test_records_round_trip_in_order():
    buf = b"".join(_records())
    records, end = _scan(buf)
    assert records == [("ledger", (7, b"key", 0, -1, -1)), ("add", 7, 0, b"payload-0", 0x12345678),
                       ("add", 7, 1, b"", None), ("ledger", (7, b"key", 1, 0, 1)), ("delete", 7)]
    assert end == jf.ScanResult(len(buf), None)


def test_the_group_encoder_writes_the_same_bytes_as_one_record_at_a_time():
    rows = [(3, 0, b"abc", None), (3, 1, memoryview(b"defg"), 7), (4, 9, b"", 0xFFFFFFFF)]
    parts: list = []
    jf.encode_adds_into(parts, rows)
    assert b"".join(parts) == b"".join(jf.encode_add(*r) for r in rows)


def test_preallocated_zeros_end_the_scan_quietly():
    buf = b"".join(_records())
    records, end = _scan(buf + bytes(4096))
    assert len(records) == 5 and end == jf.ScanResult(len(buf), None)


@pytest.mark.parametrize("cut", [1, 5, 8, 9, 12])
def test_a_cut_last_record_is_torn_and_the_records_before_it_stay(cut):
    """(A cut that keeps only the zero high bytes of the length reads as the end of the
    records: the same outcome, the cut record is not replayed.)"""
    recs = _records()
    good = b"".join(recs[:4])
    buf = good + recs[4][:len(recs[4]) - cut]
    records, end = _scan(buf + bytes(100))   # the rest of the preallocated chunk
    assert len(records) == 4
    assert end.end == len(good) and end.torn is not None


def test_a_garbled_record_is_torn_by_its_checksum():
    recs = _records()
    bad = bytearray(recs[1])
    bad[-1] ^= 0xFF
    buf = recs[0] + bytes(bad) + recs[2]
    records, end = _scan(buf)
    assert records == [("ledger", (7, b"key", 0, -1, -1))]
    assert end.end == len(recs[0]) and "checksum" in end.torn


def test_an_absurd_length_is_torn_not_an_allocation():
    buf = (2**31).to_bytes(4, "big") + bytes(4) + b"x" * 10
    records, end = _scan(buf)
    assert records == [] and end.end == 0 and "runs past" in end.torn


def test_an_unknown_record_type_with_a_good_checksum_is_torn():
    buf = jf.encode_record(b"\x09abc")
    records, end = _scan(buf)
    assert records == [] and "unknown journal record type 9" in end.torn


def test_header_round_trip_and_refusals():
    head = jf.encode_header(42, "instance-abc")
    parsed = jf.parse_header(head + b"rest")
    assert parsed == jf.JournalHeader(42, "instance-abc", len(head))
    with pytest.raises(jf.JournalFormatError, match="magic"):
        jf.parse_header(b"XXXX" + head[4:])
    with pytest.raises(jf.JournalFormatError, match="truncated"):
        jf.parse_header(head[:5])


def test_mark_round_trip_and_checksum():
    raw = jf.encode_mark(3, 4096)
    assert jf.decode_mark(raw) == (3, 4096)
    with pytest.raises(jf.JournalFormatError, match="checksum"):
        jf.decode_mark(raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(jf.JournalFormatError, match="bytes"):
        jf.decode_mark(raw[:10])


def test_file_names_sort_by_id():
    assert jf.file_id_of(jf.file_name(255)) == 255
    assert jf.file_id_of("lastMark") is None and jf.file_id_of("zzzzzzzzzzzzzzzz.txn") is None
    assert sorted([jf.file_name(16), jf.file_name(2)]) == [jf.file_name(2), jf.file_name(16)]


def test_writer_rolls_preallocates_and_replays_from_the_mark(tmp_path):
    jdir, ddir = str(tmp_path / "journal"), str(tmp_path / "data")
    os.makedirs(ddir)
    w = journal_file.JournalWriter(jdir, "iid", 1, max_file_bytes=4096, prealloc_bytes=64 * 1024, sync=True)
    w.open()
    for i in range(100):
        w.append(jf.encode_add(1, i, b"x" * 100, None))
    assert w.rolls >= 2 and w.syncs == 100
    assert os.path.getsize(os.path.join(jdir, jf.file_name(1))) == 64 * 1024   # preallocated
    got = [r[2][2] for r in journal_file.replay_records(jdir, (0, 0), "iid")]
    assert got == list(range(100))
    mark = w.roll()
    journal_file.write_mark(ddir, *mark)
    assert journal_file.read_mark(ddir) == mark
    w.append(jf.encode_add(1, 100, b"y", None))
    assert w.delete_before(mark[0]) >= 2
    assert journal_file.list_journal_files(jdir) == [mark[0]]
    assert [r[2][2] for r in journal_file.replay_records(jdir, journal_file.read_mark(ddir), "iid")] == [100]
    # a journal of another bookie instance is never replayed
    assert list(journal_file.replay_records(jdir, (0, 0), "other-instance")) == []
    w.close()


def test_a_corrupt_mark_replays_everything(tmp_path):
    (tmp_path / journal_file.MARK_FILE_NAME).write_bytes(b"garbage")
    assert journal_file.read_mark(str(tmp_path)) == (0, 0)
