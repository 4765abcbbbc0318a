"""The SDK's authentication classes (official pulsar-client names
``Authentication``, ``AuthenticationToken``), defined once in
``proto.authentication`` (shared with the broker's own links) and re-exported
here under the client's import path::

    from client import Client, AuthenticationToken
    client = Client("minipulsar://localhost:6600", authentication=AuthenticationToken(token))
    # or a callable returning a fresh token for every call and reconnect:
    client = Client(url, authentication=AuthenticationToken(lambda: read_token()))
"""
import dataclasses
from typing import Any, Optional

from proto.authentication import (TOKEN_PLUGIN_NAMES, Authentication, AuthenticationToken,  # noqa: F401
                                  authentication_from_params)
from proto.channels import ChannelSecurity
from proto.errors import InvalidConfiguration

__all__ = ["Authentication", "AuthenticationToken", "authentication_from_params", "TOKEN_PLUGIN_NAMES",
           "with_client_authentication"]


def with_client_authentication(security: Optional[ChannelSecurity], authentication: Any) -> Optional[ChannelSecurity]:
    """``security`` (the TLS part, ``client.tls.tls_channel_security``; None:
    plaintext) with ``authentication`` added (a ``client.auth.Authentication``
    such as ``AuthenticationToken``; None: no credentials). Raises
    ``InvalidConfiguration`` when ``authentication`` is not an ``Authentication``."""
    if authentication is None:
        return security
    if not isinstance(authentication, Authentication):
        raise InvalidConfiguration("authentication must be a client.auth.Authentication, e.g. "
                                   "AuthenticationToken(token)")
    return dataclasses.replace(security or ChannelSecurity(), authentication=authentication)
