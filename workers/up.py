"""`aldebaran up`: every worker of one machine in one foreground process.

What a user runs on a laptop and what the end-to-end tests drive: aggregators, book
workers, the lookout, one deliverer per configured channel and the trace recorder,
until SIGTERM or Ctrl-C (a clean exit 0).
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from aldebaran.log import get_logger
from aldebaran.settings import Settings
from workers import WORKER_MODULES

log = get_logger("up")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("up", help="run every worker of this machine in one process")
    parser.add_argument("--no-tracer", action="store_true", help="do not record firehose traces")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.set_defaults(handler=handle)


def build_workers(settings: Settings, tracer: bool = True) -> list[Any]:
    """The workers `up` runs for these settings, in start order."""
    kinds = ["aggregator", "books", "lookout"] + (["tracer"] if tracer else [])
    workers = [_module(kind).build(settings) for kind in kinds if _module(kind)]
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


def handle(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runtime import run_workers

    if args.metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": args.metrics_port})
    return run_workers(settings, build_workers(settings, tracer=not args.no_tracer))
