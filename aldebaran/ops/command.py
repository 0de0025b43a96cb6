"""`aldebaran stats` and `aldebaran health`: the operator's view from a shell.

Both print rich tables for people and `--json` for scripts and monitoring.
"""

from __future__ import annotations

import argparse
import sys

from aldebaran.errors import ExitCode, UnavailableError
from aldebaran.settings import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stats = subparsers.add_parser("stats", help="queue depths and rates, open books, recent alerts, dead letters")
    stats.add_argument("--json", action="store_true", help="print JSON instead of tables")
    stats.add_argument("--alerts", type=int, default=10, metavar="N", help="recent alerts to show (default 10)")
    stats.add_argument("--peek", type=int, default=5, metavar="N",
                       help="dead letters to peek at, requeued untouched (default 5; 0 to skip)")
    stats.add_argument("--metrics", action="append", default=[], metavar="URL",
                       help="a worker's /metrics URL; open books are then summed from aldebaran_books_open "
                            "(repeatable)")
    stats.set_defaults(handler=handle_stats)

    health = subparsers.add_parser("health",
                                   help="check RabbitMQ (AMQP and management API) and Redis; non-zero if down")
    health.add_argument("--json", action="store_true", help="print JSON instead of a table")
    health.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="per check (default 5)")
    health.set_defaults(handler=handle_health)


def handle_stats(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console

    from aldebaran.ops import stats

    result = stats.collect(settings, alerts=args.alerts, peek=args.peek, metrics_urls=args.metrics)
    if args.json:
        print(result.to_json())
    else:
        stats.render(result, Console())
    if result.problems:
        raise UnavailableError("; ".join(result.problems))
    return int(ExitCode.OK)


def handle_health(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console

    from aldebaran.ops import health

    checks = health.run_checks(settings, timeout=args.timeout)
    if args.json:
        print(health.to_json(checks))
    else:
        health.render(checks, Console())
    down = health.summary(checks)
    if down:
        print(f"aldebaran health: {down}", file=sys.stderr)
        return int(ExitCode.FAILURE)
    return int(ExitCode.OK)
