"""Unit tests of client/perf_stats.py: the pure parts of minipulsar-perf."""
from __future__ import annotations

import time

import pytest

from client.perf_stats import (HIGHEST_TRACKABLE_US, STAMP_SIZE, LatencyRecorder, Meter, TokenBucket,
                               format_interval, format_summary, histogram_percentiles, make_stamper, new_histogram, read_stamp,
                               stamp_payload)


def test_empty_histogram_percentiles_are_zero():
    assert histogram_percentiles(new_histogram()) == {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0,
                                                      "p99.9": 0.0, "max": 0.0}


def test_percentiles_of_a_uniform_distribution_in_ms():
    rec = LatencyRecorder()
    for us in range(1, 10_001):  # 1 us .. 10 ms
        rec.record(us)
    total = rec.total()
    assert total["p50"] == pytest.approx(5.0, rel=0.01)
    assert total["p95"] == pytest.approx(9.5, rel=0.01)
    assert total["p99"] == pytest.approx(9.9, rel=0.01)
    assert total["p99.9"] == pytest.approx(9.99, rel=0.01)
    assert total["max"] == pytest.approx(10.0, rel=0.001)
    assert total["mean"] == pytest.approx(5.0, rel=0.01)


def test_record_many_equals_repeated_record():
    a, b = LatencyRecorder(), LatencyRecorder()
    for _ in range(7):
        a.record(1234)
    b.record_many(1234, 7)
    b.record_many(99, 0)  # ignored
    assert a.total() == b.total()
    assert a.total_count == b.total_count == 7


def test_interval_restarts_but_total_keeps_everything():
    rec = LatencyRecorder()
    rec.record_many(1000, 10)  # 1 ms
    first = rec.interval()
    assert first["p50"] == pytest.approx(1.0, rel=0.01)
    rec.record_many(50_000, 10)  # 50 ms
    second = rec.interval()
    assert second["p50"] == pytest.approx(50.0, rel=0.01)  # only the new values
    assert rec.interval()["max"] == 0.0  # nothing since
    total = rec.total()
    assert total["max"] == pytest.approx(50.0, rel=0.01)
    assert rec.total_count == 20


def test_out_of_range_values_are_clamped_not_dropped():
    rec = LatencyRecorder()
    rec.record(0)
    rec.record(-5)  # a clock step backwards
    rec.record(HIGHEST_TRACKABLE_US * 10)
    assert rec.total_count == 3
    total = rec.total()
    assert total["p50"] == pytest.approx(0.001)
    assert total["max"] == pytest.approx(HIGHEST_TRACKABLE_US / 1000, rel=0.001)


def test_reset_total_keeps_the_current_interval():
    rec = LatencyRecorder()
    rec.record_many(2000, 5)
    rec.reset_total()
    assert rec.total_count == 0
    assert rec.total()["max"] == 0.0
    assert rec.interval()["p50"] == pytest.approx(2.0, rel=0.01)


def test_meter_rates_and_warmup_exclusion():
    m = Meter("publish", now=100.0)
    m.add(1000, 100_000)  # warm-up traffic
    m.latency.record_many(500_000, 1000)  # 500 ms during the warm-up
    m.end_warmup(101.0)
    r1 = m.interval(102.0, pending=7)  # covers 100..102
    assert r1.msg_rate == pytest.approx(500.0)
    assert r1.pending == 7 and r1.total == 1000 and r1.elapsed_s == pytest.approx(2.0)
    assert r1.latency["p50"] == pytest.approx(500.0, rel=0.01)  # the interval still saw it
    m.add(2000, 200_000)
    m.errors += 4
    m.latency.record_many(1000, 2000)
    r2 = m.interval(104.0)
    assert r2.msg_rate == pytest.approx(1000.0)
    assert r2.mb_rate == pytest.approx(0.1)
    assert r2.error_rate == pytest.approx(2.0)
    assert r2.latency["max"] == pytest.approx(1.0, rel=0.01)
    m.stop(105.0)
    s = m.summary()
    assert (s.messages, s.bytes, s.errors) == (2000, 200_000, 4)
    assert s.duration_s == pytest.approx(4.0)
    assert s.msg_rate == pytest.approx(500.0)
    assert s.mb_rate == pytest.approx(0.05)
    assert s.latency_ms["max"] == pytest.approx(1.0, rel=0.01)  # warm-up latencies left out
    d = s.to_dict()
    assert d["msg_per_s"] == s.msg_rate and set(d["latency_ms"]) == {"mean", "p50", "p95", "p99", "p99.9", "max"}


