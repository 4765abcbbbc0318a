"""Helpers shared by the Spark tests (one local Spark session per test process)."""
