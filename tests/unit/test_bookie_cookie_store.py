"""The cookie check against the metadata store's copy (bookie.cookie.check_stored_cookie), pure."""
from __future__ import annotations

import pytest

from bookie.cookie import Cookie, InvalidCookieError, check_stored_cookie, cookie_from_json

A = Cookie("a" * 32, "127.0.0.1:3181", 1)
B = Cookie("b" * 32, "127.0.0.1:3181", 2)


def test_a_new_bookie_or_its_own_data_dir_starts():
    check_stored_cookie("/d", None, None, "127.0.0.1:3181", False)   # first start
    check_stored_cookie("/d", A, None, "127.0.0.1:3181", False)      # registered before cookies were kept
    check_stored_cookie("/d", A, A, "127.0.0.1:3181", False)


def test_a_wiped_data_dir_is_refused_unless_formatted():
    with pytest.raises(InvalidCookieError, match="data dir was wiped.*--format.*etcdctl del /ledgers/cookies/"):
        check_stored_cookie("/d", None, A, "127.0.0.1:3181", False)
    check_stored_cookie("/d", None, A, "127.0.0.1:3181", True)


def test_another_instances_data_dir_is_refused():
    with pytest.raises(InvalidCookieError, match="cookie mismatch"):
        check_stored_cookie("/d", B, A, "127.0.0.1:3181", False)


def test_cookie_json_round_trip_and_garbage():
    assert cookie_from_json(A.to_json().encode()) == A
    for bad in (b"", b"{}", b"[1]", b'{"instance_id": ""}'):
        with pytest.raises(ValueError):
            cookie_from_json(bad)
