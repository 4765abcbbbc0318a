"""Namespace bundles and the load manager's pure decisions (broker/ownership/bundles.py,
load_policy.py): Pulsar's NamespaceBundles ranges, bundle of a topic, split; least-loaded
placement and the ThresholdShedder rule."""
from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.ownership.bundles import LAST_BOUNDARY, Bundle, NamespaceBundles, parse_range, topic_hash
from broker.ownership.load_policy import LoadReport, find_bundle_to_shed, select_broker


def test_default_four_bundles_match_pulsars_ranges():
    nb = NamespaceBundles.equal("public/default", 4)
    assert [b.range for b in nb.bundles] == ["0x00000000_0x40000000", "0x40000000_0x80000000",
                                             "0x80000000_0xc0000000", "0xc0000000_0xffffffff"]


def test_topic_hash_is_crc32_of_the_full_name():
    name = "persistent://public/default/my-topic-partition-3"
    assert topic_hash(name) == zlib.crc32(name.encode()) & 0xFFFFFFFF


@given(st.text(min_size=1, max_size=40), st.integers(1, 64))
def test_every_topic_is_in_exactly_one_bundle(local, count):
    nb = NamespaceBundles.equal("t/ns", count)
    name = f"persistent://t/ns/{local}"
    holders = [b for b in nb.bundles if b.contains(name)]
    assert holders == [nb.find(name)]


def test_the_top_hash_belongs_to_the_last_bundle():
    nb = NamespaceBundles.equal("t/ns", 4)
    assert nb.find_hash(LAST_BOUNDARY) == nb.bundles[-1]
    assert nb.find_hash(0) == nb.bundles[0]
    assert nb.find_hash(0x40000000) == nb.bundles[1]


@given(st.integers(0, 3), st.lists(st.integers(0, LAST_BOUNDARY), max_size=50))
def test_split_keeps_every_hash_in_the_same_half_or_neighbour(index, hashes):
    nb = NamespaceBundles.equal("t/ns", 4)
    target = nb.bundles[index]
    after = nb.split(target)
    assert len(after.bundles) == 5
    halves = target.split(2)
    assert [h.range for h in halves] == [b.range for b in after.bundles[index:index + 2]]
    for h in hashes:
        before, now = nb.find_hash(h), after.find_hash(h)
        if before == target:
            assert now in halves
        else:
            assert now == before


def test_boundaries_round_trip_and_bad_ranges_are_refused():
    nb = NamespaceBundles.equal("t/ns", 2).split(NamespaceBundles.equal("t/ns", 2).bundles[0])
    again = NamespaceBundles.from_boundaries("t/ns", nb.to_json()["boundaries"])
    assert again == nb
    assert nb.get(nb.bundles[1].range) == nb.bundles[1]
    for bad in ("0x1", "zz_0x10", "0x10_0x05", "0x00000000_0x100000000"):
        with pytest.raises(ValueError):
            parse_range(bad)
    with pytest.raises(ValueError, match="not a bundle"):
        nb.get("0x00000000_0xffffffff")
    with pytest.raises(ValueError):
        NamespaceBundles.from_boundaries("t/ns", [0, 5, 5, LAST_BOUNDARY])
    with pytest.raises(ValueError):
        Bundle("t/ns", 7, 8).split(2)


def _report(url, rate=0.0, bundles=None):
    return LoadReport(service_url=url, msg_rate_in=rate, bundles=bundles or {})


def test_select_broker_takes_the_least_loaded_and_counts_pending_assignments():
    reports = [_report("minipulsar://a:1", 50), _report("minipulsar://b:1", 5), _report("minipulsar://c:1", 10)]
    assert select_broker(reports) == "minipulsar://b:1"
    assert select_broker(reports, {"minipulsar://b:1": 20}) == "minipulsar://c:1"
    assert select_broker([]) is None
    # idle brokers: the one owning fewer bundles
    idle = [_report("minipulsar://a:1", bundles={"x": {}, "y": {}}), _report("minipulsar://b:1", bundles={"z": {}})]
    assert select_broker(idle) == "minipulsar://b:1"


def test_threshold_shedder_unloads_the_busiest_bundle_of_an_overloaded_broker():
    hot = _report("minipulsar://a:1", 1000, {"t/ns/0x00000000_0x80000000": {"msg_rate_in": 900},
                                             "t/ns/0x80000000_0xffffffff": {"msg_rate_in": 100}})
    cold = _report("minipulsar://b:1", 10, {"t/ns2/0x00000000_0xffffffff": {"msg_rate_in": 10}})
    decision = find_bundle_to_shed([hot, cold], threshold_percentage=10)
    assert decision is not None
    assert (decision.service_url, decision.bundle) == ("minipulsar://a:1", "t/ns/0x00000000_0x80000000")
    # within the threshold, or one broker only, or a single bundle: nothing to shed
    assert find_bundle_to_shed([hot, _report("minipulsar://b:1", 990)], threshold_percentage=10) is None
    assert find_bundle_to_shed([hot], threshold_percentage=10) is None
    single = _report("minipulsar://a:1", 1000, {"t/ns/0x00000000_0xffffffff": {"msg_rate_in": 1000}})
    assert find_bundle_to_shed([single, cold], threshold_percentage=10) is None


def test_load_report_json_round_trip_ignores_unknown_keys():
    r = _report("minipulsar://a:1", 3.5, {"t/ns/0x00000000_0xffffffff": {"topics": 2}})
    data = {**r.to_json(), "future_field": 1}
    assert LoadReport.from_json(data) == r
    with pytest.raises(ValueError):
        LoadReport.from_json({"service_url": 5})
