"""Namespace bundles: hash ranges of topic names (Pulsar's ``NamespaceBundles`` and
``NamespaceBundleFactory``). Pure functions and value classes, no I/O.

A namespace's hash space 0x00000000..0xffffffff is cut at sorted boundaries
``b0=0x00000000 < b1 < ... < bn=0xffffffff`` into n bundles; bundle i holds the
hashes ``[b_i, b_(i+1))``, the last one ``[b_(n-1), 0xffffffff]`` (upper end
included). A topic belongs to the bundle holding the CRC-32 of its full name
(``persistent://tenant/ns/topic``, a partition by its own name), as Pulsar's
broker does (``NamespaceBundleFactory`` over ``Hashing.crc32()``). A bundle is
named by its range, ``0x00000000_0x40000000`` (Pulsar's bundle range string).
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Iterable, Sequence

__all__ = ["FIRST_BOUNDARY", "LAST_BOUNDARY", "Bundle", "NamespaceBundles", "topic_hash", "parse_range"]

FIRST_BOUNDARY = 0x00000000
LAST_BOUNDARY = 0xFFFFFFFF


def topic_hash(topic: str) -> int:
    """The 32-bit bundle hash of a full topic name (unsigned CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(topic.encode("utf-8")) & 0xFFFFFFFF


def _hex(value: int) -> str:
    return f"0x{value:08x}"


def parse_range(text: str) -> tuple[int, int]:
    """``"0x00000000_0x40000000"`` -> ``(0, 0x40000000)``. Raises ValueError for
    anything else (not two hex numbers, out of 0..0xffffffff, lower >= upper)."""
    if not isinstance(text, str) or text.count("_") != 1:
        raise ValueError(f"invalid bundle range {text!r}: expected 0xLOWER_0xUPPER, e.g. 0x00000000_0x40000000")
    low_text, high_text = text.split("_")
    try:
        low, high = int(low_text, 16), int(high_text, 16)
    except ValueError:
        raise ValueError(f"invalid bundle range {text!r}: the bounds must be hex numbers") from None
    if not (FIRST_BOUNDARY <= low < high <= LAST_BOUNDARY):
        raise ValueError(f"invalid bundle range {text!r}: need 0x00000000 <= lower < upper <= 0xffffffff")
    return low, high


@dataclasses.dataclass(frozen=True, order=True)
class Bundle:
    """One bundle of a namespace: ``namespace`` (``tenant/ns``), hash range
    ``lower``..``upper`` (ints; upper excluded unless it is 0xffffffff)."""

    namespace: str
    lower: int
    upper: int

    @property
    def range(self) -> str:
        """Pulsar's bundle range string ``0xLOWER_0xUPPER``."""
        return f"{_hex(self.lower)}_{_hex(self.upper)}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.range}"

    def contains_hash(self, h: int) -> bool:
        """Whether the 32-bit hash ``h`` falls in this bundle."""
        return self.lower <= h < self.upper or (self.upper == LAST_BOUNDARY and h == LAST_BOUNDARY)

    def contains(self, topic: str) -> bool:
        """Whether the full topic name ``topic`` belongs to this bundle."""
        return self.contains_hash(topic_hash(topic))

    def split(self, parts: int = 2) -> list["Bundle"]:
        """The bundle cut into ``parts`` equal ranges (Pulsar's range_equally_divide
        split algorithm). Raises ValueError when it is too small to split."""
        if parts < 2 or self.upper - self.lower < parts:
            raise ValueError(f"bundle {self} cannot be split into {parts}")
        step = (self.upper - self.lower) // parts
        cuts = [self.lower + i * step for i in range(parts)] + [self.upper]
        return [Bundle(self.namespace, cuts[i], cuts[i + 1]) for i in range(parts)]


@dataclasses.dataclass(frozen=True)
class NamespaceBundles:
    """The bundles of one namespace: ``boundaries`` (sorted ints, first 0, last
    0xffffffff, at least two). Build with :meth:`equal` or :meth:`from_boundaries`."""

    namespace: str
    boundaries: tuple[int, ...]

    @classmethod
    def equal(cls, namespace: str, count: int) -> "NamespaceBundles":
        """``count`` bundles of equal size (Pulsar's defaultNumberOfNamespaceBundles split).
        Raises ValueError when count < 1."""
        if count < 1:
            raise ValueError(f"a namespace needs at least 1 bundle, got {count}")
        if count > 0x10000:
            raise ValueError(f"at most 65536 bundles per namespace, got {count}")
        step = (LAST_BOUNDARY + 1) // count  # Pulsar: FULL_UPPER_BOUND 0x100000000 / numBundles
        cuts = [FIRST_BOUNDARY + i * step for i in range(count)] + [LAST_BOUNDARY]
        return cls(namespace, tuple(cuts))

    @classmethod
    def from_boundaries(cls, namespace: str, boundaries: Iterable) -> "NamespaceBundles":
        """From boundaries as ints or hex strings (``"0x40000000"``). Raises ValueError
        unless they are strictly increasing from 0x00000000 to 0xffffffff."""
        values = tuple(int(b, 16) if isinstance(b, str) else int(b) for b in boundaries)
        if len(values) < 2 or values[0] != FIRST_BOUNDARY or values[-1] != LAST_BOUNDARY \
                or any(a >= b for a, b in zip(values, values[1:])):
            raise ValueError(f"invalid bundle boundaries for {namespace}: need strictly increasing values "
                             f"from 0x00000000 to 0xffffffff")
        return cls(namespace, values)

    @property
    def bundles(self) -> list[Bundle]:
        """Every bundle, in hash order."""
        b = self.boundaries
        return [Bundle(self.namespace, b[i], b[i + 1]) for i in range(len(b) - 1)]

    def find(self, topic: str) -> Bundle:
        """The bundle of the full topic name ``topic``."""
        return self.find_hash(topic_hash(topic))

    def find_hash(self, h: int) -> Bundle:
        """The bundle holding the 32-bit hash ``h``."""
        import bisect

        b = self.boundaries
        i = min(bisect.bisect_right(b, h) - 1, len(b) - 2)
        return Bundle(self.namespace, b[i], b[i + 1])

    def get(self, range_text: str) -> Bundle:
        """The bundle named ``0xLOWER_0xUPPER``. Raises ValueError if it is not one
        of this namespace's bundles (e.g. a range from before a split)."""
        low, high = parse_range(range_text)
        for bundle in self.bundles:
            if bundle.lower == low and bundle.upper == high:
                return bundle
        raise ValueError(f"{range_text} is not a bundle of {self.namespace}; its bundles are: "
                         f"{', '.join(b.range for b in self.bundles)}")

    def split(self, bundle: Bundle, parts: int = 2) -> "NamespaceBundles":
        """The bundles after cutting ``bundle`` into ``parts`` (Pulsar's splitBundles).
        Raises ValueError when ``bundle`` is not one of them or is too small."""
        self.get(bundle.range)
        cuts = {c.lower for c in bundle.split(parts)}
        return NamespaceBundles(self.namespace, tuple(sorted(set(self.boundaries) | cuts)))

    def to_json(self) -> dict:
        """``{"boundaries": ["0x00000000", ...], "numBundles": n}`` (Pulsar's BundlesData)."""
        return {"boundaries": [_hex(b) for b in self.boundaries], "numBundles": len(self.boundaries) - 1}


def sorted_ranges(bundles: Sequence[Bundle]) -> list[str]:
    """Range strings of ``bundles`` in hash order."""
    return [b.range for b in sorted(bundles, key=lambda b: b.lower)]
