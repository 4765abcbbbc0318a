"""JWT keys and tokens: defined in ``proto.auth_tokens`` (shared with the bookie),
re-exported under the broker's security package."""
from proto.auth_tokens import *  # noqa: F401,F403
from proto.auth_tokens import __all__  # noqa: F401
