"""The `aldebaran` command (CONTRACT §4). Each subcommand lives in its own module.

A command module exposes `register(subparsers)`, which adds its parser and sets
`handler(args, settings) -> int`. Heavy imports stay inside handlers so that
`aldebaran --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from aldebaran.errors import AldebaranError, ExitCode
from aldebaran.settings import mask_url

COMMAND_MODULES = [
    "declare.command",
    "workers.up",
    "workers.run",
    "aldebaran.demo",
    "aldebaran.publish",
    "aldebaran.bench.command",
    "spark_analytics.command",
    "aldebaran.api.command",
    "aldebaran.ops.command",
    "aldebaran.ops.delivery",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aldebaran",
        description="Streaming trade-limit alerts on RabbitMQ and Redis.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                continue  # that part of Aldebaran is not in this build
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from aldebaran.log import configure_logging
        from aldebaran.settings import load_settings

        settings = load_settings()
        configure_logging(settings.log_level, settings.log_format)
        return int(args.handler(args, settings))
    except AldebaranError as exc:
        print(f"aldebaran {args.command}: {mask_url(str(exc))}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return int(ExitCode.OK)


if __name__ == "__main__":
    raise SystemExit(main())
