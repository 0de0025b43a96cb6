"""The suite's one way to wait: poll a condition until it holds, or fail saying what never came.

Every deadline here is a liveness bound, not a speed claim: a test waits as long as the
condition needs and fails with the condition's name (and the last thing it saw) when the
bound passes. `pause` is the only fixed interval, between two polls; `quiet_window` is the
one place a test listens for a fixed time, for checks the pipeline gives no barrier for.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
Probe = Callable[[], T]
What = str | Callable[[], str]


def _message(what: What, timeout: float, last: object, error: BaseException | None) -> str:
    text = what() if callable(what) else what
    seen = f"; last error: {error!r}" if error is not None else f"; last seen: {last!r}"
    return f"timed out after {timeout:g} s waiting for {text}{seen}"


def wait_until(probe: Probe[T], what: What, timeout: float = 30, pause: float = 0.1,
               ignoring: tuple[type[BaseException], ...] = (), required: bool = True) -> T:
    """Poll `probe` until it returns something truthy and return that; `ignoring`: errors
    that mean "not yet" (a service restarting, a file half written). `required=False`: at
    the deadline return the last (falsy) value instead, for a caller whose own assertions
    say better what is missing."""
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            last, error = probe(), None
            if last:
                return last  # type: ignore[return-value]
        except ignoring as exc:
            error = exc
        if time.monotonic() >= deadline:
            if required:
                raise AssertionError(_message(what, timeout, last, error))
            return last  # type: ignore[return-value]
        time.sleep(pause)


async def eventually(probe: Callable[[], T | Awaitable[T]], what: What, timeout: float = 30,
                     pause: float = 0.05, ignoring: tuple[type[BaseException], ...] = (),
                     required: bool = True) -> T:
    """`wait_until` inside an event loop: the probe may be a plain or an async callable."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            value = probe()
            last, error = (await value) if inspect.isawaitable(value) else value, None
            if last:
                return last  # type: ignore[return-value]
        except ignoring as exc:
            error = exc
        if loop.time() >= deadline:
            if required:
                raise AssertionError(_message(what, timeout, last, error))
            return last  # type: ignore[return-value]
        await asyncio.sleep(pause)


async def loop_turns(count: int = 5) -> None:
    """Let the running loop take `count` turns: inside one event loop, what a woken task or a
    set future would do next has happened by then, so a check that something did NOT happen
    (a wait still on, a place still held) can follow without a fixed interval."""
    for _ in range(count):
        await asyncio.sleep(0)


def quiet_window(seconds: float, why: str, listen: Callable[[], object] | None = None,
                 pause: float = 0.1) -> None:
    """Listen for `seconds` for something that must NOT come, calling `listen` (a drain)
    meanwhile. Only for checks with no barrier: `why` says why nothing ordered after the
    awaited effect could prove its absence (e.g. a repeat after a crash, an alert fired by a
    book's clock)."""
    assert why, "a quiet window must say why no barrier will do"
    end = time.monotonic() + seconds
    while True:
        if listen is not None:
            listen()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(pause, left))
