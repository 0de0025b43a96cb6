"""`aldebaran up`: every worker of one machine in one foreground process.

What a user runs on a laptop and what the end-to-end tests drive: aggregators, book
workers (per `mode`: the engine, or the per-order reference's aggregator and books), the
lookout, one deliverer per configured channel and the trace recorder, until SIGTERM or
Ctrl-C (a clean exit 0). With `--aggregators N` / `--book-workers M` those two roles run
as N and M child processes (`aldebaran run KIND`) instead, to use more than one core; a
child that dies unexpectedly is restarted, as systemd would. Partitioned engines
(`[engine] partitions`) always run as children, one per partition at least.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib
import os
import signal
import socket
import sys
import tempfile
from typing import Any

from aldebaran.log import get_logger
from aldebaran.settings import Settings
from workers import MODE_KINDS, WORKER_MODULES

log = get_logger("up")
RESTART_DELAY_SECONDS = 0.5


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("up", help="run every worker of this machine in one process")
    parser.add_argument("--no-tracer", action="store_true", help="do not record firehose traces")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument("--aggregators", type=int, default=0, metavar="N",
                        help="run the aggregator role as N child processes (0 = in this process)")
    parser.add_argument("--book-workers", type=int, default=0, metavar="M",
                        help="run the book-worker role as M child processes (0 = in this process)")
    parser.set_defaults(handler=handle)


def build_workers(settings: Settings, tracer: bool = True, aggregators: int = 0,
                  book_workers: int = 0) -> list[Any]:
    """The workers `up` runs for these settings, in start order."""
    aggregator_kind, books_kind = MODE_KINDS[settings.mode]
    if aggregator_kind is None:  # the engine: one role, one child per partition when partitioned
        aggregators = 0
        if settings.engine.partitions > 1:
            book_workers = max(book_workers, settings.engine.partitions)
    kinds = ([] if aggregators or aggregator_kind is None else [aggregator_kind])
    kinds += ([] if book_workers else [books_kind]) + ["lookout"] + (["tracer"] if tracer else [])
    workers = [_module(kind).build(settings) for kind in kinds if _module(kind)]
    children = [(aggregator_kind, i, aggregators) for i in range(aggregators) if aggregator_kind is not None]
    children += [(books_kind, i, book_workers) for i in range(book_workers)]
    if children:
        workers.insert(0, ChildProcesses(settings, children))
    channel = _module("channel")
    if channel:
        workers += [channel.build(settings, name=c.name) for c in settings.channels]
    return workers


def _module(kind: str) -> Any:
    try:
        return importlib.import_module(WORKER_MODULES[kind])
    except ModuleNotFoundError as exc:
        if exc.name != WORKER_MODULES[kind]:
            raise
        log.warning("worker kind not in this build", kind=kind)
        return None


class ChildProcesses:
    """Runs `aldebaran run KIND` children; ready once every child said READY=1 (sd_notify)."""

    name = "children"

    def __init__(self, settings: Settings, children: list[tuple[str, int, int]]) -> None:
        self.settings = settings
        self.children = children
        self.processes: dict[int, asyncio.subprocess.Process] = {}

    def _env(self, kind: str, index: int, count: int, notify_path: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("WATCHDOG_USEC", None)
        env.pop("WATCHDOG_PID", None)
        env["NOTIFY_SOCKET"] = notify_path
        env["ALDEBARAN_MODE"] = self.settings.mode
        partitions = self.settings.engine.partitions
        if kind == "engine" and partitions > 1:  # children beyond the partitions stand by for one
            env["ALDEBARAN_ENGINE__PARTITION"] = str(index % partitions)
        return env

    async def _spawn(self, slot: int, notify_path: str) -> asyncio.subprocess.Process:
        kind, index, count = self.children[slot]
        args = [sys.executable, "-m", "aldebaran.cli", "run", kind]
        if self.settings.metrics_port:
            args += ["--metrics-port", str(self.settings.metrics_port + 1 + slot)]
        process = await asyncio.create_subprocess_exec(*args, env=self._env(kind, index, count, notify_path),
                                                       preexec_fn=_die_with_parent)
        self.processes[slot] = process
        log.info("child started", kind=kind, index=index, pid=process.pid)
        return process

    async def run(self, life: Any) -> None:
        loop = asyncio.get_running_loop()
        directory = tempfile.mkdtemp(prefix="aldebaran-up-")
        notify_path = os.path.join(directory, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(notify_path)
        sock.setblocking(False)
        ready = {"count": 0}

        def on_datagram() -> None:
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                return
            if b"READY=1" in data:
                ready["count"] += 1
                if ready["count"] >= len(self.children):
                    life.ready()

        loop.add_reader(sock.fileno(), on_datagram)
        try:
            watchers = [asyncio.ensure_future(self._keep(slot, notify_path, life.stopping))
                        for slot in range(len(self.children))]
            await life.stopping.wait()
            await asyncio.gather(*watchers, return_exceptions=True)
        finally:
            loop.remove_reader(sock.fileno())
            sock.close()
            os.unlink(notify_path)
            os.rmdir(directory)

    async def _keep(self, slot: int, notify_path: str, stopping: asyncio.Event) -> None:
        """Run one child until stopping; restart it when it dies on its own."""
        kind, index, _ = self.children[slot]
        while True:
            process = await self._spawn(slot, notify_path)
            waiter = asyncio.ensure_future(process.wait())
            stopper = asyncio.ensure_future(stopping.wait())
            await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if stopping.is_set():
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        await asyncio.wait_for(waiter, timeout=self.settings.shutdown_grace_seconds + 5)
                    except TimeoutError:
                        process.kill()
                        await process.wait()
                return
            log.warning("child exited; restarting", kind=kind, index=index, pid=process.pid,
                        exit_code=process.returncode)
            await asyncio.sleep(RESTART_DELAY_SECONDS)


def _die_with_parent() -> None:
    """Children get SIGTERM if `up` itself dies (even by SIGKILL): no orphan keeps consuming."""
    with contextlib.suppress(OSError):  # not glibc: children may outlive a killed parent
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def handle(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runtime import run_workers

    if args.metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": args.metrics_port})
    return run_workers(settings, build_workers(settings, tracer=not args.no_tracer,
                                               aggregators=max(0, args.aggregators),
                                               book_workers=max(0, args.book_workers)))
