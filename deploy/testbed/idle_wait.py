"""What one idle wait of the engine's cycle loop costs in CPU, on uvloop and on asyncio's loop.

The loop waits for "a batch is ready, or the session ended, or the next book falls due" once
per idle spell. Until 2026-11-29 it waited on two `asyncio.Event`s through `asyncio.wait`
(rebuilt below for comparison); now on `workers.wakeup.Wakeup`. Each wait here is woken on
the next loop turn; a bare loop turn is printed beside them. Prints µs of CPU per wait.

    .venv/bin/python deploy/testbed/idle_wait.py [waits, default 50000]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.wakeup import Wakeup


async def _two_events(first: asyncio.Event, second: asyncio.Event, timeout: float) -> None:
    """The wait as it was: a task per event, the first to finish (or the timeout) ends it."""
    waiters = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def _per_wait(waits: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    arrived, ended, wakeup = asyncio.Event(), asyncio.Event(), Wakeup()
    costs: dict[str, float] = {}
    for label in ("two events", "Wakeup", "a bare loop turn"):
        started = time.process_time()
        for _ in range(waits):
            if label == "two events":
                arrived.clear()
                loop.call_soon(arrived.set)
                await _two_events(arrived, ended, 1.0)
            elif label == "Wakeup":
                loop.call_soon(wakeup.wake)
                await wakeup.wait(1.0)
            else:
                loop.call_soon(lambda: None)
                await asyncio.sleep(0)
        costs[label] = (time.process_time() - started) / waits * 1e6
    return costs


def main() -> None:
    waits = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    for name, run in (("uvloop", uvloop.run), ("asyncio", asyncio.run)):
        costs = run(_per_wait(waits))
        print(f"{name:8}" + "  ".join(f"{label}: {cost:.1f} µs" for label, cost in costs.items()))


if __name__ == "__main__":
    main()
