"""`aldebaran run KIND [NAME]`: one worker in the foreground, for the systemd fleet."""

from __future__ import annotations

import argparse
import importlib

from aldebaran.errors import ConfigError
from aldebaran.settings import Settings
from workers import MODE_KINDS, WORKER_MODULES


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
    _check_mode(args.kind, settings.mode)
    module = importlib.import_module(WORKER_MODULES[args.kind])
    worker = module.build(settings, name=args.name) if args.kind == "channel" else module.build(settings)
    return run_workers(settings, [worker])


def _check_mode(kind: str, mode: str) -> None:
    """A worker of the other mode would take the trade ingress beside this mode's consumers, each
    seeing a share of every order's events: wrong alerts, not an error. Refused before it starts."""
    modes = [name for name, kinds in MODE_KINDS.items() if kind in kinds]
    if modes and mode not in modes:
        raise ConfigError(f"run {kind}: a worker of the {' and '.join(modes)} mode, and the settings say "
                          f"mode = {mode!r}; set ALDEBARAN_MODE={modes[0]} where {kind} workers run")
