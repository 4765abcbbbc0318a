"""The SDK's exceptions: Pulsar's ``PulsarException`` family and the gRPC status
mapping, defined once in ``proto.errors`` (shared with the broker, as
pulsar-common) and re-exported here under the client's import path."""
from proto.errors import *  # noqa: F401,F403
from proto.errors import __all__, _BY_NAME, error_from_status, to_status  # noqa: F401
