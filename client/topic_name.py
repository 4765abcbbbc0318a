"""Topic names as Pulsar parses them, defined once in ``proto.topic_name``
(shared with the broker) and re-exported here."""
from proto.topic_name import *  # noqa: F401,F403
from proto.topic_name import __all__  # noqa: F401
