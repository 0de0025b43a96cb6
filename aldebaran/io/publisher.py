"""Publishing trade data with confirms, a bounded in-flight window, a rate, and retries.

A message the broker nacks (a full ingress with `overflow = reject-publish`) or that a
flow-controlled connection could not confirm is retried with backoff, so a publisher
is slowed down, never silently dropped. Counts of both are reported. Publishes are
mandatory: a message no queue would take (the topology was never declared) comes back
and is retried and reported, instead of being confirmed into nowhere.

Cluster mode (several `amqp_urls`): when the publisher's node goes away mid-stream,
every message not yet confirmed is published again on a connection to the next node
that answers. A message may thus reach the queue twice (it was routed, its confirm was
lost with the connection); that is fine, books count an event once per event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq.exceptions

from aldebaran.errors import PublishRefused, PublishUnconfirmed, UnavailableError
from aldebaran.io import amqp
from aldebaran.io.amqp import backoff_delay
from aldebaran.log import get_logger
from aldebaran.metrics import PUBLISH_NACKS, UNROUTABLE
from aldebaran.settings import Settings, mask_url
from declare.topology import PUBLISHED_HEADER, PUBLISHED_MS_HEADER, TRADE_DATA

log = get_logger("publisher")


def published_ms(headers: Mapping[str, object] | None) -> float:
    """The publish stamp of a message's headers in epoch ms; 0.0 when absent or not a time."""
    headers = headers or {}
    for name, scale in ((PUBLISHED_HEADER, 1000), (PUBLISHED_MS_HEADER, 1)):
        value = headers.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 10**13 * scale:
            return value / scale
    return 0.0


def publish_stamp() -> int:
    """Now, as the publish header carries it."""
    return time.time_ns() // 1000


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
    unroutable: int = 0  # returned: no queue bound to the trade exchange
    resends: int = 0  # publishes repeated because their connection was lost unconfirmed
    failovers: int = 0  # connections replaced after a loss
    elapsed: float = 0.0

    @property
    def rate(self) -> float:
        return self.events / self.elapsed if self.elapsed else 0.0


# A lost connection shows up, depending on the moment, as any of these.
LOST = (aiormq.exceptions.AMQPConnectionError, aiormq.exceptions.ChannelInvalidStateError,
        aiormq.exceptions.ChannelClosed, ConnectionError, OSError, RuntimeError)


def _closing_without_reason(exc: BaseException) -> bool:
    """True for what aiormq fails every pending confirm with when its connection ends without
    a reason (the reader saw the socket close): `Exception` itself, no message.

    It fails them in the same pass as the future aio-pika's `is_closed` waits on, in no set
    order, so the sender can wake while the connection still looks open.
    """
    return type(exc) is Exception and not exc.args


class _Link:
    """The publisher's connection, replaced by one to the next node when it is lost.

    `generation` tells the senders which connection they used: many in-flight publishes
    fail together when a node dies, and only the first to ask replaces the connection.
    """

    def __init__(self, settings: Settings, report: PublishReport, attempts: int) -> None:
        self.settings = settings
        self.report = report
        self.attempts = attempts
        self.generation = 0
        self.index = 0
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.exchange: aio_pika.abc.AbstractExchange | None = None
        self._lock = asyncio.Lock()

    async def open(self, start: int = 0) -> None:
        connection, self.index = await amqp.connect_any(self.settings, "publisher", robust=False, start=start)
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        self.connection, self.exchange = connection, await channel.get_exchange(TRADE_DATA, ensure=False)

    @property
    def broken(self) -> bool:
        return self.connection is None or self.connection.is_closed

    async def replace(self, generation: int) -> None:
        """Connect again, beginning with the node after the lost one (once per loss)."""
        async with self._lock:
            if generation != self.generation:
                return  # another sender already replaced it
            await self.close()
            for attempt in range(self.attempts):
                try:
                    await self.open(start=self.index + 1)
                    break
                except (TimeoutError, UnavailableError, *LOST) as exc:
                    delay = backoff_delay(attempt, base=0.2, cap=5.0)
                    log.warning("no broker node answers; publisher retrying", error=str(exc),
                                retry_in_seconds=round(delay, 2))
                    await asyncio.sleep(delay)
            else:
                raise UnavailableError("publisher lost its broker and no node answered again")
            self.generation += 1
            self.report.failovers += 1
            log.warning("publisher reconnected; re-sending unconfirmed messages",
                        url=mask_url(self.settings.broker_urls[self.index]))

    async def close(self) -> None:
        if self.connection is not None and not self.connection.is_closed:
            with contextlib.suppress(Exception):  # closing a dead connection may fail
                await asyncio.wait_for(self.connection.close(), timeout=5)


