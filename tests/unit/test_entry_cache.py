"""Entry cache eviction logic (pure, no I/O): behind the readers, by age, by size;
per-entry overhead in the size; keys that the garbage collector does not track.

A hypothesis state machine drives one manager with two caches through random
inserts, clock advances, eviction ticks with moving reader positions, trims and
lookups, and checks against a plain model after every step that the cache never
returns wrong data or disorder, that it keeps what the rules say to keep and
drops what they say to drop, and that every byte count adds up."""
from __future__ import annotations

import gc
import tracemalloc

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker.ledger.entry_cache import ENTRY_OVERHEAD_BYTES, EntryCacheManager
from broker.ledger.position import Position

MB = 1024 * 1024


def manager(max_bytes=64 * MB, **kw):
    kw.setdefault("eviction_interval_ms", 0)      # no task: the tests call do_cache_eviction
    return EntryCacheManager(max_bytes, **kw)


def fill(cache, ledger, first, n, size=10):
    for e in range(first, first + n):
        assert cache.insert(Position(ledger, e), bytes([e % 256]) * size)


# ---------------------------------------------------------------------------- examples
def test_insert_get_and_size_counts_overhead():
    m = manager()
    c = m.new_cache("t")
    assert c.insert(Position(1, 0), b"abc")
    assert c.get(Position(1, 0)) == b"abc" and c.get(Position(1, 1)) is None
    assert (c.hits, c.misses) == (1, 1)
    assert c.size == m.total == 3 + ENTRY_OVERHEAD_BYTES and len(c) == m.entries == 1


def test_out_of_order_or_duplicate_insert_is_not_cached():
    c = manager().new_cache("t")
    fill(c, 2, 5, 3)
    assert not c.insert(Position(2, 6), b"other")       # duplicate: the first stays
    assert not c.insert(Position(1, 99), b"older")      # before the last inserted
    assert c.get(Position(2, 6)) == bytes([6]) * 10 and Position(1, 99) not in c


def test_evicts_strictly_before_the_slowest_reader():
    readers = {"pos": Position(1, 4)}
    m = manager()
    c = m.new_cache("t", lambda: readers["pos"])
    c.active = True
    fill(c, 1, 0, 10)
    fill(c, 2, 0, 5)
    stats = m.do_cache_eviction(now=100.0)
    assert stats.entries == 4 and c.positions()[0] == Position(1, 4)
    readers["pos"] = Position(2, 2)                      # across a ledger boundary
    m.do_cache_eviction(now=100.01)
    assert c.positions() == [Position(2, 2), Position(2, 3), Position(2, 4)]
    assert c.size == m.total == 3 * (10 + ENTRY_OVERHEAD_BYTES)
    assert m.evicted_entries["readers"] == 12


def test_without_an_active_cursor_the_cache_is_emptied_and_stops_caching():
    readers = {"pos": Position(1, 0)}
    m = manager()
    c = m.new_cache("t", lambda: readers["pos"])
    assert not c.insert(Position(1, 0), b"x")            # no cursor has read yet
    c.active = True                                      # a cursor read (ManagedCursor.read_entries)
    fill(c, 1, 0, 3)
    readers["pos"] = None
    m.do_cache_eviction(now=1.0)
    assert len(c) == 0 and m.total == 0 and not c.active
    assert not c.insert(Position(1, 3), b"x")
    assert m.evicted_entries["inactive"] == 3


def test_age_eviction_keeps_entries_younger_than_the_threshold():
    m = manager(eviction_time_threshold_ms=1000)
    c = m.new_cache("t")                                 # no reader callback: age and size only
    fill(c, 1, 0, 5)
    m.do_cache_eviction(now=10.0)                        # marks: the first 5 were added before t=10
    fill(c, 1, 5, 5)
    m.do_cache_eviction(now=10.5)                        # the next 5 before t=10.5
    m.do_cache_eviction(now=10.9)
    assert len(c) == 10
    m.do_cache_eviction(now=11.0)                        # 1 s after the first mark
    assert c.positions()[0] == Position(1, 5) and len(c) == 5
    m.do_cache_eviction(now=11.49)
    assert len(c) == 5
    m.do_cache_eviction(now=11.5)
    assert len(c) == 0 and m.total == 0 and m.evicted_entries["age"] == 10


