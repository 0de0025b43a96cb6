"""The alert-heavy bench's delivery side stops its processes even when a sink reader does not stop."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aldebaran.bench import delivery as delivery_mod
from aldebaran.bench.delivery import Delivery
from aldebaran.bench.environment import Place
from aldebaran.settings import Settings


async def _deaf_to_cancel(started: asyncio.Event, release: asyncio.Event) -> None:
    """A reader whose clean-up waits on something that never comes (as a client's close can)."""
    started.set()
    try:
        await asyncio.sleep(3600)
    finally:
        await release.wait()


def test_a_reader_that_ignores_its_cancel_does_not_keep_the_workers_running(tmp_path: Path,
                                                                              monkeypatch) -> None:
    monkeypatch.setattr(delivery_mod, "READER_STOP_SECONDS", 0.5)

    async def scenario() -> tuple[int | None, bool]:
        delivery = Delivery(Place(Settings()), tmp_path, {})
        worker = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(3600)")
        delivery.processes.append(worker)
        started, release = asyncio.Event(), asyncio.Event()
        stubborn = asyncio.create_task(_deaf_to_cancel(started, release))
        delivery.readers = [stubborn]
        await started.wait()
        await asyncio.wait_for(delivery.stop(), timeout=30)  # before: waited on the reader for ever
        left_behind = not stubborn.done()
        release.set()
        await asyncio.gather(stubborn, return_exceptions=True)
        return worker.returncode, left_behind

    returncode, left_behind = asyncio.run(scenario())
    assert returncode is not None  # the worker was stopped
    assert left_behind
