"""The suite's one way to wait (tests/support/waiting.py): pure, no services."""

from __future__ import annotations

import itertools

import pytest

from tests.support.waiting import eventually, quiet_window, wait_until


def test_wait_until_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "there", "the third poll", pause=0) == "there"


def test_wait_until_fails_naming_the_condition_and_what_it_last_saw() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the queue to drain \(4 left\); last seen: 0"):
        wait_until(lambda: 0, lambda: "the queue to drain (4 left)", timeout=0.05, pause=0.01)


def test_wait_until_not_required_hands_back_the_last_value() -> None:
    assert wait_until(list, "nothing", timeout=0.05, pause=0.01, required=False) == []


def test_errors_named_as_not_yet_are_retried_and_reported() -> None:
    calls = itertools.count()

    def flaky() -> bool:
        if next(calls) < 2:
            raise ConnectionError("restarting")
        return True

    assert wait_until(flaky, "a restarting service", pause=0, ignoring=(ConnectionError,)) is True
    with pytest.raises(AssertionError, match=r"last error: ConnectionError\('down'\)"):
        wait_until(lambda: (_ for _ in ()).throw(ConnectionError("down")), "a dead service", timeout=0.05,
                   pause=0.01, ignoring=(ConnectionError,))
    with pytest.raises(ValueError):  # anything else is a real failure, at once
        wait_until(lambda: (_ for _ in ()).throw(ValueError("bug")), "a bug", pause=0)


async def test_eventually_takes_plain_and_async_probes() -> None:
    counter = itertools.count()

    async def later() -> int:
        return next(counter) >= 2 and 7

    assert await eventually(later, "the async probe", pause=0) == 7
    assert await eventually(lambda: "plain", "the plain probe") == "plain"
    with pytest.raises(AssertionError, match=r"timed out after 0\.05 s waiting for never"):
        await eventually(lambda: False, "never", timeout=0.05, pause=0.01)


def test_a_quiet_window_listens_and_must_say_why() -> None:
    heard = []
    quiet_window(0.05, "no barrier orders a repeat", listen=lambda: heard.append(1), pause=0.01)
    assert len(heard) >= 2
    with pytest.raises(AssertionError, match="must say why"):
        quiet_window(0.01, "")
