"""Issue 21 item 11, the pure part: subscription (cursor) names are URL-encoded
into one metadata path segment (Pulsar's Codec.encode), so names with '/' are
allowed again; path tricks ('.', '..' parts) and control characters are not."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.metadata.names import decode_path_segment, encode_path_segment
from broker.service.errors import InvalidArgument
from broker.service.resources import check_subscription_name


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_path_segment_round_trip(name):
    segment = encode_path_segment(name)
    assert "/" not in segment and segment not in (".", "..") or name in (".", "..")
    assert all(c.isascii() and (c.isalnum() or c in "_.-~%") for c in segment)
    assert decode_path_segment(segment) == name


def test_path_segment_examples():
    assert encode_path_segment("sub-1_a.b~c") == "sub-1_a.b~c"           # plain names keep their paths
    assert encode_path_segment("a/b") == "a%2Fb"
    assert encode_path_segment("a b+c%") == "a%20b%2Bc%25"
    assert decode_path_segment("a+b") == "a+b"                           # a raw legacy segment stays itself
    assert decode_path_segment("é/ü") == "é/ü"
    with pytest.raises(TypeError):
        encode_path_segment(b"a")


def test_subscription_names_with_slashes_are_allowed_but_not_path_tricks():
    for ok in ("a/b", "team/app/sub", "/lead", "trail/", "a b", "50%", "é"):
        assert check_subscription_name(ok) == ok
    for bad in ("", ".", "..", "a/../b", "../x", "x/.", "a\nb", "a\x00b", "\ud800", 7, None):
        with pytest.raises(InvalidArgument):
            check_subscription_name(bad)
