"""The aggregator (iteration 5): colour the trade stream into per-order book queues.

For every event of a trade message it declares the order's book queue once (cached),
publishes the event there through the default exchange, and announces the book on the
work queue (requests always; any order this aggregator has not seen recently, so that
an order first seen through a purchase still gets a book). Unreadable input goes to the
dead-letter queue with its reason. The trade message is acked only after the broker
confirmed everything it produced, so killing an aggregator loses nothing.

Events are stamped with pipeline time (`aldebaran.core.pipeline_clock`): it stops while
the aggregator has no broker session and restarts after a crash from the newest stamp
recorded in Redis. Every 100 ms the aggregator records its watermark (everything stamped
before it is confirmed in its book queue); books close on it (`aldebaran.io.pipeline_watermark`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import msgspec
import redis.asyncio as aioredis

from aldebaran.apps import load_rules
from aldebaran.core.pipeline_clock import PipelineClock, StampsInFlight
from aldebaran.core.queue_cache import QueueCache
from aldebaran.core.rule import Rule
from aldebaran.io import amqp
from aldebaran.io import redis as redis_io
from aldebaran.io.pipeline_watermark import RECORD_SECONDS, REDIS_ERRORS, WatermarkWriter, restart_stamp
from aldebaran.io.publisher import published_ms as published_stamp
from aldebaran.io.redis import Keys
from aldebaran.log import Throttle, get_logger
from aldebaran.metrics import BATCH_EVENTS, DEAD_LETTERED, EVENTS_CONSUMED, INGEST_LAG, UNROUTABLE
from aldebaran.settings import Settings
from aldebaran.trades.codec import DecodeError, dead_letters
from declare.declarer import declare_async
from declare.topology import (
    DEAD_LETTER,
    PUBLISHED_HEADER,
    REASON_HEADER,
    TRADE_DATA,
    WORK_QUEUE,
    book_queue,
    book_queue_arguments,
)
from workers.runtime import Lifecycle

log = get_logger("aggregator")
INGEST_HEADER = "x-aldebaran-ingest-ms"
DECLARE_CHANNELS = 8
ATTEMPTS_REMEMBERED = 10_000


def _fingerprint(message: aio_pika.abc.AbstractIncomingMessage) -> str:
    """Which message this is across redeliveries (publishers need not set a message id)."""
    return hashlib.blake2b(message.body, digest_size=16).hexdigest()


class WorkItem(msgspec.Struct, frozen=True):
    """"Open a book for `key` under rule `app`" — the work queue's message."""

    app: str
    key: str
    queue: str


def reason_class(reason: str) -> str:
    """A low-cardinality label for the dead-letter metric."""
    for marker, label in (("batch elements rejected", "batch_summary"), ("exceeds the limit", "oversized"),
                          ("missing field", "missing_field"), ("#shares", "bad_shares"), ("not valid", "not_parseable"),
                          ("neither JSON", "not_parseable"), ("nested", "too_deep")):
        if marker in reason:
            return label
    return "invalid"


