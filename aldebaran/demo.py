"""`aldebaran demo`: the whole pipeline on this machine, with the design document's example.

Declares the topology, runs the workers of `aldebaran up` in this process, publishes
request 1 for 100 shares with purchases 2 (90) and 3 (30) in the text form, then a
generated stream of a few thousand orders, and prints the alerts and a summary. Each
run uses its own Redis namespace and order ids, so a second run shows the same alerts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

from aldebaran import runtime_tuning
from aldebaran.settings import Settings

DOC_EXAMPLE = [
    b"id:1\n# shares: 100\nclient: Sendence\nstock: AAPL\n",
    b"id:2\ninitial order id: 1\n# shares: 90\nclient: Sendence\nstock: AAPL\n",
    b"id:3\ninitial order id: 1\n# shares: 30\nclient: Sendence\nstock: AAPL\n",
]


MODE_LABELS = {"per-order": "iteration-5 per-order reference mode", "engine": "engine mode"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("demo", help="run the pipeline on the design document's example and a stream")
    parser.add_argument("--orders", type=int, default=2000, help="orders in the generated stream")
    parser.add_argument("--book-ttl", type=float, default=15.0, help="book lifetime for the demo (seconds)")
    parser.add_argument("--rows", type=int, default=12, help="alert rows to print")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    from declare.declarer import declare

    run = uuid.uuid4().hex[:6]
    settings = settings.model_copy(update={
        "book_ttl_seconds": args.book_ttl,
        "redis_key_prefix": f"{settings.redis_key_prefix}:demo-{run}",
    })
    declare(settings, echo=lambda _: None)
    return runtime_tuning.run(_demo(settings, args, run))


async def _demo(settings: Settings, args: argparse.Namespace, run: str) -> int:
    import aio_pika
    from rich.console import Console

    from aldebaran.io import amqp
    from aldebaran.io.alert_bus import split_alerts
    from aldebaran.io.publisher import Body, publish_bodies
    from aldebaran.publish import batches
    from aldebaran.trades.generator import generate
    from declare.topology import ALERT
    from workers.runtime import Lifecycle
    from workers.up import build_workers

    console = Console()
    stream = generate(args.orders, seed=2026, prefix=f"{run}-", orphans=0.01)
    expected = stream.expected | {"over_purchase:1"}
    workers = build_workers(settings, tracer=False)
    lives = [Lifecycle() for _ in workers]
    tasks = [asyncio.create_task(w.run(life), name=w.name) for w, life in zip(workers, lives, strict=True)]
    alerts: dict[str, dict[str, Any]] = {}
    connection = await amqp.connect(settings, "demo")
    try:
        with console.status("starting the pipeline"):
            await _first(asyncio.gather(*(life._ready.wait() for life in lives)), tasks)
        channel = await connection.channel()
        tap = await channel.declare_queue(exclusive=True, auto_delete=True)
        await tap.bind(await channel.get_exchange(ALERT, ensure=False), routing_key=ALERT)
        last_alert = [0.0]

        async def on_alert(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            for body in split_alerts(message.body):  # one alert, or a batch (CONTRACT §3)
                alert = json.loads(body)
                alerts.setdefault(alert["alert_id"], alert)
            last_alert[0] = time.perf_counter()
            await message.ack()

        await tap.consume(on_alert)
        started = time.perf_counter()
        with console.status("publishing the design document's example (text form)"):
            await publish_bodies(settings, [Body(b, 1, "text/plain") for b in DOC_EXAMPLE])
        with console.status(f"publishing {len(stream.events):,} events of {stream.orders:,} orders"):
            report = await publish_bodies(settings, batches(stream.events, 100))
        deadline = time.monotonic() + args.book_ttl * 2 + 120
        with console.status("waiting for the alerts (purchase_without_request fires when a book closes)"):
            while not expected <= alerts.keys() and time.monotonic() < deadline:
                await _first(asyncio.sleep(0.2), tasks)
            await asyncio.sleep(1.0)  # anything unexpected would show up now
        elapsed = (last_alert[0] or time.perf_counter()) - started
    finally:
        for life in lives:
            life.stopping.set()
        await asyncio.wait(tasks, timeout=settings.shutdown_grace_seconds)
        await connection.close()
    return _report(console, alerts, expected, report.events + len(DOC_EXAMPLE), elapsed, args.rows, settings.mode)


async def _first(awaitable: Any, tasks: list[asyncio.Task[None]]) -> None:
    """Await `awaitable`, but fail fast if a worker died meanwhile."""
    waiter = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if waiter not in done:
        waiter.cancel()
        crashed = next(t for t in tasks if t.done())
        raise RuntimeError(f"worker {crashed.get_name()} stopped: {crashed.exception()!r}")


def _report(console: Any, alerts: dict[str, dict[str, Any]], expected: set[str], events: int,
            elapsed: float, rows: int, mode: str) -> int:
    from rich.table import Table

    table = Table(title="Alerts (the design document's order 1 first)")
    for column in ("alert_id", "kind", "client", "stock", "requested", "purchased", "purchase ids"):
        table.add_column(column)
    ordered = sorted(alerts.values(), key=lambda a: (a["order_id"] != "1", a["kind"], a["order_id"]))
    for alert in ordered[:rows]:
        table.add_row(alert["alert_id"], alert["kind"], alert["client"], alert["stock"],
                      str(alert["requested_shares"]), str(alert["purchased_shares"]),
                      ", ".join(alert["purchase_ids"][:6]))
    if len(ordered) > rows:
        table.caption = f"... and {len(ordered) - rows:,} more"
    console.print(table)
    missing, unexpected = expected - alerts.keys(), alerts.keys() - expected
    kinds = {k: sum(a["kind"] == k for a in alerts.values()) for k in ("over_purchase", "purchase_without_request")}
    console.print(
        f"[bold]{events:,} events, {len(alerts):,} alerts[/] ({kinds['over_purchase']:,} over_purchase, "
        f"{kinds['purchase_without_request']:,} purchase_without_request), "
        f"{events / elapsed if elapsed else 0:,.0f} events/s, {elapsed:.1f} s elapsed, "
        f"{len(missing)} missing, {len(unexpected)} unexpected ({MODE_LABELS[mode]})")
    for label, ids in (("missing", missing), ("unexpected", unexpected)):
        if ids:
            console.print(f"[red]{label}:[/] {', '.join(sorted(ids)[:20])}")
    return 0 if not missing and not unexpected else 1
