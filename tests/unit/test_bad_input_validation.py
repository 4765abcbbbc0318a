"""Validation of names, admin request bodies and process configs, without processes
(the same rules run end to end in tests/integration/test_bad_input_names_config.py)."""
from __future__ import annotations

import dataclasses

import pytest

from broker.config import BrokerConfig, ConfigError
from client.errors import InvalidArgument, InvalidTopicName
from client.topic_name import TopicName


# ---------------------------------------------------------------------------- topic names
@pytest.mark.parametrize("bad", [
    "..", ".", "persistent://public/default/..", "persistent://../default/t", "persistent://public/./t",
    "public/default/t\n", "t\n", "public/default\n/t", "public/default/a\x00b", "public/default/a\x7fb",
    "t-partition-01", "persistent://a/b/t-partition-007",
])
def test_path_tricks_and_control_characters_are_invalid_topic_names(bad):
    with pytest.raises(InvalidTopicName) as info:
        TopicName.get(bad)
    assert "use" in str(info.value) or "without leading zeros" in str(info.value)


def test_names_that_only_contain_dots_among_other_characters_stay_valid():
    assert TopicName.get("a..b").local_name == "a..b"
    assert TopicName.get("ten.ant/n.s/.t.").tenant == "ten.ant"


def test_partition_index_uses_ascii_digits_only():
    assert TopicName.get("t-partition-0").partition_index == 0
    assert TopicName.get("t-partition-12").partition_index == 12
    assert TopicName.get("a-partition-1-partition-2").partitioned_topic_name.local_name == "a-partition-1"
    for name in ("t-partition-\u0663", "t-partition-\u00b2", "t-partition-", "-partition-3"):
        tn = TopicName.get(name)                    # legal names, but not partitions (no crash on int())
        assert tn.partition_index == -1 and not tn.is_partition


# ---------------------------------------------------------------------------- broker config
def test_broker_config_reports_every_problem_at_once():
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_dict({"broker_service_port": "abc", "max_message_size": "5MB", "bookies": "h:p",
                                "web_service_port": 99999, "managed_ledger_default_ack_quorum": 3,
                                "enable_fault_injection": 1, "typo_key": True}, source="b.toml")
    problems = info.value.problems
    assert isinstance(info.value, ValueError)
    assert 'broker_service_port: expected an integer, got the string "abc"' in problems
    assert 'max_message_size: expected an integer, got the string "5MB"' in problems
    assert any(p.startswith("bookies: expected an array of strings") and '"h:p"' in p for p in problems)
    assert any(p.startswith("web_service_port = 99999: must be a TCP port") for p in problems)
    assert any("ensemble size >= write quorum >= ack quorum" in p for p in problems)
    assert "enable_fault_injection: expected true or false, got the integer 1" in problems
    assert any("typo_key" in p for p in problems)
    assert str(info.value).startswith("b.toml: 7 problem(s):")


@pytest.mark.parametrize("values,needle", [
    ({"broker_service_port": -1}, "broker_service_port = -1"),
    ({"broker_service_port": 65536}, "broker_service_port = 65536"),
    ({"max_message_size": 0}, "max_message_size = 0: must be >= 1"),
    ({"max_message_size": 64 * 1024 * 1024}, "must be at most"),
    ({"managed_ledger_default_ensemble_size": 0}, "managed_ledger_default_ensemble_size = 0: must be >= 1"),
    ({"managed_ledger_default_write_quorum": 3}, "ensemble size >= write quorum"),
    ({"bookkeeper_client_timeout_in_seconds": 0}, "must be > 0"),
    ({"dispatcher_max_read_batch_size": 0}, "must be >= 1"),
    ({"default_retention_time_in_minutes": -2}, "must be >= -1"),
    ({"bookies": ["127.0.0.1:0", "nohostport"]}, "each bookie must be 'host:port'"),
    ({"cluster_name": ".."}, "cluster_name"),
    ({"cluster_name": "a/b"}, "cluster_name"),
    ({"data_dir": ""}, "data_dir"),
    ({"managed_ledger_min_ledger_rollover_time_minutes": 5.0,
      "managed_ledger_max_ledger_rollover_time_minutes": 1.0}, "must not exceed"),
])
def test_broker_config_ranges(values, needle):
    _, problems = BrokerConfig.parse(values)
    assert any(needle in p for p in problems), problems


def test_broker_config_accepts_good_values_and_widens_ints_to_floats():
    config = BrokerConfig.from_dict({"bookkeeper_client_timeout_in_seconds": 3, "broker_service_port": 0,
                                     "web_service_port": -1, "max_unacked_messages_per_consumer": 0,
                                     "bookies": ["127.0.0.1:3181", "h:3182"]})
    assert config.bookkeeper_client_timeout_in_seconds == 3.0
    assert isinstance(config.bookkeeper_client_timeout_in_seconds, float)
    assert config.validate() == []


