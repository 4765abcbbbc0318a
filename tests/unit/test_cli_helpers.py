"""Unit tests of the pure helpers of the command-line tools (client/cli.py,
client/admin_cli.py, client/perf.py): parsing and rendering, no broker."""
from __future__ import annotations

import io

import pytest

from client.admin_cli import build_parser as admin_parser
from client.admin_cli import parse_reset_time, render, service_urls, split_list
from client.cli import CliError, Progress, build_parser as client_parser, format_message, parse_properties
from client.message import Message
from client.message_id import MessageId
from client.perf import build_parser as perf_parser, make_payload


def test_parse_reset_time_absolute_and_relative():
    now = 1_700_000_000_000
    assert parse_reset_time("1690000000000", now) == 1_690_000_000_000
    assert parse_reset_time("10m", now) == now - 600_000
    assert parse_reset_time("30s", now) == now - 30_000
    assert parse_reset_time("2h", now) == now - 7_200_000
    assert parse_reset_time("1d", now) == now - 86_400_000
    assert parse_reset_time("1w", now) == now - 604_800_000
    assert parse_reset_time("1.5h", now) == now - 5_400_000
    with pytest.raises(CliError, match="relative time"):
        parse_reset_time("yesterday", now)


def test_split_list_and_service_urls(monkeypatch):
    assert split_list("a, b,,c ") == ["a", "b", "c"]
    assert service_urls(["minipulsar://a:1,minipulsar://b:2", "minipulsar://a:1"]) == \
        ["minipulsar://a:1", "minipulsar://b:2"]
    # an item without a scheme is one more host of the cluster before it (a multi-host URL)
    assert service_urls(["minipulsar://a:1,a2:1,minipulsar://b:2", "minipulsar://a:1,a2:1"]) == \
        ["minipulsar://a:1,a2:1", "minipulsar://b:2"]
    assert service_urls(["minipulsar://a:1, a2:1, a3:1"]) == ["minipulsar://a:1,a2:1,a3:1"]
    monkeypatch.setenv("MINIPULSAR_SERVICE_URL", "minipulsar://env:7")
    assert service_urls(None) == ["minipulsar://env:7"]
    monkeypatch.delenv("MINIPULSAR_SERVICE_URL")
    assert service_urls(None) == ["minipulsar://127.0.0.1:6600"]


def test_render_lists_dicts_and_nested_records():
    assert render(["a", "b"]) == "a\nb"
    text = render({"msgInCounter": 5, "deduplicationEnabled": False, "replication_clusters": ["x", "y"],
                   "subscriptions": {"s1": {"msgBacklog": 3, "type": "Shared",
                                            "consumers": [{"consumerName": "c1", "availablePermits": 10}]}},
                   "ledgers": [{"ledgerId": 1, "entries": 10}]})
    lines = text.splitlines()
    assert "msgInCounter          5" in lines
    assert "deduplicationEnabled  false" in lines
    assert "replication_clusters  x, y" in lines
    assert "subscriptions:" in lines and "ledgers:" in lines
    assert any(line.split()[:3] == ["s1", "3", "Shared"] for line in lines)
    assert any("c1" in line and "10" in line for line in lines)  # the consumers sub-table
    assert render(None) == ""


def test_admin_parser_options_before_and_after_the_verb():
    p = admin_parser()
    a = p.parse_args(["--service-url", "minipulsar://x:1", "clusters", "list"])
    assert a.service_url == ["minipulsar://x:1"] and a.json is False
    a = p.parse_args(["clusters", "list", "--json", "--admin-url", "minipulsar://y:2"])
    assert a.service_url == ["minipulsar://y:2"] and a.json is True
    a = p.parse_args(["--json", "topics", "reset-cursor", "t", "-s", "sub", "-t", "10m"])
    assert a.json is True and a.time == "10m" and a.message_id is None
    with pytest.raises(SystemExit):  # -m and -t are exclusive
        p.parse_args(["topics", "reset-cursor", "t", "-s", "sub", "-t", "10m", "-m", "1:2"])
    a = p.parse_args(["namespaces", "set-deduplication", "a/b", "--disable"])
    assert a.enable is False
    with pytest.raises(SystemExit):
        p.parse_args(["namespaces", "set-deduplication", "a/b"])


def test_admin_help_explains_per_cluster_calls(capsys):
    with pytest.raises(SystemExit):
        admin_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "changes only the" in out and "--service-url" in out and "comma-separated" in out


def test_client_parser_defaults():
    p = client_parser()
    a = p.parse_args(["consume", "t", "-s", "sub"])
    assert (a.num_messages, a.subscription_type, a.subscription_position) == (1, "Exclusive", "Latest")
    a = p.parse_args(["--service-url", "minipulsar://h:1", "produce", "t", "-m", "a,b", "-n", "3"])
    assert a.service_url == "minipulsar://h:1" and a.num_produce == 3
    with pytest.raises(SystemExit):
        p.parse_args(["consume", "t", "-s", "sub", "-t", "Sharded"])


def test_perf_parser():
    p = perf_parser()
    a = p.parse_args(["produce", "t", "-r", "0", "-s", "100", "-t", "15", "--compression", "lz4"])
    assert (a.rate, a.size, a.duration, a.compression) == (0.0, 100, 15.0, "LZ4")
    a = p.parse_args(["consume", "t", "-s", "sub", "-t", "Key_Shared", "--ack"])
    assert a.subscription_type == "Key_Shared" and a.ack
    a = p.parse_args(["e2e", "t", "-d", "3"])
    assert a.duration == 3.0 and a.num_consumers == 1
    assert len(make_payload(100)) == 100


def test_parse_properties():
    assert parse_properties(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(CliError):
        parse_properties(["novalue"])


def test_format_message_like_pulsar_client():
    msg = Message(b"hello", MessageId(1, 2), "persistent://public/default/t", properties={"b": "2", "a": "1"},
                  partition_key="k")
    assert format_message(msg) == "----- got message -----\nkey:[k], properties:[a=1, b=2], content:hello\n"
    msg = Message(b"\xff", MessageId(1, 3), "t")
    assert format_message(msg) == "----- got message -----\nkey:[null], properties:[], content:\\xff\n"


def test_progress_line_not_a_tty_prints_lines():
    out = io.StringIO()
    progress = Progress(lambda elapsed: "tick", stream=out, interval=1.0)
    progress.maybe_update(progress.start + 0.5)
    progress.maybe_update(progress.start + 1.1)
    progress.maybe_update(progress.start + 1.2)
    progress.maybe_update(progress.start + 2.2)
    progress.finish()
    assert out.getvalue() == "tick\ntick\n"
