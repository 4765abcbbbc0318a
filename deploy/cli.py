"""The ``minipulsar`` command (like Pulsar's ``bin/pulsar``): one subcommand per process kind.

To add a subcommand, write ``_add_<name>(subparsers)`` that creates its parser
and sets ``func`` (a callable taking the parsed args and returning an exit
status), and list it in ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def _add_bookie(subparsers) -> None:
    from bookie.__main__ import add_arguments, run_from_args

    p = subparsers.add_parser("bookie", help="run one bookie (like `pulsar bookie`)",
                              description="Run a minipulsar bookie")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_broker(subparsers) -> None:
    from broker.__main__ import add_arguments, run_from_args

    p = subparsers.add_parser("broker", help="run one broker (like `pulsar broker`)",
                              description="Run a minipulsar broker from a TOML config; flags override")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_standalone(subparsers) -> None:
    from deploy.standalone import add_arguments, run_from_args

    p = subparsers.add_parser("standalone", help="bookies + broker in one command (like `pulsar standalone`)",
                              description="Run a one-cluster minipulsar: N bookies and a broker")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_geo(subparsers) -> None:
    from deploy.geo import add_arguments, run_from_args

    p = subparsers.add_parser("geo", help="the three-cluster geo demo: up, status, demo, down, compose",
                              description="Three geo-replicated clusters as local processes (deploy/geo.toml)")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_cluster(subparsers) -> None:
    from deploy.cluster import add_arguments, run_from_args

    p = subparsers.add_parser("cluster", help="a local broker cluster (etcd, bookies, N brokers): up, status, down",
                              description="Several brokers sharing one etcd metadata store and the bookies, "
                                          "as local background processes")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_tokens(subparsers) -> None:
    from deploy.tokens_cli import add_arguments, run_from_args

    p = subparsers.add_parser("tokens", help="keys and JWT tokens for token authentication (like `pulsar tokens`)",
                              description="Create secret keys, key pairs and tokens; show and validate tokens")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def _add_tls(subparsers) -> None:
    from deploy.tls_cli import add_arguments, run_from_args

    p = subparsers.add_parser("tls", help="a local CA and certificates for TLS: create-ca, create-cert",
                              description="Create a local certificate authority and certificates signed by it")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


# name -> function adding that subcommand's parser
SUBCOMMANDS: dict[str, Callable] = {
    "bookie": _add_bookie,
    "broker": _add_broker,
    "standalone": _add_standalone,
    "geo": _add_geo,
    "cluster": _add_cluster,
    "tokens": _add_tokens,
    "tls": _add_tls,
}


def build_parser() -> argparse.ArgumentParser:
    """The ``minipulsar`` argument parser with every subcommand of SUBCOMMANDS."""
    parser = argparse.ArgumentParser(prog="minipulsar", description="minipulsar process launcher")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    argv = sys.argv[1:]
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, add in SUBCOMMANDS.items():
        if wanted in SUBCOMMANDS and name != wanted:
            # Only the chosen subcommand's modules are imported (fast start, and a
            # broken optional subcommand cannot stop the others).
            subparsers.add_parser(name)
            continue
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: parse ``argv`` and run the subcommand; returns its exit status."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
