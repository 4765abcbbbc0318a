"""The broker's error edge (broker/service/error_edge.py): storage errors
become the client-visible hierarchy, retriable where retrying can help."""
from __future__ import annotations

import pytest

from bookie.errors import BookieUnavailableError, NotEnoughBookiesError
from broker.ledger.errors import (InvalidCursorPosition, ManagedCursorError, ManagedLedgerClosedError,
                                  ManagedLedgerError, ManagedLedgerFencedError)
from broker.metadata.store import BadVersion, NotFound as MetadataNotFound
from broker.service.error_edge import to_pulsar
from proto.errors import InvalidArgument, NotFound, ProducerBusy, ServiceNotReady, to_status


@pytest.mark.parametrize("exc", [NotEnoughBookiesError("2 of 3"), BookieUnavailableError("down"),
                                 ManagedLedgerClosedError("closed"), ManagedCursorError("persist failed"),
                                 BadVersion("/managed-ledgers/x")])
def test_storage_failures_are_retriable_service_not_ready(exc):
    out = to_pulsar(exc)
    assert isinstance(out, ServiceNotReady) and out.retriable
    assert type(exc).__name__ in str(out)


def test_a_fenced_ledger_says_to_look_the_topic_up_again():
    out = to_pulsar(ManagedLedgerFencedError("ledger 7 fenced"))
    assert isinstance(out, ServiceNotReady) and "look it up again" in str(out)


def test_positions_and_missing_metadata_are_not_retriable():
    assert isinstance(to_pulsar(InvalidCursorPosition("5:9 is not an entry")), InvalidArgument)
    assert isinstance(to_pulsar(MetadataNotFound("/admin/policies/x")), NotFound)


def test_pulsar_exceptions_pass_and_bugs_stay_internal():
    busy = ProducerBusy("p")
    assert to_pulsar(busy) is busy
    bug = KeyError("x")
    assert to_pulsar(bug) is bug and to_status(to_pulsar(bug))[0] == "INTERNAL"
    assert issubclass(ManagedCursorError, ManagedLedgerError)     # one root for ledger and cursors
