"""`aldebaran audit`: the CLI glue around the audit job (the only file here that reads settings)."""

from __future__ import annotations

import argparse

from aldebaran.errors import ConfigError
from aldebaran.settings import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from spark_analytics.job import add_arguments

    parser = subparsers.add_parser("audit", help="audit alerts against firehose traces with PySpark")
    add_arguments(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    """Defaults come from the settings: the book TTL and the configured channels."""
    from spark_analytics.job import options_from, read_in_doubt_files, run

    opts = options_from(args, book_ttl_default=settings.book_ttl_seconds)
    if not args.channel:
        opts.channels = [c.name for c in settings.channels]
    try:
        listed = read_in_doubt_files(opts)
    except OSError as exc:
        raise ConfigError(f"--in-doubt: {exc}") from None
    code, _ = run(opts, args.master, args.out, args.allow_gaps, memory=args.driver_memory, in_doubt=listed)
    return code
