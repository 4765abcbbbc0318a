"""Client-side authentication, with the official pulsar-client names
(``pulsar.Authentication``, ``pulsar.AuthenticationToken``); shared by the SDK
(re-exported as ``client.auth``) and the broker's own outgoing links, as
``proto.errors`` is.

An ``Authentication`` gives the gRPC metadata sent on every call
(``auth_metadata() -> [("authorization", "Bearer <token>")]``); channels
opened with ``proto.channels.open_channel`` add it to each call, so a token
supplier (a callable, or a token file read again) is asked again for every
new call and stream: a refreshed token is used from the next call and every
stream reconnect on (see ``AuthenticationToken``).

``authentication_from_params(plugin, params)`` builds one from the CLI and
config strings pulsar-client uses (``--auth-plugin``, ``--auth-params``):
``token:<jwt>``, ``file:///path/to/token`` or ``{"token": "<jwt>"}``.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Callable, Optional, Union
from urllib.parse import unquote, urlparse

from proto.errors import InvalidConfiguration

__all__ = ["Authentication", "AuthenticationToken", "authentication_from_params", "TOKEN_PLUGIN_NAMES"]

TOKEN_PLUGIN_NAMES = ("org.apache.pulsar.client.impl.auth.AuthenticationToken", "AuthenticationToken", "token")


class Authentication:
    """Base of the client's authentication methods (Pulsar's ``Authentication``):
    ``auth_method_name`` and ``auth_metadata()``, the gRPC metadata pairs sent on
    every call. The base sends nothing."""

    auth_method_name = "none"

    def auth_metadata(self) -> list[tuple[str, str]]:
        """The ``(key, value)`` gRPC metadata of one call (lower-case keys)."""
        return []


class AuthenticationToken(Authentication):
    """Token authentication (Pulsar's ``AuthenticationToken``): ``token`` is the
    JWT string, or a callable returning the current one (called for every call and
    stream, so it can hand out a fresh token before the old one expires; cache in
    it if producing one is costly). Raises InvalidConfiguration for an empty token
    or another type; ``auth_metadata`` raises InvalidConfiguration when the
    callable fails or returns something else than a non-empty string."""

    auth_method_name = "token"

    def __init__(self, token: Union[str, Callable[[], str]]):
        if callable(token):
            self._supplier: Callable[[], str] = token
        elif isinstance(token, str) and token.strip():
            value = token.strip()
            self._supplier = lambda: value
        else:
            raise InvalidConfiguration("AuthenticationToken needs a token string or a callable returning one")

    def token(self) -> str:
        """The current token (the callable's answer)."""
        try:
            value = self._supplier()
        except Exception as exc:  # noqa: BLE001 - report the supplier's failure clearly
            raise InvalidConfiguration(f"the token supplier of AuthenticationToken failed: {exc}") from None
        if isinstance(value, bytes):
            value = value.decode()
        if not isinstance(value, str) or not value.strip():
            raise InvalidConfiguration("the token supplier of AuthenticationToken returned no token")
        return value.strip()

    def auth_metadata(self) -> list[tuple[str, str]]:
        """``[("authorization", "Bearer <token>")]``."""
        return [("authorization", f"Bearer {self.token()}")]


class _TokenFile:
    """A token read from a file, read again when the file changes (its mtime and
    size), so a token file rewritten before expiry refreshes the client's token."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._stamp: Optional[tuple] = None
        self._token = ""
        self()  # fail now on an unreadable file

    def __call__(self) -> str:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            with self._lock:
                if stamp != self._stamp:
                    with open(self.path, encoding="utf-8") as f:
                        self._token = f.read().strip()
                    self._stamp = stamp
                return self._token
        except OSError as exc:
            raise InvalidConfiguration(f"cannot read the token file {self.path}: {exc.strerror or exc}") from None


def _file_path(url: str) -> str:
    if url.startswith("file://"):
        return unquote(urlparse(url).path)
    return unquote(url[len("file:"):])


def authentication_from_params(plugin: Optional[str], params: Optional[str]) -> Optional[Authentication]:
    """The ``Authentication`` of pulsar-client's ``--auth-plugin`` / ``--auth-params``
    (and of the broker's ``broker_client_authentication_*`` keys): ``params`` is
    ``token:<jwt>``, ``file:///path/to/token-file`` (read again when it changes)
    or JSON ``{"token": "<jwt>"}``; ``plugin`` is empty, ``token``,
    ``AuthenticationToken`` or Pulsar's class name. None when ``params`` is empty.
    Raises InvalidConfiguration for another plugin, malformed params or an
    unreadable token file."""
    if not params:
        if plugin:
            raise InvalidConfiguration(f"--auth-plugin {plugin} needs --auth-params (token:<jwt> or "
                                       f"file:///path/to/token)")
        return None
    if plugin and plugin not in TOKEN_PLUGIN_NAMES:
        raise InvalidConfiguration(f"unsupported authentication plugin {plugin!r}; minipulsar supports "
                                   f"{TOKEN_PLUGIN_NAMES[0]} (or 'token')")
    params = params.strip()
    if params.startswith("token:"):
        return AuthenticationToken(params[len("token:"):])
    if params.startswith("file:"):
        return AuthenticationToken(_TokenFile(_file_path(params)))
    if params.startswith("{"):
        try:
            data = json.loads(params)
        except ValueError as exc:
            raise InvalidConfiguration(f"auth params are not JSON: {exc}") from None
        if isinstance(data, dict) and isinstance(data.get("token"), str):
            return authentication_from_params(plugin, data["token"] if data["token"].startswith(("token:", "file:"))
                                              else "token:" + data["token"])
        raise InvalidConfiguration('auth params JSON must be {"token": "<jwt>"}')
    raise InvalidConfiguration("auth params must be token:<jwt>, file:///path/to/token or {\"token\": \"<jwt>\"}")
