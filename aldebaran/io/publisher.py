"""Publishing trade data with confirms, a bounded in-flight window, a rate, and retries.

A message the broker nacks (a full ingress with `overflow = reject-publish`) or that a
flow-controlled connection could not confirm is retried with backoff, so a publisher
is slowed down, never silently dropped. Counts of both are reported.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import aio_pika
import aio_pika.exceptions

from aldebaran.errors import PublishRefused
from aldebaran.io import amqp
from aldebaran.io.amqp import backoff_delay
from aldebaran.log import get_logger
from aldebaran.metrics import PUBLISH_NACKS
from aldebaran.settings import Settings
from declare.topology import TRADE_DATA

log = get_logger("publisher")
PUBLISHED_HEADER = "x-aldebaran-published-ms"


@dataclass
class Body:
    data: bytes
    events: int
    content_type: str = "application/json"


@dataclass
class PublishReport:
    messages: int = 0
    events: int = 0
    nacks: int = 0
    elapsed: float = 0.0

    @property
    def rate(self) -> float:
        return self.events / self.elapsed if self.elapsed else 0.0


async def publish_bodies(settings: Settings, bodies: Iterable[Body], *, rate: float = 0.0,
                         window: int = 256, progress: Callable[[int], None] | None = None,
                         max_retries: int = 50) -> PublishReport:
    """Publish every body to the trade exchange; returns once all are confirmed."""
    report = PublishReport()
    connection = await amqp.connect(settings, "publisher", robust=False)
    started = time.perf_counter()
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(TRADE_DATA, ensure=False)
        slots = asyncio.Semaphore(window)
        pending: set[asyncio.Task[None]] = set()

        async def send(body: Body) -> None:
            try:
                for attempt in range(max_retries):
                    message = aio_pika.Message(
                        body.data, content_type=body.content_type,
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        headers={PUBLISHED_HEADER: int(time.time() * 1000)})
                    try:
                        await exchange.publish(message, routing_key=TRADE_DATA, timeout=30)
                        break
                    except (aio_pika.exceptions.DeliveryError, asyncio.TimeoutError) as exc:
                        report.nacks += 1
                        PUBLISH_NACKS.labels(publisher="trade").inc()
                        delay = backoff_delay(attempt, base=0.05, cap=2.0)
                        log.warning("broker refused a message; retrying", reason=str(exc) or "timeout",
                                    retry_in_seconds=round(delay, 3))
                        await asyncio.sleep(delay)
                else:
                    raise PublishRefused(
                        f"the broker refused a message {max_retries} times (ingress full: "
                        "overflow = reject-publish, or flow control); nothing was lost — "
                        "retry later, slow down (--rate), or add consumers")
                report.messages += 1
                report.events += body.events
                if progress:
                    progress(body.events)
            finally:
                slots.release()

        sent_events = 0
        for body in bodies:
            if rate:
                ahead = sent_events / rate - (time.perf_counter() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            await slots.acquire()
            task = asyncio.create_task(send(body))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent_events += body.events
        if pending:
            await asyncio.gather(*pending)
    finally:
        report.elapsed = time.perf_counter() - started
        await connection.close()
    return report
