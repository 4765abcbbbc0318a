"""Entry bytes (Pulsar's ``headersAndPayload`` with a CRC32C checksum), defined
once in ``proto.entry_format`` (shared with the broker) and re-exported here."""
from proto.entry_format import *  # noqa: F401,F403
from proto.entry_format import __all__  # noqa: F401
