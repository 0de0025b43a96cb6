"""`aldebaran declare`: create the CONTRACT §2 exchanges and queues."""

from __future__ import annotations

import argparse
import dataclasses

from aldebaran.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("declare", help="declare exchanges and queues (idempotent)")
    parser.add_argument("--queue-type", choices=["classic", "quorum"],
                        help="override queue_type (quorum for clusters)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be declared")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    from declare.declarer import declare, describe
    from declare.topology import topology

    if args.queue_type:
        settings = settings.model_copy(update={"queue_type": args.queue_type})
    if args.dry_run:
        for line in describe(topology(settings)):
            print(f"would declare {line}")
        return 0
    count = declare(settings)
    print(f"{count} exchanges and queues declared on {settings.broker_urls[0].split('@')[-1]}")
    return 0