def test_meter_summary_needs_an_end():
    m = Meter("x", now=0.0)
    with pytest.raises(ValueError):
        m.summary()
    assert m.summary(now=2.0).duration_s == pytest.approx(2.0)


def test_token_bucket_limits_the_rate():
    b = TokenBucket(1000, now=0.0)  # capacity 10 (10 ms worth)
    assert b.capacity == 10
    assert b.take(50, 0.0) == 10  # the initial burst
    assert b.take(1, 0.0) == 0
    assert b.delay(0.0) == pytest.approx(0.001)
    assert b.take(50, 0.005) == 5
    granted = 15
    t = 0.005
    while t < 1.0:  # many small steps: at most rate * time + capacity
        t += 0.0007
        granted += b.take(100, t)
    assert 990 <= granted <= 1000 + 10 + 1


def test_token_bucket_capacity_is_capped_and_give_back():
    b = TokenBucket(10, now=0.0, capacity=2)
    assert b.take(5, 0.0) == 2
    assert b.take(5, 100.0) == 2  # long idle time does not accumulate more than the capacity
    b.give_back(5)
    assert b.tokens == 2


def test_token_bucket_unlimited():
    b = TokenBucket(0, now=0.0)
    assert b.unlimited
    assert b.take(12345, 0.0) == 12345
    assert b.delay(0.0) == 0.0


def test_slow_rate_has_at_least_one_token():
    b = TokenBucket(0.5, now=0.0)  # one message every 2 s
    assert b.capacity == 1
    assert b.take(1, 0.0) == 1
    assert b.delay(0.0) == pytest.approx(2.0)
    assert b.take(1, 1.0) == 0
    assert b.take(1, 2.0) == 1


def test_payload_stamp_round_trip():
    template = b"A" * 100
    now = time.time_ns()
    payload = stamp_payload(template, now)
    assert len(payload) == 100 and payload[STAMP_SIZE:] == template[STAMP_SIZE:]
    assert read_stamp(payload) == now
    assert read_stamp(template) is None
    assert read_stamp(b"short") is None
    assert stamp_payload(b"tiny", now) == b"tiny"  # too small to carry a stamp
    assert make_stamper(template)(now) == payload
    assert make_stamper(b"tiny")(now) == b"tiny"


def test_formatting():
    m = Meter("publish", now=0.0)
    m.add(10, 1000)
    m.latency.record_many(1500, 10)
    line = format_interval(m.interval(1.0, pending=3))
    assert line.startswith("[publish]") and "10.0 msg/s" in line and "pending 3" in line and "p99 1.5" in line
    m.stop(1.0)
    text = format_summary(m.summary(), "publish latency")
    assert "10 messages" in text and "p99.9" in text and "publish latency" in text


def test_quantization_keeps_the_histogram_resolution_and_few_keys():
    exact, rounded = new_histogram(), LatencyRecorder()
    values = [1, 2047, 2048, 2049, 4097, 123_456, 999_999, 5_000_000, 59_999_999]
    values += list(range(100_000, 2_000_000, 97))  # a spread over ~2 s
    for v in values:
        exact.record_value(v)
        rounded.record(v)
    assert rounded.pending_values < len(values) / 2
    rounded.drain()
    for pct in (0, 10, 50, 90, 99, 99.9, 100):
        assert rounded.total_hist.get_value_at_percentile(pct) == exact.get_value_at_percentile(pct)
    assert rounded.total_hist.get_total_count() == len(values)


def test_percentiles_are_cheap_enough_for_the_event_loop():
    rec = LatencyRecorder()
    for v in range(1000, 3_000_000, 31):  # up to 3 s, ~100k values
        rec.record(v)
    rec.drain()
    t0 = time.perf_counter()
    interval, total = rec.interval(), rec.total()
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.05, f"percentiles took {elapsed * 1000:.0f} ms: they would stall the perf event loop"
    assert interval["p50"] == pytest.approx(1500.0, rel=0.01) and total["max"] == pytest.approx(3000.0, rel=0.01)
    assert total["mean"] == pytest.approx(1500.0, rel=0.01)
