"""`aldebaran declare`: create the CONTRACT §2 exchanges and queues."""

from __future__ import annotations

import argparse

from aldebaran.settings import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("declare", help="declare exchanges and queues (idempotent)")
    parser.add_argument("--queue-type", choices=["classic", "quorum"],
                        help="override queue_type (quorum for clusters)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be declared")
    parser.add_argument("--publisher-user", metavar="NAME=PASSWORD_FILE",
                        help="also create a user that may only write Aldebaran.Trade_Data (docs/operations.md)")
    parser.add_argument("--workers-user", metavar="NAME=PASSWORD_FILE",
                        help="also create the workers' user: full rights in this vhost only, no management tag")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    from declare.declarer import declare, describe
    from declare.topology import topology
    from declare.users import apply_users, parse_user

    if args.queue_type:
        settings = settings.model_copy(update={"queue_type": args.queue_type})
    if args.dry_run:
        for line in describe(topology(settings)):
            print(f"would declare {line}")
        return 0
    count = declare(settings)
    print(f"{count} exchanges and queues declared on {settings.broker_urls[0].split('@')[-1]}")
    users = [parse_user(role, spec) for role, spec in (("publisher", args.publisher_user),
                                                       ("workers", args.workers_user)) if spec]
    for line in apply_users(settings, users) if users else []:
        print(line)
    return 0
