"""The broker's one error edge: what a client sees for an exception raised
inside the broker (Pulsar's ``BrokerServiceException.getClientErrorCode``).

Inside, the storage layers keep their own roots: ``bookie.errors.BKException``
(bookie client), ``broker.ledger.errors.ManagedLedgerError`` (managed ledger
and cursors) and ``broker.metadata.store.MetadataStoreError``. At the gRPC
edge (``broker.grpc_servicer``) every exception goes through ``to_pulsar``
and then ``proto.errors.to_status``, so a client only ever gets the
``proto.errors`` hierarchy, whose ``retriable`` attribute is the one answer to
"retry?". Anything not translated is a bug and leaves as INTERNAL.
"""
from __future__ import annotations

from bookie.errors import BKException
from broker.ledger.errors import (InvalidCursorPosition, InvalidMarkDeletePosition, ManagedLedgerError,
                                  ManagedLedgerFencedError)
from broker.metadata.store import MetadataStoreError
from broker.metadata.store import NotFound as MetadataNotFound
from proto.errors import InvalidArgument, NotFound, PulsarException, ServiceNotReady

__all__ = ["to_pulsar"]


def to_pulsar(exc: BaseException) -> BaseException:
    """The client-visible exception for ``exc``: a ``PulsarException`` as it is;
    an invalid cursor position -> ``InvalidArgument``; a fenced managed ledger
    (another broker owns the topic) -> ``ServiceNotReady`` (look the topic up
    again); any other managed-ledger, bookie or metadata-store failure ->
    ``ServiceNotReady`` (retriable: storage not available now), a missing
    metadata node -> ``NotFound``; anything else unchanged (sent as INTERNAL)."""
    if isinstance(exc, PulsarException):
        return exc
    name = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (InvalidCursorPosition, InvalidMarkDeletePosition)):
        return InvalidArgument(str(exc))
    if isinstance(exc, ManagedLedgerFencedError):
        return ServiceNotReady(f"the topic's ledger was fenced: another broker owns it now; look it up again "
                               f"({name})")
    if isinstance(exc, MetadataNotFound):
        return NotFound(str(exc))
    if isinstance(exc, (ManagedLedgerError, BKException, MetadataStoreError)):
        return ServiceNotReady(f"storage not available ({name}); retry")
    return exc
