"""``minipulsar geo up --auth``: the geo demo with token authentication and
authorization on (Pulsar's ``AuthenticationProviderToken`` and
``authorizationEnabled``), its keys and tokens kept in ``<data-dir>/auth``:

- ``secret.key``: the HS256 secret key every broker and bookie checks tokens
  with (one key for the three clusters, as one Pulsar instance shares its
  ``tokenSecretKey``);
- ``broker.token``: role ``geo-broker``, a superuser: what brokers present to
  other brokers, to remote clusters (the replicators) and to the bookies
  (``broker_client_authentication_parameters``,
  ``bookkeeper_client_authentication_parameters``); the bookies serve this
  role only (``--authorized-roles geo-broker``): every other one, the
  administrator's included, gets PERMISSION_DENIED there;
- ``admin.token``: role ``geo-admin``, a superuser: what ``geo up`` (set-up),
  ``geo demo`` and ``geo status`` use.

The TLS compose stack (``docker-compose.tls.yml``) has the same files: its
``geo-certs`` service (``geo certs --tls-dir /tls --auth``) writes them once into
``/tls/auth`` beside the certificates, and the brokers, bookies, ``geo-setup``,
the dashboard and the health checks read them there (``--auth-dir /tls/auth``).

Other roles get access with ``minipulsar tokens create --secret-key
file://<data-dir>/auth/secret.key --subject ROLE`` and ``minipulsar-admin
namespaces grant-permission``. No expiry: the demo's tokens live as long as
its data dir.
"""
from __future__ import annotations

import os
from pathlib import Path

from proto.auth_tokens import create_secret_key, create_token

__all__ = ["AUTH_DIR", "AUTH_FILES", "BROKER_ROLE", "ADMIN_ROLE", "ensure_auth_material", "missing_auth_files",
           "token_role", "secret_key_url", "admin_authentication", "broker_authentication", "broker_auth_settings",
           "bookie_auth_args"]

AUTH_DIR = "auth"
BROKER_ROLE = "geo-broker"
ADMIN_ROLE = "geo-admin"
AUTH_FILES = ("secret.key", "broker.token", "admin.token")   # what ensure_auth_material writes


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def ensure_auth_material(data_dir: Path) -> str:
    """Create (once) ``<data_dir>/auth`` with the secret key and the broker's and
    administrator's tokens; returns the directory (absolute path)."""
    auth = (Path(data_dir) / AUTH_DIR).resolve()
    auth.mkdir(parents=True, exist_ok=True)
    key_file = auth / "secret.key"
    if not key_file.exists():
        _write_private(key_file, create_secret_key("HS256"))
    key = key_file.read_bytes()
    for role, name in ((BROKER_ROLE, "broker.token"), (ADMIN_ROLE, "admin.token")):
        if not (auth / name).exists():
            _write_private(auth / name, create_token(key, role, "HS256").encode())
    return str(auth)


def missing_auth_files(auth_dir: str | Path) -> list[str]:
    """The files of ``AUTH_FILES`` that are not (non-empty) files in ``auth_dir``; [] when complete."""
    return [f for f in AUTH_FILES if not (Path(auth_dir) / f).is_file() or (Path(auth_dir) / f).stat().st_size == 0]


def token_role(token_file: str | Path) -> str:
    """The role (JWT ``sub``) of the token in ``token_file``, read without checking the
    signature (as ``pulsar tokens show``). Raises OSError / ``proto.auth_tokens.TokenError``."""
    from proto.auth_tokens import decode_unverified

    return str(decode_unverified(Path(token_file).read_text().strip())[1].get("sub", ""))


def secret_key_url(auth_dir: str) -> str:
    """``file:///...secret.key``: the brokers' and bookies' ``token_secret_key``."""
    return "file://" + os.path.join(auth_dir, "secret.key")


def admin_authentication(auth_dir: str):
    """The SDK's ``AuthenticationToken`` of the demo administrator (``admin.token``, re-read
    when the file changes)."""
    from proto.authentication import authentication_from_params
    return authentication_from_params("token", "file://" + os.path.join(auth_dir, "admin.token"))


def broker_authentication(auth_dir: str):
    """The SDK's ``AuthenticationToken`` of the brokers' own role (``broker.token``): the only
    one the demo's bookies serve (the bookies' health check calls them with it)."""
    from proto.authentication import authentication_from_params
    return authentication_from_params("token", "file://" + os.path.join(auth_dir, "broker.token"))


def broker_auth_settings(auth_dir: str) -> dict:
    """The ``BrokerConfig`` keys of a broker of the demo with ``--auth``."""
    broker_token = "file://" + os.path.join(auth_dir, "broker.token")
    return dict(authentication_enabled=True, authorization_enabled=True,
                token_secret_key=secret_key_url(auth_dir), superuser_roles=[BROKER_ROLE, ADMIN_ROLE],
                broker_client_authentication_plugin="token", broker_client_authentication_parameters=broker_token,
                bookkeeper_client_authentication_plugin="token",
                bookkeeper_client_authentication_parameters=broker_token)


def bookie_auth_args(auth_dir: str) -> list[str]:
    """The ``minipulsar bookie`` flags of a bookie of the demo with ``--auth``: tokens of the
    demo's key, and only the brokers' role (``BROKER_ROLE``) served (BookKeeper's
    ``authorizedRoles``; other roles get PERMISSION_DENIED on every bookie RPC)."""
    return ["--authentication-enabled", "--token-secret-key", secret_key_url(auth_dir),
            "--authorized-roles", BROKER_ROLE]
