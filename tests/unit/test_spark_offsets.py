"""Offsets of the Spark source (client.spark.offsets) and its options
(client.spark.options): pure logic, no Spark, no broker."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.spark.offsets import (EARLIEST, LedgerInfo, OffsetError, Position, TopicPartition, advance,
                                  count_entries, from_spark, parse_offsets_option, parse_position,
                                  partition_topic_name, possible_data_loss, rate_limit, resolve_offsets,
                                  start_beyond_end, to_spark, update_seen)
from client.spark.options import SourceError, SourceOptions

T = "persistent://public/default/t"
TP0, TP1 = TopicPartition(T, 0), TopicPartition(T, 1)


# -- positions and JSON ---------------------------------------------------------------------------
def test_parse_position_forms():
    assert parse_position("12:345", "o") == Position(12, 345)
    assert parse_position(" 3:-1 ", "o") == Position(3, -1)
    assert parse_position("-1:-1", "o") == EARLIEST
    assert parse_position("12:5:0:-1", "o") == Position(12, 5)
    assert str(Position(12, 5)) == "12:5"


@pytest.mark.parametrize("text, fragment", [
    ("12", "expected 'ledger:entry'"), ("a:b", "expected 'ledger:entry'"), ("1:2:3", "expected"),
    ("12:5:0:3", "inside a batch entry"), ("-5:3", "ledger must be >= 0"), (17, "must be a string")])
def test_parse_position_errors_name_the_option(text, fragment):
    with pytest.raises(OffsetError) as excinfo:
        parse_position(text, "startingOffsets", "t partition 0")
    assert "option 'startingOffsets'" in str(excinfo.value) and fragment in str(excinfo.value)


def test_parse_offsets_option_keywords_and_json():
    assert parse_offsets_option(None, "startingOffsets", "latest") == "latest"
    assert parse_offsets_option("EARLIEST", "startingOffsets", "latest") == "earliest"
    spec = parse_offsets_option(json.dumps({"t": {"0": "1:2", "1": "latest"}, "a/b/c": {"-1": "earliest"}}),
                                "startingOffsets", "latest")
    assert spec == {TP0: Position(1, 2), TP1: "latest",
                    TopicPartition("persistent://a/b/c", -1): "earliest"}


@pytest.mark.parametrize("value, fragment", [
    ("yesterday", "expected 'earliest' or 'latest' or JSON"),
    ("{bad json", "invalid JSON"),
    ('{"t": "1:2"}', "must map each topic"),
    ('{"t": {"x": "1:2"}}', "must be an index"),
    ('{"t-partition-1": {"0": "1:2"}}', "not the partition's own name"),
    ('{"a/b": {"0": "1:2"}}', "invalid short topic name"),
])
def test_parse_offsets_option_errors(value, fragment):
    with pytest.raises(OffsetError) as excinfo:
        parse_offsets_option(value, "startingOffsets", "latest")
    assert "option 'startingOffsets'" in str(excinfo.value) and fragment in str(excinfo.value)


def test_ending_offsets_refuse_earliest():
    with pytest.raises(OffsetError, match="option 'endingOffsets'"):
        parse_offsets_option("earliest", "endingOffsets", "latest", keywords=("latest",))
    with pytest.raises(OffsetError, match="not allowed here"):
        parse_offsets_option('{"t": {"0": "earliest"}}', "endingOffsets", "latest", keywords=("latest",))


def test_resolve_offsets():
    latest = {TP0: Position(5, 9), TP1: EARLIEST}
    assert resolve_offsets("earliest", [TP0, TP1], latest, "o") == {TP0: EARLIEST, TP1: EARLIEST}
    assert resolve_offsets("latest", [TP0, TP1], latest, "o") == latest
    assert resolve_offsets({TP0: Position(5, 1)}, [TP0, TP1], latest, "o", unlisted="latest") == \
        {TP0: Position(5, 1), TP1: EARLIEST}
    with pytest.raises(OffsetError, match=r"partition 7 of .* does not exist \(the topic has partitions 0..1\)"):
        resolve_offsets({TopicPartition(T, 7): EARLIEST}, [TP0, TP1], latest, "startingOffsets")
    with pytest.raises(OffsetError, match="is not one of the topics read"):
        resolve_offsets({TopicPartition("persistent://x/y/z", 0): EARLIEST}, [TP0], latest, "startingOffsets")
    nonpart = TopicPartition("persistent://a/b/c", -1)
    with pytest.raises(OffsetError, match="is not partitioned"):
        resolve_offsets({TopicPartition("persistent://a/b/c", 0): EARLIEST}, [nonpart], {nonpart: EARLIEST}, "o")


@given(st.dictionaries(st.tuples(st.sampled_from(["persistent://a/b/x", "persistent://a/b/y"]),
                                 st.integers(-1, 50)),
                       st.tuples(st.integers(0, 2**40), st.integers(-1, 2**30)), max_size=20))
def test_spark_form_round_trips(raw):
    offsets = {TopicPartition(t, p): Position(l, e) for (t, p), (l, e) in raw.items()}
    data = to_spark(offsets)
    assert json.loads(json.dumps(data)) == data
    assert from_spark(data) == offsets
    assert from_spark(json.dumps(data)) == offsets


def test_from_spark_errors():
    with pytest.raises(OffsetError, match="checkpointed offsets"):
        from_spark({"t": {"zero": "1:2"}})
    with pytest.raises(OffsetError):
        from_spark("[1, 2]")


def test_partition_topic_name():
    assert partition_topic_name(TP1) == T + "-partition-1"
    assert partition_topic_name(TopicPartition(T, -1)) == T


# -- ledger arithmetic -------------------------------------------------------------------------
LEDGERS = [LedgerInfo(3, 10), LedgerInfo(7, 0), LedgerInfo(9, 5)]   # entries 3:0..3:9, 9:0..9:4


def _all_positions(ledgers):
    return [Position(lid, e) for lid, n in sorted(ledgers) for e in range(n)]


def test_count_entries():
    assert count_entries(EARLIEST, Position(9, 4), LEDGERS) == 15
    assert count_entries(Position(3, 4), Position(9, 1), LEDGERS) == 5 + 2
    assert count_entries(Position(3, 9), Position(9, -1), LEDGERS) == 0
    assert count_entries(Position(9, 4), Position(9, 4), LEDGERS) == 0


def test_advance():
    assert advance(EARLIEST, 1, LEDGERS) == Position(3, 0)
    assert advance(Position(3, 8), 1, LEDGERS) == Position(3, 9)
    assert advance(Position(3, 8), 2, LEDGERS) == Position(9, 0)       # skips the empty ledger 7
    assert advance(Position(3, 8), 100, LEDGERS) == Position(9, 4)     # no further than the last entry
    assert advance(Position(3, 0), 100, LEDGERS, upto=Position(9, 1)) == Position(9, 1)
    assert advance(Position(3, 0), 0, LEDGERS) == Position(3, 0)
    assert advance(Position(9, 4), 3, LEDGERS) == Position(9, 4)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=5), st.data())
def test_advance_and_count_agree(sizes, data):
    ledgers = [LedgerInfo(10 + 3 * i, n) for i, n in enumerate(sizes)]
    positions = [EARLIEST] + _all_positions(ledgers)
    start = data.draw(st.sampled_from(positions))
    n = data.draw(st.integers(0, 40))
    end = advance(start, n, ledgers)
    assert end >= start
    assert count_entries(start, end, ledgers) == min(n, count_entries(start, positions[-1], ledgers))


def test_rate_limit_splits_by_backlog():
    ledgers = {TP0: [LedgerInfo(1, 100)], TP1: [LedgerInfo(2, 10)]}
    starts = {TP0: EARLIEST, TP1: EARLIEST}
    ends = {TP0: Position(1, 99), TP1: Position(2, 9)}
    assert rate_limit(starts, ends, ledgers, 1000) == ends
    limited = rate_limit(starts, ends, ledgers, 11)
    assert limited == {TP0: Position(1, 9), TP1: Position(2, 0)}      # 10 + 1 entries
    # every partition with a backlog progresses, even with a tiny budget
    tiny = rate_limit(starts, ends, ledgers, 1)
    assert tiny[TP0] > EARLIEST and tiny[TP1] > EARLIEST
    # a partition new to the query (not in starts) starts at the beginning
    assert rate_limit({TP0: Position(1, 99)}, ends, ledgers, 5) == {TP0: Position(1, 99), TP1: Position(2, 4)}
    with pytest.raises(ValueError):
        rate_limit(starts, ends, ledgers, 0)


@given(st.lists(st.integers(0, 30), min_size=1, max_size=4), st.integers(1, 50))
def test_rate_limited_batches_cover_everything_once(sizes, budget):
    tps = [TopicPartition(T, i) for i in range(len(sizes))]
    ledgers = {tp: [LedgerInfo(100 + i, n)] for i, (tp, n) in enumerate(zip(tps, sizes))}
    ends = {tp: (Position(100 + i, n - 1) if n else EARLIEST) for i, (tp, n) in enumerate(zip(tps, sizes))}
    starts = {tp: EARLIEST for tp in tps}
    read = {tp: 0 for tp in tps}
    for _ in range(sum(sizes) + 1):
        batch_end = rate_limit(starts, ends, ledgers, budget)
        for tp in tps:
            read[tp] += count_entries(starts[tp], batch_end[tp], ledgers[tp])
        if batch_end == starts:
            break
        starts = batch_end
    assert starts == {tp: max(ends[tp], EARLIEST) for tp in tps}
    assert [read[tp] for tp in tps] == sizes


def test_start_beyond_end_means_another_incarnation_of_the_topic():
    assert not start_beyond_end(EARLIEST, EARLIEST)            # nothing read yet, empty topic
    assert not start_beyond_end(Position(3, 9), Position(3, 9))  # read up to the end
    assert not start_beyond_end(Position(3, 9), Position(4, 0))  # more to read
    assert start_beyond_end(Position(3, 9), Position(3, 8))      # the tail never shrinks
    assert start_beyond_end(Position(7, 0), Position(2, 500))    # ledger ids started over
    assert start_beyond_end(Position(0, 0), EARLIEST)            # recreated and still empty


def test_possible_data_loss():
    current = [LedgerInfo(9, 5)]
    assert not possible_data_loss(EARLIEST, current)
    assert not possible_data_loss(Position(9, 2), current)
    assert possible_data_loss(Position(3, 9), current)                   # ledger 3 gone, size unknown
    seen: dict = {}
    update_seen(seen, [LedgerInfo(3, 10), LedgerInfo(9, 0)])               # 3 closed with 10 entries, 9 open
    assert seen == {3: 10, 9: None}
    assert not possible_data_loss(Position(3, 9), current, seen)           # read to the end of ledger 3
    assert possible_data_loss(Position(3, 5), current, seen)               # 3:6..3:9 were never read
    seen2 = {3: 10, 5: 4}
    assert possible_data_loss(Position(3, 9), current, seen2)              # ledger 5 held entries
    assert possible_data_loss(Position(3, 9), current, {3: 10, 5: None})   # ledger 5 was open: unknown
    assert not possible_data_loss(Position(3, 9), current, {3: 10, 5: 0, 9: None})
    assert possible_data_loss(Position(3, 9), current, {3: 10})            # successor never seen


def test_update_seen_keeps_the_newest():
    seen: dict = {}
    for lid in range(20):
        update_seen(seen, [LedgerInfo(lid, 3), LedgerInfo(lid + 1, 1)], limit=5)
    assert sorted(seen) == [16, 17, 18, 19, 20] and seen[19] == 3 and seen[20] is None


# -- options -----------------------------------------------------------------------------------------
URL = "minipulsar://127.0.0.1:6600"


def test_options_defaults_and_aliases():
    o = SourceOptions.parse({"serviceUrl": URL, "TOPICS": "a, persistent://x/y/b,a"}, streaming=True)
    assert o.service_url == URL
    assert o.topics == ("persistent://public/default/a", "persistent://x/y/b")
    assert o.starting_offsets == "latest" and o.fail_on_data_loss and o.max_offsets_per_trigger is None
    b = SourceOptions.parse({"service_url": URL, "topics": "a", "failOnDataLoss": "false",
                             "startingOffsets": "latest", "endingOffsets": '{"a": {"-1": "3:4"}}'}, False)
    assert b.starting_offsets == "latest" and not b.fail_on_data_loss
    assert b.ending_offsets == {TopicPartition("persistent://public/default/a", -1): Position(3, 4)}
    assert SourceOptions.parse({"service_url": URL, "topics": "a"}, False).starting_offsets == "earliest"


def test_options_pattern():
    o = SourceOptions.parse({"service_url": URL, "topicsPattern": "persistent://geo/flights/dep.*"}, True)
    assert o.pattern_namespace == "geo/flights"
    assert o.pattern_regex.fullmatch("persistent://geo/flights/departures")
    assert not o.pattern_regex.fullmatch("persistent://geo/flightsX/departures")
    assert not o.pattern_regex.fullmatch("persistent://geo/flights/arrivals")


@pytest.mark.parametrize("options, streaming, fragment", [
    ({"topics": "a"}, False, "option 'service_url' is required"),
    ({"service_url": "http://x:1", "topics": "a"}, False, "option 'service_url'"),
    ({"service_url": URL}, False, "exactly one of the options 'topics'"),
    ({"service_url": URL, "topics": "a", "topicsPattern": "a/b/.*"}, False, "exactly one of"),
    ({"service_url": URL, "topics": "a-partition-2"}, False, "is one partition"),
    ({"service_url": URL, "topics": "a/b"}, False, "option 'topics'"),
    ({"service_url": URL, "topicsPattern": "public/default/(("}, False, "invalid regex"),
    ({"service_url": URL, "topicsPattern": "pub.*/default/x"}, False, "must be literal"),
    ({"service_url": URL, "topicsPattern": "x.*"}, False, "expected persistent://tenant/namespace/<regex>"),
    ({"service_url": URL, "topics": "a", "endingOffsets": "latest"}, True, "option 'endingOffsets'"),
    ({"service_url": URL, "topics": "a", "maxOffsetsPerTrigger": "5"}, False, "option 'maxOffsetsPerTrigger'"),
    ({"service_url": URL, "topics": "a", "maxOffsetsPerTrigger": "-5"}, True, "option 'maxOffsetsPerTrigger'"),
    ({"service_url": URL, "topics": "a", "failOnDataLoss": "maybe"}, True, "option 'failOnDataLoss'"),
    ({"service_url": URL, "topics": "a", "startingOfsets": "earliest"}, True, "unknown option 'startingOfsets'"),
])
def test_option_errors_name_the_option(options, streaming, fragment):
    with pytest.raises(SourceError) as excinfo:
        SourceOptions.parse(options, streaming)
    assert fragment in str(excinfo.value)
