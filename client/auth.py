"""The SDK's authentication classes (official pulsar-client names
``Authentication``, ``AuthenticationToken``), defined once in
``proto.authentication`` (shared with the broker's own links) and re-exported
here under the client's import path::

    from client import Client, AuthenticationToken
    client = Client("minipulsar://localhost:6600", authentication=AuthenticationToken(token))
    # or a callable returning a fresh token for every call and reconnect:
    client = Client(url, authentication=AuthenticationToken(lambda: read_token()))
"""
from proto.authentication import (TOKEN_PLUGIN_NAMES, Authentication, AuthenticationToken,  # noqa: F401
                                  authentication_from_params)

__all__ = ["Authentication", "AuthenticationToken", "authentication_from_params", "TOKEN_PLUGIN_NAMES"]
