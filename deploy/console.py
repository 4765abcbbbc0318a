"""Terminal output for the launchers: plain-text tables and per-line progress
bars (redrawn in place on a terminal, one summary line every few seconds
otherwise, so logs of CI runs stay readable)."""
from __future__ import annotations

import os
import sys
import time
from typing import Sequence, TextIO

__all__ = ["table", "human_count", "human_bytes", "ProgressBars"]


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = ()) -> str:
    """Rows under headers, columns padded; column indexes in ``right`` are
    right-aligned (numbers). Returns the text without a trailing newline."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        """Row ``r`` (strings) padded to ``widths``, trailing spaces stripped."""
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def human_count(n: float) -> str:
    """12345 -> '12,345'; floats with one decimal below 100."""
    if isinstance(n, float) and n < 100:
        return f"{n:.1f}"
    return f"{int(round(n)):,}"


def human_bytes(n: float) -> str:
    """Bytes as B/KiB/MiB/GiB with one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class ProgressBars:
    """Named progress bars, e.g. one per cluster: ``update(name, done)`` then
    ``render()`` (rate-limited); ``close()`` prints the final state.

    On a terminal the bars are redrawn in place; otherwise (``stream`` not a
    tty, or ``plain=True``) one compact line is printed every ``interval_s``.
    """

    def __init__(self, totals: dict[str, int], unit: str = "msg", stream: TextIO | None = None,
                 plain: bool | None = None, interval_s: float | None = None, width: int = 30):
        self.totals = dict(totals)
        self.done = {k: 0 for k in totals}
        self.extra = {k: "" for k in totals}
        self.unit = unit
        self.stream = stream or sys.stderr
        tty = hasattr(self.stream, "isatty") and self.stream.isatty() and os.environ.get("TERM") != "dumb"
        self.plain = (not tty) if plain is None else plain
        self.interval_s = interval_s if interval_s is not None else (5.0 if self.plain else 0.2)
        self.width = width
        self.start = time.monotonic()
        self.finished_at: dict[str, float] = {}
        self.base: dict[str, tuple[int, float]] = {}
        self._last = 0.0
        self._drawn = 0
        self._name_w = max((len(k) for k in totals), default=4)

    def update(self, name: str, done: int, extra: str = "") -> None:
        """Set ``name``'s count (and an optional note shown after the bar); the
        rate counts from the first update."""
        self.base.setdefault(name, (done, time.monotonic()))
        self.done[name] = done
        if extra:
            self.extra[name] = extra
        if done >= self.totals.get(name, 0) and name not in self.finished_at:
            self.finished_at[name] = time.monotonic()

    def rate(self, name: str) -> float:
        """Average units per second for ``name`` since its first update (until it finished)."""
        base, t0 = self.base.get(name, (0, self.start))
        end = self.finished_at.get(name, time.monotonic())
        elapsed = end - t0
        return (self.done[name] - base) / elapsed if elapsed > 0.05 else 0.0

    def _line(self, name: str) -> str:
        total = max(1, self.totals[name])
        frac = min(1.0, self.done[name] / total)
        filled = int(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        eta = ""
        r = self.rate(name)
        if frac < 1.0 and r > 0:
            eta = f" eta {int((total - self.done[name]) / r)}s"
        return (f"{name.ljust(self._name_w)} [{bar}] {frac * 100:5.1f}% {self.done[name]:>9,}/{self.totals[name]:,} "
                f"{r:8,.0f} {self.unit}/s{eta} {self.extra.get(name, '')}").rstrip()

    def render(self, force: bool = False) -> None:
        """Draw (at most every ``interval_s`` unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        if self.plain:
            parts = [f"{n} {self.done[n]:,}/{self.totals[n]:,} ({self.rate(n):,.0f}/s)" for n in self.totals]
            self.stream.write(f"  [{now - self.start:6.1f}s] " + " | ".join(parts) + "\n")
        else:
            if self._drawn:
                self.stream.write(f"\x1b[{self._drawn}F")
            for n in self.totals:
                self.stream.write("\x1b[2K" + self._line(n) + "\n")
            self._drawn = len(self.totals)
        self.stream.flush()

    def close(self) -> None:
        """Final redraw (on a terminal) or the final lines (plain)."""
        if self.plain:
            for n in self.totals:
                self.stream.write("  " + self._line(n) + "\n")
            self.stream.flush()
        else:
            self.render(force=True)
