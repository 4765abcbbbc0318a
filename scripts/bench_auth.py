"""Cost of token authentication and authorization (issue 17, Figures): end-to-end
msgs/s and latency p99 at 5,000 msg/s, with and without, in the same run.

Two stacks run side by side on free loopback ports, each one bookie (Qw = Qa =
E = 1, no fsync) and one broker: ``plain`` (security off, as today) and
``auth`` (``authentication_enabled`` + ``authorization_enabled``, HS256 token
key, the bookie checking the broker's token too). ``minipulsar-perf e2e``
runs against each in turn, alternating plain / auth, ``--runs`` times
(default 3): ``-r 5000`` (the rate and the end-to-end p99 at that rate) and
``-r 0`` (the most it sustains: end-to-end msgs/s). The auth client is a role
with ``produce,consume`` granted on the namespace (not a superuser: the
permission is looked up). Prints one line per run and the median [min-max]
of each figure per side; ``--json`` adds one JSON line.

    .venv/bin/python scripts/bench_auth.py [--runs 3] [--duration 10] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.procs import ProcessTracker  # noqa: E402
from tests.security_support import Keys, start_secure_broker  # noqa: E402


def start_plain(base: Path, tracker: ProcessTracker):
    from tests.procs import start_bookie, start_broker
    bookie = start_bookie(base / "bookie", journal_sync=False, tracker=tracker)
    conf = base / "broker.toml"
    conf.write_text("managed_ledger_default_ensemble_size = 1\nmanaged_ledger_default_write_quorum = 1\n"
                    "managed_ledger_default_ack_quorum = 1\n")
    return start_broker(base / "broker", [bookie.address], config_file=conf, tracker=tracker)


def perf(url: str, topic: str, rate: int, duration: float, auth_params: str | None) -> dict:
    cmd = [sys.executable, "-m", "client.perf", "e2e", topic, "--service-url", url, "-r", str(rate), "-s", "100",
           "-d", str(duration), "--warmup", "2", "--json", "-q"]
    if auth_params:
        cmd += ["--auth-params", auth_params]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"perf failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def figures(doc: dict) -> dict:
    """end-to-end msgs/s and p99 (ms) of a perf e2e summary."""
    side = doc["consume"]                      # the e2e consumer side: end-to-end latency
    return {"msg_rate": side["msg_per_s"], "p99_ms": side["latency_ms"]["p99"], "errors": side["errors"]}


def micro() -> dict:
    """CPU cost of one token check on the server (``AuthenticationService.authenticate``: a
    verified token found in the cache, and a first-seen token verified with HS256 / RS256),
    in microseconds per call (median of 5 timings), in this process."""
    import timeit

    from proto.auth_server import AuthenticationProviderToken, AuthenticationService
    from proto.auth_tokens import create_key_pair, create_secret_key, create_token
    import base64
    secret = create_secret_key()
    private, public = create_key_pair()
    hs = AuthenticationService([AuthenticationProviderToken(
        token_secret_key="data:;base64," + base64.b64encode(secret).decode())])
    rs = AuthenticationService([AuthenticationProviderToken(
        token_public_key="data:;base64," + base64.b64encode(public).decode())])
    hs_md = [("authorization", "Bearer " + create_token(secret, "app", "HS256", 3600))]
    rs_md = [("authorization", "Bearer " + create_token(private, "app", "RS256", 3600))]

    def per_call(fn, n: int) -> float:
        return statistics.median(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6

    def uncached(service, md):
        def run():
            service._cache.clear()
            service.authenticate(md)
        return run
    return {"cached_us": round(per_call(lambda: hs.authenticate(hs_md), 20000), 2),
            "hs256_verify_us": round(per_call(uncached(hs, hs_md), 2000), 1),
            "rs256_verify_us": round(per_call(uncached(rs, rs_md), 500), 1)}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} [{min(values):,.1f}-{max(values):,.1f}]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds of each perf run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    cost = micro()
    print(f"token check per call (server): cached {cost['cached_us']} us, first use HS256 "
          f"{cost['hs256_verify_us']} us, RS256 {cost['rs256_verify_us']} us", flush=True)
    tracker = ProcessTracker()
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
            base = Path(tmp)
            (base / "plain").mkdir()
            (base / "auth").mkdir()
            plain = start_plain(base / "plain", tracker)
            keys = Keys(base / "auth")
            _, secure = start_secure_broker(base / "auth", tracker, keys, authorization=True)
            for url, token in ((plain.service_url, None), (secure.service_url, keys.token("admin"))):
                _setup(url, token)
            app = f"token:{keys.token('app')}"
            for run in range(args.runs):
                for side, url, params in (("plain", plain.service_url, None), ("auth", secure.service_url, app)):
                    for rate in (5000, 0):
                        doc = perf(url, f"persistent://bench/ns/t-{side}-{rate}-{run}", rate, args.duration, params)
                        fig = figures(doc)
                        key = f"{side} r={rate or 'max'}"
                        for name, value in fig.items():
                            results.setdefault(key, {}).setdefault(name, []).append(value)
                        print(f"run {run + 1} {key:>13}: {fig['msg_rate']:,.0f} msg/s end to end, "
                              f"p99 {fig['p99_ms']:.2f} ms, errors {fig['errors']}", flush=True)
    finally:
        tracker.kill_all()
    print("\nmedian [min-max] over", args.runs, "runs:")
    for key, figs in results.items():
        print(f"  {key:>13}: {spread(figs['msg_rate'])} msg/s, p99 {spread(figs['p99_ms'])} ms")
    if args.json:
        print(json.dumps({**results, "token_check": cost}, sort_keys=True))
    return 0


def _setup(url: str, admin_token: str | None) -> None:
    """Tenant bench, namespace bench/ns; with security: role app may produce and consume there."""
    import asyncio

    from client import AdminClient, AuthenticationToken

    async def run():
        auth = AuthenticationToken(admin_token) if admin_token else None
        async with AdminClient(url, operation_timeout_seconds=20, authentication=auth) as admin:
            clusters = await admin.list_clusters()
            await admin.create_tenant("bench", clusters[:1] or None)
            await admin.create_namespace("bench/ns")
            if admin_token:
                await admin.grant_namespace_permission("bench/ns", "app", ["produce", "consume"])

    asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
