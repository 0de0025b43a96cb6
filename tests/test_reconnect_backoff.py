"""`run_sessions` on a real broker: a session that ends at once after every connect (a queue
that keeps refusing the engine's publishes) backs off further each time; one that lasted
starts the backoff over; a session whose connection closed under it is reconnected whatever
the client raised, and a session's own bug still ends the worker."""

from __future__ import annotations

import asyncio

import aio_pika.abc
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


async def test_a_connection_closed_under_a_session_is_reconnected_whatever_the_client_raises(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut between a session's connect and its first channel: aiormq raises RuntimeError."""
    monkeypatch.setattr(amqp, "backoff_delay", lambda *a, **k: 0.0)
    stopping = asyncio.Event()
    raised: list[BaseException] = []

    async def session(connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event) -> None:
        if raised:
            stopping.set()
            return
        await connection.close()
        try:
            await connection.channel()
        except BaseException as exc:
            raised.append(exc)
            raise

    await asyncio.wait_for(amqp.run_sessions(settings, "test", stopping, session), timeout=60)
    assert len(raised) == 1 and isinstance(raised[0], RuntimeError)


async def test_a_sessions_own_bug_on_an_open_connection_still_ends_the_worker(settings: Settings) -> None:
    async def session(connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event) -> None:
        raise RuntimeError("a bug in the session")

    with pytest.raises(RuntimeError, match="a bug in the session"):
        await asyncio.wait_for(amqp.run_sessions(settings, "test", asyncio.Event(), session), timeout=60)


async def test_what_a_lost_session_held_is_collected_before_the_next(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its connection's objects are old and in cycles: the tuned collector would keep them for
    hundreds of millions of allocations."""
    import gc
    import weakref

    monkeypatch.setattr(amqp, "backoff_delay", lambda *a, **k: 0.0)
    stopping = asyncio.Event()
    held: list[weakref.ref[object]] = []
    alive_at_next: list[bool] = []

    class Book:  # a per-order worker's book, in a cycle with what holds it
        def __init__(self) -> None:
            self.me = self

    async def session(connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event) -> None:
        if held:
            alive_at_next.append(held[0]() is not None)
            stopping.set()
            return
        book = Book()
        held.append(weakref.ref(book))
        gc.collect()
        gc.freeze()  # old, as a book of a long session is: out of the young collections' reach
        try:
            raise ConnectionError("connection lost")
        finally:
            gc.unfreeze()

    gc.disable()  # only the collection under test runs
    try:
        await asyncio.wait_for(amqp.run_sessions(settings, "test", stopping, session), timeout=60)
    finally:
        gc.enable()
    assert alive_at_next == [False]
