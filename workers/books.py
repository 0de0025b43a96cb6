"""The book manager (iteration 5): one lightweight asyncio book per open order.

It consumes the work queue and, per announced order, starts a book that consumes
`book-<order id>` (a single-active-consumer queue, so two hosts never split one order).
A book holds its events unacked until nothing more can fire (the alert went out, or the
book closed and left a `done` marker in Redis). If its host dies, the broker redelivers
both the work item and the held events, and another manager rebuilds the book: same
events, same ingest timestamps, same verdict, and the outbox turns a repeat into nothing.

Books live on pipeline time: they close when the stream's watermark (written by the
aggregators, `aldebaran.io.pipeline_watermark`) passes their deadline, not on this
host's clock, so an outage that stops the aggregators ages no book.

The work queue's prefetch is the open-book limit: at `max_open_books` the manager simply
receives no new work until books close (never evicting a book that could still alert).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import aio_pika
import aio_pika.abc
import msgspec
import redis.asyncio as aioredis

from aldebaran.apps import load_rules
from aldebaran.core.rule import Rule
from aldebaran.io import amqp
from aldebaran.io import redis as redis_io
from aldebaran.io.alert_outbox import AlertOutbox
from aldebaran.io.pipeline_watermark import WatermarkReader
from aldebaran.io.redis import Keys
from aldebaran.log import Throttle, get_logger
from aldebaran.metrics import BOOKS_OPEN, DEAD_LETTERED
from aldebaran.settings import Settings
from declare.declarer import declare_async
from declare.topology import ALERT, DEAD_LETTER, REASON_HEADER, WORK_QUEUE, book_queue, book_queue_arguments
from workers.aggregator import WorkItem
from workers.book_consumer import BookConsumer
from workers.runtime import Lifecycle

log = get_logger("books")
BOOKS_PER_CHANNEL = 500
_work_decoder = msgspec.json.Decoder(WorkItem)


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
        self.watermark: WatermarkReader  # the stream's pipeline time: books close on it
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
        self.watermark = WatermarkReader(self.redis, self.keys.pipeline_clock(),
                                         self.settings.per_order.watermark_stale_seconds)
        reader = asyncio.ensure_future(self.watermark.run(life.stopping))

        async def session(connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event) -> None:
            await self._session(connection, ended, life)

        try:
            await amqp.run_sessions(self.settings, self.name, life.stopping, session)
        finally:
            reader.cancel()
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

    @property
    def stopping(self) -> asyncio.Event:
        """The current session's end."""
        return self._stopping

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
        assert task is not None, "aio-pika runs each consumer callback in a task"
        self._tasks.add(task)
        error: Exception | None = None
        try:
            finished = await book.run(self._stopping)
        except Exception as exc:  # noqa: BLE001 - one book's trouble must not stop the others
            error, finished = exc, False
        finally:
            del self.books[slot]
            BOOKS_OPEN.dec()
            self._tasks.discard(task)
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
