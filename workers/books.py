"""The book manager (iteration 5): one lightweight asyncio book per open order.

It consumes the work queue and, per announced order, starts a book that consumes
`book-<order id>` (a single-active-consumer queue, so two hosts never split one order).
A book holds its events unacked until nothing more can fire (the alert went out, or the
book closed and left a `done` marker in Redis). If its host dies, the broker redelivers
both the work item and the held events, and another manager rebuilds the book: same
events, same ingest timestamps, same verdict, and the outbox turns a repeat into nothing.

The work queue's prefetch is the open-book limit: at `max_open_books` the manager simply
receives no new work until books close (never evicting a book that could still alert).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any, Sequence

import aio_pika
import aio_pika.abc
import msgspec
import redis.asyncio as aioredis

from aldebaran.apps import load_rules
from aldebaran.core.book import Book, Outcome
from aldebaran.io.alert_outbox import AlertOutbox
from aldebaran.core.rule import Rule
from aldebaran.io import amqp
from aldebaran.io import redis as redis_io
from aldebaran.io.redis import Keys
from aldebaran.log import Throttle, get_logger
from aldebaran.metrics import (BOOK_EVENTS, BOOKS_OPEN, CONFLICTING_DUPLICATES, DEAD_LETTERED, PROCESSING_LATENCY,
                               RULE_ERRORS)
from aldebaran.settings import Settings
from declare.declarer import declare_async
from declare.topology import ALERT, DEAD_LETTER, REASON_HEADER, WORK_QUEUE, book_queue, book_queue_arguments
from workers.aggregator import INGEST_HEADER, PUBLISHED_HEADER, WorkItem
from workers.runtime import Lifecycle

log = get_logger("books")
BOOKS_PER_CHANNEL = 500
_work_decoder = msgspec.json.Decoder(WorkItem)


class BookConsumer:
    """One open book: consumes its queue, holds events until final, closes at its deadline."""

    def __init__(self, manager: "BookManager", rule: Rule[Any], item: WorkItem,
                 channel: aio_pika.abc.AbstractChannel) -> None:
        self.manager = manager
        self.rule = rule
        self.item = item
        self.channel = channel
        self.book: Book[Any] | None = None
        self.done = False            # a `done` marker exists: every event is late
        self.held: list[aio_pika.abc.AbstractIncomingMessage] = []
        self.lock = asyncio.Lock()
        self.first_event = asyncio.Event()
        self.pending = 0  # deliveries received and not yet processed
        self.digests: dict[str, bytes] = {}  # event id -> digest of the counted copy (conflicts)
        self.conflicted: set[str] = set()  # event ids whose conflict was logged
        self.log = log.bind(order_id=item.key, app=item.app)

    async def run(self, stopping: asyncio.Event) -> bool:
        """Live the book's life; True when it ended on its own (the work item is done)."""
        settings = self.manager.settings
        ttl = self.rule.ttl_seconds(settings.book_ttl_seconds)
        self.done = bool(await self.manager.redis.exists(self.manager.done_key(self.rule, self.item.key)))
        queue = await self.channel.declare_queue(self.item.queue, durable=True,
                                                 arguments=self.manager.book_args)
        tag = await queue.consume(self.on_event)
        finished = False
        try:
            # Wait for the first event (a standby consumer may never get one).
            if not await _wait_any(stopping, self.first_event, timeout=ttl * 2):
                finished = not stopping.is_set()
                return finished
            if self.book is not None and not self.done:
                # Close a moment after the deadline: events stamped before it may still be
                # on their way from the aggregator; they count, later ones are late.
                remaining = self.book.deadline + settings.per_order.book_close_delay_seconds - time.time()
                if await _wait_any(stopping, None, timeout=max(0.0, remaining)):
                    return False
                await self._drain(ttl)
                await self.close()
            # Tombstone: late events are counted and acked until the grace period ends.
            if await _wait_any(stopping, None, timeout=ttl):
                return False
            finished = True
            return True
        finally:
            if not self.channel.is_closed:
                try:
                    await queue.cancel(tag)
                    if not finished:
                        # Unfinished (stopping, or a failure): hand the held events back
                        # so that the next owner of this queue rebuilds the book.
                        for message in self.held:
                            await message.nack(requeue=True)
                except Exception:  # noqa: BLE001 - the channel died meanwhile: the broker requeues
                    pass
            self.held.clear()

    async def _drain(self, limit: float) -> None:
        """Take in what already waits in the queue before closing.

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
                    return
            else:
                quiet = 0
            await asyncio.sleep(0.05)
        self.log.warning("closing with events still queued (held events at book_prefetch?)")

    async def on_event(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.pending += 1
        try:
            async with self.lock:
                await self._on_event(message)
        except Exception as exc:  # noqa: BLE001 - Redis or broker trouble: rebuild from the broker
            self.manager.fail(exc)
            return
        finally:
            self.pending -= 1
        self.first_event.set()

    async def _on_event(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        headers = message.headers or {}
        ingest_ms = headers.get(INGEST_HEADER)
        try:
            event = self.rule.codec.unpack(message.body)
            at = float(ingest_ms) / 1000.0
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError) as exc:
            await self.manager.dead_letter(message, f"unreadable book message: {exc}")
            return
        context = self.rule.codec.describe(event)
        if self.done:
            after_alert = self.book is not None and not self.book.closed
            BOOK_EVENTS.labels(outcome="after_alert" if after_alert else "late").inc()
            if not after_alert:
                self.log.info("late event: book already closed", **context)
            await message.ack()
            return
        try:
            if self.book is None:
                self.book = Book(self.rule, self.item.key, opened_at=at,
                                 ttl=self.rule.ttl_seconds(self.manager.settings.book_ttl_seconds))
            offer = self.book.offer(event, at=at, now=datetime.now(timezone.utc))
        except Exception as exc:  # noqa: BLE001 - a rule's error: refuse this event, not the session
            RULE_ERRORS.labels(app=self.rule.name).inc()
            reason = (f"application {self.rule.name} failed on this event of book {self.item.key[:200]!r}: "
                      f"{type(exc).__name__}: {exc}")
            await self.manager.dead_letter(message, reason[:1000])
            return
        BOOK_EVENTS.labels(outcome=offer.outcome.value).inc()
        published_ms = headers.get(PUBLISHED_HEADER)
        if isinstance(published_ms, int):
            PROCESSING_LATENCY.labels(stage="book").observe(max(0.0, time.time() - published_ms / 1000))
        if offer.outcome is Outcome.LATE:
            self.log.info("late event: after the book's deadline", **context)
            await message.ack()
            return
        if offer.outcome is Outcome.DUPLICATE:
            self._check_conflict(event, message.body, context)
            await message.ack()
            return
        self.digests[self.rule.event_id(event)] = _digest(message.body)
        self.held.append(message)
        for alert in offer.alerts:
            await self.manager.outbox.emit(alert)
            if isinstance(published_ms, int):
                PROCESSING_LATENCY.labels(stage="alert").observe(max(0.0, time.time() - published_ms / 1000))
        if self.book.final:
            await self._finish()

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

    async def close(self) -> None:
        """The deadline passed: fire what closing fires, then release every held event."""
        async with self.lock:
            if self.book is None or self.done:
                return
            for alert in self.book.close(datetime.now(timezone.utc)):
                await self.manager.outbox.emit(alert)
            await self._finish()

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


async def _wait_any(stopping: asyncio.Event, other: asyncio.Event | None, timeout: float) -> bool:
    """Wait for `other` (if any) or the timeout; True when stopping was requested or `other` fired."""
    waiters = [asyncio.ensure_future(stopping.wait())]
    if other is not None:
        waiters.append(asyncio.ensure_future(other.wait()))
    done, pending = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for waiter in pending:
        waiter.cancel()
    return bool(done)


class BookManager:
    name = "books"

    def __init__(self, settings: Settings, rules: Sequence[Rule[Any]]) -> None:
        self.settings = settings
        self.rules = {rule.name: rule for rule in rules}
        self.keys = Keys(settings.redis_key_prefix)
        self.book_args = book_queue_arguments(settings)
        self.books: dict[tuple[str, str], BookConsumer] = {}
        self.redis: aioredis.Redis
        self.outbox: AlertOutbox
        self._channels: list[aio_pika.abc.AbstractChannel] = []
        self._default: aio_pika.abc.AbstractExchange
        self._stopping = asyncio.Event()  # the current session's end
        self._tasks: set[asyncio.Task[None]] = set()
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._failures: OrderedDict[tuple[str, str], int] = OrderedDict()  # failed runs per book (bounded)
        self._throttle = Throttle()

    def done_key(self, rule: Rule[Any], key: str) -> str:
        return self.keys.book_done(rule.name, key)

    async def run(self, life: Lifecycle) -> None:
        self.redis = await redis_io.connect(self.settings)

        async def session(connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event) -> None:
            await self._session(connection, ended, life)

        try:
            await amqp.run_sessions(self.settings, self.name, life.stopping, session)
        finally:
            await self.redis.aclose()

    async def _session(self, connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event,
                       life: Lifecycle) -> None:
        self._stopping = ended
        self._connection = connection
        control = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await declare_async(control, self.settings)
        self._default = control.default_exchange
        alerts = await control.get_exchange(ALERT, ensure=False)
        self.outbox = AlertOutbox(self.redis, alerts, self.keys, self.settings.alert_dedup_ttl_seconds)
        work_channel = await connection.channel()
        await work_channel.set_qos(prefetch_count=self.settings.per_order.max_open_books)
        self._channels = []
        for _ in range(max(1, min(32, self.settings.per_order.max_open_books // BOOKS_PER_CHANNEL))):
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self.settings.per_order.book_prefetch)
            self._channels.append(channel)
        work = await work_channel.get_queue(WORK_QUEUE, ensure=False)
        tag = await work.consume(self.on_work)
        log.info("consuming", queue=WORK_QUEUE, max_open_books=self.settings.per_order.max_open_books)
        life.ready()
        await ended.wait()
        if not work_channel.is_closed:
            await work.cancel(tag)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.settings.shutdown_grace_seconds)

    def fail(self, exc: BaseException) -> None:
        """A book could not do its I/O: end the session so every book rebuilds cleanly."""
        log.error("book I/O failed; restarting the session", error=str(exc))
        self._stopping.set()

    async def on_work(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        item, rule, problem = self._read_work(message.body)
        if problem is not None:
            await self.dead_letter(message, problem)
            return
        assert item is not None and rule is not None
        slot = (item.app, item.key)
        if slot in self.books:
            await message.ack()  # already open here: one book per order per process
            return
        book = BookConsumer(self, rule, item, await self._channel_for(slot))
        self.books[slot] = book
        BOOKS_OPEN.inc()
        task = asyncio.current_task()
        self._tasks.add(task)  # type: ignore[arg-type]
        error: Exception | None = None
        try:
            finished = await book.run(self._stopping)
        except Exception as exc:  # noqa: BLE001 - one book's trouble must not stop the others
            error, finished = exc, False
        finally:
            del self.books[slot]
            BOOKS_OPEN.dec()
            self._tasks.discard(task)  # type: ignore[arg-type]
        if message.channel.is_closed:
            return
        if error is not None:
            await self._book_failed(message, slot, error)
        elif finished:
            self._failures.pop(slot, None)
            await message.ack()
        else:
            await message.nack(requeue=True)

    def _read_work(self, body: bytes) -> tuple[WorkItem | None, Rule[Any] | None, str | None]:
        """The work item and its rule, or why it is not one: a forged or garbled item
        naming a queue that is not its book's (an internal queue, another order's) must
        never be consumed or declared with book arguments."""
        try:
            item = _work_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return None, None, f"unreadable work item: {exc}"
        rule = self.rules.get(item.app)
        if rule is None:
            return None, None, f"work item for an unknown application {item.app[:100]!r}"
        if not item.key:
            return None, None, "work item with an empty key"
        if item.queue != book_queue(rule.queue_prefix, item.key):
            return None, None, (f"work item names queue {item.queue[:300]!r}, not the book queue "
                                f"of its key {item.key[:200]!r}")
        return item, rule, None

    async def _channel_for(self, slot: tuple[str, str]) -> aio_pika.abc.AbstractChannel:
        """The slot's book channel, reopened if a broker error closed it (it must not stay dead)."""
        index = hash(slot) % len(self._channels)
        channel = self._channels[index]
        if channel.is_closed and self._connection is not None and not self._connection.is_closed:
            channel = await self._connection.channel()
            await channel.set_qos(prefetch_count=self.settings.per_order.book_prefetch)
            self._channels[index] = channel
        return channel

    async def _book_failed(self, message: aio_pika.abc.AbstractIncomingMessage, slot: tuple[str, str],
                           error: Exception) -> None:
        """Retry a failing book with a growing pause; dead-letter its work item at the limit.
        One log line per failure kind every few seconds, with the count held back."""
        attempts = self._failures.pop(slot, 0) + 1
        held = self._throttle.allow(f"{type(error).__name__}:{str(error)[:200]}")
        if held is not None:
            log.error("book failed; work item returned", order_id=slot[1], app=slot[0], error=str(error)[:500],
                      attempt=attempts, similar_failures_not_logged=held, exc_info=error if not held else None)
        if attempts >= self.settings.delivery_limit:
            await self.dead_letter(message, f"book failed {attempts} times: {error}"[:1000])
            return
        self._failures[slot] = attempts
        while len(self._failures) > 10_000:
            self._failures.popitem(last=False)
        await asyncio.sleep(min(2.0, 0.05 * 2 ** attempts))
        if not message.channel.is_closed:
            await message.nack(requeue=True)

    async def dead_letter(self, message: aio_pika.abc.AbstractIncomingMessage, reason: str) -> None:
        DEAD_LETTERED.labels(reason="internal").inc()
        kind = reason.partition("'")[0][:60]  # the reason before any quoted id: per kind, not per book
        held = self._throttle.allow(f"dead-letter:{kind}")
        if held is not None:
            log.error("dead-lettered", reason=reason, routing_key=message.routing_key, similar_not_logged=held)
        await self._default.publish(
            amqp.persistent(message.body, headers={REASON_HEADER: reason,
                                                   "x-aldebaran-source": message.routing_key or ""}),
            routing_key=DEAD_LETTER)
        await message.ack()


def build(settings: Settings, **_: Any) -> BookManager:
    return BookManager(settings, load_rules(settings))
