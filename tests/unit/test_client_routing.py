"""client.routing: Pulsar-identical key hashes and partition routers."""
import struct
from collections import Counter

import pytest
from hypothesis import given, strategies as st

from client.errors import InvalidConfiguration
from client.routing import (
    HashingScheme, PartitionsRoutingMode, RoundRobinPartitionMessageRouter, SinglePartitionMessageRouter,
    create_router, java_string_hash, murmur3_32_hash, partition_switch_ms, sign_safe_mod,
)


def _i32(x):
    x &= 0xFFFFFFFF
    return x


def _rotl(x, r):
    return _i32((x << r) | (x >> (32 - r)))


def reference_murmur3(data: bytes) -> int:
    """Line-by-line transcription of Pulsar's org.apache.pulsar.common.util.Murmur3_32Hash."""
    c1, c2, h1 = 0xCC9E2D51, 0x1B873593, 0
    n = len(data) // 4
    for (k1,) in struct.iter_unpack("<I", data[:n * 4]):
        k1 = _i32(_rotl(_i32(k1 * c1), 15) * c2)
        h1 = _i32(_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64)
    k1 = 0
    for i, b in enumerate(data[n * 4:]):
        k1 ^= b << (i * 8)
    h1 ^= _i32(_rotl(_i32(k1 * c1), 15) * c2)
    h1 ^= len(data)
    h1 ^= h1 >> 16
    h1 = _i32(h1 * 0x85EBCA6B)
    h1 ^= h1 >> 13
    h1 = _i32(h1 * 0xC2B2AE35)
    h1 ^= h1 >> 16
    return h1 & 0x7FFFFFFF


def reference_java_hash(s: str) -> int:
    """sum(s[i] * 31^(n-1-i)) over UTF-16 code units, as int32, & Integer.MAX_VALUE."""
    units = s.encode("utf-16-be", "surrogatepass")
    codes = [int.from_bytes(units[i:i + 2], "big") for i in range(0, len(units), 2)]
    total = sum(c * 31 ** (len(codes) - 1 - i) for i, c in enumerate(codes))
    return total % 2**32 & 0x7FFFFFFF


# Vectors from Pulsar's pulsar-client/src/test/java/org/apache/pulsar/client/impl/HashTest.java
# ("Same value as C++ client").
@pytest.mark.parametrize("key,expected", [
    ("k1", 2110152746), ("k2", 1479966664), ("key1", 462881061), ("key2", 1936800180),
    ("key01", 39696932), ("key02", 751761803),
])
def test_murmur3_matches_pulsar_hash_test(key, expected):
    assert murmur3_32_hash(key) == expected
    assert murmur3_32_hash(key.encode()) == expected
    assert reference_murmur3(key.encode()) == expected


@pytest.mark.parametrize("key,expected", [("keykeykeykeykey1", 434058482), ("keykeykey2", 42978643)])
def test_java_string_hash_matches_pulsar_hash_test(key, expected):
    # key1 overflows as unsigned int32, key2's hashCode() is negative as signed int32
    assert java_string_hash(key) == expected


def test_empty_and_non_ascii_keys():
    assert murmur3_32_hash("") == 0 and java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00  # surrogate pair, as Java chars
    assert murmur3_32_hash("é") == reference_murmur3("é".encode("utf-8"))
    assert java_string_hash("é".encode()) == java_string_hash("é")


@given(st.binary(max_size=64))
def test_murmur3_equals_java_algorithm(data):
    assert murmur3_32_hash(data) == reference_murmur3(data)


@given(st.text(max_size=40))
def test_hashes_are_non_negative_int32_and_match_references(key):
    assert murmur3_32_hash(key) == reference_murmur3(key.encode("utf-8"))
    assert java_string_hash(key) == reference_java_hash(key)
    assert 0 <= murmur3_32_hash(key) < 2**31 and 0 <= java_string_hash(key) < 2**31


@pytest.mark.parametrize("n,m,expected", [(7, 3, 1), (-7, 3, 2), (-1, 5, 4), (0, 4, 0), (2**62 + 1, 2, 1)])
def test_sign_safe_mod(n, m, expected):
    assert sign_safe_mod(n, m) == expected


def test_sign_safe_mod_rejects_non_positive_modulus():
    with pytest.raises(ValueError):
        sign_safe_mod(1, 0)


def test_enums_have_pulsar_names():
    assert [m.name for m in PartitionsRoutingMode] == ["RoundRobinDistribution", "UseSinglePartition",
                                                       "CustomPartition"]
    assert [m.name for m in HashingScheme] == ["JavaStringHash", "Murmur3_32Hash"]


