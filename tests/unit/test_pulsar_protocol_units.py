"""Pure parts of the Pulsar-protocol edge: ServerError codes of the broker's
exceptions (what the official clients retry) and the schema registry's FULL
compatibility rule."""
import json

import pytest

from broker.ledger.errors import ManagedLedgerFencedError
from broker.protocols.pulsar.schemas import IncompatibleSchema, compatible
from broker.protocols.pulsar.server_errors import is_retriable, server_error
from proto import errors as e
from proto.pulsar_wire_pb2 import Schema, ServerError


@pytest.mark.parametrize("exc, code", [
    (e.TopicNotFound("t"), ServerError.TopicNotFound),
    (e.ProducerBusy("p"), ServerError.ProducerBusy),
    (e.ConsumerBusy("c"), ServerError.ConsumerBusy),
    (e.AuthenticationError("a"), ServerError.AuthenticationError),
    (e.AuthorizationError("a"), ServerError.AuthorizationError),
    (e.InvalidTopicName("n"), ServerError.InvalidTopicName),
    (e.ChecksumError("c"), ServerError.ChecksumError),
    (e.ServiceNotReady("s"), ServerError.ServiceNotReady),
    (e.NotAllowed("n"), ServerError.NotAllowedError),
    (e.InvalidArgument("i"), ServerError.NotAllowedError),
    (IncompatibleSchema("s"), ServerError.IncompatibleSchema),
    (ManagedLedgerFencedError("fenced"), ServerError.ServiceNotReady),   # through the broker's error edge
])
def test_server_error_codes(exc, code):
    got, message = server_error(exc)
    assert got == code and type(exc).__name__ in message


def test_retriable_refusals_close_the_producer_instead_of_failing_the_message():
    assert is_retriable(e.ServiceNotReady("s")) and is_retriable(ManagedLedgerFencedError("fenced"))
    assert not is_retriable(e.MessageTooBig("m")) and not is_retriable(e.InvalidArgument("i"))


def test_an_untranslated_exception_is_unknown_error():
    assert server_error(RuntimeError("bug"))[0] == ServerError.UnknownError


def _avro(*fields) -> bytes:
    return json.dumps({"type": "record", "name": "R", "fields": list(fields)}).encode()


def _stored(data: bytes, kind=Schema.Avro) -> dict:
    import base64
    return {"type": kind, "data": base64.b64encode(data).decode()}


def test_full_compatibility_of_record_schemas():
    v1 = _avro({"name": "a", "type": "string"})
    assert compatible(_stored(v1), Schema(name="r", schema_data=v1, type=Schema.Avro))
    with_default = _avro({"name": "a", "type": "string"}, {"name": "b", "type": "int", "default": 0})
    nullable = _avro({"name": "a", "type": "string"}, {"name": "c", "type": ["null", "string"]})
    required = _avro({"name": "a", "type": "string"}, {"name": "d", "type": "int"})
    assert compatible(_stored(v1), Schema(name="r", schema_data=with_default, type=Schema.Avro))
    assert compatible(_stored(v1), Schema(name="r", schema_data=nullable, type=Schema.Avro))
    assert not compatible(_stored(v1), Schema(name="r", schema_data=required, type=Schema.Avro))
    assert not compatible(_stored(v1), Schema(name="r", schema_data=v1, type=Schema.Json))      # another type
    assert not compatible(_stored(b"x", Schema.String), Schema(name="r", schema_data=b"y", type=Schema.String))
    assert not compatible(_stored(v1), Schema(name="r", schema_data=b"not json", type=Schema.Avro))
