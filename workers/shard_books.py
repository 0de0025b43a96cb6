"""The shard book worker: many books per shard queue, checkpointed, closed on a heap.

It consumes the `book-shard-<n>` queues it can get (single active consumer: one owner
per shard at a time; the others wait as standbys and take over on a crash). Each shard
has its own channel, because a `multiple` ack covers every earlier tag of a channel.
Events go into a `ShardBooks` (pure); alerts go out through the outbox in batches.
Every `shard_checkpoint_ms` or `shard_checkpoint_messages`, per shard: wait for the
alerts fired so far, append ONE delta record to the shard's Redis list, then ack
everything processed with ONE multiple-ack. Every `shard_compact_seconds` the delta is
replaced by a full snapshot (MULTI: set snapshot, delete deltas). A new owner loads
snapshot + deltas before it processes the redelivered tail. Books close on the shard's
`ShardClock`: the minimum of the live routers' heartbeats, which arrive in order behind
their batches, so a starved or lagging worker never closes a book early. See docs/sharding.md.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any, Sequence

import aio_pika.abc
import aiormq.abc
import msgspec
import redis.asyncio as aioredis

from aldebaran.apps import load_rules
from aldebaran.bench.samples import LatencySamples
from aldebaran.core.outbox import AlertOutbox
from aldebaran.core.rule import Alert, Rule
from aldebaran.core.shard_state import FINAL_HEADER, HEARTBEAT, ROUTER_HEADER, ShardBooks, ShardClock
from aldebaran.core.shards import decode_batch
from aldebaran.core.snapshot import decode_image
from aldebaran.io import amqp
from aldebaran.io import redis as redis_io
from aldebaran.io.redis import Keys
from aldebaran.log import get_logger
from aldebaran.runtime_tuning import tune_gc
from aldebaran.metrics import (BATCH_EVENTS, BOOK_EVENTS, BOOKS_OPEN, DEAD_LETTERED, DONE_MARKERS,
                               DONE_MARKERS_FORGOTTEN, PROCESSING_LATENCY)
from aldebaran.settings import Settings
from declare.declarer import declare_async
from declare.topology import ALERT, DEAD_LETTER, REASON_HEADER, shard_queue, shard_queue_arguments
from workers.runtime import Lifecycle

log = get_logger("shard-books")
TICK_SECONDS = 0.05
DRAIN_CHECK_SECONDS = 1.0  # a silent shard asks its queue's depth at most this often
# Closing later than a deadline changes no verdict (a Book judges each event by its own
# ingest time), closing earlier would: so the closing clock lags a little. The heartbeat
# watermark is exact for the routers it knows; the skew covers a router that has just
# started (its first batches come before its first heartbeat) with a clock a bit behind.
SKEW_SECONDS = 0.5
ROUTER_EXPIRY_HEARTBEATS = 10  # a router silent for this many heartbeat intervals is forgotten
ALERT_BATCH = 500
ALERT_BATCHES_IN_FLIGHT = 8


class ShardKeys(Keys):
    """The shard state's Redis keys (beside the core's, under the same prefix)."""

    def shard_snapshot(self, shard: int) -> str:
        return f"{self.prefix}:shard:{shard}:snapshot"

    def shard_deltas(self, shard: int) -> str:
        return f"{self.prefix}:shard:{shard}:deltas"


class AlertEmitter:
    """Batches alerts into `AlertOutbox.emit_many`: up to 8 drainers, each taking up to 500.

    Why drainers and not one task per `add`: a task per add made batches of a handful of
    alerts queue behind each other, so the alert rate was bounded by round trips, not by
    work. A drainer takes everything pending (up to a batch) whenever it is free, so the
    batch grows with the load. `flush` waits for every alert added before it was called
    (not for later ones): a checkpoint never records a state whose alerts are unsent.
    """

    def __init__(self, outbox: AlertOutbox, samples: LatencySamples, fail: Any) -> None:
        self._outbox = outbox
        self._samples = samples
        self._fail = fail
        self._pending: list[tuple[Alert, int]] = []
        self._added = 0  # alerts ever added
        self._taken = 0  # alerts ever taken by a drainer (FIFO)
        self._inflight: dict[int, int] = {}  # batch id -> sequence number of its first alert
        self._drainers: set[asyncio.Task[None]] = set()
        self._progress = asyncio.Event()
        self._batch_ids = 0
        self.failed: BaseException | None = None

    def add(self, alert: Alert, published_ms: int) -> None:
        self._pending.append((alert, published_ms))
        self._added += 1
        if len(self._drainers) < ALERT_BATCHES_IN_FLIGHT:
            task = asyncio.ensure_future(self._drain())
            self._drainers.add(task)
            task.add_done_callback(self._drainers.discard)

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # let the current delivery add all its alerts first
        while self._pending and self.failed is None:
            batch = self._pending[:ALERT_BATCH]
            del self._pending[:ALERT_BATCH]
            self._batch_ids += 1
            batch_id = self._batch_ids
            self._inflight[batch_id] = self._taken
            self._taken += len(batch)
            try:
                await self._outbox.emit_many([alert for alert, _ in batch])
            except Exception as exc:  # noqa: BLE001 - Redis or broker trouble: rebuild from the broker
                self.failed = exc
                self._fail(exc)
                return
            finally:
                del self._inflight[batch_id]
                self._progress.set()
            now_ms = time.time() * 1000
            histogram = PROCESSING_LATENCY.labels(stage="alert")  # the label lookup once per batch
            for _, published_ms in batch:
                if published_ms:
                    latency = max(0.0, now_ms - published_ms)
                    histogram.observe(latency / 1000)
                    if self._samples.enabled:
                        self._samples.add(1, latency)

    async def flush(self) -> None:
        """Wait for the alerts added so far (not for those added meanwhile: no livelock)."""
        target = self._added
        while True:
            if self.failed is not None:
                raise RuntimeError("alert emission failed") from self.failed
            blocking = any(first < target for first in self._inflight.values())
            if self._taken >= target and not blocking:
                return
            if not self._drainers and self._pending:
                task = asyncio.ensure_future(self._drain())
                self._drainers.add(task)
                task.add_done_callback(self._drainers.discard)
            self._progress.clear()
            await self._progress.wait()


class ShardConsumer:
    """One shard this process consumes: its channel, its books once loaded, its checkpoints."""

    def __init__(self, worker: "ShardBookWorker", shard: int, channel: aiormq.abc.AbstractChannel) -> None:
        self.worker = worker
        self.shard = shard
        self.channel = channel
        self.state: ShardBooks | None = None
        self.backlog: list[aiormq.abc.DeliveredMessage] = []
        self.loader: asyncio.Task[None] | None = None
        self.last_tag = 0
        self.acked_tag = 0
        self.since_checkpoint = 0
        self.clock: ShardClock | None = None  # set with the state: the routers' heartbeats
        self.last_checkpoint = time.monotonic()
        self.last_compaction = time.monotonic()
        self.checkpointing: asyncio.Task[None] | None = None
        self.side_tasks: set[asyncio.Task[None]] = set()
        self.drained_at = float("-inf")  # monotonic time a check last found the queue empty
        self.drain_check: asyncio.Task[None] | None = None
        self.drain_checked_at = float("-inf")  # monotonic time the last check started
        self.lag_warned = float("-inf")  # the silence (by its last message) already logged as lagging
        self.log = log.bind(shard=shard)

    async def on_delivery(self, message: aiormq.abc.DeliveredMessage) -> None:
        if self.state is None:
            self.backlog.append(message)
            if self.loader is None:
                self.loader = asyncio.ensure_future(self._load())
            return
        self._process(message)

    async def _load(self) -> None:
        """Became the active consumer: rebuild the books from snapshot + deltas, then the backlog."""
        keys = self.worker.keys
        started = time.perf_counter()
        try:
            async with self.worker.redis.pipeline(transaction=True) as pipe:
                pipe.get(keys.shard_snapshot(self.shard))
                pipe.lrange(keys.shard_deltas(self.shard), 0, -1)
                snapshot, deltas = await pipe.execute()
        except Exception as exc:  # noqa: BLE001
            self.worker.fail(exc)
            return
        images = ([decode_image(snapshot)] if snapshot else []) + [decode_image(d) for d in deltas]
        state = self.worker.new_state()
        state.restore(images, time.time())
        self.clock = self.worker.new_clock()
        self.log.info("shard taken over", books=len(state.books), done_markers=len(state.done),
                      deltas=len(deltas), backlog=len(self.backlog),
                      load_ms=round((time.perf_counter() - started) * 1000, 1))
        self.state = state
        backlog, self.backlog = self.backlog, []
        for message in backlog:
            self._process(message)

    def _process(self, message: aiormq.abc.DeliveredMessage) -> None:
        state = self.state
        assert state is not None
        worker = self.worker
        tag = message.delivery.delivery_tag  # type: ignore[union-attr]
        properties = message.header.properties
        if properties.content_type == HEARTBEAT:
            self._heartbeat(message, properties.headers or {})
            self.last_tag = tag  # acked by the next checkpoint's multiple-ack, like any message
            return
        try:
            segments = decode_batch(message.body)
            batches = [(seg, worker.rules[seg.app].codec.unpack_many(seg.events)) for seg in segments]
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as exc:
            self._spawn(self._dead_letter(message, f"unreadable shard batch: {exc!r}"))
            self.last_tag = tag
            return
        now = datetime.now(timezone.utc)
        now_ms = time.time() * 1000
        emitter = worker.emitter
        samples = worker.samples
        applied = duplicate = late = events_total = 0
        assert self.clock is not None
        self.clock.message(time.monotonic())
        offer_many = state.offer_many
        fired: list[Alert] = []
        for segment, events in batches:
            published_ms = segment.published_ms
            counts = offer_many(segment.app, events, segment.ingest_ms / 1000.0, now, fired)
            applied += counts[0]
            duplicate += counts[1]
            late += counts[2]
            if fired:
                for alert in fired:
                    emitter.add(alert, published_ms)
                fired.clear()
            events_total += len(events)
            if published_ms:
                latency = max(0.0, now_ms - published_ms)
                PROCESSING_LATENCY.labels(stage="book").observe(latency / 1000)
                if samples.enabled:
                    samples.add(0, latency, len(events))
        BATCH_EVENTS.labels(stage="book").observe(events_total)
        worker.count(applied, duplicate, late)
        self.last_tag = tag
        self.since_checkpoint += 1
        if self.since_checkpoint >= worker.settings.shard_checkpoint_messages:
            self.request_checkpoint()

    def _heartbeat(self, message: aiormq.abc.DeliveredMessage, headers: Any) -> None:
        """A router promises to stamp nothing earlier than the body's clock from now on."""
        assert self.clock is not None
        router = headers.get(ROUTER_HEADER)
        try:
            if isinstance(router, bytes):
                router = router.decode()
            if not isinstance(router, str) or not router:
                raise ValueError(f"no {ROUTER_HEADER} header")
            clock_ms = int(message.body)
        except (ValueError, UnicodeDecodeError) as exc:
            self._spawn(self._dead_letter(message, f"unreadable shard heartbeat: {exc!r}"))
            return
        self.clock.heartbeat(router, clock_ms / 1000.0, time.monotonic(), final=bool(headers.get(FINAL_HEADER)))

    def tick(self, now_ts: float, now: datetime, monotonic: float) -> None:
        """Close books whose deadline passed; checkpoint when the interval is up.

        "Now" for closing is the shard's watermark: the minimum of the live routers'
        heartbeats processed so far (`ShardClock`), never ahead of the wall clock, minus a
        little skew. A shard that lags behind its queue (a backlog, a starved process, a
        takeover replaying redelivered messages) reads the heartbeats late too, so it still
        counts every event stamped before a book's deadline. Only when nothing at all was
        processed for the router expiry, and a check found the queue empty since, does it
        close on the wall clock minus a generous margin (`shard_clock_margin_seconds`).
        """
        if self.state is None or self.clock is None:
            return
        drained = self.drained_at >= self.clock.last_message
        # One passive declare per second while silent and not yet seen empty, none once it was.
        if (not drained and self.clock.silent(monotonic) and monotonic - self.drain_checked_at >= DRAIN_CHECK_SECONDS
                and (self.drain_check is None or self.drain_check.done())):
            self.drain_checked_at = monotonic
            self.drain_check = asyncio.ensure_future(self._check_drained(monotonic, self.clock.last_message))
        watermark = self.clock.watermark(now_ts, monotonic, drained=drained)
        if watermark is not None:
            for alert in self.state.close_due(watermark - SKEW_SECONDS, now):
                self.worker.emitter.add(alert, 0)
        if monotonic - self.last_checkpoint >= self.worker.checkpoint_seconds:
            self.request_checkpoint()

    async def _check_drained(self, started: float, last_message: float) -> None:
        """Silence means "every router is gone" only while nothing waits in the queue."""
        try:
            declared = await self.channel.queue_declare(shard_queue(self.shard), passive=True)
        except Exception as exc:  # noqa: BLE001 - the channel died: the session restarts
            self.log.warning("could not check the shard queue's depth", error=repr(exc))
            return
        if not declared.message_count:
            self.drained_at = started
        elif self.lag_warned != last_message:  # once per silence, not per tick
            self.lag_warned = last_message
            self.log.warning("silent while the shard queue holds messages: lagging, closing on heartbeats only",
                             queued=declared.message_count)

    def request_checkpoint(self) -> None:
        if self.checkpointing is None or self.checkpointing.done():
            self.checkpointing = asyncio.ensure_future(self.checkpoint())

    async def checkpoint(self) -> None:
        """Alerts first, then one delta (or a compaction), then one multiple-ack."""
        state = self.state
        if state is None:
            return
        self.last_checkpoint = time.monotonic()
        self.since_checkpoint = 0
        tag = self.last_tag
        if tag == self.acked_tag and not state.changed:
            return
        keys = self.worker.keys
        compact = time.monotonic() - self.last_compaction >= self.worker.settings.shard_compact_seconds
        image = state.take_snapshot() if compact else (state.take_delta() if state.changed else None)
        try:
            await self.worker.emitter.flush()
            if self.side_tasks:
                await asyncio.gather(*list(self.side_tasks))
            if image is not None:
                async with self.worker.redis.pipeline(transaction=True) as pipe:
                    if compact:
                        pipe.set(keys.shard_snapshot(self.shard), image)
                        pipe.delete(keys.shard_deltas(self.shard))
                    else:
                        pipe.rpush(keys.shard_deltas(self.shard), image)
                    await pipe.execute()
            if compact:
                self.last_compaction = time.monotonic()
            if tag > self.acked_tag:
                await self.channel.basic_ack(tag, multiple=True)
                self.acked_tag = tag
        except Exception as exc:  # noqa: BLE001 - the session restarts; the broker redelivers
            self.worker.fail(exc)

    async def _dead_letter(self, message: aiormq.abc.DeliveredMessage, reason: str) -> None:
        DEAD_LETTERED.labels(reason="internal").inc()
        self.log.error("dead-lettered", reason=reason, routing_key=message.routing_key)
        await self.worker.default.publish(
            amqp.persistent(message.body, headers={REASON_HEADER: reason,
                                                   "x-aldebaran-source": message.routing_key or ""}),
            routing_key=DEAD_LETTER)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.side_tasks.add(task)
        task.add_done_callback(self.side_tasks.discard)


