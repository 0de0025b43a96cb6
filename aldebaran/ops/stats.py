"""`aldebaran stats`: what the pipeline is doing now, from the broker and Redis.

Queue depths and rates come from the RabbitMQ management API (the only place rates
exist); open books from the per-order book queues' consumers, or exactly from the
workers' own `aldebaran_books_open` gauges when their /metrics URLs are given; recent
alerts from the Redis list the pipeline keeps; dead letters from the dead-letter queue
with their `x-aldebaran-reason`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from aldebaran.errors import AldebaranError
from aldebaran.io.redis import Keys, as_bytes, describe, sync_client
from aldebaran.log import get_logger
from aldebaran.ops.management import Management
from aldebaran.settings import Settings, mask_url
from declare.topology import DEAD_LETTER, REASON_HEADER

log = get_logger("stats")

BOOK_PREFIX = "book-"


@dataclass
class QueueStats:
    """One queue, or one family of queues (`book-*`) summed, as the management API sees it."""

    name: str
    messages: int = 0
    ready: int = 0
    unacked: int = 0
    consumers: int = 0
    publish_rate: float = 0.0
    deliver_rate: float = 0.0
    ack_rate: float = 0.0
    queues: int = 1


@dataclass
class DeadLetter:
    reason: str | None
    message_id: str | None
    body: str


@dataclass
class Stats:
    vhost: str
    queues: list[QueueStats]
    book_queues: int
    open_books: int
    open_books_source: str
    dead_letters: int
    dead_letter_peek: list[DeadLetter]
    dead_letter_note: str | None
    recent_alerts: list[dict[str, Any]] | None
    channels: list[dict[str, Any]] = field(default_factory=list)  # guarantee and alerts in doubt per channel
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def _rate(stats: dict[str, Any] | None, key: str) -> float:
    details = (stats or {}).get(f"{key}_details") or {}
    return float(details.get("rate") or 0.0)


def queue_stats(raw: dict[str, Any]) -> QueueStats:
    message_stats = raw.get("message_stats")
    return QueueStats(
        name=raw["name"],
        messages=int(raw.get("messages") or 0),
        ready=int(raw.get("messages_ready") or 0),
        unacked=int(raw.get("messages_unacknowledged") or 0),
        consumers=int(raw.get("consumers") or 0),
        publish_rate=_rate(message_stats, "publish"),
        deliver_rate=_rate(message_stats, "deliver_get"),
        ack_rate=_rate(message_stats, "ack"),
    )


def _family(name: str, members: list[QueueStats]) -> QueueStats:
    total = QueueStats(name=name, queues=len(members))
    for q in members:
        total.messages += q.messages
        total.ready += q.ready
        total.unacked += q.unacked
        total.consumers += q.consumers
        total.publish_rate += q.publish_rate
        total.deliver_rate += q.deliver_rate
        total.ack_rate += q.ack_rate
    return total


def summarise_queues(raw: list[dict[str, Any]]) -> tuple[list[QueueStats], list[QueueStats]]:
    """Named queues one by one; per-order book queues (thousands) folded into one row.

    Returns (rows to show, the per-order book queues themselves).
    """
    named, books = [], []
    for item in raw:
        q = queue_stats(item)
        if q.name.startswith(BOOK_PREFIX):
            books.append(q)
        else:
            named.append(q)
    rows = sorted(named, key=lambda q: q.name)
    if books:
        rows.append(_family(f"{BOOK_PREFIX}*", books))
    return rows, books


def books_open_from_metrics(urls: Sequence[str], timeout: float = 5.0) -> float:
    """Sum of `aldebaran_books_open` over the given workers' /metrics endpoints."""
    total = 0.0
    for url in urls:
        try:
            text = httpx.get(url, timeout=timeout).raise_for_status().text
        except httpx.HTTPError as exc:
            raise AldebaranError(f"cannot scrape {mask_url(url)}: {exc}") from None
        for family in text_string_to_metric_families(text):
            if family.name == "aldebaran_books_open":
                total += sum(sample.value for sample in family.samples)
    return total


def _dead_letter(message: dict[str, Any]) -> DeadLetter:
    properties = message.get("properties") or {}
    headers = properties.get("headers") or {}
    reason = headers.get(REASON_HEADER)
    return DeadLetter(
        reason=str(reason) if reason is not None else None,
        message_id=properties.get("message_id"),
        body=str(message.get("payload", ""))[:200],
    )


def peek_dead_letters(mgmt: Management, queue: dict[str, Any] | None,
                      count: int) -> tuple[list[DeadLetter], str | None]:
    """The oldest `count` dead letters, requeued untouched, and a note when not peeked.

    A quorum queue counts every requeue as a delivery and drops the message at
    `x-delivery-limit`, so peeking one repeatedly would destroy what it shows: skip it.
    """
    if queue is None:
        return [], f"{DEAD_LETTER} is not declared in this vhost"
    if queue.get("type") == "quorum" or (queue.get("arguments") or {}).get("x-queue-type") == "quorum":
        return [], f"{DEAD_LETTER} is a quorum queue: not peeked (each requeue counts toward its delivery limit)"
    if count <= 0 or not queue.get("messages"):
        return [], None
    return [_dead_letter(m) for m in mgmt.peek(DEAD_LETTER, count)], None