def test_validate_checks_a_whole_process_config():
    assert any("bookies is empty" in p for p in BrokerConfig().validate())
    assert any("only 1 bookie(s)" in p for p in BrokerConfig(bookies=["a:1"]).validate())
    assert BrokerConfig(bookies=["a:1"], managed_ledger_default_ensemble_size=1, managed_ledger_default_write_quorum=1,
                        managed_ledger_default_ack_quorum=1).validate() == []
    # values set in code (flags, override) are checked too
    bad = dataclasses.replace(BrokerConfig(bookies=["a:1", "b:2"]), broker_service_port=99999, max_message_size="5")
    problems = bad.validate()
    assert any("broker_service_port = 99999" in p for p in problems)
    assert any(p.startswith("max_message_size: expected an integer") for p in problems)


def test_a_bad_typed_key_does_not_cascade_into_other_problems():
    _, problems = BrokerConfig.parse({"bookies": "h:p", "managed_ledger_default_write_quorum": "3"}, complete=True)
    assert len(problems) == 2, problems          # no "bookies is empty", no quorum rule on the default


def test_load_toml_reports_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        BrokerConfig.load_toml(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("x = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        BrokerConfig.load_toml(str(bad))
    good = tmp_path / "good.toml"
    good.write_text("[broker]\nmax_message_size = 1000\n")
    assert BrokerConfig.from_toml(str(good)).max_message_size == 1000


def test_geo_topology_checks_broker_setting_types():
    from deploy.topology import DEFAULT_TOPOLOGY, TopologyError, parse_topology

    text = DEFAULT_TOPOLOGY.read_text().replace(
        "[broker]", '[broker]\nmax_message_size = "5MB"\ndispatcher_max_read_batch_size = 0\n', 1)
    with pytest.raises(TopologyError) as info:
        parse_topology(text)
    assert '[broker] max_message_size: expected an integer, got the string "5MB"' in str(info.value)
    assert "[broker] dispatcher_max_read_batch_size = 0: must be >= 1" in str(info.value)


# ---------------------------------------------------------------------------- bookie config
def test_bookie_config_problems():
    from bookie.__main__ import config_problems
    from bookie.server import BookieConfig

    assert config_problems(BookieConfig()) == []
    problems = config_problems(BookieConfig(port="abc", journal_sync="yes", max_entry_size_bytes=0, host=""))
    assert any(p.startswith("port: expected an integer") for p in problems)
    assert any(p.startswith("journal_sync: expected true or false") for p in problems)
    assert "max_entry_size_bytes = 0: must be >= 1" in problems
    assert any(p.startswith("host = ''") for p in problems)
    assert any("must be a TCP port" in p for p in config_problems(BookieConfig(port=99999)))
    assert any("expected an integer" in p for p in config_problems(BookieConfig(port=True)))


# ---------------------------------------------------------------------------- admin bodies
def test_admin_bodies_are_checked_in_one_place():
    from broker.service.admin import HANDLERS, SCHEMAS, check_body

    assert set(SCHEMAS) == set(HANDLERS)
    assert check_body("topics.delete", {"topic": "t", "force": None}) == {"topic": "t"}
    assert check_body("tenants.create", {"tenant": "acme"}) == {"tenant": "acme"}
    for method, body, needle in [
        ("topics.create", {}, "missing field 'topic'"),
        ("topics.create", {"topic": 5}, "field 'topic' must be a string, got the number 5"),
        ("topics.create", {"topic": "t", "extra": 1}, "unknown field(s) 'extra'"),
        ("topics.create_partitioned", {"topic": "t", "partitions": "4"}, "must be an integer, got the string"),
        ("topics.create_partitioned", {"topic": "t", "partitions": True}, "must be an integer, got true/false"),
        ("namespaces.set_deduplication", {"namespace": "a/b", "enabled": 1}, "must be true or false"),
        ("namespaces.set_clusters", {"namespace": "a/b", "clusters": ["x", 2]}, "must be a list of strings"),
        ("namespaces.create", {"namespace": "a/.."}, "invalid namespace name '..'"),
        ("namespaces.create", {"namespace": "a"}, "use tenant/namespace"),
        ("tenants.create", {"tenant": "a\n"}, "invalid tenant name"),
        ("topics.unsubscribe", {"topic": "t", "subscription": "a/../b"}, "invalid subscription name"),
        ("clusters.create", {"name": "c", "service_url": "pulsar://h:6650"}, "unsupported scheme"),
    ]:
        with pytest.raises(InvalidArgument) as info:
            check_body(method, body)
        assert needle in str(info.value), (method, body, str(info.value))
        assert info.value.grpc_code == "INVALID_ARGUMENT"
    with pytest.raises(InvalidTopicName):
        check_body("topics.stats", {"topic": "public/../t"})


async def test_admin_dispatch_rejects_bad_json_and_methods():
    from broker.service.admin import dispatch

    for method, body_json, needle in [("no.such", "{}", "unknown admin method"),
                                      ("topics.create", "[1]", "must be a JSON object"),
                                      ("topics.create", "{", "not JSON"),
                                      ("topics.create", '{"topic": ".."}', "path tricks")]:
        with pytest.raises((InvalidArgument, InvalidTopicName), match=needle):
            await dispatch(None, method, body_json)


def test_resource_names_reject_dots_and_newlines():
    from broker.service.resources import check_name

    for bad in (".", "..", "a\n", "", "a/b", 5):
        with pytest.raises(InvalidArgument):
            check_name("tenant", bad)
    assert check_name("tenant", "a.b") == "a.b"
