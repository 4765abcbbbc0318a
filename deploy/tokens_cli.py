"""``minipulsar tokens ...``: keys and JWT tokens for token authentication, with
``pulsar tokens``' verbs and flags:

    minipulsar tokens create-secret-key --output my-secret.key [--base64]
    minipulsar tokens create-key-pair --output-private-key my-private.key --output-public-key my-public.key
    minipulsar tokens create --secret-key file:///path/my-secret.key --subject my-role [--expiry-time 1h]
    minipulsar tokens create --private-key file:///path/my-private.key --subject my-role
    minipulsar tokens show TOKEN | -f FILE | -i
    minipulsar tokens validate --secret-key file:///... TOKEN    (or --public-key)

Keys are given as Pulsar's ``file:///path`` or ``data:;base64,...`` (a bare
path is read as a file). ``create`` prints the token on stdout; ``validate``
prints its claims and exits 1 when the token is refused (the reason on stderr).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys

__all__ = ["add_arguments", "run_from_args"]


def _key_value(value: str) -> str:
    return value if value.startswith(("file:", "data:")) else f"file:{os.path.abspath(value)}"


def _write(path: str, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _read_token(args) -> str:
    if getattr(args, "stdin", False):
        token = sys.stdin.read()
    elif getattr(args, "token_file", None):
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read()
    else:
        token = args.token or ""
    token = token.strip()
    if not token:
        raise ValueError("give the token: as an argument, -f FILE or -i (stdin)")
    return token


def _create_secret_key(args) -> int:
    from broker.security.tokens import create_secret_key
    key = create_secret_key(args.signature_algorithm)
    if args.output:
        _write(args.output, base64.b64encode(key) if args.base64 else key, private=True)
        print(f"secret key written to {args.output}", file=sys.stderr)
    elif args.base64:
        print(base64.b64encode(key).decode())
    else:
        sys.stdout.buffer.write(key)
    return 0


def _create_key_pair(args) -> int:
    from broker.security.tokens import create_key_pair
    if not args.output_private_key or not args.output_public_key:
        raise ValueError("give --output-private-key FILE and --output-public-key FILE")
    private, public = create_key_pair(args.signature_algorithm)
    _write(args.output_private_key, private, private=True)
    _write(args.output_public_key, public, private=False)
    print(f"private key written to {args.output_private_key}, public key to {args.output_public_key}",
          file=sys.stderr)
    return 0


def _create(args) -> int:
    from broker.security.tokens import create_token, parse_relative_time, read_key_value
    if bool(args.secret_key) == bool(args.private_key):
        raise ValueError("give exactly one of --secret-key (HS256) or --private-key (RS256)")
    key = read_key_value(_key_value(args.secret_key or args.private_key))
    algorithm = args.signature_algorithm or ("HS256" if args.secret_key else "RS256")
    expiry = parse_relative_time(args.expiry_time) if args.expiry_time else None
    print(create_token(key, args.subject, algorithm, expiry))
    return 0


def _show(args) -> int:
    from broker.security.tokens import decode_unverified
    header, claims = decode_unverified(_read_token(args))
    print(json.dumps(header, sort_keys=True))
    print("---")
    print(json.dumps(claims, sort_keys=True))
    return 0


def _validate(args) -> int:
    from broker.security.tokens import (KEY_PAIR_ALGORITHMS, SECRET_ALGORITHMS, TokenError, load_public_key,
                                        read_key_value, validate_token)
    if bool(args.secret_key) == bool(args.public_key):
        raise ValueError("give exactly one of --secret-key or --public-key")
    token = _read_token(args)
    if args.secret_key:
        key, algorithms = read_key_value(_key_value(args.secret_key)), SECRET_ALGORITHMS
    else:
        key, algorithms = load_public_key(read_key_value(_key_value(args.public_key))), KEY_PAIR_ALGORITHMS
    if args.signature_algorithm:
        algorithms = (args.signature_algorithm,)
    try:
        claims = validate_token(token, key, algorithms)
    except TokenError as exc:
        print(f"tokens validate: invalid token: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(claims, sort_keys=True))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``tokens`` verbs to ``p``."""
    verbs = p.add_subparsers(dest="tokens_verb", metavar="VERB", required=True)
    v = verbs.add_parser("create-secret-key", help="a new secret key (HS256)")
    v.add_argument("-o", "--output", default=None, metavar="FILE", help="write it there (default: stdout)")
    v.add_argument("-b", "--base64", action="store_true", help="base64-encode it")
    v.add_argument("-a", "--signature-algorithm", default="HS256", choices=["HS256", "HS384", "HS512"])
    v.set_defaults(tokens_func=_create_secret_key)

    v = verbs.add_parser("create-key-pair", help="a new RSA key pair (RS256)")
    v.add_argument("--output-private-key", required=True, metavar="FILE")
    v.add_argument("--output-public-key", required=True, metavar="FILE")
    v.add_argument("-a", "--signature-algorithm", default="RS256", choices=["RS256", "RS384", "RS512"])
    v.set_defaults(tokens_func=_create_key_pair)

    v = verbs.add_parser("create", help="a new token (printed on stdout)")
    v.add_argument("-s", "--subject", required=True, metavar="ROLE", help="the role the token stands for")
    v.add_argument("-e", "--expiry-time", default=None, metavar="TIME", help="e.g. 1h, 30m, 7d, 1y (default: never)")
    v.add_argument("-sk", "--secret-key", default=None, metavar="file:///PATH|data:;base64,...")
    v.add_argument("-pk", "--private-key", default=None, metavar="file:///PATH|data:;base64,...")
    v.add_argument("-a", "--signature-algorithm", default=None,
                   choices=["HS256", "HS384", "HS512", "RS256", "RS384", "RS512"])
    v.set_defaults(tokens_func=_create)

    for name, func, help_text in (("show", _show, "print a token's header and claims (not verified)"),
                                  ("validate", _validate, "verify a token's signature and expiry")):
        v = verbs.add_parser(name, help=help_text)
        v.add_argument("token", nargs="?", default=None, metavar="TOKEN")
        v.add_argument("-i", "--stdin", action="store_true", help="read the token from stdin")
        v.add_argument("-f", "--token-file", default=None, metavar="FILE")
        if name == "validate":
            v.add_argument("-sk", "--secret-key", default=None, metavar="file:///PATH|data:;base64,...")
            v.add_argument("-pk", "--public-key", default=None, metavar="file:///PATH|data:;base64,...")
            v.add_argument("-a", "--signature-algorithm", default=None,
                           choices=["HS256", "HS384", "HS512", "RS256", "RS384", "RS512"])
        v.set_defaults(tokens_func=func)


def run_from_args(args) -> int:
    """Run the chosen verb; exit status 0, 1 for a refused token, 2 for bad input (one line on stderr)."""
    from broker.security.tokens import TokenError
    try:
        return args.tokens_func(args)
    except (TokenError, ValueError, OSError) as exc:
        print(f"tokens {args.tokens_verb}: {exc}", file=sys.stderr)
        return 2
