"""``minipulsar-perf``: load generator with HdrHistogram latencies, like Pulsar's ``pulsar-perf``.

    minipulsar-perf produce my-topic -r 10000 -s 100 -t 30          # 10,000 msg/s of 100 bytes for 30 s
    minipulsar-perf produce my-topic -r 0 -s 100 -t 15 --json       # as fast as possible, JSON summary
    minipulsar-perf consume my-topic -s perf-sub -t Shared --ack
    minipulsar-perf e2e my-topic -r 5000 -s 100 --batch-delay-ms 1 -d 20

- ``produce``: ``-n`` producers on one client (one gRPC channel) publish at
  ``-r`` msg/s in total (token bucket; 0 = as fast as possible, bounded by
  ``--max-outstanding`` unacknowledged messages per producer).  Latency =
  from ``send_async`` to the broker's receipt (the message is persisted on
  the bookies' ack quorum).
- ``consume``: ``-n`` consumers on subscription ``-s``; with ``--ack`` every
  message is acknowledged.  Latency = end to end, from the producer's send
  call to the moment the application receives the message.
- ``e2e``: both in one process: a fresh subscription (removed at the end),
  then a producer; the consumer acknowledges every message.  Reports the
  publish latency and the end-to-end latency.

End-to-end latency uses the send time (``time.time_ns()``) that perf
producers write into the first 16 bytes of each payload (``-s`` >= 16;
``client.perf_stats.stamp_payload``), which gives microseconds on one host;
for other messages it falls back to the broker metadata's ``publish_time``
(milliseconds, so figures are up to 1 ms coarse).

Every ``-i`` seconds one stats line per side goes to stderr (rate msg/s,
MB/s, pending, errors, latency p50/p99/p99.9/max in ms over the interval);
the end prints the aggregated summary (p50/p95/p99/p99.9/max) on stdout, or
with ``--json`` one JSON line.  ``--warmup`` seconds run first and are left
out of the summary; ``-t``/``-d`` is the measured duration after it.
Ctrl-C ends the run early (with the summary).  Exit status: 0, or 1 on an
error (``error: <message>``) or when every send failed.

The pure parts (histograms, meters, token bucket, payload stamps) are in
``client.perf_stats``.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import sys
import time
from typing import Any

from client.cli import DEFAULT_SERVICE_URL, SERVICE_URL_ENV, CliError, add_tls_arguments, default_service_url, \
    install_stop_handlers, run_main, tls_kwargs
from client.perf_stats import Meter, TokenBucket, format_interval, format_summary, make_stamper, read_stamp

__all__ = ["main", "build_parser", "PerfProducers", "PerfConsumers"]

_SUB_TYPES = {"exclusive": "Exclusive", "shared": "Shared", "failover": "Failover", "key_shared": "KeyShared",
              "keyshared": "KeyShared"}
_SEND_CHUNK = 200  # messages sent per turn of the event loop at full speed
_DRAIN_TIMEOUT_S = 30.0
_MIN_SLEEP_S = 0.001


def make_payload(size: int, rng: random.Random | None = None) -> bytes:
    """``size`` random upper-case letters (pulsar-perf's default payload; compressible
    like text, not all zeros)."""
    rng = rng or random.Random(12345)
    return bytes(rng.randrange(65, 91) for _ in range(size))


# ---------------------------------------------------------------------------- producing
class PerfProducers:
    """``args.num_producers`` producers of ``args.topic`` sharing ``meter``
    (a ``Meter``) and one token bucket of ``args.rate`` msg/s (0 = unlimited).

    ``run(stop)`` publishes until ``stop`` is set or ``num_messages`` (0 =
    unlimited) were sent, then waits until every sent message is settled.
    ``pending`` is the number of sent, unsettled messages.
    """

    def __init__(self, client, args) -> None:
        self.client = client
        self.args = args
        self.meter = Meter("publish", time.monotonic())  # replace it before run() to start the clock later
        self.size = args.size
        self.template = make_payload(args.size)
        self.producers: list = []
        self.sent = 0
        self.settled = 0
        self.first_error: BaseException | None = None
        self.bucket = TokenBucket(args.rate, time.monotonic())
        self._room = asyncio.Event()

    @property
    def pending(self) -> int:
        """Messages sent and not yet acknowledged or failed."""
        return self.sent - self.settled

    async def start(self) -> None:
        """Create the producers (batching and compression from the arguments)."""
        a = self.args
        options: dict[str, Any] = dict(
            batching_enabled=not a.disable_batching, batching_max_messages=a.batch_max_messages,
            batching_max_allowed_size_in_bytes=a.batch_max_bytes, batching_max_publish_delay_ms=a.batch_delay_ms,
            compression_type=a.compression, max_pending_messages=a.max_outstanding, block_if_queue_full=False,
            send_timeout_millis=a.send_timeout_ms)
        self.producers = list(await asyncio.gather(
            *(self.client.create_producer(a.topic, **options) for _ in range(a.num_producers))))

    def _callback(self):
        """The send callback: records the publish latency of a message sent at
        ``t0`` (``perf_counter_ns``); bound per message with functools.partial."""
        meter = self.meter
        record = meter.latency.record
        size = self.size
        perf_ns = time.perf_counter_ns
        room = self._room

        def on_sent(t0: int, exc, _msg_id) -> None:
            self.settled += 1
            if exc is None:
                record((perf_ns() - t0) // 1000)
                meter.messages += 1
                meter.bytes += size
            else:
                meter.errors += 1
                if self.first_error is None:
                    self.first_error = exc
            if not room.is_set():
                room.set()
        return on_sent

    async def _publish(self, producer, stop: asyncio.Event, quota: int) -> None:
        """One producer's send loop; ``quota``: its share of ``num_messages`` (0 = unlimited)."""
        bucket = self.bucket
        max_out = self.args.max_outstanding
        limit_all = self.args.num_producers * max_out
        cb = self._callback()
        partial = functools.partial
        perf_ns = time.perf_counter_ns
        wall_ns = time.time_ns
        stamp = make_stamper(self.template)
        send = producer.send_async
        mine = 0
        while not stop.is_set() and (quota == 0 or mine < quota):
            n = _SEND_CHUNK if quota == 0 else min(_SEND_CHUNK, quota - mine)
            if not bucket.unlimited:
                n = bucket.take(n, time.monotonic())
                if n == 0:
                    # not below 1 ms: event loop timers have ms resolution, shorter sleeps spin
                    await asyncio.sleep(max(_MIN_SLEEP_S, bucket.delay(time.monotonic())))
                    continue
            room = min(max_out - producer.pending_count, limit_all - self.pending)
            if room <= 0:
                self._room.clear()
                try:
                    await asyncio.wait_for(self._room.wait(), 1.0)
                except asyncio.TimeoutError:
                    pass
                bucket.give_back(n)
                continue
            if n > room:
                bucket.give_back(n - room)
                n = room
            for _ in range(n):
                send(stamp(wall_ns()), partial(cb, perf_ns()))
            self.sent += n
            mine += n
            await asyncio.sleep(0)  # let the producer's writer and reader run

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until ``stop`` or the message count, then drain."""
        total, n = self.args.num_messages, len(self.producers)
        quotas = [total // n + (1 if i < total % n else 0) for i in range(n)] if total else [0] * n
        await asyncio.gather(*(self._publish(p, stop, q) for p, q in zip(self.producers, quotas)))
        try:
            await asyncio.wait_for(asyncio.gather(*(p.flush() for p in self.producers), return_exceptions=True),
                                   _DRAIN_TIMEOUT_S)
        except asyncio.TimeoutError:
            pass

    async def close(self) -> None:
        """Close every producer."""
        await asyncio.gather(*(p.close() for p in self.producers), return_exceptions=True)


# ---------------------------------------------------------------------------- consuming
class PerfConsumers:
    """``args.num_consumers`` consumers of subscription ``subscription`` sharing
    ``meter`` (a ``Meter``); the latency recorded is end to end (payload
    stamp, else publish time).  ``ack``: acknowledge every message."""

    def __init__(self, client, topic: str, subscription: str, args, ack: bool,
                 initial_position: str = "Latest") -> None:
        self.client = client
        self.topic = topic
        self.subscription = subscription
        self.args = args
        self.meter = Meter("consume", time.monotonic())  # replace it before run() to start the clock later
        self.ack = ack
        self.initial_position = initial_position
        self.consumers: list = []
        self.stamped = 0  # messages whose latency came from a payload stamp
        self.unstamped = 0  # ... from the millisecond publish_time

    async def start(self) -> None:
        """Subscribe every consumer."""
        from client.consumer_config import BatchReceivePolicy, ConsumerType, InitialPosition
        sub_type = ConsumerType[_SUB_TYPES[self.args.subscription_type.lower()]]
        position = InitialPosition[self.initial_position.capitalize()]
        policy = BatchReceivePolicy(max_num_messages=self.args.receiver_queue_size, max_num_bytes=0, timeout_ms=0)
        for _ in range(self.args.num_consumers):  # one after the other: Exclusive errors stay clear
            self.consumers.append(await self.client.subscribe(
                self.topic, self.subscription, consumer_type=sub_type, initial_position=position,
                receiver_queue_size=self.args.receiver_queue_size, batch_receive_policy=policy))

    async def _consume(self, consumer, stop: asyncio.Event) -> None:
        from client.errors import AlreadyClosed, Timeout
        meter = self.meter
        record = meter.latency.record
        wall_ns = time.time_ns
        ack = consumer.acknowledge if self.ack else None
        batch_receive = consumer.batch_receive
        while not stop.is_set():
            try:
                msgs = await batch_receive()  # whatever is queued, without waiting
                if not msgs:
                    msgs = [await consumer.receive(timeout_millis=200)]
            except Timeout:
                continue
            except AlreadyClosed:
                return
            now = wall_ns()
            nbytes = 0
            stamped = 0
            for m in msgs:
                data = m.data()
                nbytes += len(data)
                sent = read_stamp(data)
                if sent is not None:
                    stamped += 1
                    record((now - sent) // 1000)
                else:
                    record((now - m.publish_timestamp() * 1_000_000) // 1000)
                if ack is not None:
                    ack(m)
            meter.messages += len(msgs)
            meter.bytes += nbytes
            self.stamped += stamped
            self.unstamped += len(msgs) - stamped

    async def run(self, stop: asyncio.Event) -> None:
        """Receive until ``stop`` is set."""
        await asyncio.gather(*(self._consume(c, stop) for c in self.consumers))

    async def close(self, unsubscribe: bool = False) -> None:
        """Close the consumers (``unsubscribe``: delete the subscription first)."""
        if unsubscribe and self.consumers:
            try:
                await self.consumers[0].unsubscribe()
            except Exception:  # noqa: BLE001 - best effort: other consumers may still be attached
                pass
        await asyncio.gather(*(c.close() for c in self.consumers), return_exceptions=True)

    @property
    def latency_source(self) -> str:
        """Where the end-to-end latencies came from."""
        if self.unstamped == 0:
            return "payload send time (us)"
        if self.stamped == 0:
            return "publish_time (ms resolution)"
        return "mixed: payload send time and publish_time"


# ---------------------------------------------------------------------------- the run
class _Run:
    """Timing of one run: warm-up, measured duration, stats lines."""

    def __init__(self, args, meters: list[Meter], pending_of) -> None:
        self.args = args
        self.meters = meters
        self.pending_of = pending_of  # Meter -> pending count or None
        self.stop = asyncio.Event()  # stop producing/consuming
        self.measuring = args.warmup <= 0

    async def timer(self) -> None:
        """End the warm-up, print stats lines, set ``stop`` after the duration."""
        a = self.args
        loop = asyncio.get_running_loop()
        start = loop.time()
        warmup_end = start + max(0.0, a.warmup)
        end = warmup_end + a.duration if a.duration > 0 else None
        next_line = start + a.interval
        while not self.stop.is_set():
            now = loop.time()
            deadlines = [next_line] + ([warmup_end] if not self.measuring else []) + ([end] if end else [])
            try:
                await asyncio.wait_for(self.stop.wait(), max(0.0, min(deadlines) - now))
            except asyncio.TimeoutError:
                pass
            now = loop.time()
            mono = time.monotonic()
            if not self.measuring and now >= warmup_end:
                self.measuring = True
                for m in self.meters:
                    m.end_warmup(mono)
                if not a.quiet:
                    print(f"warm-up of {a.warmup:g} s done; measuring", file=sys.stderr, flush=True)
            if now >= next_line:
                next_line += a.interval
                self.print_lines(mono)
            if end is not None and now >= end:
                self.stop.set()

    def print_lines(self, mono: float) -> None:
        """One stats line per meter on stderr."""
        if self.args.quiet:
            for m in self.meters:
                m.interval(mono)
            return
        for m in self.meters:
            print(format_interval(m.interval(mono, self.pending_of(m))), file=sys.stderr)
        sys.stderr.flush()


def _config(args) -> dict:
    keys = ("topic", "rate", "size", "num_producers", "num_messages", "duration", "warmup", "batch_max_messages",
            "batch_max_bytes", "batch_delay_ms", "compression", "disable_batching", "max_outstanding",
            "subscription", "subscription_type", "num_consumers", "ack", "receiver_queue_size")
    return {k: getattr(args, k) for k in keys if hasattr(args, k)}


def _report(args, sections: dict[str, tuple[Meter, str]], extra: dict) -> None:
    """Print the summary (text or one JSON line) of every side."""
    if args.json:
        doc = {"command": args.command, **{name: m.summary().to_dict() for name, (m, _) in sections.items()},
               **extra, "config": _config(args)}
        print(json.dumps(doc, sort_keys=True), flush=True)
        return
    for name, (m, latency_name) in sections.items():
        print(format_summary(m.summary(), latency_name))
    for k, v in extra.items():
        print(f"{k}: {v}")
    sys.stdout.flush()


async def _with_client(args, body):
    from client.client import AsyncClient
    from client.cli import cli_authentication
    async with AsyncClient(args.service_url, operation_timeout_seconds=args.operation_timeout,
                           authentication=cli_authentication(args), **tls_kwargs(args)) as client:
        return await body(client)


async def perf_produce(args) -> int:
    """``minipulsar-perf produce``; returns the exit status."""
    async def body(client) -> int:
        producers = PerfProducers(client, args)
        await producers.start()
        meter = producers.meter = Meter("publish", time.monotonic())  # the clock starts now
        run = _Run(args, [meter], lambda m: producers.pending)
        install_stop_handlers(run.stop)
        timer = asyncio.create_task(run.timer())
        await producers.run(run.stop)
        meter.stop(time.monotonic())
        run.stop.set()
        await timer
        await producers.close()
        _report(args, {"publish": (meter, "publish latency")}, {})
        return _exit_status(producers)
    return await _with_client(args, body)


def _exit_status(producers: PerfProducers) -> int:
    if producers.first_error is None:
        return 0
    print(f"error: {producers.meter.errors} send(s) failed; first: {producers.first_error}", file=sys.stderr)
    return 1


async def perf_consume(args) -> int:
    """``minipulsar-perf consume``; returns the exit status."""
    async def body(client) -> int:
        consumers = PerfConsumers(client, args.topic, args.subscription, args, args.ack, args.subscription_position)
        await consumers.start()
        meter = consumers.meter = Meter("consume", time.monotonic())
        run = _Run(args, [meter], lambda m: None)
        install_stop_handlers(run.stop)
        timer = asyncio.create_task(run.timer())
        counter = asyncio.create_task(_stop_at_count(meter, args.num_messages, run.stop)) \
            if args.num_messages else None
        await consumers.run(run.stop)
        meter.stop(time.monotonic())
        await timer
        if counter is not None:
            await counter
        await consumers.close()
        _report(args, {"consume": (meter, "end-to-end latency")}, {"latency_source": consumers.latency_source})
        return 0
    return await _with_client(args, body)


async def _stop_at_count(meter: Meter, count: int, stop: asyncio.Event) -> None:
    while not stop.is_set() and meter.messages < count:
        await asyncio.sleep(0.01)
    stop.set()


async def perf_e2e(args) -> int:
    """``minipulsar-perf e2e``: produce and consume in this process; returns the exit status."""
    async def body(client) -> int:
        subscription = args.subscription or f"perf-e2e-{os.getpid()}-{random.randrange(1 << 30)}"
        consumers = PerfConsumers(client, args.topic, subscription, args, ack=True, initial_position="Latest")
        await consumers.start()
        producers = PerfProducers(client, args)
        await producers.start()
        now = time.monotonic()
        pub = producers.meter = Meter("publish", now)
        sub = consumers.meter = Meter("e2e", now)
        run = _Run(args, [pub, sub], lambda m: producers.pending if m is pub else None)
        install_stop_handlers(run.stop)
        consume_stop = asyncio.Event()
        consuming = asyncio.create_task(consumers.run(consume_stop))
        timer = asyncio.create_task(run.timer())
        await producers.run(run.stop)
        pub.stop(time.monotonic())
        run.stop.set()
        await timer
        # let the consumer receive what was published (bounded)
        deadline = time.monotonic() + _DRAIN_TIMEOUT_S
        while sub.messages < pub.messages and time.monotonic() < deadline and not consuming.done():
            await asyncio.sleep(0.01)
        sub.stop(time.monotonic())
        consume_stop.set()
        await consuming
        await producers.close()
        await consumers.close(unsubscribe=args.subscription is None)
        _report(args, {"publish": (pub, "publish latency"), "consume": (sub, "end-to-end latency")},
                {"latency_source": consumers.latency_source, "not_received": max(0, pub.messages - sub.messages)})
        return _exit_status(producers)
    return await _with_client(args, body)


# ---------------------------------------------------------------------------- parser
def _sub_type(text: str) -> str:
    if text.lower() not in _SUB_TYPES:
        raise argparse.ArgumentTypeError(f"invalid subscription type {text!r}: use Exclusive, Shared, Failover "
                                          f"or Key_Shared")
    return text


def _compression(text: str) -> str:
    value = text.upper()
    if value not in ("NONE", "LZ4", "ZLIB", "ZSTD"):
        raise argparse.ArgumentTypeError(f"invalid compression {text!r}: use NONE, LZ4, ZLIB or ZSTD")
    return value


def _position(text: str) -> str:
    if text.lower() not in ("earliest", "latest"):
        raise argparse.ArgumentTypeError(f"invalid position {text!r}: use Earliest or Latest")
    return text


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--service-url", "--url", dest="service_url", default=default_service_url(),
                   help=f"broker service URL (default ${SERVICE_URL_ENV} or {DEFAULT_SERVICE_URL})")
    from client.cli import add_auth_options
    add_auth_options(p)
    add_tls_arguments(p)
    p.add_argument("-i", "--stats-interval", dest="interval", type=float, default=10.0, metavar="SECONDS",
                   help="seconds between stats lines (default 10)")
    p.add_argument("--warmup", type=float, default=1.0, metavar="SECONDS",
                   help="run this long first, left out of the summary (default 1)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no stats lines, only the summary")
    p.add_argument("--operation-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="timeout of lookups and producer/consumer creation (default 30)")


def _add_producer_options(p: argparse.ArgumentParser, duration_flags: tuple[str, ...]) -> None:
    p.add_argument("-r", "--rate", type=float, default=100.0, metavar="RATE",
                   help="publish rate in msg/s over all producers (default 100; 0 = as fast as possible)")
    p.add_argument("-s", "--size", type=int, default=1024, metavar="BYTES", help="message size (default 1024)")
    p.add_argument("-n", "--num-producers", type=int, default=1, metavar="N", help="producers (default 1)")
    p.add_argument("-m", "--num-messages", type=int, default=0, metavar="N",
                   help="stop after publishing N messages in total (default 0 = no limit)")
    p.add_argument(*duration_flags, dest="duration", type=float, default=0.0, metavar="SECONDS",
                   help="measured duration after the warm-up (default 0 = until Ctrl-C or -m)")
    p.add_argument("--batch-max-messages", type=int, default=1000, metavar="N", help="default 1000")
    p.add_argument("--batch-max-bytes", type=int, default=128 * 1024, metavar="B", help="default 131072")
    p.add_argument("--batch-delay-ms", type=float, default=1.0, metavar="D",
                   help="max publish delay of a batch in ms (default 1)")
    p.add_argument("--compression", type=_compression, default="NONE", metavar="NONE|LZ4|ZLIB|ZSTD",
                   help="payload compression (default NONE)")
    p.add_argument("--disable-batching", action="store_true", help="one message per entry")
    p.add_argument("-o", "--max-outstanding", type=int, default=5000, metavar="N",
                   help="max unacknowledged messages per producer (default 5000)")
    p.add_argument("--send-timeout-ms", type=int, default=30000, metavar="MS", help="default 30000")


def _add_consumer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--subscription-type", type=_sub_type, default="Exclusive", metavar="TYPE",
                   help="Exclusive (default), Shared, Failover or Key_Shared")
    p.add_argument("--receiver-queue-size", "-rq", type=int, default=1000, metavar="N",
                   help="receiver queue size per consumer (default 1000)")


def build_parser() -> argparse.ArgumentParser:
    """The ``minipulsar-perf`` argument parser (``produce``, ``consume``, ``e2e``)."""
    parser = argparse.ArgumentParser(
        prog="minipulsar-perf", description="Load generator with HdrHistogram latencies (like pulsar-perf).",
        epilog=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("produce", help="publish at a rate and measure publish latency",
                       description="Publish to TOPIC and measure the publish latency.")
    _add_common(p)
    _add_producer_options(p, ("-t", "--test-duration", "-d"))
    p.set_defaults(func=perf_produce)

    c = sub.add_parser("consume", help="consume and measure end-to-end latency",
                       description="Consume TOPIC on subscription -s and measure the end-to-end latency.")
    _add_common(c)
    c.add_argument("-s", "--subscription", required=True, metavar="SUB")
    _add_consumer_options(c)
    c.add_argument("-n", "--num-consumers", type=int, default=1, metavar="N", help="consumers (default 1)")
    c.add_argument("--ack", action="store_true", help="acknowledge every message")
    c.add_argument("-p", "--subscription-position", type=_position, default="Latest", metavar="POSITION",
                   help="where a new subscription starts: Latest (default) or Earliest")
    c.add_argument("-m", "--num-messages", type=int, default=0, metavar="N",
                   help="stop after N messages (default 0 = no limit)")
    c.add_argument("-d", "--test-duration", dest="duration", type=float, default=0.0, metavar="SECONDS",
                   help="measured duration after the warm-up (default 0 = until Ctrl-C)")
    c.set_defaults(func=perf_consume)

    e = sub.add_parser("e2e", help="produce and consume (acking) in one process; end-to-end latency",
                       description="Produce to TOPIC and consume it at the same time in this process "
                                   "(a fresh subscription, every message acknowledged).")
    _add_common(e)
    _add_producer_options(e, ("-d", "--test-duration"))
    _add_consumer_options(e)
    e.add_argument("--subscription", default=None, metavar="SUB",
                   help="subscription to use (default: a fresh one, removed at the end)")
    e.set_defaults(func=perf_e2e, num_consumers=1)
    return parser


def _check(args) -> None:
    for name in ("size", "num_producers", "num_consumers", "max_outstanding", "receiver_queue_size",
                 "batch_max_messages", "batch_max_bytes"):
        if hasattr(args, name) and getattr(args, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("rate", "num_messages", "duration", "warmup", "batch_delay_ms"):
        if hasattr(args, name) and getattr(args, name) < 0:
            raise CliError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.interval <= 0:
        raise CliError("--stats-interval must be > 0 seconds")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point of ``minipulsar-perf``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        _check(args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return run_main(args.func, args, "minipulsar-perf")


if __name__ == "__main__":
    sys.exit(main())
