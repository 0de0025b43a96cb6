"""A cheap wait for "work arrived, or this long passed": one future and one timer per wait.

The engine's cycle loop waits like this once per idle spell: at low load once per message,
and once per group of books falling due in between. Waiting on two `asyncio.Event`s through
`asyncio.wait` made two tasks, a timer and two cancellations each time, and took two more
loop turns from the wake to the waiter: 15.6-28.9 µs of CPU per wait against 3.7-6.3 for this
on uvloop, the engine's loop, in four runs on 2026-11-29's host (`deploy/testbed/idle_wait.py`).
"""

from __future__ import annotations

import asyncio
from typing import Literal


class Wakeup:
    """One waiter at a time, woken by `wake()` or by its timeout, whichever comes first.

    A wake while nobody waits is not kept (unlike an Event's set): the waiter checks what it
    waits for before it waits, with no await in between, as the engine's cycle loop does.
    """

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        """End the current wait, if there is one."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until `wake()` or `timeout` seconds, whichever comes first."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, self.wake)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def wake_when(self, event: asyncio.Event) -> asyncio.Task[Literal[True]]:
        """Wake whenever `event` is set from now on; cancel the returned watch to stop."""
        watch = asyncio.ensure_future(event.wait())
        watch.add_done_callback(lambda _: self.wake())
        return watch
