"""Compare the sink job's ``carrier_hourly`` tables of several clusters:
``python -m client.spark.compare DIR [DIR ...]`` prints rows, flights and
cancellations per directory and whether all are identical (exit status 1 when
they differ, 2 when a directory holds no table)."""
from __future__ import annotations

import sys


def load(path: str):
    """The carrier_hourly Parquet table at ``path`` as a pandas DataFrame sorted by
    its keys (float columns rounded to 6 digits so equal sums compare equal)."""
    import pandas as pd

    df = pd.read_parquet(path)
    keys = [c for c in df.columns if df[c].dtype == object or "window" in c or c in ("carrier", "hour", "date")]
    df = df.sort_values(keys).reset_index(drop=True) if keys else df
    for c in df.columns:
        if df[c].dtype.kind == "f":
            df[c] = df[c].round(6)
    return df


def main(argv: list[str] | None = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if len(paths) < 1:
        print("usage: python -m client.spark.compare CARRIER_HOURLY_DIR [...]", file=sys.stderr)
        return 2
    tables = {}
    for p in paths:
        try:
            tables[p] = load(p)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{p}: cannot read the table ({exc}); did the sink job run?", file=sys.stderr)
            return 2
    for p, df in tables.items():
        flights = int(df["flights"].sum()) if "flights" in df else len(df)
        cancelled = int(df["cancellations"].sum()) if "cancellations" in df else 0
        print(f"{p}: {len(df)} carrier-hour rows, {flights} flights, {cancelled} cancellations")
    first = next(iter(tables.values()))
    same = all(df.shape == first.shape and df.equals(first) for df in tables.values())
    print("aggregates identical across clusters: " + ("yes" if same else "NO"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
