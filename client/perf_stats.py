"""Pure statistics of ``minipulsar-perf`` (no I/O, no asyncio): latency
histograms, per-interval rates, the token bucket that limits the publish rate,
the payload time stamp, and the text/JSON rendering of the results.

Like pulsar-perf, latencies go into an HdrHistogram (``hdrhistogram``
package, 3 significant digits, values in microseconds up to one hour).
Recording one value in that pure-Python histogram costs ~0.8 us, too much at
100,000+ messages per second, so :class:`LatencyRecorder` first counts equal
values (rounded to the histogram's own resolution) in a dict (~0.2 us per
message) and moves the counts into the histograms (one ``record_value(v,
count)`` per distinct value) when an interval ends.

Time stamps are passed in by the caller (seconds as floats, latencies as int
microseconds), so everything here is deterministic and unit-tested directly
(tests/unit/test_perf_stats.py).
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from hdrh.histogram import HdrHistogram

__all__ = ["LatencyRecorder", "Meter", "IntervalReport", "Summary", "TokenBucket", "new_histogram",
           "histogram_percentiles", "PERCENTILES", "HIGHEST_TRACKABLE_US", "stamp_payload", "make_stamper",
           "read_stamp", "STAMP_SIZE", "format_interval", "format_summary"]

HIGHEST_TRACKABLE_US = 3_600_000_000  # one hour, in microseconds
SIGNIFICANT_FIGURES = 3
# (name in reports, percentile) of the final summary, as pulsar-perf's aggregated line
PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p95", 95.0), ("p99", 99.0), ("p99.9", 99.9))

# A perf payload starts with MAGIC + the send time (time.time_ns(), big endian u64),
# so a consumer (in this or another process on the same host) measures the
# end-to-end latency with microsecond resolution instead of the broker
# metadata's millisecond publish_time.
_MAGIC = b"mpPERF\x00\x01"
_STAMP = struct.Struct(">8sQ")
STAMP_SIZE = _STAMP.size  # 16 bytes: payloads of at least this size carry a stamp


def new_histogram() -> HdrHistogram:
    """An empty latency histogram: 1 us .. 1 hour, 3 significant digits."""
    return HdrHistogram(1, HIGHEST_TRACKABLE_US, SIGNIFICANT_FIGURES)


def histogram_percentiles(hist: HdrHistogram, mean_us: float | None = None) -> dict[str, float]:
    """``{"mean", "p50", "p95", "p99", "p99.9", "max"}`` of ``hist`` in milliseconds
    (floats, 3 decimals); all 0.0 for an empty histogram.

    Uses ``get_percentile_to_value_dict`` (one pass, ~1 ms) rather than one
    ``get_value_at_percentile`` per percentile and ``get_mean_value`` (tens of
    ms each in this pure-Python histogram: they would stall the event loop
    and show up as latency).  ``mean_us``: the mean if the caller tracks it
    (else computed from the histogram, slowly)."""
    if hist.get_total_count() == 0:
        return {"mean": 0.0, **{name: 0.0 for name, _ in PERCENTILES}, "max": 0.0}
    if mean_us is None:
        mean_us = hist.get_mean_value()
    values = hist.get_percentile_to_value_dict([pct for _, pct in PERCENTILES])
    out = {"mean": round(mean_us / 1000.0, 3)}
    for name, pct in PERCENTILES:
        out[name] = round(values[pct] / 1000.0, 3)
    out["max"] = round(hist.get_max_value() / 1000.0, 3)
    return out


# HdrHistogram with 3 significant digits keeps 2048 sub-buckets: values below 2048
# exactly, above with 11 significant bits.  Rounding a value down to 11 bits
# gives the lowest value of its histogram bucket, so recording the rounded
# value changes nothing, and the dict of counts stays small (at most 1024
# keys per power of two) even when latencies spread over seconds.
_SIGNIFICANT_BITS = 11
_EXACT_BELOW = 1 << _SIGNIFICANT_BITS


class LatencyRecorder:
    """Collects latencies (int microseconds) for an interval histogram and a
    cumulative one.

    ``record(us)`` only counts the value in a dict; ``drain()`` moves the
    counts into both histograms (call it before reading them: ``interval()``
    and ``total()`` do).  Values below 1 us count as 1 us, values above one
    hour as one hour (HdrHistogram would drop them silently).
    """

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self.interval_hist = new_histogram()
        self.total_hist = new_histogram()
        self._interval_sum = 0  # sums of the recorded (rounded) values, for the means
        self._total_sum = 0

    def record(self, latency_us: int) -> None:
        """Count one latency (microseconds)."""
        if latency_us >= _EXACT_BELOW:  # keep HdrHistogram's own resolution: 11 significant bits
            shift = latency_us.bit_length() - _SIGNIFICANT_BITS
            latency_us = latency_us >> shift << shift
        counts = self._counts
        counts[latency_us] = counts.get(latency_us, 0) + 1

    def record_many(self, latency_us: int, count: int) -> None:
        """Count ``count`` messages with the same latency (microseconds)."""
        if count > 0:
            if latency_us >= _EXACT_BELOW:
                shift = latency_us.bit_length() - _SIGNIFICANT_BITS
                latency_us = latency_us >> shift << shift
            self._counts[latency_us] = self._counts.get(latency_us, 0) + count

    @property
    def pending_values(self) -> int:
        """Distinct values waiting for ``drain()`` (bounded by the quantization)."""
        return len(self._counts)

    def drain(self) -> None:
        """Move the pending counts into the interval and total histograms."""
        counts, self._counts = self._counts, {}
        interval, total = self.interval_hist, self.total_hist
        added = 0
        for value, count in counts.items():
            if value < 1:
                value = 1
            elif value > HIGHEST_TRACKABLE_US:
                value = HIGHEST_TRACKABLE_US
            interval.record_value(value, count)
            total.record_value(value, count)
            added += value * count
        self._interval_sum += added
        self._total_sum += added

    def interval(self) -> dict[str, float]:
        """Percentiles (ms) of the values since the previous ``interval()`` call,
        which starts a new interval."""
        self.drain()
        hist = self.interval_hist
        result = histogram_percentiles(hist, self._interval_sum / max(1, hist.get_total_count()))
        hist.reset()
        self._interval_sum = 0
        return result

    def total(self) -> dict[str, float]:
        """Percentiles (ms) of every value since creation or ``reset_total()``."""
        self.drain()
        hist = self.total_hist
        return histogram_percentiles(hist, self._total_sum / max(1, hist.get_total_count()))

    @property
    def total_count(self) -> int:
        """Values in the total histogram plus those not drained yet."""
        return self.total_hist.get_total_count() + sum(self._counts.values())

    def reset_total(self) -> None:
        """Restart the total histogram (the warm-up ends); the current
        interval keeps its values."""
        self.drain()
        self.total_hist.reset()
        self._total_sum = 0


@dataclass
class IntervalReport:
    """What one stats line shows: ``elapsed_s`` since the start, ``msg_rate``
    (msg/s) and ``mb_rate`` (MB/s, 10^6 bytes) over the interval,
    ``error_rate`` (errors/s), ``total`` messages so far, ``pending``
    (messages sent and not acknowledged yet; None for consumers) and the
    interval's latency percentiles in ms (``latency``)."""

    label: str
    elapsed_s: float
    msg_rate: float
    mb_rate: float
    error_rate: float
    total: int
    pending: int | None
    latency: dict[str, float]


