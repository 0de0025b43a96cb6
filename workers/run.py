"""`aldebaran run KIND [NAME]`: one worker in the foreground, for the systemd fleet."""

from __future__ import annotations

import argparse
import importlib

from aldebaran.errors import ConfigError
from aldebaran.settings import Settings
from workers import WORKER_MODULES


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("run", help="run one worker (aggregator, books, lookout, channel NAME, tracer)")
    parser.add_argument("kind", choices=sorted(WORKER_MODULES))
    parser.add_argument("name", nargs="?", help="the channel's name (for `run channel NAME`)")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runtime import run_workers

    if args.metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": args.metrics_port})
    if args.kind == "channel" and not args.name:
        raise ConfigError("run channel: name the channel (one of the [[channels]] in the settings)")
    module = importlib.import_module(WORKER_MODULES[args.kind])
    worker = module.build(settings, name=args.name) if args.kind == "channel" else module.build(settings)
    return run_workers(settings, [worker])
