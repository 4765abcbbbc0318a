"""``minipulsar-client``: produce and consume from the shell, like Pulsar's ``pulsar-client``.

    minipulsar-client produce my-topic -m "hello" -n 10
    minipulsar-client produce my-topic -m "a,b,c" -k user-1 -p source=shell --rate 100
    minipulsar-client consume my-topic -s my-sub -t Shared -n 10 -p Earliest
    minipulsar-client consume my-topic -s my-sub -n 0          # forever, Ctrl-C stops

``produce`` sends every message of ``-m`` (split at ``-s``, default ``,``) ``-n``
times; ``consume`` prints each message as pulsar-client does
(``----- got message -----`` then ``key:[..], properties:[..], content:..``)
unless ``--quiet``, and acknowledges it.  Both show a progress line on stderr
(redrawn in place on a terminal, one line per second otherwise) and end with
a summary line (``N messages successfully produced/consumed ...``).

The broker is ``--service-url`` (default ``$MINIPULSAR_SERVICE_URL`` or
``minipulsar://127.0.0.1:6600``).  Errors print one line ``error: <message>``
and exit with status 1; bad arguments exit with 2 (argparse).

The helpers ``default_service_url``, ``run_main`` and ``Progress`` are shared
with ``minipulsar-admin`` (client/admin_cli.py) and ``minipulsar-perf``
(client/perf.py).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from typing import Callable, TextIO

from proto.common import run_async

__all__ = ["main", "build_parser", "default_service_url", "run_main", "Progress", "DEFAULT_SERVICE_URL",
           "add_tls_arguments", "tls_kwargs",
           "SERVICE_URL_ENV", "format_message", "parse_properties"]

DEFAULT_SERVICE_URL = "minipulsar://127.0.0.1:6600"
SERVICE_URL_ENV = "MINIPULSAR_SERVICE_URL"
_POLL_MS = 200
_SUB_TYPES = {"exclusive": "Exclusive", "shared": "Shared", "failover": "Failover", "key_shared": "KeyShared",
              "keyshared": "KeyShared"}


# ---------------------------------------------------------------------------- shared helpers
def default_service_url() -> str:
    """``$MINIPULSAR_SERVICE_URL`` if set, else ``minipulsar://127.0.0.1:6600``."""
    return os.environ.get(SERVICE_URL_ENV) or DEFAULT_SERVICE_URL


def add_tls_arguments(parser: argparse.ArgumentParser, suppress: bool = False) -> None:
    """The TLS flags shared by minipulsar-client, -admin and -perf (Pulsar's
    client.conf keys tlsTrustCertsFilePath, tlsCertificateFilePath, tlsKeyFilePath,
    tlsAllowInsecureConnection; pulsar-admin's --tls-trust-cert-path and
    pulsar-perf's --trust-cert-file as aliases). ``suppress``: for a subcommand's
    copy of options also accepted before it (does not reset their values)."""
    def default(value):
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--tls-trust-certs-file-path", "--tls-trust-cert-path", "--trust-cert-file",
                        dest="tls_trust_certs_file_path", default=default(None), metavar="CA.pem",
                        help="PEM CA bundle trusted for a minipulsar+ssl:// service URL (default: the system roots)")
    parser.add_argument("--tls-certificate-file-path", "--tls-cert-file", dest="tls_certificate_file_path",
                        default=default(None), metavar="CERT.pem", help="client certificate (mutual TLS)")
    parser.add_argument("--tls-key-file-path", "--tls-key-file", dest="tls_key_file_path", default=default(None),
                        metavar="KEY.pem", help="private key of --tls-certificate-file-path")
    parser.add_argument("--tls-allow-insecure-connection", "--tls-allow-insecure",
                        dest="tls_allow_insecure_connection", action="store_true", default=default(False),
                        help="accepted for Pulsar compatibility; gRPC always verifies the broker's certificate")


