"""Token authentication (AuthenticationProviderToken, AuthenticationService, the
gRPC server interceptor): defined in ``proto.auth_server`` (shared with the
bookie), re-exported under the broker's security package."""
from proto.auth_server import *  # noqa: F401,F403
from proto.auth_server import __all__  # noqa: F401
