"""What tracing costs the pipeline's broker: `python -m aldebaran.bench.tracing bench`.

A pipeline-shaped flow (publish, an aggregator-like republish to a book queue, a book-like
consumer) is timed with the firehose off, on with nothing bound, on with the recorder's
bindings recorded, and on with `#` recorded; docs/audit.md has the numbers.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
import aio_pika.abc
import httpx

from aldebaran.io.firehose import Firehose
from aldebaran.settings import Settings
from workers.runtime import Lifecycle
from workers.tracer import BINDINGS, Tracer


def _bench_recorder(settings: Settings, bindings: tuple[str, ...], stop: Any, ready: Any) -> None:
    """Runs in a child process so the recorder does not share the publisher's CPU."""
    async def main() -> None:
        life = Lifecycle()
        tracer = Tracer(settings, bindings=bindings, heartbeat_seconds=5)
        task = asyncio.create_task(tracer.run(life))
        await life._ready.wait()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        life.stopping.set()
        await task
    asyncio.run(main())


async def _pipeline_rate(url: str, events: int) -> float:
    """Trade events/s through a pipeline-shaped flow: publish to Aldebaran.Trade_Data, an
    aggregator-like consumer republishes each to a book queue (default exchange), a book-like
    consumer drains it. Two publishes and two deliveries per event; the audit traces one."""
    connection = await aio_pika.connect(url)
    async with connection:
        pub = await connection.channel(publisher_confirms=True)
        agg = await connection.channel()
        book = await connection.channel()
        await agg.set_qos(prefetch_count=500)
        await book.set_qos(prefetch_count=500)
        trades = await pub.get_exchange("Aldebaran.Trade_Data")
        ingress = await agg.get_queue("Aldebaran.Trade_Data")
        books_q = await book.declare_queue("book-bench", durable=False, auto_delete=True)
        done = asyncio.Event()
        seen = 0

        async def route(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await agg.default_exchange.publish(aio_pika.Message(message.body), routing_key="book-bench")
            await message.ack()

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal seen
            await message.ack()
            seen += 1
            if seen >= events:
                done.set()
        await ingress.consume(route)
        await books_q.consume(take)
        body = json.dumps({"id": "1", "initial_order_id": "9", "#shares": 10, "client": "c", "stock": "s"}).encode()
        started = time.perf_counter()
        window = 500
        for start in range(0, events, window):
            await asyncio.gather(*(trades.publish(aio_pika.Message(body), routing_key="Aldebaran.Trade_Data")
                                   for _ in range(min(window, events - start))))
        await asyncio.wait_for(done.wait(), 600)
        return events / (time.perf_counter() - started)


def bench(events: int = 20_000, rounds: int = 3) -> dict[str, float]:
    """Median events/s per mode: firehose off, on with nothing bound, on with the audit's
    bindings recorded, on with `#` recorded. Modes are interleaved round by round so a
    machine whose load changes (shared CI) biases none of them."""
    import multiprocessing
    import statistics
    import tempfile
    import uuid

    from aldebaran.settings import load_settings
    from declare.declarer import declare

    base = load_settings()
    firehose = Firehose(base.management_url, "/")
    parts = urlsplit(base.amqp_url)
    ctx = multiprocessing.get_context("spawn")
    modes = ("off", "on, nothing bound", "on, audit bindings recorded", "on, '#' recorded")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for round_no in range(rounds):
        for mode in modes:
            vhost = f"tracebench-{uuid.uuid4().hex[:8]}"
            url = urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), "", ""))
            with httpx.Client(base_url=firehose.base, auth=firehose.auth, timeout=30) as http:
                http.put(f"/api/vhosts/{quote(vhost, safe='')}").raise_for_status()
                http.put(f"/api/permissions/{quote(vhost, safe='')}/{quote(parts.username or 'guest')}",
                         json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    settings = base.model_copy(update={"amqp_url": url, "amqp_urls": [], "traces_dir": tmp})
                    declare(settings, echo=lambda _: None)
                    stop, ready, child = ctx.Event(), ctx.Event(), None
                    if mode == "on, nothing bound":
                        asyncio.run(Firehose(base.management_url, vhost).turn_on())
                    elif mode != "off":
                        bindings = BINDINGS if "audit" in mode else ("#",)
                        child = ctx.Process(target=_bench_recorder, args=(settings, bindings, stop, ready))
                        child.start()
                        ready.wait(60)
                    rate = asyncio.run(_pipeline_rate(url, events))
                    rates[mode].append(rate)
                    if child is not None:
                        stop.set()
                        child.join(60)
                    print(f"round {round_no + 1} {mode:30s} {rate:8.0f} events/s", flush=True)
            finally:
                with httpx.Client(base_url=firehose.base, auth=firehose.auth, timeout=30) as http:
                    http.delete(f"/api/vhosts/{quote(vhost, safe='')}")
    medians = {m: statistics.median(r) for m, r in rates.items()}
    for mode, rate in medians.items():
        print(f"median {mode:30s} {rate:8.0f} events/s ({rate / medians['off']:.2f}x of off)", flush=True)
    return medians


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Measure what the firehose costs the pipeline.")
    parser.add_argument("command", choices=["bench"])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bench(args.events, args.rounds)
