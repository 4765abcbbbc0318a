"""JWT token keys and tokens (Pulsar's ``AuthTokenUtils`` and ``pulsar tokens``):
pure logic, no I/O but reading key files. Shared by the broker, the bookie and
the tools (``broker.security.tokens`` re-exports it).

- Key values are Pulsar's: ``file:///path/to/key`` or ``data:;base64,<base64>``
  (:func:`read_key_value`). A secret key (HS256/384/512) is raw bytes; an RSA
  key pair (RS256/384/512) is DER (as Pulsar writes them: PKCS#8 private key,
  X.509 SubjectPublicKeyInfo public key); PEM is accepted too.
- Tokens are signed JWTs whose ``sub`` claim is the role and whose optional
  ``exp`` claim is the expiry (seconds since the epoch), checked with ``pyjwt``.

Errors: :class:`TokenError` (a ValueError) with a message saying what is wrong.
"""
from __future__ import annotations

import base64
import re
import secrets
import time
from typing import Any, Optional
from urllib.parse import unquote, urlparse

import jwt

__all__ = ["TokenError", "SECRET_ALGORITHMS", "KEY_PAIR_ALGORITHMS", "read_key_value", "create_secret_key",
           "create_key_pair", "load_private_key", "load_public_key", "create_token", "validate_token",
           "decode_unverified", "parse_relative_time"]

SECRET_ALGORITHMS = ("HS256", "HS384", "HS512")
KEY_PAIR_ALGORITHMS = ("RS256", "RS384", "RS512")
_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


class TokenError(ValueError):
    """A key or token that cannot be used; the message says what is wrong."""


def read_key_value(value: str) -> bytes:
    """The bytes of a key given as Pulsar does: ``file:///abs/path`` (or
    ``file:relative/path``) or ``data:;base64,<base64>`` (also ``data:base64,...``).
    Raises TokenError for another form, an unreadable file or bad base64."""
    if not isinstance(value, str) or not value.strip():
        raise TokenError("no key given: use file:///path/to/key or data:;base64,<base64 of the key>")
    value = value.strip()
    if value.startswith("data:"):
        head, sep, data = value[5:].partition(",")
        if not sep or "base64" not in head:
            raise TokenError(f"key {value[:40]!r}: a data: key must be data:;base64,<base64 of the key>")
        try:
            return base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise TokenError(f"key data:;base64,...: not valid base64 ({exc})") from None
    if value.startswith("file:"):
        if value.startswith("file://"):
            parsed = urlparse(value)
            if parsed.netloc not in ("", "localhost"):
                raise TokenError(f"key {value[:60]!r}: use file:///absolute/path (three slashes)")
            path = unquote(parsed.path)
        else:
            path = unquote(value[5:])                      # file:relative/path
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise TokenError(f"cannot read key file {path}: {exc.strerror or exc}") from None
    raise TokenError(f"key {value[:40]!r}: give file:///path/to/key or data:;base64,<base64 of the key>")


def create_secret_key(algorithm: str = "HS256") -> bytes:
    """A random secret key for ``algorithm`` (HS256: 32 bytes, HS384: 48, HS512: 64),
    as ``pulsar tokens create-secret-key``. Raises TokenError for another algorithm."""
    if algorithm not in _SECRET_BYTES:
        raise TokenError(f"secret keys are for {', '.join(SECRET_ALGORITHMS)}, not {algorithm}")
    return secrets.token_bytes(_SECRET_BYTES[algorithm])


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """A new 2048-bit RSA key pair ``(private_der, public_der)`` (PKCS#8, X.509 DER,
    as ``pulsar tokens create-key-pair``). Raises TokenError for another algorithm."""
    if algorithm not in KEY_PAIR_ALGORITHMS:
        raise TokenError(f"key pairs are for {', '.join(KEY_PAIR_ALGORITHMS)}, not {algorithm}")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def load_private_key(data: bytes) -> Any:
    """An RSA private key object from DER (PKCS#8) or PEM bytes. Raises TokenError."""
    from cryptography.hazmat.primitives import serialization
    try:
        if data.lstrip().startswith(b"-----"):
            return serialization.load_pem_private_key(data, password=None)
        return serialization.load_der_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise TokenError(f"not a private key (DER or PEM, unencrypted): {exc}") from None


