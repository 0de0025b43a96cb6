"""`aldebaran delivery`: the operator's view and decisions on alerts in doubt.

An at-most-once channel never sends an alert twice on its own: an attempt a crash
interrupted (or one that ended without a verdict, such as a timeout after the request
left) is listed *in doubt* instead. Only the operator can tell, by asking the recipient,
whether it arrived: `settle --delivered` records that it did, `settle --send-again`
puts it back on the channel's queue to be sent once more.

`in-doubt --json` is also the nightly audit's input (`aldebaran audit --in-doubt FILE`): one
JSON object per line, every entry (no limit), each carrying its deployment (`vhost`, the
RabbitMQ vhost the traces record) so one file can hold several deployments' lists.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC

import pika
import pika.exceptions
import redis

from aldebaran.channels.ledger import SETTLE, InDoubt, entry_field, ledger_key
from aldebaran.errors import AldebaranError, ExitCode, UnavailableError
from aldebaran.io.redis import Keys, describe, sync_client
from aldebaran.ops.management import vhost_of
from aldebaran.settings import Settings, mask_url
from declare.topology import channel_queue


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("delivery", help="alerts in doubt on at-most-once channels: list and settle")
    commands = parser.add_subparsers(dest="delivery_command", metavar="ACTION", required=True)
    listing = commands.add_parser("in-doubt", help="list the alerts in doubt, per channel")
    listing.add_argument("--channel", help="only this channel")
    listing.add_argument("--json", action="store_true",
                         help="print every entry as JSON lines (vhost, channel, alert_id, target, reason, since, "
                              "since_ms) instead of a table: the audit's --in-doubt input")
    listing.set_defaults(handler=handle_list)
    settle = commands.add_parser("settle", help="decide one alert in doubt")
    settle.add_argument("channel")
    settle.add_argument("alert_id")
    settle.add_argument("--target", default="", help="the recipient, for channels with several (SMS, push)")
    decision = settle.add_mutually_exclusive_group(required=True)
    decision.add_argument("--delivered", action="store_true", help="the recipient has it: never send it")
    decision.add_argument("--send-again", action="store_true", help="the recipient does not have it: send it")
    settle.set_defaults(handler=handle_settle)


@contextmanager
def _redis(settings: Settings) -> Iterator[redis.Redis]:
    """A short-lived client; Redis trouble becomes `UnavailableError` (exit 69) naming the masked URL."""
    conn = sync_client(settings.redis_url, timeout=5, tls_ca_file=settings.tls_ca_file)
    try:
        yield conn
    except (redis.RedisError, OSError) as exc:
        raise UnavailableError(f"redis at {describe(settings)}: {mask_url(str(exc))}") from None
    finally:
        conn.close()


def in_doubt(settings: Settings, channel: str | None = None,
             limit: int | None = 1000) -> dict[str, list[InDoubt]]:
    """The entries in doubt of every at-most-once channel (or one), oldest first, at most `limit` each
    (None: all)."""
    keys = Keys(settings.redis_key_prefix)
    names = [channel] if channel else [c.name for c in settings.channels]
    found: dict[str, list[InDoubt]] = {}
    with _redis(settings) as conn:
        for name in names:
            entries = [InDoubt.parse(name, raw) for _, raw in conn.hscan_iter(keys.in_doubt(name), count=500)]
            found[name] = sorted(entries, key=lambda e: e.since_ms)[:limit]
    return found


def in_doubt_counts(settings: Settings) -> dict[str, int]:
    """How many alerts each configured channel has in doubt (for stats and the dashboard)."""
    keys = Keys(settings.redis_key_prefix)
    with _redis(settings) as conn, conn.pipeline(transaction=False) as pipe:
        for config in settings.channels:
            pipe.hlen(keys.in_doubt(config.name))
        return {c.name: int(n) for c, n in zip(settings.channels, pipe.execute(), strict=True)}


def settle(settings: Settings, channel: str, alert_id: str, target: str, *, send_again: bool) -> InDoubt:
    """Remove one entry from the in-doubt list: recorded delivered, or queued to be sent again."""
    settings.channel(channel)  # a ConfigError naming the configured channels when unknown
    keys = Keys(settings.redis_key_prefix)
    args = [ledger_key(keys, channel, alert_id, target), keys.in_doubt(channel)]
    with _redis(settings) as conn:
        raw = conn.eval(SETTLE, 2, *args, entry_field(alert_id, target), "again" if send_again else "delivered",
                        settings.alert_dedup_ttl_seconds)
        if raw is None:
            raise AldebaranError(f"{alert_id!r} is not in doubt on channel {channel!r}"
                                 + (f" for {target!r}" if target else ""))
        entry = InDoubt.parse(channel, raw)
        if send_again:
            try:
                _requeue(settings, channel, entry)
            except Exception:
                conn.hset(args[1], entry_field(alert_id, target), raw)  # still in doubt: nothing was queued
                conn.set(args[0], "in-doubt", ex=settings.alert_dedup_ttl_seconds)
                raise
        return entry


def _requeue(settings: Settings, channel: str, entry: InDoubt) -> None:
    """The alert's body back on the channel's queue, persistent and confirmed."""
    last: Exception | None = None
    for url in settings.broker_urls:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(url))
        except pika.exceptions.AMQPError as exc:
            last = exc
            continue
        try:
            ch = connection.channel()
            ch.confirm_delivery()
            ch.basic_publish("", channel_queue(channel), entry.body, mandatory=True,
                             properties=pika.BasicProperties(delivery_mode=2, message_id=entry.alert_id,
                                                             content_type="application/json"))
            return
        finally:
            connection.close()
    raise UnavailableError(f"no broker answered to queue the alert again: {mask_url(str(last))}")


def json_lines(settings: Settings, found: dict[str, list[InDoubt]]) -> list[str]:
    """One JSON object per entry, with the deployment it belongs to: the audit's `--in-doubt` format."""
    vhost = vhost_of(settings.broker_urls[0])
    return [json.dumps({"vhost": vhost, **entry.to_dict(), "since": _utc(entry.since_ms, iso=True)})
            for entries in found.values() for entry in entries]


def handle_list(args: argparse.Namespace, settings: Settings) -> int:
    if args.json:
        for line in json_lines(settings, in_doubt(settings, args.channel, limit=None)):
            print(line)
        return int(ExitCode.OK)
    found = in_doubt(settings, args.channel)
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Alerts in doubt (at-most-once channels)", title_justify="left")
    for column in ("channel", "alert id", "recipient", "since (UTC)", "why"):
        table.add_column(column, overflow="fold")
    for entries in found.values():
        for e in entries:
            table.add_row(e.channel, e.alert_id, e.target or "-", _utc(e.since_ms), e.reason)
    Console().print(table if table.row_count else "No alert is in doubt.")
    return int(ExitCode.OK)


def handle_settle(args: argparse.Namespace, settings: Settings) -> int:
    entry = settle(settings, args.channel, args.alert_id, args.target, send_again=args.send_again)
    what = "queued to be sent again" if args.send_again else "recorded as delivered"
    print(f"{entry.alert_id} on {entry.channel}" + (f" ({entry.target})" if entry.target else "") + f": {what}")
    return int(ExitCode.OK)


def _utc(ms: int, iso: bool = False) -> str:
    from datetime import datetime

    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds") if iso else moment.strftime("%Y-%m-%d %H:%M:%S")