class Meter:
    """Message, byte and error counters of one side (publish or consume) with
    interval rates and a total that restarts at the end of the warm-up.

    Hot path: ``add(count, nbytes)`` and ``errors += n`` (plain attributes);
    latencies go to ``latency`` (a ``LatencyRecorder``).  ``now`` arguments are
    seconds on any monotonic clock.
    """

    def __init__(self, label: str, now: float) -> None:
        self.label = label
        self.latency = LatencyRecorder()
        self.messages = 0  # since the start (warm-up included)
        self.bytes = 0
        self.errors = 0
        self.start = now  # of the measured period (moved by end_warmup)
        self._t0 = now  # of the run, for "elapsed"
        self._base_messages = 0  # counters at the start of the measured period
        self._base_bytes = 0
        self._base_errors = 0
        self._last_t = now
        self._last_messages = 0
        self._last_bytes = 0
        self._last_errors = 0
        self.end: float | None = None

    def add(self, count: int, nbytes: int) -> None:
        """Count ``count`` messages of ``nbytes`` bytes in total."""
        self.messages += count
        self.bytes += nbytes

    def end_warmup(self, now: float) -> None:
        """Start the measured period now: totals and the total latency histogram restart."""
        self.start = now
        self._base_messages, self._base_bytes, self._base_errors = self.messages, self.bytes, self.errors
        self.latency.reset_total()

    def interval(self, now: float, pending: int | None = None) -> IntervalReport:
        """Rates since the previous call (or the start) and the interval's latencies."""
        dt = max(1e-9, now - self._last_t)
        report = IntervalReport(
            label=self.label, elapsed_s=now - self._t0,
            msg_rate=(self.messages - self._last_messages) / dt,
            mb_rate=(self.bytes - self._last_bytes) / dt / 1e6,
            error_rate=(self.errors - self._last_errors) / dt,
            total=self.messages, pending=pending, latency=self.latency.interval())
        self._last_t, self._last_messages, self._last_bytes, self._last_errors = \
            now, self.messages, self.bytes, self.errors
        return report

    def stop(self, now: float) -> None:
        """End of the measured period (``summary`` uses it)."""
        self.end = now

    def summary(self, now: float | None = None) -> "Summary":
        """Totals, rates and latency percentiles of the measured period
        (from the end of the warm-up to ``stop()``, or ``now``)."""
        end = self.end if self.end is not None else now
        if end is None:
            raise ValueError("summary() needs now= before stop()")
        duration = max(1e-9, end - self.start)
        messages = self.messages - self._base_messages
        nbytes = self.bytes - self._base_bytes
        return Summary(label=self.label, messages=messages, bytes=nbytes,
                       errors=self.errors - self._base_errors, duration_s=round(duration, 3),
                       msg_rate=round(messages / duration, 1), mb_rate=round(nbytes / duration / 1e6, 3),
                       latency_ms=self.latency.total())


