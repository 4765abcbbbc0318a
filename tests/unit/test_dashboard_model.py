"""The live dashboard's data (``broker.http.dashboard_model``, pure functions): broker
rows from load reports, brokers gone or not answering shown down (never leader, no
bundles once gone), a topic's summary from Pulsar's TopicStats names."""
from __future__ import annotations

from broker.http.dashboard_model import BrokerMemory, broker_row, cluster_snapshot, topic_summary


def report(port: int, bundles: dict) -> dict:
    return {"service_url": f"minipulsar://127.0.0.1:{port}", "web_service_url": f"http://127.0.0.1:{port + 1}",
            "cpu": 12.5, "msg_rate_in": 100.456, "msg_rate_out": 50.0, "topics": 2,
            "bundles": {b: {"topics": n} for b, n in bundles.items()}}


def test_a_broker_that_does_not_answer_is_down_and_not_leader_then_gone_loses_its_bundles():
    memory = BrokerMemory()
    leader = "minipulsar://127.0.0.1:6600"
    rows = memory.merge([broker_row(report(6600, {"a/b/0x0_0x8": 1}), leader),
                         broker_row(report(6610, {"a/b/0x8_0xf": 2}), leader)])
    assert [(r["id"], r["status"], r["leader"], r["bundles"]) for r in rows] == [
        ("127.0.0.1:6600", "up", True, {"a/b/0x0_0x8": 1}), ("127.0.0.1:6610", "up", False, {"a/b/0x8_0xf": 2})]
    assert rows[0]["msg_rate_in"] == 100.46

    # killed: still in the load reports (its session not expired yet) but not answering
    rows = memory.merge([broker_row(report(6600, {"a/b/0x0_0x8": 1}), leader),
                         broker_row(report(6610, {"a/b/0x8_0xf": 2}), leader)], unreachable=["127.0.0.1:6600"])
    dead = rows[0]
    assert (dead["status"], dead["leader"], dead["cpu"], dead["msg_rate_in"]) == ("down", False, 0.0, 0.0)
    assert dead["bundles"] == {"a/b/0x0_0x8": 1}, "its last report's bundles: not taken over yet"
    assert cluster_snapshot("c", 1, rows, [])["leader"] is None, "a down broker is nobody's leader"

    # its session expired: gone from the reports, remembered down with no bundles
    rows = memory.merge([broker_row(report(6610, {"a/b/0x0_0x8": 1, "a/b/0x8_0xf": 2}),
                                    "minipulsar://127.0.0.1:6610")])
    assert [(r["id"], r["status"], r["leader"], sorted(r["bundles"])) for r in rows] == [
        ("127.0.0.1:6600", "down", False, []), ("127.0.0.1:6610", "up", True, ["a/b/0x0_0x8", "a/b/0x8_0xf"])]
    assert cluster_snapshot("c", 1, rows, [])["leader"] == "127.0.0.1:6610"


def test_topic_summary_takes_pulsars_topic_stats_names():
    stats = {"msgRateIn": 10.123, "msgRateOut": 5.0, "msgInCounter": 42, "storageSize": 4096,
             "subscriptions": {"board": {"msgBacklog": 7, "msgRateOut": 1.234, "markDeletePosition": "3:9",
                                         "isReplicated": True, "consumers": [{}, {}]},
                               "reader-x": {"isDurable": False, "msgBacklog": 1}},
             "replication": {"us-west": {"replicationBacklog": 3, "replicationDelayInSeconds": 0.25,
                                         "msgRateOut": 2.0, "connected": True}}}
    s = topic_summary("persistent://a/b/t", stats, "minipulsar://127.0.0.1:6600")
    assert (s["msg_rate_in"], s["msg_in"], s["storage"]) == (10.12, 42, 4096)
    assert s["subscriptions"] == {"board": {"backlog": 7, "rate_out": 1.23, "mark_delete": "3:9",
                                            "replicated": True, "consumers": 2}}, "non-durable readers left out"
    assert s["replication"] == {"us-west": {"backlog": 3, "delay_s": 0.25, "rate_out": 2.0, "connected": True}}