class FakeClock:
    def __init__(self, now=0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.mark.parametrize("scheme,hash_fn", [(HashingScheme.Murmur3_32Hash, murmur3_32_hash),
                                            (HashingScheme.JavaStringHash, java_string_hash)])
def test_keyed_messages_use_the_hash(scheme, hash_fn):
    for router in (RoundRobinPartitionMessageRouter(scheme), SinglePartitionMessageRouter(hashing_scheme=scheme)):
        for key in ("k1", "key02", "order-17", ""):
            assert router.choose_partition(key, 7) == hash_fn(key) % 7


def test_round_robin_with_batching_switches_per_window():
    clock = FakeClock(1000)
    router = RoundRobinPartitionMessageRouter(start_partition_index=2, batching_enabled=True,
                                              partition_switch_ms=10, clock=clock)
    picks = set()
    for t in range(1000, 1010):
        clock.now = t
        picks.add(router.choose_partition(None, 5))
    assert picks == {(1000 // 10 + 2) % 5}  # same partition within one window: batches fill up
    clock.now = 1010
    assert router.choose_partition(None, 5) == (101 + 2) % 5
    seen = []
    for w in range(5):
        clock.now = 2000 + 10 * w
        seen.append(router.choose_partition(None, 5))
    assert sorted(seen) == [0, 1, 2, 3, 4]  # every partition in turn


def test_partition_switch_interval_is_at_least_one_ms():
    clock = FakeClock(0)
    router = RoundRobinPartitionMessageRouter(start_partition_index=0, partition_switch_ms=0, clock=clock)
    assert router.partition_switch_ms == 1
    picks = []
    for clock.now in range(4):  # a new 1 ms window each time
        picks.append(router.choose_partition(None, 3))
    assert picks == [0, 1, 2, 0]


def test_partition_switch_ms_helper():
    assert partition_switch_ms(1) == 10  # Pulsar: publish delay x frequency (default 10)
    assert partition_switch_ms(5, 1) == 5
    assert partition_switch_ms(0) == 1 and partition_switch_ms(0.01, 1) == 1


def test_round_robin_without_batching_cycles():
    router = RoundRobinPartitionMessageRouter(start_partition_index=3, batching_enabled=False)
    assert [router.choose_partition(None, 4) for _ in range(6)] == [3, 0, 1, 2, 3, 0]


def test_random_start_is_in_range_and_spreads():
    starts = {RoundRobinPartitionMessageRouter(batching_enabled=False).choose_partition(None, 8) for _ in range(200)}
    assert len(starts) > 4 and starts <= set(range(8))


def test_single_partition_router():
    router = SinglePartitionMessageRouter(partition_index=6)
    assert {router.choose_partition(None, 4) for _ in range(10)} == {2}
    assert 0 <= SinglePartitionMessageRouter().choose_partition(None, 3) < 3


@pytest.mark.parametrize("router", [RoundRobinPartitionMessageRouter(), SinglePartitionMessageRouter()])
def test_zero_partitions_rejected(router):
    with pytest.raises(ValueError, match="num_partitions"):
        router.choose_partition("k", 0)


@given(st.text(max_size=20) | st.none(), st.integers(1, 1000))
def test_choice_is_always_in_range(key, n):
    assert 0 <= RoundRobinPartitionMessageRouter().choose_partition(key, n) < n
    assert 0 <= SinglePartitionMessageRouter().choose_partition(key, n) < n


def test_murmur_spreads_keys_evenly():
    counts = Counter(murmur3_32_hash(f"user-{i}") % 8 for i in range(8000))
    assert min(counts.values()) > 800


def test_create_router():
    assert isinstance(create_router(), RoundRobinPartitionMessageRouter)
    assert isinstance(create_router("UseSinglePartition"), SinglePartitionMessageRouter)
    rr = create_router(PartitionsRoutingMode.RoundRobinDistribution, HashingScheme.JavaStringHash,
                       batching_enabled=False, partition_switch_ms=50)
    assert rr.choose_partition("keykeykey2", 1000) == 42978643 % 1000 and not rr.batching_enabled

    class Fixed:
        def choose_partition(self, key, num_partitions):
            return num_partitions - 1

    custom = Fixed()
    assert create_router(PartitionsRoutingMode.CustomPartition, custom_router=custom) is custom
    with pytest.raises(InvalidConfiguration, match="CustomPartition"):
        create_router(PartitionsRoutingMode.CustomPartition)
    with pytest.raises(InvalidConfiguration, match="CustomPartition"):
        create_router(PartitionsRoutingMode.RoundRobinDistribution, custom_router=custom)
