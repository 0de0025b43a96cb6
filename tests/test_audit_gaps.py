"""Silences between a recorder's signs of life, found before Spark: the rule on whole seconds."""

from __future__ import annotations

from spark_analytics.gaps import silences

ALLOWED = 1500.0  # three heartbeats of 0.5 s


def test_signs_of_life_just_over_a_second_apart_are_no_silence() -> None:
    """A heartbeat at 10.99 s and the next at 12.00 s are 1.01 s apart, 2 s apart once floored
    to whole seconds: more than three 0.5 s intervals by the buckets, not by the clock."""
    assert silences([10_000, 12_000, 13_000], [], ALLOWED, None, None) == []


def test_a_silence_longer_than_allowed_is_a_window_and_a_marked_gap_covers_one() -> None:
    assert silences([10_000, 14_000, 15_000], [], ALLOWED, None, None) == [(10_000, 14_000, "no heartbeat")]
    marked = [(10_500, 13_500, "recorder not running")]
    assert silences([10_000, 14_000], marked, ALLOWED, None, None) == marked


def test_the_window_edges_allow_the_same_second() -> None:
    assert silences([10_000, 11_000], [], ALLOWED, 8_000, 13_000) == []
    assert silences([10_000, 11_000], [], ALLOWED, 5_000, 16_000) == [
        (5_000, 10_000, "not recording at the window's start"), (11_000, 16_000, "not recording at the window's end")]
