"""BrokerConfig carries the managed-ledger broker.conf keys (inherited from
ManagedLedgerSettings) into each topic's ManagedLedgerConfig."""

import dataclasses

import pytest

from broker.config import BrokerConfig
from broker.ledger.ml_config import ManagedLedgerConfig, ManagedLedgerSettings


def test_every_managed_ledger_key_reaches_the_managed_ledger_config():
    keys = [f.name for f in dataclasses.fields(ManagedLedgerSettings)]
    def sample(default):   # a valid non-default value of the key's type
        return True if isinstance(default, bool) else 7 if isinstance(default, int) else 0.75

    values = {k: sample(getattr(ManagedLedgerSettings, k)) for k in keys}
    ml = BrokerConfig.from_dict({**values, "max_message_size": 1000}).managed_ledger_config()
    assert isinstance(ml, ManagedLedgerConfig)
    assert {k: getattr(ml, k) for k in keys} == values
    assert ml.max_entry_size_bytes == 1000 + 64 * 1024   # the message plus room for metadata


def test_max_entry_size_bytes_is_not_a_broker_key():
    with pytest.raises(ValueError, match="max_entry_size_bytes"):
        BrokerConfig.from_dict({"max_entry_size_bytes": 1})
