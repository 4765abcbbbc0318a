"""Print p50/p90/p99 of every hop from the out.* files in $HOP_TRACE_DIR."""

import collections
import glob
import os

ev = collections.defaultdict(list)
start = None
for path in glob.glob(os.path.join(os.environ.get("HOP_TRACE_DIR", "/tmp/hop-trace"), "out.*")):
    for line in open(path):
        tag, a, b, t = line.split()
        if tag == "START":
            start = int(t)
            continue
        ev[tag].append((a, b, int(t)))
for tag in ev:
    ev[tag] = [e for e in ev[tag] if start is None or e[2] > start]


def first(tag):
    d = {}
    for a, _, t in ev[tag]:
        d.setdefault(a, t)
    return d


def last(tag):
    return {a: t for a, _, t in ev[tag]}


C1, C3, B1, B5, B6 = first("C1"), first("C3"), first("B1"), first("B5"), first("B6")
B2, B4f, B4l = first("B2"), first("B4"), last("B4")
K1, K2, K3, K4 = first("K1"), first("K2"), first("K3"), first("K4")
D1, D3 = first("D1"), first("D3")
seq_to_entry = {a: b for a, b, _ in ev["B6"]}
HOPS = [
    ("client write -> broker reads Send", lambda s, e: (C1[s], B1[s])),
    ("broker: Send -> bookie write", lambda s, e: (B1[s], B2[e])),
    ("broker write -> bookie reads add", lambda s, e: (B2[e], K1[e])),
    ("bookie: read -> commit starts", lambda s, e: (K1[e], K2[e])),
    ("bookie: commit (+fsync)", lambda s, e: (K2[e], K3[e])),
    ("bookie: commit -> answer yielded", lambda s, e: (K3[e], K4[e])),
    ("bookie answer -> broker reads it", lambda s, e: (K4[e], B4f[e])),
    ("second bookie's answer", lambda s, e: (B4f[e], B4l[e])),
    ("broker: answers -> add complete", lambda s, e: (B4l[e], B5[e])),
    ("add complete -> receipt written", lambda s, e: (B5[e], B6[s])),
    ("receipt written -> client reads it", lambda s, e: (B6[s], C3[s])),
    ("add complete -> dispatched", lambda s, e: (B5[e], D1[e])),
    ("dispatched -> consumer reads it", lambda s, e: (D1[e], D3[e])),
    ("TOTAL send -> receipt", lambda s, e: (C1[s], C3[s])),
    ("TOTAL send -> consumer", lambda s, e: (C1[s], D3[e])),
]
for name, fn in HOPS:
    v = []
    for s, e in seq_to_entry.items():
        try:
            a, b = fn(s, e)
        except KeyError:
            continue
        v.append((b - a) / 1000)
    if not v:
        print(f"{name:38s} no samples")
        continue
    v.sort()
    print(f"{name:38s} n={len(v):5d}  p50 {v[len(v) // 2]:7.0f} us  p90 {v[int(len(v) * .9)]:7.0f}  "
          f"p99 {v[int(len(v) * .99)]:7.0f}")
