"""`run_sessions`' backoff on a real broker: a session that ends at once after every connect
(a queue that keeps refusing the engine's publishes) backs off further each time; one that
lasted starts the backoff over."""

from __future__ import annotations

import asyncio

import pytest

from aldebaran.io import amqp
from aldebaran.settings import Settings


async def _attempts(settings: Settings, monkeypatch: pytest.MonkeyPatch, lasts: float, sessions: int) -> list[int]:
    """The backoff attempt asked for after each of `sessions` sessions that end after `lasts` s."""
    asked: list[int] = []
    monkeypatch.setattr(amqp, "backoff_delay", lambda attempt, *a, **k: asked.append(attempt) or 0.0)
    stopping = asyncio.Event()
    ran = 0

    async def session(connection: object, ended: asyncio.Event) -> None:
        nonlocal ran
        ran += 1
        if ran > sessions:
            stopping.set()
            return
        await asyncio.sleep(lasts)
        raise ConnectionError("publish refused")

    await asyncio.wait_for(amqp.run_sessions(settings, "test", stopping, session), timeout=60)
    return asked


async def test_sessions_that_end_at_once_back_off_further_each_time(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    assert await _attempts(settings, monkeypatch, lasts=0.0, sessions=5) == [0, 1, 2, 3, 4]


async def test_a_session_that_lasted_starts_the_backoff_over(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amqp, "STABLE_SESSION_SECONDS", 0.05)
    assert await _attempts(settings, monkeypatch, lasts=0.1, sessions=4) == [0, 0, 0, 0]
