"""The fault suite's oracle: which repeats at an at-least-once sink a deliverer kill explains."""

from __future__ import annotations

from tests.support.checker import allow_window_repeats, check


def test_a_repeat_is_allowed_only_across_a_kill_and_only_up_to_the_in_flight_bound() -> None:
    arrivals = [(1.0, "a"), (2.0, "b"), (3.0, "a"), (4.0, "b"), (5.0, "c"), (6.0, "c")]
    ids = [alert for _, alert in arrivals]
    report = allow_window_repeats(check("webhook", {"a", "b", "c"}, ids), arrivals, kill_times=[2.5], in_flight=16)
    assert report.window_repeats == {"a": 2, "b": 2}  # each pair straddles the kill at 2.5
    assert report.duplicated == {"c": 2} and not report.ok  # no kill between c's two arrivals
    assert "2 repeats inside a deliverer kill's window" in report.line()

    bounded = allow_window_repeats(check("webhook", {"a", "b"}, ids[:4]), arrivals[:4], kill_times=[2.5], in_flight=1)
    assert bounded.duplicated == {"a": 2, "b": 2} and not bounded.window_repeats  # more than one kill can explain
