"""The engine's idle wait: ended by a wake, by its timeout, or by an event it watches."""

from __future__ import annotations

import asyncio

from tests.support.waiting import loop_turns
from workers.wakeup import Wakeup

GUARD = 10.0  # seconds: a wait that a wake should end but does not fails the test here
FOREVER = 3600.0


async def _waiting(wakeup: Wakeup) -> asyncio.Future[None]:
    """A wait with no timeout to speak of, still waiting after a few loop turns."""
    waiting = asyncio.ensure_future(wakeup.wait(FOREVER))
    await loop_turns()
    assert not waiting.done()
    return waiting


def test_a_wake_ends_the_wait_it_finds() -> None:
    async def scenario() -> None:
        wakeup = Wakeup()
        waiting = await _waiting(wakeup)
        wakeup.wake()
        await asyncio.wait_for(waiting, GUARD)

    asyncio.run(scenario())


def test_the_timeout_ends_a_wait_nobody_wakes() -> None:
    async def scenario() -> bool:
        wakeup = Wakeup()
        await asyncio.wait_for(wakeup.wait(0.01), GUARD)
        return wakeup._waiter is None

    assert asyncio.run(scenario())


def test_a_wake_while_nobody_waits_is_not_kept_for_the_next_wait() -> None:
    async def scenario() -> None:
        wakeup = Wakeup()
        wakeup.wake()
        waiting = await _waiting(wakeup)  # the earlier wake did not end it
        wakeup.wake()
        await asyncio.wait_for(waiting, GUARD)

    asyncio.run(scenario())


def test_an_earlier_waits_timer_does_not_end_a_later_wait() -> None:
    async def scenario() -> None:
        wakeup = Wakeup()
        first = asyncio.ensure_future(wakeup.wait(0.05))
        await loop_turns()
        wakeup.wake()
        await first
        second = asyncio.ensure_future(wakeup.wait(FOREVER))
        await asyncio.sleep(0.2)  # a negative check needs a span: past the first wait's timer, had it been left
        assert not second.done()
        wakeup.wake()
        await asyncio.wait_for(second, GUARD)

    asyncio.run(scenario())


def test_setting_a_watched_event_wakes_until_the_watch_is_cancelled() -> None:
    async def scenario() -> None:
        wakeup, ended = Wakeup(), asyncio.Event()
        watch = wakeup.wake_when(ended)
        waiting = await _waiting(wakeup)
        ended.set()
        await asyncio.wait_for(waiting, GUARD)

        other = asyncio.Event()
        stopped = wakeup.wake_when(other)
        stopped.cancel()
        await loop_turns()
        waiting = await _waiting(wakeup)
        other.set()
        await loop_turns()
        assert not waiting.done()  # its watch was cancelled: setting the event wakes nothing
        wakeup.wake()
        await asyncio.wait_for(waiting, GUARD)
        assert watch.done()

    asyncio.run(scenario())
