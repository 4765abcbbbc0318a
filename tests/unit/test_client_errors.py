"""client.errors: one hierarchy, default messages, gRPC status mapping."""
import pytest
from hypothesis import given, strategies as st

from client import errors
from client.errors import (
    AlreadyClosed, AuthorizationError, ChecksumError, ConnectError, ConsumerBusy, CorruptedMessage,
    InvalidConfiguration, InvalidTopicName, MessageTooBig, NotAllowed, ProducerBusy, ProducerQueueIsFull,
    PulsarException, Timeout, TopicNotFound, TopicTerminated, error_from_status, to_status,
)

ALL = [TopicNotFound, ProducerBusy, ConsumerBusy, MessageTooBig, Timeout, AlreadyClosed, AuthorizationError,
       InvalidTopicName, InvalidConfiguration, ConnectError, ProducerQueueIsFull, CorruptedMessage,
       ChecksumError, NotAllowed, TopicTerminated]


@pytest.mark.parametrize("cls", ALL)
def test_every_error_is_a_pulsar_exception_with_docs_and_advice(cls):
    assert issubclass(cls, PulsarException)
    assert cls.__doc__ and "raised" in cls.__doc__.lower()
    exc = cls()
    assert str(exc) == cls.default_message == exc.message
    assert cls.default_message != PulsarException.default_message
    assert cls.grpc_code.isupper()


def test_checksum_error_is_a_corrupted_message():
    assert issubclass(ChecksumError, CorruptedMessage)


def test_custom_message_replaces_default():
    assert str(TopicNotFound("persistent://a/b/c does not exist")) == "persistent://a/b/c does not exist"


def test_all_exports_exist():
    for name in errors.__all__:
        assert hasattr(errors, name)


@pytest.mark.parametrize("cls", ALL + [PulsarException])
def test_status_round_trip_restores_class_and_message(cls):
    exc = cls("details here: with a colon")
    code, details = to_status(exc)
    assert code == cls.grpc_code
    back = error_from_status(code, details)
    assert type(back) is cls
    assert back.message == "details here: with a colon"


@pytest.mark.parametrize("code,cls", [
    ("NOT_FOUND", TopicNotFound), ("StatusCode.DEADLINE_EXCEEDED", Timeout), ("UNAVAILABLE", ConnectError),
    ("PERMISSION_DENIED", AuthorizationError), ("UNAUTHENTICATED", AuthorizationError),
    ("RESOURCE_EXHAUSTED", MessageTooBig), ("DATA_LOSS", CorruptedMessage),
])
def test_bare_status_codes_map_to_their_usual_class(code, cls):
    exc = error_from_status(code, "something happened")
    assert type(exc) is cls and exc.message == "something happened"


def test_status_code_object_with_name_is_accepted():
    class FakeStatusCode:
        name = "UNAVAILABLE"
    assert isinstance(error_from_status(FakeStatusCode(), "down"), ConnectError)


def test_class_name_as_code_or_as_whole_details():
    assert isinstance(error_from_status("ProducerBusy", "producer p exists"), ProducerBusy)
    exc = error_from_status("FAILED_PRECONDITION", "NotAllowed")
    assert isinstance(exc, NotAllowed) and exc.message == NotAllowed.default_message


def test_ambiguous_code_without_class_name_is_generic_but_keeps_information():
    exc = error_from_status("FAILED_PRECONDITION", "no idea")
    assert type(exc) is PulsarException
    assert "FAILED_PRECONDITION" in exc.message and "no idea" in exc.message
    assert type(error_from_status("INTERNAL", "")) is PulsarException


@pytest.mark.parametrize("code, details", [
    ("INTERNAL", "Internal error from Core"),
    ("INTERNAL", "Received RST_STREAM with error code 2"),
    ("UNKNOWN", "Stream removed"),
    ("UNAVAILABLE", "Socket closed"),
])
def test_grpc_transport_failures_are_retriable_connect_errors(code, details):
    exc = error_from_status(code, details)
    assert isinstance(exc, ConnectError) and exc.retriable and details in exc.message


def test_a_broker_internal_error_stays_an_internal_error_even_if_it_mentions_the_transport():
    exc = error_from_status("INTERNAL", "PulsarException: RuntimeError: Socket closed while persisting")
    assert type(exc) is PulsarException and not isinstance(exc, ConnectError)


def test_details_prefix_wins_over_code():
    assert isinstance(error_from_status("NOT_FOUND", "TopicTerminated: t is terminated"), TopicTerminated)


def test_foreign_exceptions_become_internal_generic_errors():
    code, details = to_status(KeyError("boom"))
    assert code == "INTERNAL"
    back = error_from_status(code, details)
    assert type(back) is PulsarException and "KeyError" in back.message


def test_retriable_flags():
    assert Timeout.retriable and ConnectError.retriable and ProducerQueueIsFull.retriable
    assert not CorruptedMessage.retriable and not InvalidTopicName.retriable


@given(st.text(), st.text())
def test_error_from_status_never_raises(code, details):
    assert isinstance(error_from_status(code, details), PulsarException)