def tls_kwargs(args: argparse.Namespace) -> dict:
    """The ``Client`` / ``AdminClient`` TLS keyword arguments of parsed ``args`` (see ``add_tls_arguments``)."""
    return {key: getattr(args, key, None) for key in ("tls_trust_certs_file_path", "tls_certificate_file_path",
                                                       "tls_key_file_path")} | \
        {"tls_allow_insecure_connection": bool(getattr(args, "tls_allow_insecure_connection", False))}


class CliError(Exception):
    """An error to print as ``error: <message>`` with exit status 1."""


def error_line(exc: BaseException) -> str:
    """The one-line text of an error: the message of a ``PulsarException``
    (which says what to do), else ``Type: message``."""
    from client.errors import PulsarException
    unreachable = getattr(exc, "unreachable", None)
    if unreachable and not getattr(exc, "tls_problem", False):  # client.connection.check_reachable, client.admin
        return (f"no answer from the broker at {unreachable[0]} ({unreachable[1]}): is it running? start it "
                f"(e.g. minipulsar standalone) or give the right --service-url (or ${SERVICE_URL_ENV})")
    if isinstance(exc, PulsarException):
        return exc.message
    if isinstance(exc, CliError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def run_main(coro_fn: Callable, args, prog: str) -> int:
    """Run ``await coro_fn(args)`` on a fresh event loop (uvloop when
    installed) and return its exit status; ``PulsarException``/``CliError``
    become ``error: <message>`` on stderr and status 1, Ctrl-C status 130."""
    from client.errors import PulsarException

    try:
        return int(run_async(coro_fn(args)) or 0)
    except (PulsarException, CliError, OSError) as exc:
        print(f"error: {error_line(exc)}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130


def install_stop_handlers(stop: asyncio.Event) -> None:
    """SIGINT/SIGTERM set ``stop`` (so the command ends cleanly with its summary);
    a second SIGINT interrupts at once."""
    loop = asyncio.get_running_loop()

    def on_signal(sig):
        if stop.is_set() and sig == signal.SIGINT:
            loop.remove_signal_handler(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError):  # not the main thread / platform without signals
            pass


class Progress:
    """A progress line on ``stream`` (stderr): redrawn in place (``\\r``) every
    ``tty_interval`` s when the stream is a terminal, else printed as a new
    line every ``interval`` s.  ``render(elapsed_s)`` returns the text.  Call
    ``maybe_update()`` often (cheap when not due) and ``finish()`` at the end."""

    def __init__(self, render: Callable[[float], str], stream: TextIO | None = None, interval: float = 1.0,
                 tty_interval: float = 0.2, enabled: bool = True) -> None:
        self.render = render
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self.interval = tty_interval if self.tty else interval
        self.enabled = enabled
        self.start = time.monotonic()
        self._next = self.start + self.interval
        self._width = 0

    def maybe_update(self, now: float | None = None) -> None:
        """Show the line if an interval has passed."""
        now = time.monotonic() if now is None else now
        if self.enabled and now >= self._next:
            self._next = now + self.interval
            self._show(self.render(now - self.start))

    def _show(self, text: str) -> None:
        if self.tty:
            pad = max(0, self._width - len(text))
            self._width = len(text)
            self.stream.write("\r" + text + " " * pad)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        """End the in-place line (a newline on a terminal)."""
        if self.enabled and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Update the line until ``stop`` is set (a background task)."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            self.maybe_update()


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def parse_properties(items: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` -> dict; raises ``CliError`` for an item without ``=``."""
    props: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"bad property {item!r}: use -p key=value")
        props[key] = value
    return props


def format_message(msg) -> str:
    """pulsar-client's print of a received message: ``----- got message -----``
    then ``key:[<key or null>], properties:[k=v, ...], content:<payload>``
    (payload decoded as UTF-8, undecodable bytes escaped)."""
    key = msg.partition_key() if msg.has_partition_key() else "null"
    props = ", ".join(f"{k}={v}" for k, v in sorted(msg.properties().items()))
    content = msg.data().decode("utf-8", errors="backslashreplace")
    return f"----- got message -----\nkey:[{key}], properties:[{props}], content:{content}\n"


# ---------------------------------------------------------------------------- produce
def _messages(args) -> list[bytes]:
    out: list[bytes] = []
    for text in args.messages or []:
        parts = text.split(args.separator) if args.separator else [text]
        out.extend(p.encode() for p in parts)
    for path in args.files or []:
        try:
            with open(path, "rb") as f:
                out.append(f.read())
        except OSError as exc:
            raise CliError(f"cannot read {path}: {exc.strerror}") from None
    if not out:
        raise CliError("nothing to send: give messages with -m MSG (or files with -f FILE)")
    return out


async def produce(args) -> int:
    """``minipulsar-client produce``: send every message ``-n`` times, at most
    ``--rate`` msg/s (0 = as fast as possible); returns the exit status."""
    from client.client import AsyncClient
    from client.connection import check_reachable
    from client.perf_stats import TokenBucket

    if args.num_produce < 1:
        raise CliError(f"-n/--num-produce must be >= 1, got {args.num_produce}")
    if args.rate < 0:
        raise CliError(f"--rate must be >= 0 (0 = no limit), got {args.rate}")
    payloads = _messages(args)
    properties = parse_properties(args.properties)
    total = len(payloads) * args.num_produce
    stop = asyncio.Event()
    install_stop_handlers(stop)
    state = {"sent": 0, "acked": 0, "failed": 0, "error": None}
    all_settled = asyncio.Event()
    room = asyncio.Event()
    max_outstanding = 1000

    def on_settled(exc, _mid) -> None:
        if exc is not None:
            state["failed"] += 1
            if state["error"] is None:
                state["error"] = exc
                stop.set()
        else:
            state["acked"] += 1
        if state["acked"] + state["failed"] >= total:
            all_settled.set()
        if state["sent"] - state["acked"] - state["failed"] < max_outstanding:
            room.set()

    t0 = time.monotonic()

    def render(elapsed: float) -> str:
        return (f"produced {state['acked']}/{total} messages ({_rate(state['acked'], elapsed):.1f} msg/s), "
                f"pending {state['sent'] - state['acked'] - state['failed']}, failed {state['failed']}")

    progress = Progress(render, enabled=not args.no_progress)
    await check_reachable(args.service_url)
    async with AsyncClient(args.service_url, authentication=cli_authentication(args), **tls_kwargs(args)) as client:
        producer = await client.create_producer(
            args.topic, batching_enabled=not args.disable_batching, max_pending_messages=max_outstanding,
            block_if_queue_full=True, batching_max_publish_delay_ms=1)
        t0 = progress.start = time.monotonic()
        progress_task = asyncio.create_task(progress.run(all_settled))
        bucket = TokenBucket(args.rate, time.monotonic())
        key = args.key
        try:
            for _ in range(args.num_produce):
                for payload in payloads:
                    if stop.is_set():
                        break
                    while not bucket.take(1, time.monotonic()):
                        await asyncio.sleep(max(0.001, bucket.delay(time.monotonic())))
                    while state["sent"] - state["acked"] - state["failed"] >= max_outstanding:
                        room.clear()
                        await room.wait()
                    producer.send_async(payload, on_settled, properties=properties or None, partition_key=key)
                    state["sent"] += 1
                    if state["sent"] % 200 == 0:
                        await asyncio.sleep(0)
            await producer.flush()  # every send settles (persisted, failed or timed out)
        finally:
            all_settled.set()
            await progress_task
            progress.finish()
        await producer.close()
    elapsed = time.monotonic() - t0
    print(f"{state['acked']} messages successfully produced in {elapsed:.2f} s "
          f"({_rate(state['acked'], elapsed):.1f} msg/s)", flush=True)
    if state["error"] is not None:
        raise CliError(f"{state['failed']} message(s) failed: {error_line(state['error'])}")
    return 0 if state["acked"] == total else 130  # fewer: interrupted


# ---------------------------------------------------------------------------- consume
async def consume(args) -> int:
    """``minipulsar-client consume``: receive ``-n`` messages (0 = until Ctrl-C),
    print and acknowledge each; returns the exit status (1 when ``--timeout``
    expired before ``-n`` messages arrived)."""
    from client.client import AsyncClient
    from client.connection import check_reachable
    from client.consumer_config import ConsumerType, InitialPosition
    from client.errors import Timeout

    if args.num_messages < 0:
        raise CliError(f"-n/--num-messages must be >= 0 (0 = forever), got {args.num_messages}")
    sub_type = ConsumerType[_SUB_TYPES[args.subscription_type.lower()]]
    position = InitialPosition[args.subscription_position.capitalize()]
    stop = asyncio.Event()
    install_stop_handlers(stop)
    received = 0
    wanted = args.num_messages
    out = sys.stdout

    def render(elapsed: float) -> str:
        target = f"/{wanted}" if wanted else ""
        return f"consumed {received}{target} messages ({_rate(received, elapsed):.1f} msg/s)"

    progress = Progress(render, enabled=not args.no_progress)
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    await check_reachable(args.service_url)
    async with AsyncClient(args.service_url, authentication=cli_authentication(args), **tls_kwargs(args)) as client:
        consumer = await client.subscribe(args.topic, args.subscription_name, consumer_type=sub_type,
                                          initial_position=position)
        t0 = progress.start = time.monotonic()
        try:
            while not stop.is_set() and (wanted == 0 or received < wanted):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                try:  # short waits, so that Ctrl-C and --timeout are noticed
                    msg = await consumer.receive(timeout_millis=_POLL_MS)
                except Timeout:
                    progress.maybe_update()
                    continue
                if not args.quiet:
                    out.write(format_message(msg))
                    out.flush()
                consumer.acknowledge(msg)
                received += 1
                progress.maybe_update()
        finally:
            progress.finish()
            await consumer.close()
    elapsed = time.monotonic() - t0
    print(f"{received} messages successfully consumed in {elapsed:.2f} s ({_rate(received, elapsed):.1f} msg/s)",
          flush=True)
    if wanted and received < wanted and not stop.is_set():
        print(f"error: received only {received} of {wanted} messages within --timeout {args.timeout:g} s; "
              f"check that messages are being produced (and -p Earliest for messages already published)",
              file=sys.stderr, flush=True)
        return 1
    return 0


# ---------------------------------------------------------------------------- parser
def _sub_type(text: str) -> str:
    if text.lower() not in _SUB_TYPES:
        raise argparse.ArgumentTypeError(f"invalid subscription type {text!r}: use Exclusive, Shared, Failover "
                                          f"or Key_Shared")
    return text


def _position(text: str) -> str:
    if text.lower() not in ("earliest", "latest"):
        raise argparse.ArgumentTypeError(f"invalid position {text!r}: use Earliest or Latest")
    return text


def add_auth_options(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    """pulsar-client's ``--auth-plugin`` / ``--auth-params`` (``token:<jwt>`` or
    ``file:///path/to/token``); read back with :func:`cli_authentication`."""
    p.add_argument("--auth-plugin", dest="auth_plugin", default=argparse.SUPPRESS if suppress else None,
                   metavar="PLUGIN", help="authentication plugin: AuthenticationToken (the default with --auth-params)")
    p.add_argument("--auth-params", dest="auth_params", default=argparse.SUPPRESS if suppress else None,
                   metavar="PARAMS", help="credentials: token:<jwt> or file:///path/to/token (read again when "
                                          "the file changes)")


def cli_authentication(args):
    """The ``client.auth.Authentication`` of ``--auth-plugin`` / ``--auth-params`` (None
    without); raises InvalidConfiguration for bad params."""
    from client.auth import authentication_from_params
    return authentication_from_params(getattr(args, "auth_plugin", None), getattr(args, "auth_params", None))


def build_parser() -> argparse.ArgumentParser:
    """The ``minipulsar-client`` argument parser (subcommands ``produce``, ``consume``)."""
    def common_options(suppress: bool) -> argparse.ArgumentParser:
        # given before or after the subcommand; the subcommand's copy must not reset the value
        common = argparse.ArgumentParser(add_help=False)
        common.add_argument("--service-url", "--url", dest="service_url",
                            default=argparse.SUPPRESS if suppress else default_service_url(),
                            help=f"broker service URL (default ${SERVICE_URL_ENV} or {DEFAULT_SERVICE_URL})")
        common.add_argument("--no-progress", action="store_true",
                            default=argparse.SUPPRESS if suppress else False, help="no progress line on stderr")
        add_auth_options(common, suppress)
        add_tls_arguments(common, suppress)
        return common

    common = common_options(suppress=True)
    parser = argparse.ArgumentParser(
        prog="minipulsar-client", parents=[common_options(suppress=False)],
        description="Produce or consume messages from the shell (like pulsar-client).",
        epilog="Examples:\n  minipulsar-client produce my-topic -m hello -n 10\n"
               "  minipulsar-client consume my-topic -s my-sub -n 10 -p Earliest",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("produce", parents=[common], help="send messages to a topic",
                       description="Send messages to TOPIC (each -m message, -n times).")
    p.add_argument("topic", metavar="TOPIC", help="topic name (short names resolve to public/default)")
    p.add_argument("-m", "--messages", action="append", metavar="MSG",
                   help="message(s) to send; split at the separator; repeatable")
    p.add_argument("-f", "--files", action="append", metavar="FILE", help="send the content of FILE; repeatable")
    p.add_argument("-n", "--num-produce", type=int, default=1, metavar="COUNT",
                   help="send the messages this many times (default 1)")
    p.add_argument("-k", "--key", default=None, help="partition key of every message")
    p.add_argument("-p", "--property", dest="properties", action="append", metavar="KEY=VALUE",
                   help="message property; repeatable")
    p.add_argument("-s", "--separator", default=",", help="separator of the -m messages (default ',')")
    p.add_argument("-r", "--rate", type=float, default=0.0, metavar="R",
                   help="publish at most R messages per second (default 0 = no limit)")
    p.add_argument("--disable-batching", action="store_true", help="send each message as its own entry")
    p.set_defaults(func=produce)

    c = sub.add_parser("consume", parents=[common], help="receive, print and acknowledge messages",
                       description="Receive messages from TOPIC on subscription -s, print and acknowledge them.")
    c.add_argument("topic", metavar="TOPIC")
    c.add_argument("-s", "--subscription-name", required=True, metavar="SUB", help="subscription name")
    c.add_argument("-t", "--subscription-type", type=_sub_type, default="Exclusive", metavar="TYPE",
                   help="Exclusive (default), Shared, Failover or Key_Shared")
    c.add_argument("-n", "--num-messages", type=int, default=1, metavar="COUNT",
                   help="messages to consume (default 1; 0 = until Ctrl-C)")
    c.add_argument("-p", "--subscription-position", type=_position, default="Latest", metavar="POSITION",
                   help="where a new subscription starts: Latest (default) or Earliest")
    c.add_argument("-q", "--quiet", action="store_true", help="do not print the messages")
    c.add_argument("--timeout", type=float, default=0.0, metavar="SECONDS",
                   help="give up after SECONDS (default 0 = wait forever); exit status 1 if fewer than "
                        "COUNT messages arrived")
    c.set_defaults(func=consume)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point of ``minipulsar-client``; returns the exit status."""
    args = build_parser().parse_args(argv)
    return run_main(args.func, args, "minipulsar-client")


if __name__ == "__main__":
    sys.exit(main())
