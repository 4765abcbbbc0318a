import pytest

from client.errors import InvalidTopicName
from client.topic_name import TopicName


def test_short_and_full_names():
    assert str(TopicName.get("t")) == "persistent://public/default/t"
    assert str(TopicName.get("a/b/t")) == "persistent://a/b/t"
    tn = TopicName.get("persistent://geo/flights/departures-partition-3")
    assert tn.namespace == "geo/flights"
    assert tn.partition_index == 3
    assert str(tn.partitioned_topic_name) == "persistent://geo/flights/departures"
    assert str(TopicName.get("x").partition(2)) == "persistent://public/default/x-partition-2"
    assert TopicName.get("x").persistence_naming == "public/default/persistent/x"


@pytest.mark.parametrize("bad", ["", "  ", "a/b", "a/b/c/d", "http://a/b/c", "persistent://a/b",
                                 "persistent://a//c", "persistent://a/b/c d", "non-persistent://a/b/c"])
def test_invalid_names(bad):
    with pytest.raises(InvalidTopicName):
        TopicName.get(bad)