def load_public_key(data: bytes) -> Any:
    """An RSA public key object from DER (X.509) or PEM bytes. Raises TokenError."""
    from cryptography.hazmat.primitives import serialization
    try:
        if data.lstrip().startswith(b"-----"):
            return serialization.load_pem_public_key(data)
        return serialization.load_der_public_key(data)
    except (ValueError, TypeError) as exc:
        raise TokenError(f"not a public key (DER or PEM): {exc}") from None


def parse_relative_time(text: str) -> int:
    """Seconds of a Pulsar relative time (``RelativeTimeUtil``): a number and a
    unit ``s``, ``m`` (minutes), ``h``, ``d``, ``w`` or ``y``; a bare number is
    seconds. Raises TokenError otherwise or for a value <= 0."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdwy]?)\s*", str(text))
    if not m or int(m.group(1)) <= 0:
        raise TokenError(f"expiry time {text!r}: give a positive number with a unit s, m, h, d, w or y "
                         f"(e.g. 1h, 30m, 7d)")
    return int(m.group(1)) * _UNITS[m.group(2) or "s"]


def create_token(key: Any, subject: str, algorithm: str, expiry_seconds: Optional[int] = None,
                 now: Optional[float] = None) -> str:
    """A signed JWT with ``sub`` = ``subject`` (the role) and, when
    ``expiry_seconds`` is given, ``exp`` = now + that many seconds. ``key``: the
    secret key bytes (HS*) or a private key (bytes or object, RS*). Raises
    TokenError for an empty subject, an unknown algorithm or a key of the wrong kind."""
    if not isinstance(subject, str) or not subject:
        raise TokenError("the token needs a subject (the role), e.g. --subject my-role")
    if algorithm not in SECRET_ALGORITHMS + KEY_PAIR_ALGORITHMS:
        raise TokenError(f"unknown signature algorithm {algorithm}; use one of "
                         f"{', '.join(SECRET_ALGORITHMS + KEY_PAIR_ALGORITHMS)}")
    if algorithm in KEY_PAIR_ALGORITHMS and isinstance(key, bytes):
        key = load_private_key(key)
    claims: dict[str, Any] = {"sub": subject}
    if expiry_seconds is not None:
        claims["exp"] = int((time.time() if now is None else now) + expiry_seconds)
    try:
        return jwt.encode(claims, key, algorithm=algorithm)
    except (jwt.PyJWTError, TypeError, ValueError) as exc:
        raise TokenError(f"cannot sign with this key and {algorithm}: {exc}") from None


def decode_unverified(token: str) -> tuple[dict, dict]:
    """``(header, claims)`` of a JWT without checking its signature or expiry
    (``pulsar tokens show``). Raises TokenError for something that is not a JWT."""
    try:
        return jwt.get_unverified_header(token), jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise TokenError(f"not a JWT token ({exc})") from None


def validate_token(token: str, key: Any, algorithms: tuple[str, ...], leeway_s: float = 0) -> dict:
    """The claims of ``token`` once its signature verifies with ``key`` (secret
    key bytes or a public key object) for one of ``algorithms`` and it has not
    expired (``exp``, with ``leeway_s`` seconds of clock skew). Raises TokenError
    saying which: malformed, wrong algorithm, bad signature, expired, no ``sub``."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise TokenError(f"the token is not a JWT ({exc})") from None
    alg = header.get("alg")
    if alg not in algorithms:
        raise TokenError(f"the token is signed with {alg!r}, the key expects {'/'.join(algorithms)}")
    try:
        claims = jwt.decode(token, key, algorithms=list(algorithms), leeway=leeway_s,
                            options={"require": [], "verify_aud": False})
    except jwt.ExpiredSignatureError:
        exp = decode_unverified(token)[1].get("exp")
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp)) if isinstance(exp, (int, float)) else "?"
        raise TokenError(f"the token expired at {when}; get a new token") from None
    except jwt.InvalidSignatureError:
        raise TokenError("the token's signature does not verify with the key (tampered, or signed "
                         "with another key)") from None
    except jwt.PyJWTError as exc:
        raise TokenError(f"invalid token ({exc})") from None
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise TokenError("the token has no subject ('sub' claim): it names no role")
    return claims
