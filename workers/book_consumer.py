"""One per-order book (iteration 5): consumes `book-<order id>`, holds events until final.

A book holds its events unacked until nothing more can fire (the alert went out, or the
book closed and left a `done` marker in Redis). If its host dies, the broker redelivers
the held events and another manager rebuilds the book: same events, same ingest stamps,
same verdict. An alert found pending after such a crash is *in doubt*: the book reads its
queue for the alert's witness (the copy the outbox routed there with the alert) and
publishes only when there is none, so `Aldebaran.Alert` carries each alert once.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aio_pika
import aio_pika.abc
import msgspec

from aldebaran.core.book import Book, Outcome
from aldebaran.core.rule import Alert, Rule
from aldebaran.io.alert_outbox import Emitted, is_witness
from aldebaran.io.publisher import published_ms as published_stamp
from aldebaran.log import get_logger
from aldebaran.metrics import BOOK_EVENTS, CONFLICTING_DUPLICATES, PROCESSING_LATENCY, RULE_ERRORS
from workers.aggregator import INGEST_HEADER, WorkItem

if TYPE_CHECKING:
    from workers.books import BookManager

log = get_logger("books")


class BookConsumer:
    """One open book: consumes its queue, holds events until final, closes at its deadline."""

    def __init__(self, manager: BookManager, rule: Rule[Any], item: WorkItem,
                 channel: aio_pika.abc.AbstractChannel) -> None:
        self.manager = manager
        self.rule = rule
        self.item = item
        self.channel = channel
        self.queue: aio_pika.abc.AbstractQueue | None = None
        self.book: Book[Any] | None = None
        self.done = False            # a `done` marker exists: every event is late
        self.held: list[aio_pika.abc.AbstractIncomingMessage] = []
        self.lock = asyncio.Lock()
        self.first_event = asyncio.Event()
        self.pending = 0  # deliveries received and not yet processed
        self.giving_up = False  # a standby leaving: deliveries from now on go back to the queue
        self.bounced = 0  # deliveries handed back while giving up
        self.doubts: dict[str, Alert] = {}  # alert id -> alert found pending after a crash
        self.settling: asyncio.Task[None] | None = None
        self.digests: dict[str, bytes] = {}  # event id -> digest of the counted copy (conflicts)
        self.conflicted: set[str] = set()  # event ids whose conflict was logged
        self.log = log.bind(order_id=item.key, app=item.app)

    async def run(self, stopping: asyncio.Event) -> bool:
        """Live the book's life; True when it ended on its own (the work item is done).

        Every wait is on pipeline time (the stream's watermark), never on this host's clock.
        """
        settings = self.manager.settings
        ttl = self.rule.ttl_seconds(settings.book_ttl_seconds)
        ttl_ms = int(ttl * 1000)
        self.done = bool(await self.manager.redis.exists(self.manager.done_key(self.rule, self.item.key)))
        queue = self.queue = await self.channel.declare_queue(self.item.queue, durable=True,
                                                              arguments=self.manager.book_args)
        consumer_tag = await queue.consume(self.on_event)
        tag: str | None = consumer_tag
        finished = False
        try:
            if not await self._first_event(stopping, 2 * ttl_ms):
                finished, tag = await self._give_up(stopping, queue, consumer_tag)
                return finished
            closed_at = None
            if self.book is not None and not self.done:
                # Close a moment after the deadline: events stamped before it may still be
                # on their way from the aggregator; they count, later ones are late.
                closed_at = int((self.book.deadline + settings.per_order.book_close_delay_seconds) * 1000)
                if await self._wait(stopping, closed_at):
                    return False
                await self._drain(ttl)
                if not await self.close(stopping):
                    return False
            # Tombstone: late events are counted and acked until the grace period ends.
            if await self._wait(stopping, (closed_at or await self._pipeline_now(stopping)) + ttl_ms):
                return False
            finished = not self.held
            return finished
        finally:
            await self._leave(queue, tag, finished)

    async def _pipeline_now(self, stopping: asyncio.Event) -> int:
        """The stream's watermark (ms), once there is one."""
        watermark = self.manager.watermark
        if watermark.value is None:
            await self._wait(stopping, 0)
        return watermark.value or 0

    async def _wait(self, stopping: asyncio.Event, until_ms: int, other: asyncio.Event | None = None) -> bool:
        """Wait until the watermark reaches `until_ms` or `other` fires; True when stopping."""
        waiters: list[asyncio.Future[Any]] = [self.manager.watermark.reached(until_ms),
                                              asyncio.ensure_future(stopping.wait())]
        if other is not None:
            waiters.append(asyncio.ensure_future(other.wait()))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        return stopping.is_set()

    async def _first_event(self, stopping: asyncio.Event, patience_ms: int) -> bool:
        """Wait for the first event; False when none came within `patience_ms` (a standby) or stopping."""
        start = await self._pipeline_now(stopping)
        await self._wait(stopping, start + patience_ms, self.first_event)
        return self.first_event.is_set() and not stopping.is_set()

    async def _give_up(self, stopping: asyncio.Event, queue: aio_pika.abc.AbstractQueue,
                       tag: str) -> tuple[bool, str | None]:
        """No event came: leave the queue. A delivery that races the leaving is handed back
        and the book is not finished (its work item returns): acking the work item while an
        event sat unacked in this book lost that order's alert."""
        if stopping.is_set():
            return False, tag
        self.giving_up = True
        await queue.cancel(tag)
        for _ in range(3):  # deliveries dispatched before the cancel-ok run their callbacks
            await asyncio.sleep(0)
        return not (self.bounced or self.first_event.is_set()), None

    async def _leave(self, queue: aio_pika.abc.AbstractQueue, tag: str | None, finished: bool) -> None:
        if self.settling is not None:
            self.settling.cancel()
        if not self.channel.is_closed:
            try:
                if tag is not None:
                    await queue.cancel(tag)
                if not finished:
                    # Unfinished (stopping, or a failure): hand the held events back
                    # so that the next owner of this queue rebuilds the book.
                    for message in self.held:
                        await message.nack(requeue=True)
            except Exception:  # noqa: BLE001 - the channel died meanwhile: the broker requeues
                pass
        self.held.clear()

    async def _drain(self, limit: float) -> bool:
        """Take in what already waits in the queue; True once it was read to its end.

        A book that started late (a busy manager, a takeover) may find its deadline
        passed while events stamped before it still sit in its queue: they count, so
        the book reads until the queue is empty. A delivery reaches `on_event` through
        two task hops in aio-pika, so "empty and nothing pending" must hold twice, a
        moment apart, before the book trusts it.
        """
        give_up = time.monotonic() + max(5.0, limit)
        quiet = 0
        while time.monotonic() < give_up:
            declared = await self.channel.declare_queue(self.item.queue, passive=True)
            if not declared.declaration_result.message_count and not self.pending:
                quiet += 1
                if quiet >= 2:
                    return True
            else:
                quiet = 0
            await asyncio.sleep(0.05)
        self.log.warning("closing with events still queued (held events at book_prefetch?)")
        return False

    async def on_event(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        if self.giving_up:
            self.bounced += 1
            await message.nack(requeue=True)
            return
        self.pending += 1
        try:
            async with self.lock:
                if is_witness(message):
                    await self._on_witness(message)
                    return
                await self._on_event(message)
        except Exception as exc:  # noqa: BLE001 - Redis or broker trouble: rebuild from the broker
            self.manager.fail(exc)
            return
        finally:
            self.pending -= 1
        self.first_event.set()

    async def _on_witness(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """An alert of this book went out before a crash: settle it, never publish it again.
        The witness of a publish the broker refused proves nothing: the alert goes out again."""
        alert_id = message.message_id or ""
        if not await self.manager.outbox.settle(alert_id):
            await message.ack()
            return
        self.doubts.pop(alert_id, None)
        await message.ack()
        if not self.doubts and self.book is not None and self.book.final and not self.done:
            await self._finish()

    async def _on_event(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        headers = message.headers or {}
        ingest_ms = headers.get(INGEST_HEADER)
        try:
            event = self.rule.codec.unpack(message.body)
            if not isinstance(ingest_ms, int | float):  # the aggregator stamps every event it routes
                raise TypeError(f"{INGEST_HEADER} is {type(ingest_ms).__name__}, not a number")
            at = float(ingest_ms) / 1000.0
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError) as exc:
            await self.manager.dead_letter(message, f"unreadable book message: {exc}")
            return
        context = self.rule.codec.describe(event)
        if self.book is None and not self.done:
            # Read again at the first event: a standby activated after another manager's book
            # for this order closed would otherwise open a fresh book on its late events.
            self.done = bool(await self.manager.redis.exists(self.manager.done_key(self.rule, self.item.key)))
        if self.done:
            after_alert = self.book is not None and not self.book.closed
            BOOK_EVENTS.labels(outcome="after_alert" if after_alert else "late").inc()
            if not after_alert:
                self.log.info("late event: book already closed", ingest_ms=ingest_ms, **context)
            await message.ack()
            return
        try:
            if self.book is None:
                self.book = Book(self.rule, self.item.key, opened_at=at,
                                 ttl=self.rule.ttl_seconds(self.manager.settings.book_ttl_seconds))
            offer = self.book.offer(event, at=at, now=datetime.now(UTC))
        except Exception as exc:  # noqa: BLE001 - a rule's error: refuse this event, not the session
            RULE_ERRORS.labels(app=self.rule.name).inc()
            reason = (f"application {self.rule.name} failed on this event of book {self.item.key[:200]!r}: "
                      f"{type(exc).__name__}: {exc}")
            await self.manager.dead_letter(message, reason[:1000])
            return
        BOOK_EVENTS.labels(outcome=offer.outcome.value).inc()
        published_ms = published_stamp(headers)
        if published_ms:
            PROCESSING_LATENCY.labels(stage="book").observe(max(0.0, time.time() - published_ms / 1000))
        if offer.outcome is Outcome.LATE:
            self.log.info("late event: after the book's deadline", ingest_ms=ingest_ms,
                          deadline_ms=int(self.book.deadline * 1000), **context)
            await message.ack()
            return
        if offer.outcome is Outcome.DUPLICATE:
            self._check_conflict(event, message.body, context)
            await message.ack()
            return
        self.digests[self.rule.event_id(event)] = _digest(message.body)
        self.held.append(message)
        for alert in offer.alerts:
            await self._emit(alert)
            if published_ms:
                PROCESSING_LATENCY.labels(stage="alert").observe(max(0.0, time.time() - published_ms / 1000))
        if self.book.final:
            if not self.doubts:
                await self._finish()
            elif self.settling is None:
                self.settling = asyncio.ensure_future(self._settle_in_background())

    async def _emit(self, alert: Alert) -> None:
        if await self.manager.outbox.emit(alert, self.queue) is Emitted.IN_DOUBT:
            self.doubts[alert.alert_id] = alert

    def _check_conflict(self, event: Any, body: bytes, context: dict[str, str]) -> None:
        """A repeat with other content is not a redelivery: count it, say so once per event id."""
        event_id = self.rule.event_id(event)
        counted = self.digests.get(event_id)
        if counted is None or counted == _digest(body):
            return
        CONFLICTING_DUPLICATES.inc()
        if event_id not in self.conflicted:  # later conflicts of this id are only counted
            self.conflicted.add(event_id)
            self.log.warning("conflicting duplicate: same event id, other content; the first copy counts",
                             **context)

    async def close(self, stopping: asyncio.Event) -> bool:
        """The deadline passed: fire what closing fires, then release every held event.

        False when an alert stayed in doubt (stopping before its queue was read to the end)."""
        async with self.lock:
            if self.book is None or self.done:
                return True
            for alert in self.book.close(datetime.now(UTC)):
                await self._emit(alert)
            if not self.doubts:
                await self._finish()
                return True
        return await self._settle_doubts(stopping)

    async def _settle_in_background(self) -> None:
        try:
            await self._settle_doubts(self.manager.stopping)
        except Exception as exc:  # noqa: BLE001 - Redis or broker trouble: rebuild from the broker
            self.manager.fail(exc)

    async def _settle_doubts(self, stopping: asyncio.Event) -> bool:
        """Read the queue to its end: a witness of an in-doubt alert settles it on the way
        (`_on_witness`); an alert still in doubt afterwards was never published, and is now.
        Then the book finishes if nothing more can fire. False when the read was cut short."""
        ttl = self.rule.ttl_seconds(self.manager.settings.book_ttl_seconds)
        if not await self._drain(ttl) or stopping.is_set():
            return False
        async with self.lock:
            assert self.queue is not None
            for alert in list(self.doubts.values()):
                await self.manager.outbox.publish_unwitnessed(alert, self.queue)
            self.doubts.clear()
            if self.book is not None and self.book.final and not self.done:
                await self._finish()
        return True

    async def _finish(self) -> None:
        # The marker first: a host dying after it but before the acks rebuilds a closed book.
        await self.manager.redis.set(self.manager.done_key(self.rule, self.item.key), b"1",
                                     ex=self.manager.settings.alert_dedup_ttl_seconds)
        self.done = True
        for message in self.held:
            await message.ack()
        self.held.clear()


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=8).digest()