@dataclass
class Summary:
    """The final figures of one side: ``messages``, ``bytes``, ``errors`` and
    ``duration_s`` of the measured period, ``msg_rate`` (msg/s), ``mb_rate``
    (MB/s) and ``latency_ms`` (mean, p50, p95, p99, p99.9, max)."""

    label: str
    messages: int
    bytes: int
    errors: int
    duration_s: float
    msg_rate: float
    mb_rate: float
    latency_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-able dict (the label is left out: it is the key in the report)."""
        return {"messages": self.messages, "bytes": self.bytes, "errors": self.errors,
                "duration_s": self.duration_s, "msg_per_s": self.msg_rate, "mb_per_s": self.mb_rate,
                "latency_ms": dict(self.latency_ms)}


class TokenBucket:
    """Token bucket limiting a rate to ``rate`` tokens (messages) per second
    with a burst of at most ``capacity`` tokens (default: 10 ms worth, at
    least 1), starting full.  ``rate`` <= 0 means unlimited.

    ``take(n, now)`` grants up to ``n`` tokens now (returns how many);
    ``delay(now)`` says how long until the next token (seconds); ``give_back(n)``
    returns unused tokens.  ``now`` is
    seconds on a monotonic clock, never going backwards.
    """

    def __init__(self, rate: float, now: float, capacity: float | None = None) -> None:
        self.rate = float(rate)
        self.unlimited = self.rate <= 0
        self.capacity = float(capacity) if capacity else max(1.0, self.rate / 100.0)
        self.tokens = self.capacity
        self._last = now

    def _refill(self, now: float) -> None:
        if now > self._last:
            self.tokens = min(self.capacity, self.tokens + (now - self._last) * self.rate)
            self._last = now

    def take(self, n: int, now: float) -> int:
        """Grant up to ``n`` whole tokens now; returns the number granted (0..n)."""
        if self.unlimited:
            return n
        self._refill(now)
        granted = min(n, int(self.tokens + 1e-9))
        if granted > 0:
            self.tokens -= granted
        return granted

    def give_back(self, n: int) -> None:
        """Return ``n`` tokens taken but not used (never above ``capacity``)."""
        if not self.unlimited and n > 0:
            self.tokens = min(self.capacity, self.tokens + n)

    def delay(self, now: float) -> float:
        """Seconds until at least one whole token is available (0.0 if one is)."""
        if self.unlimited:
            return 0.0
        self._refill(now)
        missing = 1.0 - self.tokens
        return 0.0 if missing <= 1e-9 else missing / self.rate


def stamp_payload(template: bytes | bytearray, send_time_ns: int) -> bytes:
    """``template`` (at least ``STAMP_SIZE`` bytes) with its first 16 bytes
    replaced by the perf magic and ``send_time_ns`` (ns since the epoch).
    Shorter templates are returned unchanged (consumers then fall back to the
    message's publish time)."""
    if len(template) < STAMP_SIZE:
        return bytes(template)
    return _STAMP.pack(_MAGIC, send_time_ns) + template[STAMP_SIZE:]


def make_stamper(template: bytes):
    """A fast ``stamp(send_time_ns) -> payload`` equivalent to
    ``stamp_payload(template, send_time_ns)`` (the hot path of perf producers)."""
    if len(template) < STAMP_SIZE:
        fixed = bytes(template)
        return lambda _send_time_ns: fixed
    pack, magic, tail = _STAMP.pack, _MAGIC, bytes(template[STAMP_SIZE:])
    return lambda send_time_ns: pack(magic, send_time_ns) + tail


def read_stamp(payload: bytes) -> int | None:
    """The send time (ns since the epoch) a perf producer wrote into
    ``payload``, or None when the payload carries no stamp."""
    if len(payload) < STAMP_SIZE or payload[:8] != _MAGIC:
        return None
    return _STAMP.unpack_from(payload)[1]


def _fmt_latency(lat: dict[str, float]) -> str:
    return (f"latency ms p50 {lat['p50']:.3f} p99 {lat['p99']:.3f} p99.9 {lat['p99.9']:.3f} "
            f"max {lat['max']:.3f}")


def format_interval(r: IntervalReport) -> str:
    """One stats line (pulsar-perf style), e.g. ``[publish] 10.0 s: 45123.4 msg/s
    4.51 MB/s | pending 812 | errors 0.0/s | latency ms p50 ... | total 451234``."""
    pending = "" if r.pending is None else f" | pending {r.pending}"
    return (f"[{r.label}] {r.elapsed_s:6.1f} s: {r.msg_rate:10.1f} msg/s {r.mb_rate:8.3f} MB/s{pending}"
            f" | errors {r.error_rate:.1f}/s | {_fmt_latency(r.latency)} | total {r.total}")


def format_summary(s: Summary, latency_name: str = "latency") -> str:
    """The two-line aggregated summary of one side (pulsar-perf's "Aggregated
    throughput stats" / "Aggregated latency stats")."""
    lat = s.latency_ms
    head = (f"[{s.label}] aggregated: {s.messages} messages in {s.duration_s:.2f} s --- {s.msg_rate:.1f} msg/s"
            f" --- {s.mb_rate:.3f} MB/s --- {s.errors} errors")
    if not lat or not math.isfinite(lat.get("max", 0.0)):
        return head
    tail = (f"[{s.label}] aggregated {latency_name} ms: mean {lat['mean']:.3f} - p50 {lat['p50']:.3f}"
            f" - p95 {lat['p95']:.3f} - p99 {lat['p99']:.3f} - p99.9 {lat['p99.9']:.3f} - max {lat['max']:.3f}")
    return head + "\n" + tail