def test_size_cap_evicts_the_globally_oldest_down_to_the_watermark():
    per = 1000 + ENTRY_OVERHEAD_BYTES
    m = manager(max_bytes=100 * per, eviction_watermark=0.5, eviction_time_threshold_ms=0)
    old, new = m.new_cache("old"), m.new_cache("new")
    fill(old, 1, 0, 30, size=1000)
    m.do_cache_eviction(now=1.0)                         # old's entries are older...
    fill(new, 7, 0, 60, size=1000)
    m.do_cache_eviction(now=2.0)                         # ...than new's, though new is bigger
    assert m.total == 90 * per
    fill(new, 7, 60, 11, size=1000)                      # 101 entries: over the cap
    assert m.total <= 50 * per
    assert len(old) == 0                                 # the oldest went first
    assert new.positions()[-1] == Position(7, 70)        # the newest stayed
    assert m.evicted_entries["size"] == 101 - len(new)
    assert old.size + new.size == m.total


def test_invalidate_ledgers_and_clear():
    m = manager()
    c = m.new_cache("t")
    fill(c, 1, 0, 3)
    fill(c, 2, 0, 3)
    fill(c, 3, 0, 3)
    assert c.invalidate_ledgers([1, 3]) == (6, 6 * (10 + ENTRY_OVERHEAD_BYTES))
    assert c.positions() == [Position(2, 0), Position(2, 1), Position(2, 2)]
    c.clear()
    assert m.total == 0 and m.caches() == []


def test_zero_budget_disables_caching():
    c = manager(max_bytes=0).new_cache("t")
    assert not c.insert(Position(1, 0), b"x") and len(c) == 0


def test_watermark_must_be_a_fraction():
    with pytest.raises(ValueError):
        EntryCacheManager(MB, eviction_watermark=1.5)


# ---------------------------------------------------------------------------- memory
def test_accounted_size_matches_the_memory_python_allocates():
    """ENTRY_OVERHEAD_BYTES is what an entry costs besides its payload (within 20%)."""
    for size in (100, 1000):
        c = manager(max_bytes=1 << 40).new_cache("t")
        n = 20_000
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for i in range(n):
                c.insert(Position(3, 1000 + i), b"%d" % i + bytes(size - len(b"%d" % i)))
            used = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        overhead = used / n - size
        assert 0.8 * ENTRY_OVERHEAD_BYTES <= overhead <= 1.2 * ENTRY_OVERHEAD_BYTES, overhead
        assert c.size == n * (size + ENTRY_OVERHEAD_BYTES)


def test_cached_entries_are_not_tracked_by_the_garbage_collector():
    c = manager().new_cache("t")
    gc.collect()
    before = len(gc.get_objects())
    fill(c, 1, 0, 20_000)
    fill(c, 2, 0, 20_000)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert grown < 50, f"{grown} new GC-tracked objects for 40,000 cached entries"
    for led in c._ledgers.values():
        assert not gc.is_tracked(led.entries)


