"""The collector of every worker process is tuned; the idle engine's collections are the ones the
automatic collector would run next, only once due."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aldebaran.runtime_tuning import GC_THRESHOLDS, IDLE_YOUNG, collect_when_idle


@pytest.fixture
def manual_gc() -> Iterator[None]:
    """The automatic collector off (it would reset the young count at 700 objects), all counts at 0."""
    was_enabled = gc.isenabled()
    gc.disable()
    gc.collect()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _young(count: int) -> list[list[int]]:
    return [[n] for n in range(count)]  # lists are tracked: each counts as a young object


def test_nothing_is_collected_until_enough_young_objects_wait(manual_gc: None) -> None:
    kept = _young(IDLE_YOUNG // 2)
    assert collect_when_idle() is None
    assert gc.get_count()[0] >= IDLE_YOUNG // 2  # untouched
    kept += _young(IDLE_YOUNG)
    assert collect_when_idle() == 0
    assert gc.get_count()[0] < 100 and gc.get_count()[1] == 1


def test_older_generations_follow_the_automatic_collectors_thresholds(manual_gc: None) -> None:
    for _ in range(GC_THRESHOLDS[1]):
        gc.collect(0)
    kept = _young(IDLE_YOUNG)
    assert collect_when_idle() == 1  # the 51st young collection: a middle one instead
    assert gc.get_count()[1] == 0 and gc.get_count()[2] == 1
    for _ in range(GC_THRESHOLDS[2]):
        gc.collect(1)
    for _ in range(GC_THRESHOLDS[1]):
        gc.collect(0)
    kept += _young(IDLE_YOUNG)
    assert collect_when_idle() == 2
    assert gc.get_count()[1:] == (0, 0)


def test_processes_run_their_coroutine_on_uvloop() -> None:
    import asyncio

    from aldebaran.runtime_tuning import run

    async def loop_module() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    assert run(loop_module()).startswith("uvloop")


REPORTING_WORKER = """
import gc
from aldebaran.settings import load_settings
from workers.runtime import run_workers

class Report:
    name = "report"
    async def run(self, life):
        print("collector", *gc.get_threshold(), gc.get_freeze_count(), flush=True)

run_workers(load_settings(), [Report()])
"""


def test_every_worker_process_runs_with_the_tuned_collector() -> None:
    """Not the engine alone: at the default thresholds the lookout and the channel deliverers
    spent seconds of CPU per alert-heavy run collecting almost nothing (aldebaran/runtime_tuning.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALDEBARAN_")}
    result = subprocess.run([sys.executable, "-c", REPORTING_WORKER], env=env, capture_output=True, text=True,
                            timeout=120, cwd=Path(__file__).resolve().parents[1])
    reports = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("collector ")]
    assert reports, result.stdout + result.stderr
    *thresholds, frozen = map(int, reports[0])
    assert tuple(thresholds) == GC_THRESHOLDS
    assert frozen > 1000  # the modules and settings live at start-up, out of every later scan