class ShardBookWorker:
    name = "shard-books"

    def __init__(self, settings: Settings, rules: Sequence[Rule[Any]]) -> None:
        self.settings = settings
        self.rules = {rule.name: rule for rule in rules}
        self.keys = ShardKeys(settings.redis_key_prefix)
        self.checkpoint_seconds = settings.shard_checkpoint_ms / 1000.0
        self.samples = LatencySamples(settings.latency_samples_dir)
        self.consumers: dict[int, ShardConsumer] = {}
        self.redis: aioredis.Redis
        self.emitter: AlertEmitter
        self.default: aio_pika.abc.AbstractExchange
        self._ended = asyncio.Event()
        self._counts = [0, 0, 0]
        # Per shard, so a worker holding every shard holds at most shard_done_max_markers.
        self.done_cap_per_shard = max(1, settings.shard_done_max_markers // settings.shards)

    def new_state(self) -> ShardBooks:
        return ShardBooks(self.rules, self.settings.book_ttl_seconds,
                          self.settings.shard_done_retention_seconds, done_cap=self.done_cap_per_shard)

    def new_clock(self) -> ShardClock:
        expiry = ROUTER_EXPIRY_HEARTBEATS * self.settings.shard_heartbeat_ms / 1000.0
        return ShardClock(expiry, self.settings.shard_clock_margin_seconds, time.monotonic())

    def count(self, applied: int, duplicate: int, late: int) -> None:
        counts = self._counts
        counts[0] += applied
        counts[1] += duplicate
        counts[2] += late

    def fail(self, exc: BaseException) -> None:
        """Shard I/O failed: end the session; every shard reloads and the broker redelivers."""
        if not self._ended.is_set():
            log.error("shard I/O failed; restarting the session", error=repr(exc))
            self._ended.set()

    def preferred(self) -> tuple[list[int], list[int]]:
        """This process's own shards first; the others later, as standby."""
        workers, index = self.settings.shard_workers, self.settings.shard_worker_index
        own = [n for n in range(self.settings.shards) if n % workers == index % workers]
        return own, [n for n in range(self.settings.shards) if n not in own]

    async def run(self, life: Lifecycle) -> None:
        tune_gc()
        self.redis = await redis_io.connect(self.settings)

        async def session(connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event) -> None:
            await self._session(connection, ended, life)

        try:
            await amqp.run_sessions(self.settings, self.name, life.stopping, session)
        finally:
            self.samples.flush()
            await self.redis.aclose()

    async def _session(self, connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event,
                       life: Lifecycle) -> None:
        self._ended = ended
        self.consumers = {}
        control = await connection.channel(publisher_confirms=True)
        await declare_async(control, self.settings)
        arguments = shard_queue_arguments(self.settings)
        for n in range(self.settings.shards):
            await control.declare_queue(shard_queue(n), durable=True, arguments=arguments)
        self.default = control.default_exchange
        alerts = await control.get_exchange(ALERT, ensure=False)
        outbox = AlertOutbox(self.redis, alerts, self.keys, self.settings.alert_dedup_ttl_seconds)
        self.emitter = AlertEmitter(outbox, self.samples, self.fail)
        own, others = self.preferred()
        for n in own:
            await self._consume(connection, n)
        log.info("consuming", shards=own, standby_later=len(others), mode="sharded")
        life.ready()
        ticker = asyncio.ensure_future(self._tick())
        try:
            if others and not await _wait(ended, self.settings.shard_standby_seconds):
                for n in others:
                    await self._consume(connection, n)
                log.info("standing by", shards=others)
            await ended.wait()
        finally:
            ticker.cancel()
        if life.stopping.is_set():
            await self._final_checkpoints()

    async def _consume(self, connection: aio_pika.abc.AbstractConnection, shard: int) -> None:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=self.settings.shard_prefetch)
        underlay = await channel.get_underlay_channel()
        consumer = ShardConsumer(self, shard, underlay)
        self.consumers[shard] = consumer
        await underlay.basic_consume(shard_queue(shard), consumer.on_delivery)

    async def _tick(self) -> None:
        last_flush = time.monotonic()
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now_ts = time.time()
            now = datetime.now(timezone.utc)
            monotonic = time.monotonic()
            for consumer in list(self.consumers.values()):
                consumer.tick(now_ts, now, monotonic)
            self._count_events()
            if monotonic - last_flush >= 1.0:
                last_flush = monotonic
                self._report()

    def _count_events(self) -> None:
        """Book outcomes reach the metric once per tick, not once per event (hot path)."""
        applied, duplicate, late = self._counts
        self._counts = [0, 0, 0]
        if applied:
            BOOK_EVENTS.labels(outcome="applied").inc(applied)
        if duplicate:
            BOOK_EVENTS.labels(outcome="duplicate").inc(duplicate)
        if late:
            BOOK_EVENTS.labels(outcome="late").inc(late)
            log.info("late events: their book already closed", count=late)

    def _report(self) -> None:
        self._count_events()
        states = {shard: c.state for shard, c in self.consumers.items() if c.state}
        BOOKS_OPEN.set(sum(len(state.books) for state in states.values()))
        DONE_MARKERS.set(sum(len(state.done) for state in states.values()))
        for shard, state in states.items():
            forgotten = state.done.take_evicted()
            if forgotten:
                if forgotten == state.done.evicted:  # this shard's store's first: say it once
                    log.warning("done markers at their cap: forgetting the oldest before their retention",
                                shard=shard, cap=self.done_cap_per_shard,
                                remembered_seconds=round(state.done.remembered_seconds, 1))
                DONE_MARKERS_FORGOTTEN.inc(forgotten)
        self.samples.flush()

    async def _final_checkpoints(self) -> None:
        """Graceful stop: cancel nothing mid-way; checkpoint and ack what was processed."""
        for consumer in self.consumers.values():
            if consumer.loader is not None:
                await asyncio.wait([consumer.loader], timeout=self.settings.shutdown_grace_seconds)
            if consumer.checkpointing is not None and not consumer.checkpointing.done():
                await asyncio.wait([consumer.checkpointing], timeout=self.settings.shutdown_grace_seconds)
            if not consumer.channel.is_closed:
                await consumer.checkpoint()
        self._report()


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout=timeout)
        return True
    except asyncio.TimeoutError:
        return False


def build(settings: Settings, **_: Any) -> ShardBookWorker:
    return ShardBookWorker(settings, load_rules(settings))
