"""Running workers: signals, readiness, systemd notify, metrics, bounded graceful stop.

The first SIGTERM (or Ctrl-C) asks every worker to stop: they stop consuming, finish
in-flight work, ack what is done and close their connections. A second signal exits at
once with `ExitCode.KILLED`; unacked messages go back to their queues broker-side.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aldebaran import systemd
from aldebaran.errors import AldebaranError, ExitCode
from aldebaran.io import frame_reader
from aldebaran.log import get_logger
from aldebaran.metrics import serve as serve_metrics
from aldebaran.runtime_tuning import run, tune_gc
from aldebaran.settings import Settings, mask_url

log = get_logger("runtime")


@dataclass
class Lifecycle:
    """What a worker sees of the process: a stop request and a way to say it is ready."""

    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def ready(self) -> None:
        self._ready.set()

    async def wait_stopping(self) -> None:
        await self.stopping.wait()


class Worker(Protocol):
    name: str

    async def run(self, life: Lifecycle) -> None:
        """Work until `life.stopping` is set, then finish in-flight work and return."""


def run_workers(settings: Settings, workers: Sequence[Worker]) -> int:
    """Run workers until a signal or a crash; returns the process exit status."""
    frame_reader.install()
    tune_gc()  # every worker's process: what is live by now (modules, settings) is never scanned again
    return run(_supervise(settings, list(workers)))


async def _supervise(settings: Settings, workers: list[Worker]) -> int:
    serve_metrics(settings.metrics_port)
    loop = asyncio.get_running_loop()
    lives = [Lifecycle() for _ in workers]
    stop_requested = asyncio.Event()
    signals = {"count": 0}

    def on_signal(signum: int) -> None:
        signals["count"] += 1
        if signals["count"] > 1:
            log.warning("second signal: exiting at once", signal=signal.Signals(signum).name)
            os._exit(ExitCode.KILLED)
        log.info("stopping", signal=signal.Signals(signum).name, grace_seconds=settings.shutdown_grace_seconds)
        systemd.notify("STOPPING=1")
        stop_requested.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)

    tasks = [asyncio.create_task(w.run(life), name=w.name) for w, life in zip(workers, lives, strict=True)]
    helpers = [asyncio.create_task(_announce_ready(workers, lives)), asyncio.create_task(_watchdog()),
               asyncio.create_task(_memory_watch(settings.max_rss_mib))]
    stopper = asyncio.create_task(stop_requested.wait())
    await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)

    for life in lives:
        life.stopping.set()
    deadline = time.monotonic() + settings.shutdown_grace_seconds
    pending = [t for t in tasks if not t.done()]
    if pending:
        _, still = await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        for task in still:
            log.warning("worker did not stop within the grace period", worker=task.get_name())
            task.cancel()
        if still:
            await asyncio.wait(still, timeout=2)
    for helper in [*helpers, stopper]:
        helper.cancel()
    return _exit_code(tasks, stopped_by_signal=stop_requested.is_set())


def _exit_code(tasks: list[asyncio.Task[None]], stopped_by_signal: bool) -> int:
    code = ExitCode.OK
    for task in tasks:
        if task.cancelled():
            continue
        exc = task.exception()
        if exc is None:
            if not stopped_by_signal and code == ExitCode.OK:
                log.error("worker ended on its own", worker=task.get_name())
                code = ExitCode.SOFTWARE
            continue
        if isinstance(exc, AldebaranError):
            log.error("worker failed", worker=task.get_name(), error=str(exc))
            code = exc.exit_code
        else:
            # The traceback as text: the log's secret masking turns an `exc_info` object into
            # its repr, and the traceback was lost (a crash could not be diagnosed).
            log.error("worker crashed", worker=task.get_name(), error=mask_url(repr(exc)),
                      traceback=mask_url("".join(traceback.format_exception(exc))))
            code = ExitCode.SOFTWARE
    log.info("stopped", exit_code=int(code))
    return int(code)


async def _announce_ready(workers: list[Worker], lives: list[Lifecycle]) -> None:
    await asyncio.gather(*(life._ready.wait() for life in lives))
    log.info("ready", workers=[w.name for w in workers], pid=os.getpid())
    systemd.notify("READY=1")


async def _watchdog() -> None:
    interval = systemd.watchdog_interval()
    if interval is None:
        return
    while True:
        systemd.notify("WATCHDOG=1")
        await asyncio.sleep(interval)


def resident_mib() -> float:
    """This process's resident memory now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


async def _memory_watch(bound_mib: int, interval: float = 5.0) -> None:
    """Warn once each time resident memory crosses `max_rss_mib`, before systemd's MemoryMax
    kills the worker: the log says which process grew, the unit only that it died."""
    above = False
    while True:
        rss = resident_mib()
        if not above and rss > bound_mib:
            above = True
            log.warning("resident memory above max_rss_mib", rss_mib=round(rss, 1), max_rss_mib=bound_mib)
        elif above and rss <= bound_mib * 0.9:  # a margin, so hovering at the bound is one warning
            above = False
            log.info("resident memory back under max_rss_mib", rss_mib=round(rss, 1), max_rss_mib=bound_mib)
        await asyncio.sleep(interval)