def recent_alerts(settings: Settings, count: int) -> list[dict[str, Any]]:
    """The newest alerts first, from the list the pipeline LPUSHes to and trims."""
    client = sync_client(settings.redis_url, timeout=5, tls_ca_file=settings.tls_ca_file)
    try:
        raw = client.lrange(Keys(settings.redis_key_prefix).recent_alerts(), 0, count - 1)
    finally:
        client.close()
    alerts = []
    for item in raw:
        try:
            alert = json.loads(item)
        except ValueError:
            alert = None
        unreadable = {"unreadable": as_bytes(item).decode(errors="replace")[:200]}
        alerts.append(alert if isinstance(alert, dict) else unreadable)
    return alerts


def channel_rows(settings: Settings, shown: int = 5) -> list[dict[str, Any]]:
    """Each channel's delivery guarantee, how many alerts it has in doubt, and the oldest of them."""
    from aldebaran.ops.delivery import in_doubt, in_doubt_counts

    found = in_doubt(settings, limit=shown)
    counts = in_doubt_counts(settings)
    return [{"name": c.name, "kind": c.kind, "delivery": c.guarantee, "in_doubt": counts.get(c.name, 0),
             "oldest_in_doubt": [e.to_dict() for e in found.get(c.name, [])]} for c in settings.channels]


def collect(settings: Settings, *, alerts: int = 10, peek: int = 5, metrics_urls: Sequence[str] = ()) -> Stats:
    """Everything `aldebaran stats` shows; the management API must answer, Redis may not."""
    with Management(settings) as mgmt:
        raw = mgmt.queues()
        rows, books = summarise_queues(raw)
        dlq = next((q for q in raw if q["name"] == DEAD_LETTER), None)
        peeked, note = peek_dead_letters(mgmt, dlq, peek)
    problems: list[str] = []
    open_books, source = sum(q.consumers for q in books), "consumers on book-* queues"
    if metrics_urls:
        open_books, source = int(books_open_from_metrics(metrics_urls)), "aldebaran_books_open of the given workers"
    try:
        latest: list[dict[str, Any]] | None = recent_alerts(settings, alerts) if alerts > 0 else []
    except (redis.RedisError, OSError) as exc:
        latest = None
        problems.append(f"redis at {describe(settings)}: {mask_url(str(exc))}")
        log.warning("recent alerts unavailable", error=str(exc))
    try:
        channels = channel_rows(settings)
    except AldebaranError as exc:
        channels = []
        problems.append(str(exc))
    return Stats(
        channels=channels,
        vhost=mgmt.vhost,
        queues=rows,
        book_queues=len(books),
        open_books=open_books,
        open_books_source=source,
        dead_letters=int(dlq.get("messages") or 0) if dlq else 0,
        dead_letter_peek=peeked,
        dead_letter_note=note,
        recent_alerts=latest,
        problems=problems,
    )


def render(stats: Stats, console: Any) -> None:
    """Rich tables for people."""
    from rich.table import Table

    queues = Table(title=f"Queues in vhost {stats.vhost!r}", title_justify="left")
    for column in ("queue", "ready", "unacked", "consumers", "in/s", "out/s", "ack/s"):
        if column == "queue":
            queues.add_column(column, no_wrap=True, overflow="fold")
        else:
            queues.add_column(column, justify="right")
    for q in stats.queues:
        name = q.name if q.queues == 1 else f"{q.name} ({q.queues} queues)"
        queues.add_row(name, str(q.ready), str(q.unacked), str(q.consumers),
                       f"{q.publish_rate:.1f}", f"{q.deliver_rate:.1f}", f"{q.ack_rate:.1f}")
    console.print(queues)
    console.print(f"Open books: [bold]{stats.open_books}[/bold] ({stats.open_books_source}); "
                  f"per-order book queues: {stats.book_queues}")

    console.print(f"Dead letters: [bold]{stats.dead_letters}[/bold] in {DEAD_LETTER}")
    if stats.dead_letter_note:
        console.print(f"  {stats.dead_letter_note}")
    if stats.dead_letter_peek:
        peek = Table(title="Oldest dead letters (requeued)", title_justify="left")
        for column in ("reason", "message id", "body"):
            peek.add_column(column, overflow="fold")
        for d in stats.dead_letter_peek:
            peek.add_row(d.reason or "-", d.message_id or "-", d.body)
        console.print(peek)

    if stats.recent_alerts is None:
        console.print("Recent alerts: unavailable (Redis did not answer)")
    elif not stats.recent_alerts:
        console.print("Recent alerts: none")
    else:
        alerts = Table(title="Recent alerts (newest first)", title_justify="left")
        for column in ("detected at", "kind", "order", "client", "stock", "requested", "purchased"):
            alerts.add_column(column)
        for a in stats.recent_alerts:
            if "unreadable" in a:
                alerts.add_row("-", "unreadable", a["unreadable"], "", "", "", "")
                continue
            alerts.add_row(*(str(a.get(k, "")) if a.get(k) is not None else "-" for k in (
                "detected_at", "kind", "order_id", "client", "stock", "requested_shares", "purchased_shares")))
        console.print(alerts)
    _render_channels(stats.channels, console)
    for problem in stats.problems:
        console.print(f"[red]problem:[/red] {problem}")


def _render_channels(channels: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    if not channels:
        return
    table = Table(title="Channels (alerts in doubt: `aldebaran delivery in-doubt`, settle one with "
                        "`aldebaran delivery settle`)", title_justify="left")
    for column in ("channel", "kind", "delivery", "in doubt", "oldest in doubt"):
        table.add_column(column, overflow="fold")
    for c in channels:
        oldest = ", ".join(e["alert_id"] for e in c["oldest_in_doubt"]) or "-"
        table.add_row(c["name"], c["kind"], c["delivery"], str(c["in_doubt"]), oldest)
    console.print(table)