# ---------------------------------------------------------------------------- model
class CacheMachine(RuleBasedStateMachine):
    """Two caches on one manager; the model remembers every inserted entry, when it
    was inserted and which eviction rules applied to it since."""

    THRESHOLD_S = 1.0

    @initialize(budget_entries=st.sampled_from([5, 40, 10_000]))
    def setup(self, budget_entries):
        self.per = 8 + ENTRY_OVERHEAD_BYTES
        self.budget = budget_entries * self.per
        self.m = EntryCacheManager(self.budget, eviction_watermark=0.9, eviction_interval_ms=0,
                                   eviction_time_threshold_ms=self.THRESHOLD_S * 1000)
        self.now = 100.0
        self.reader = [Position(0, 0), Position(0, 0)]
        self.no_reader = [False, False]
        self.caches = [self.m.new_cache(f"c{i}", (lambda i=i: None if self.no_reader[i] else self.reader[i]))
                       for i in range(2)]
        for c in self.caches:
            c.active = True
        self.next = [(1, 0), (1, 0)]
        self.inserted = [{}, {}]          # position -> (data, insert time)
        self.size_evicted = False
        self.gone = [set(), set()]        # positions the rules allowed to drop
        self.ticks: list[float] = []      # times of the eviction ticks so far

    @rule(i=st.integers(0, 1), n=st.integers(1, 8), new_ledger=st.booleans(), gap=st.integers(0, 2))
    def insert(self, i, n, new_ledger, gap):
        lid, eid = self.next[i]
        if new_ledger:
            lid, eid = lid + 1 + gap, 0
        else:
            eid += gap
        for _ in range(n):
            pos = Position(lid, eid)
            data = b"%03d:%04d" % (lid % 1000, eid % 10_000)
            before = self.m.evicted_entries["size"]
            cached = self.caches[i].insert(pos, data)
            assert cached == self.caches[i].active
            if cached:
                self.inserted[i][pos] = (data, self.now, len(self.ticks))
            if self.m.evicted_entries["size"] != before:
                self.size_evicted = True
            eid += 1
        self.next[i] = (lid, eid)

    @rule(dt=st.sampled_from([0.001, 0.01, 0.3, 0.6, 1.0, 2.5]))
    def advance(self, dt):
        self.now += dt

    @rule(i=st.integers(0, 1), back=st.integers(0, 12))
    def move_reader(self, i, back):
        lid, eid = self.next[i]
        self.reader[i] = Position(lid, max(0, eid - back))   # may move backwards (a rewind)

    @rule(i=st.integers(0, 1))
    def reader_goes_away(self, i):
        self.no_reader[i] = True

    @rule(i=st.integers(0, 1))
    def reader_comes_back(self, i):
        self.no_reader[i] = False
        self.caches[i].active = True

    @rule()
    def tick(self):
        before_size = self.m.evicted_entries["size"]
        self.m.do_cache_eviction(self.now)
        self.ticks.append(self.now)
        if self.m.evicted_entries["size"] != before_size:
            self.size_evicted = True
        for i, c in enumerate(self.caches):
            ins = self.inserted[i]
            cached = set(c.positions())
            if self.no_reader[i]:
                assert not cached       # (an empty cache is deactivated once something is added)
                self.gone[i] |= set(ins)
                continue
            for pos, (_, t, ticks_before) in ins.items():
                if pos < self.reader[i]:
                    assert pos not in cached, "kept an entry every reader has passed"
                    self.gone[i].add(pos)
                elif self.now - t < self.THRESHOLD_S and pos not in self.gone[i] and not self.size_evicted:
                    assert pos in cached, f"dropped {pos}, {self.now - t:.3f} s old, not passed by the reader"
                # Age eviction is prompt: an entry goes at the first tick at least the
                # threshold after the first tick that followed its insertion.
                if pos in cached and ticks_before < len(self.ticks):
                    assert self.ticks[ticks_before] > self.now - self.THRESHOLD_S, f"kept {pos}, too old"
            self.gone[i] |= {p for p in ins if p not in cached}

    @rule(i=st.integers(0, 1), data=st.data())
    @precondition(lambda self: any(self.inserted))
    def trim(self, i, data):
        ledgers = sorted({p.ledger_id for p in self.inserted[i]})
        if not ledgers:
            return
        lid = data.draw(st.sampled_from(ledgers))
        self.caches[i].invalidate_ledgers([lid])
        self.gone[i] |= {p for p in self.inserted[i] if p.ledger_id == lid}

    @invariant()
    def consistent(self):
        if not hasattr(self, "m"):
            return
        total = 0
        for i, c in enumerate(self.caches):
            positions = c.positions()
            assert positions == sorted(positions) and len(positions) == len(c)
            for pos in positions:
                assert c.get(pos) == self.inserted[i][pos][0], "wrong data for a position"
            assert c.size == len(c) * self.per
            total += c.size
        assert self.m.total == total <= self.budget
        assert self.m.entries == sum(len(c) for c in self.caches)


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
