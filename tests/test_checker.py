"""The fault suite's oracle: lost, duplicated, unexpected, and alerts in doubt at an at-most-once sink."""

from __future__ import annotations

from tests.support.checker import check


def test_an_alert_in_doubt_is_accounted_for_but_never_excuses_a_repeat() -> None:
    report = check("webhook", {"a", "b", "c"}, ["a", "b"], in_doubt=["c"])
    assert report.ok and report.lost == [] and report.in_doubt == ["c"]
    assert "in doubt 1" in report.line()

    missing = check("webhook", {"a", "b", "c"}, ["a"], in_doubt=["c"])
    assert missing.lost == ["b"] and not missing.ok

    repeated = check("webhook", {"a", "b"}, ["a", "a", "b"], in_doubt=["a"])
    assert repeated.duplicated == {"a": 2} and not repeated.ok  # in doubt is never a licence to resend

    stray = check("webhook", {"a"}, ["a"], in_doubt=["z"])
    assert stray.unexpected == ["z"] and not stray.ok
