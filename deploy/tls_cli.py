"""``minipulsar tls create-ca / create-cert``: a local CA and certificates for
the demo and the tests (see :mod:`deploy.tls_certs`).

    minipulsar tls create-ca --output-dir certs
    minipulsar tls create-cert --ca-dir certs --name broker --host 127.0.0.1 --host localhost
    minipulsar tls create-cert --ca-dir certs --name broker-client --client --no-server

Exit status 0 on success (the written paths are printed), 2 for bad input.
"""
from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "run_from_args"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``tls`` subcommands ``create-ca`` and ``create-cert`` on ``parser``."""
    sub = parser.add_subparsers(dest="tls_command", metavar="{create-ca,create-cert}", required=True)
    ca = sub.add_parser("create-ca", help="create a self-signed CA: ca.cert.pem + ca.key.pem")
    ca.add_argument("--output-dir", required=True, help="directory for ca.cert.pem and ca.key.pem")
    ca.add_argument("--common-name", default="minipulsar CA", help="the CA's subject CN")
    ca.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")
    cert = sub.add_parser("create-cert", help="create <name>.cert.pem + <name>.key.pem signed by the CA")
    cert.add_argument("--ca-dir", required=True, help="directory holding ca.cert.pem and ca.key.pem")
    cert.add_argument("--name", required=True, help="certificate name (CN and file names), e.g. broker")
    cert.add_argument("--host", action="append", default=None, metavar="HOST",
                      help="subject alternative name (IP or DNS name); repeat or comma-separate; "
                           "default 127.0.0.1 and localhost")
    cert.add_argument("--output-dir", default=None, help="where to write the files (default: --ca-dir)")
    cert.add_argument("--client", action="store_true", default=False,
                      help="also usable as a client certificate (mutual TLS, clientAuth)")
    cert.add_argument("--no-server", dest="server", action="store_false", default=True,
                      help="not a server certificate (a client-only certificate)")
    cert.add_argument("--days", type=int, default=825, help="validity in days (default 825)")


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``create-ca`` / ``create-cert``; prints the paths written. Returns the exit status."""
    from deploy.tls_certs import TlsCertError, create_ca, create_cert

    try:
        if args.tls_command == "create-ca":
            files = create_ca(args.output_dir, args.common_name, args.days)
        else:
            hosts = None
            if args.host:
                hosts = [h.strip() for item in args.host for h in item.split(",")]
            files = create_cert(args.ca_dir, args.name, hosts, args.output_dir, server=args.server,
                                client=args.client, days=args.days)
    except TlsCertError as exc:
        print(f"minipulsar tls: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"minipulsar tls: cannot write: {exc}", file=sys.stderr)
        return 2
    print(f"certificate: {files.cert}")
    print(f"private key: {files.key}")
    return 0