class Aggregator:
    name = "aggregator"

    def __init__(self, settings: Settings, rules: Sequence[Rule[Any]]) -> None:
        self.settings = settings
        self.rules = list(rules)
        self.codec = self.rules[0].codec
        self.cache = QueueCache(settings.per_order.declare_cache_size, lifetime_seconds=settings.book_ttl_seconds / 2)
        self._book_args = book_queue_arguments(settings)
        self._default: aio_pika.abc.AbstractExchange | None = None
        self._declare_channels: list[aio_pika.abc.AbstractChannel] = []
        self._attempts: OrderedDict[str, int] = OrderedDict()  # failed tries per message (bounded)
        self._throttle = Throttle()
        self.clock: PipelineClock | None = None  # None until the first session
        self.in_flight = StampsInFlight()
        self._clock_key = Keys(settings.redis_key_prefix).pipeline_clock()

    async def run(self, life: Lifecycle) -> None:
        redis = await redis_io.connect(self.settings)
        writer = WatermarkWriter(redis, self._clock_key)

        async def session(connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event) -> None:
            await self._resume(redis)
            try:
                await self._session(connection, ended, life)
            finally:
                assert self.clock is not None
                self.clock.pause(time.monotonic())

        recorder = asyncio.ensure_future(self._record(writer, life.stopping))
        try:
            await amqp.run_sessions(self.settings, self.name, life.stopping, session)
        finally:
            recorder.cancel()
            await redis.aclose()

    async def _resume(self, redis: aioredis.Redis) -> None:
        """Pipeline time flows again: from where it stood, or from the newest stamp any
        aggregator recorded (a restart after a crash; another aggregator that went on)."""
        try:
            recorded = await restart_stamp(redis, self._clock_key)
        except REDIS_ERRORS as exc:
            if self.clock is None:
                raise  # never guess where a restarted pipeline time begins
            log.warning("cannot read the recorded pipeline time; going on from this aggregator's own",
                        error=str(exc))
            recorded = None
        monotonic = time.monotonic()
        if self.clock is None:
            start = recorded if recorded is not None else int(time.time() * 1000)
            self.clock = PipelineClock(start, monotonic)
        elif recorded is not None and recorded > self.clock.stamp(monotonic):
            self.clock = PipelineClock(recorded, monotonic)
        else:
            self.clock.resume(monotonic)

    async def _record(self, writer: WatermarkWriter, stopping: asyncio.Event) -> None:
        """Every RECORD_SECONDS: this aggregator's watermark and newest stamp into Redis."""
        while not stopping.is_set():
            if self.clock is not None:
                newest = self.clock.stamp(time.monotonic())
                await writer.write(self.in_flight.watermark(newest), newest)
            await asyncio.sleep(RECORD_SECONDS)

    async def _session(self, connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event,
                       life: Lifecycle) -> None:
        # Returns raise: a book queue that vanished (expired, or unknown to the node this
        # worker failed over to) must fail the publish, never confirm it into nowhere.
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await declare_async(channel, self.settings)
        await channel.set_qos(prefetch_count=self.settings.per_order.aggregator_prefetch)
        self._default = channel.default_exchange
        # The broker declares ~400 queues/s per channel and ~2x that spread over several.
        self._declare_channels = [await connection.channel() for _ in range(DECLARE_CHANNELS)]
        queue = await channel.get_queue(TRADE_DATA, ensure=False)
        inflight: set[asyncio.Task[None]] = set()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            task = asyncio.current_task()
            assert task is not None, "aio-pika runs each consumer callback in a task"
            inflight.add(task)
            try:
                await self.handle(message)
            finally:
                inflight.discard(task)

        tag = await queue.consume(on_message)
        backlog = asyncio.ensure_future(amqp.watch_backlog(self._declare_channels[0], TRADE_DATA, ended))
        log.info("consuming", queue=TRADE_DATA, mode="per-order", apps=[r.name for r in self.rules])
        life.ready()
        await ended.wait()
        backlog.cancel()
        if not channel.is_closed:
            await queue.cancel(tag)
            if inflight:
                await asyncio.wait(list(inflight), timeout=self.settings.shutdown_grace_seconds)

    async def handle(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """Route one trade message; ack after every output is confirmed, else requeue.

        A message whose handling keeps failing while the connection is fine (a poison
        message, e.g. an order id too long for a queue name) is retried with a growing
        pause, at most `delivery_limit` times, then dead-lettered whole with the last
        error as its reason: never a hot requeue loop, never silently dropped. (Quorum
        queues also enforce `x-delivery-limit` broker-side; this counter comes first and
        adds the reason header.)
        """
        try:
            await asyncio.gather(*self._outputs(message))
        except Exception as exc:  # noqa: BLE001 - a broker hiccup or a poison message
            if message.channel.is_closed:
                return  # the connection went: the broker requeues it, nothing to count
            await self._failed(message, exc)
            return
        if self._attempts:
            self._attempts.pop(_fingerprint(message), None)
        await message.ack()

    async def _failed(self, message: aio_pika.abc.AbstractIncomingMessage, exc: Exception) -> None:
        key = _fingerprint(message)
        attempts = self._attempts.pop(key, 0) + 1
        error = str(exc) or repr(exc)
        if attempts >= self.settings.delivery_limit:
            reason = f"handling failed {attempts} times: {error}"[:1000]
            try:
                await self._dead_letter(message, DecodeError(reason, message.body))
                await message.ack()
                return
            except Exception as again:  # noqa: BLE001 - cannot even dead-letter: keep it queued
                error = f"{error}; dead-lettering failed: {again}"
        self._attempts[key] = attempts
        while len(self._attempts) > ATTEMPTS_REMEMBERED:
            self._attempts.popitem(last=False)
        pause = min(2.0, 0.05 * 2 ** attempts)
        held = self._throttle.allow(f"failed:{error[:200]}")
        if held is not None:
            log.warning("routing failed, requeueing", error=error[:500], attempt=attempts,
                        limit=self.settings.delivery_limit, retry_in_seconds=pause,
                        delivery_tag=message.delivery_tag, similar_not_logged=held)
        await asyncio.sleep(pause)
        with contextlib.suppress(Exception):  # channel gone meanwhile: the broker requeues it
            await message.nack(requeue=True)

    def _outputs(self, message: aio_pika.abc.AbstractIncomingMessage) -> list[Any]:
        decoded = self.codec.decode(message.body, message.content_type, self.settings.max_message_bytes)
        published_ms = published_stamp(message.headers)
        if published_ms:
            INGEST_LAG.labels(stage="aggregator").set(max(0.0, time.time() - published_ms / 1000))
        BATCH_EVENTS.labels(stage="ingress").observe(len(decoded.events) + len(decoded.rejects))
        outputs = [self._dead_letter(message, reject) for reject in dead_letters(decoded, message.body)]
        for kind, number in self.codec.kinds(decoded.events).items():
            EVENTS_CONSUMED.labels(type=kind).inc(number)
        for event in decoded.events:
            for rule in self.rules:
                if rule.accepts(event):
                    outputs.append(self._route(rule, event, published_ms, bool(message.redelivered)))
        return outputs

    async def _route(self, rule: Rule[Any], event: Any, published_ms: float, redelivered: bool = False) -> None:
        key = rule.key(event, time.time())  # the routing clock: a windowed key's time
        queue = book_queue(rule.queue_prefix, key)
        first = await self.cache.ensure(queue, self._declare_book)
        # Stamped as it enters its book queue (after a possibly slow declare): a book's
        # lifetime is measured on these stamps, and its queue then holds them in order.
        assert self.clock is not None
        stamp = self.clock.stamp(time.monotonic())
        headers: dict[str, Any] = {INGEST_HEADER: stamp, "x-aldebaran-app": rule.name}
        if published_ms:
            headers[PUBLISHED_HEADER] = round(published_ms * 1000)
        assert self._default is not None
        publishes = [self._default.publish(
            amqp.persistent(rule.codec.pack(event), headers=headers, content_type="application/msgpack"),
            routing_key=queue)]
        # A redelivered message announces its book again: its first try may have declared
        # the queue (now cached) and lost the work item with the connection, and an order
        # seen only through purchases would then never get a book (nor its alert).
        if first or redelivered or rule.opens(event):
            item = msgspec.json.encode(WorkItem(app=rule.name, key=key, queue=queue))
            publishes.append(self._default.publish(
                amqp.persistent(item, content_type="application/json"), routing_key=WORK_QUEUE))
        self.in_flight.add(stamp)  # held back from the watermark until confirmed (or failed)
        try:
            await asyncio.gather(*publishes)
        except aio_pika.exceptions.PublishError:
            UNROUTABLE.labels(publisher="aggregator").inc()
            self.cache.forget(queue)  # the retry declares the queue again
            raise
        finally:
            self.in_flight.settle(stamp)

    async def _declare_book(self, queue: str) -> None:
        channel = self._declare_channels[zlib.crc32(queue.encode()) % len(self._declare_channels)]
        await channel.declare_queue(queue, durable=True, arguments=self._book_args)

    async def _dead_letter(self, message: aio_pika.abc.AbstractIncomingMessage, reject: Any) -> None:
        label = reason_class(reject.reason)
        DEAD_LETTERED.labels(reason=label).inc()
        held = self._throttle.allow(label)  # a flood of junk: one line per kind every 10 s
        if held is not None:
            log.warning("dead-lettered", reason=reject.reason[:500], index=reject.index,
                        message_id=message.message_id, queue=TRADE_DATA, similar_not_logged=held)
        headers: dict[str, Any] = {REASON_HEADER: reject.reason, "x-aldebaran-source": TRADE_DATA}
        if reject.index is not None:
            headers["x-aldebaran-index"] = reject.index
        assert self._default is not None
        await self._default.publish(
            amqp.persistent(reject.raw, headers=headers, content_type=message.content_type),
            routing_key=DEAD_LETTER)


def build(settings: Settings, **_: Any) -> Aggregator:
    return Aggregator(settings, load_rules(settings))