class _Sender:
    """Publishes one body until it is confirmed: a nack or a return is retried with backoff,
    a confirm lost with its connection is published again on the next node."""

    def __init__(self, settings: Settings, link: _Link, report: PublishReport, *, max_retries: int,
                 slots: asyncio.Semaphore, progress: Callable[[int], None] | None) -> None:
        self.settings = settings
        self.link = link
        self.report = report
        self.max_retries = max_retries
        self.slots = slots
        self.progress = progress
        # Why sends failed, kept before their window slot is freed: the caller sends nothing more.
        self.failed: list[BaseException] = []

    async def send(self, body: Body) -> None:
        """Publish `body` (its window slot is taken by the caller, released here)."""
        try:
            for attempt in range(self.max_retries):
                if await self._attempt(body, attempt):
                    break
            else:
                raise self._refused()
            self.report.messages += 1
            self.report.events += body.events
            if self.progress:
                self.progress(body.events)
        except asyncio.CancelledError:
            self.failed.append(PublishUnconfirmed(
                "a publish was cancelled before the broker confirmed it; sending stopped there: "
                "publish again (events count once by id)"))
            raise
        except BaseException as exc:
            self.failed.append(exc)
            raise
        finally:
            self.slots.release()

    async def _attempt(self, body: Body, attempt: int) -> bool:
        """One publish; True once confirmed, False when it must be tried again."""
        message = aio_pika.Message(
            body.data, content_type=body.content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers={PUBLISHED_HEADER: publish_stamp()})
        generation, exchange = self.link.generation, self.link.exchange
        assert exchange is not None
        try:
            await exchange.publish(message, routing_key=TRADE_DATA, timeout=30)
            return True
        except (TimeoutError, aio_pika.exceptions.DeliveryError) as exc:
            if self.link.broken:  # a timeout on a dead connection is a loss, not a nack
                self.report.resends += 1
                await self.link.replace(generation)
                return False
            await self._back_off(exc, attempt, generation)
        except (asyncio.CancelledError, Exception) as exc:  # a loss (LOST) or not: told apart below
            task = asyncio.current_task()
            # Lost with its connection: that one is broken, or another sender has replaced it
            # already (then the link looks healthy, and only the generation tells), or the
            # connection is closing and has not said so yet (`_closing_without_reason`).
            lost = self.link.broken or generation != self.link.generation or _closing_without_reason(exc)
            if isinstance(exc, asyncio.CancelledError) and (task is None or task.cancelling() or not lost):
                raise  # a real cancellation, not a confirm dropped with its connection
            if not isinstance(exc, LOST) and not lost:
                raise  # a fault with a reason of its own: shown, not taken for a loss
            self.report.resends += 1
            log.warning("connection lost before the confirm; re-sending on another node",
                        error=str(exc) or type(exc).__name__)
            await self.link.replace(generation)
        return False

    async def _back_off(self, exc: Exception, attempt: int, generation: int) -> None:
        """A nack or a return: count it, say why, wait before the next attempt."""
        delay = backoff_delay(attempt, base=0.05, cap=2.0)
        if isinstance(exc, aio_pika.exceptions.PublishError):
            self.report.unroutable += 1
            UNROUTABLE.labels(publisher="trade").inc()
            log.warning("no queue is bound to the trade exchange (run `aldebaran declare`); "
                        "retrying", retry_in_seconds=round(delay, 3))
        else:
            self.report.nacks += 1
            PUBLISH_NACKS.labels(publisher="trade").inc()
            log.warning("broker refused a message; retrying", reason=str(exc) or "timeout",
                        retry_in_seconds=round(delay, 3))
        await asyncio.sleep(delay)
        if attempt >= 2 and len(self.settings.broker_urls) > 1:
            # A node that keeps refusing may hold a stale view of a quorum
            # queue's leader after a failover (RabbitMQ 3.10 nacks every
            # publish then, until the old leader is back): a fresh channel on
            # the next node asks anew. Once per connection, not per message.
            await self.link.replace(generation)

    def _refused(self) -> PublishRefused:
        if self.report.unroutable and not self.report.nacks:
            return PublishRefused(
                f"the broker returned a message {self.max_retries} times: no queue is bound to "
                f"{TRADE_DATA}; run `aldebaran declare` and publish again")
        return PublishRefused(
            f"the broker refused a message {self.max_retries} times (ingress full: "
            "overflow = reject-publish, or flow control); nothing was lost — "
            "retry later, slow down (--rate), or add consumers")


async def publish_bodies(settings: Settings, bodies: Iterable[Body], *, rate: float = 0.0,
                         window: int = 256, progress: Callable[[int], None] | None = None,
                         max_retries: int = 50) -> PublishReport:
    """Publish every body to the trade exchange; returns once all are confirmed.

    Survives losing its broker node: unconfirmed bodies are re-sent on the next node.
    """
    report = PublishReport()
    link = _Link(settings, report, attempts=max_retries)
    await link.open()
    started = time.perf_counter()
    try:
        slots = asyncio.Semaphore(window)
        sender = _Sender(settings, link, report, max_retries=max_retries, slots=slots, progress=progress)
        pending: set[asyncio.Task[None]] = set()
        failed = sender.failed  # a send that fails while later ones go out must not end with its task
        sent_events = 0
        for body in bodies:
            if rate:
                ahead = sent_events / rate - (time.perf_counter() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            await slots.acquire()
            if failed:  # nothing more is sent once a message failed
                slots.release()
                break
            task = asyncio.create_task(sender.send(body))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent_events += body.events
        if pending:  # (cancelled with us: gather cancels them)
            await asyncio.gather(*pending, return_exceptions=True)
        if failed:
            raise failed[0]
    finally:
        report.elapsed = time.perf_counter() - started
        await link.close()
    return report
