"""The sharded aggregator ("router"): re-batch the trade stream into a fixed set of shard queues.

Trade messages (often batches of events) are consumed with a large prefetch and decoded;
each event goes to the buffer of its shard (stable hash of the rule's key). A buffer is
published to `book-shard-<n>` through the default exchange when it holds
`batch_max_events` events or after `batch_linger_ms` (bounded latency), with publisher
confirms. A trade message is acked only once every batch holding its events, and its
dead-letters, are confirmed: one `multiple` ack on the highest fully-confirmed tag.
Unreadable input is dead-lettered exactly like the per-order aggregator does.

When a shard queue holds more than `router_max_shard_backlog` messages (its depth sampled
twice a second, plus what the router sent it since), the router stops routing: it holds
the trade messages it has (at most `router_prefetch`) and the broker delivers no more, so
a surge waits unstamped in the ingress, where `ingress_max_length` and `reject-publish`
can tell publishers, instead of running ahead of the shard workers into their queues and
their memory (a shard worker holds every order stamped within a ttl of its clock). It
resumes, in order, at the first sample that finds every shard queue back at the limit or
under. A pause stretches the ingest stamps of an order split across it by its length, so
no pause lasts longer than a quarter of the shortest book ttl: then the held messages are
routed anyway and the next pause begins (docs/backpressure.md). Heartbeats go on.

Every `shard_heartbeat_ms` the router flushes its buffers and then publishes to EVERY
shard queue, on the same confirm channel and so behind those batches, a heartbeat with
its ingest clock T: no event it stamps from then on is stamped before T. Shard workers
close books on the minimum of their routers' heartbeats (`ShardClock`), never on their
own clock while routers are alive. Stamps are kept monotonic for that promise to hold.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
import zlib
from collections import Counter, deque
from typing import Any, Sequence

import aio_pika.abc
import aiormq
import aiormq.abc
from pamqp import commands as spec

from aldebaran.apps import load_rules
from aldebaran.core.acks import AckTracker
from aldebaran.core.rule import Rule
from aldebaran.core.shard_state import FINAL_HEADER, HEARTBEAT, ROUTER_HEADER
from aldebaran.core.shards import SHARD_BATCH, Segment, encode_batch
from aldebaran.io import amqp
from aldebaran.log import get_logger
from aldebaran.runtime_tuning import tune_gc
from aldebaran.metrics import BATCH_EVENTS, EVENTS_CONSUMED, ROUTER_PAUSED
from aldebaran.settings import Settings
from declare.declarer import declare_async
from declare.topology import TRADE_DATA, shard_queue, shard_queue_arguments
from workers.aggregator import PUBLISHED_HEADER, Aggregator
from workers.runtime import Lifecycle

log = get_logger("router")
BACKLOG_SAMPLE_SECONDS = 0.5


class RouterFailed(Exception):
    """A shard batch was refused or could not be confirmed: the session restarts."""


class _Buffer:
    __slots__ = ("segments", "events", "tags")

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self.events = 0
        self.tags: list[int] = []


class Router(Aggregator):
    """Reuses the aggregator's rules, codec and dead-lettering; replaces its routing."""

    name = "router"

    def __init__(self, settings: Settings, rules: Sequence[Rule[Any]]) -> None:
        super().__init__(settings, rules)
        self.shards = settings.shards
        self.queues = [shard_queue(n) for n in range(self.shards)]
        self._linger = settings.batch_linger_ms / 1000.0
        self._max_events = settings.batch_max_events
        self._buffers = [_Buffer() for _ in range(self.shards)]
        self._timer: asyncio.TimerHandle | None = None
        self._tracker = AckTracker()
        self._out: aiormq.abc.AbstractChannel | None = None
        self._in: aiormq.abc.AbstractChannel | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._failed: asyncio.Event = asyncio.Event()
        self._ack_scheduled = False
        self._acked_sent = 0
        self._heartbeat = settings.shard_heartbeat_ms / 1000.0
        self.router_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._clock_ms = 0  # newest ingest stamp handed out or promised (monotonic, epoch ms)
        self._max_backlog = settings.router_max_shard_backlog  # 0 = never pause
        # Per shard: messages ready at the last depth sample, batches flushed ever, batches
        # confirmed ever, and confirmed before that sample's declare went out. Ready now
        # is at most depth + flushed - confirmed-at-sample (in flight counted, none lost).
        self._depths = [0] * self.shards
        self._flushed = [0] * self.shards
        self._confirmed = [0] * self.shards
        self._confirmed_at_sample = [0] * self.shards
        self._held: deque[aio_pika.abc.AbstractIncomingMessage] = deque()  # paused: not routed yet, in order
        self._paused_at: float | None = None  # when the current hold began
        self._throttled_at: float | None = None  # when this episode of holds began (log, gauge)
        self._forced = 0  # holds of this episode released at the pause limit, not by the backlog
        ttl = min(rule.ttl_seconds(settings.book_ttl_seconds) for rule in rules)
        self._max_pause = max(0.0, ttl / 4 - BACKLOG_SAMPLE_SECONDS)  # + one sample = ttl / 4

    def _stamp(self) -> int:
        """The ingest clock (epoch ms), never going back: a heartbeat's promise holds across NTP steps."""
        now = int(time.time() * 1000)
        if now > self._clock_ms:
            self._clock_ms = now
        return self._clock_ms

    async def _session(self, connection: aio_pika.abc.AbstractConnection, ended: asyncio.Event,
                       life: Lifecycle) -> None:
        tune_gc()
        self._buffers = [_Buffer() for _ in range(self.shards)]
        self._tracker = AckTracker()
        self._acked_sent = 0
        self._failed = asyncio.Event()
        self._tasks = set()
        self._held.clear()  # the previous channel's: the broker redelivers them
        self._flushed, self._confirmed = [0] * self.shards, [0] * self.shards
        self._depths, self._confirmed_at_sample = [0] * self.shards, [0] * self.shards
        channel = await connection.channel(publisher_confirms=True)
        await declare_async(channel, self.settings)
        arguments = shard_queue_arguments(self.settings)
        for name in self.queues:  # idempotent; the router needs them whatever `mode` says
            await channel.declare_queue(name, durable=True, arguments=arguments)
        self._default = channel.default_exchange
        self._out = await channel.get_underlay_channel()
        inbound = await connection.channel()
        await inbound.set_qos(prefetch_count=self.settings.router_prefetch)
        self._in = await inbound.get_underlay_channel()
        queue = await inbound.get_queue(TRADE_DATA, ensure=False)
        tag = await queue.consume(self.on_message)
        log.info("consuming", queue=TRADE_DATA, mode="sharded", shards=self.shards,
                 batch_max_events=self._max_events, linger_ms=self.settings.batch_linger_ms)
        life.ready()
        beats = asyncio.ensure_future(self._heartbeats())
        sampler = asyncio.ensure_future(self._sample_backlog(await connection.channel())) \
            if self._max_backlog else None
        failed = asyncio.ensure_future(self._failed.wait())
        ended_wait = asyncio.ensure_future(ended.wait())
        try:
            await asyncio.wait([failed, ended_wait], return_when=asyncio.FIRST_COMPLETED)
        finally:
            beats.cancel()
            failed.cancel()
            ended_wait.cancel()
            if sampler is not None:
                sampler.cancel()
            self._resumed()
        if not inbound.is_closed:
            try:
                await queue.cancel(tag)
            except Exception:  # noqa: BLE001 - the channel died meanwhile
                pass
        if not self._failed.is_set():
            self._beat(final=True)  # flushes first; then shards forget this router at once
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=self.settings.shutdown_grace_seconds)
            self._ack()
        if self._failed.is_set() and not life.stopping.is_set():
            raise ConnectionError("a shard batch was not confirmed; restarting the session")

    async def on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """Decode one trade message into the shard buffers (no await on the happy path)."""
        if self._max_backlog and (self._held or self._backlogged(self._max_backlog)):
            self._held.append(message)
            if self._paused_at is None:
                self._paused_at = time.monotonic()
            if self._throttled_at is None:
                self._throttled_at = self._paused_at
                ROUTER_PAUSED.set(1)
                log.warning("shard queues backlogged: routing paused, the surge waits in the ingress",
                            shard_backlog=max(self._depths), limit=self._max_backlog,
                            max_pause_seconds=round(self._max_pause + BACKLOG_SAMPLE_SECONDS, 1))
            return
        self._take(message)

    def _take(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        tracker = self._tracker
        delivery_tag = message.delivery_tag
        assert delivery_tag is not None
        tracker.add(delivery_tag)
        decoded = self.codec.decode(message.body, message.content_type, self.settings.max_message_bytes)
        BATCH_EVENTS.labels(stage="ingress").observe(len(decoded.events) + len(decoded.rejects))
        for reject in decoded.rejects:
            tracker.hold(delivery_tag)
            self._spawn(self._dead_letter_then_release(message, reject, delivery_tag))
        if decoded.events:
            self._route(decoded.events, delivery_tag, message.headers)
        self._release(delivery_tag)

    def _route(self, events: list[Any], delivery_tag: int, headers: Any) -> None:
        """Group a message's events by shard and append one segment per shard to its buffer.

        Per event this is only the key and its crc32 (`shard_of`, inlined): events are
        packed once per segment by the codec (msgspec, in C), never one by one.
        """
        ingest_ms = self._stamp()
        at = ingest_ms / 1000
        published_ms = (headers or {}).get(PUBLISHED_HEADER)
        published_ms = published_ms if isinstance(published_ms, int) else 0
        for kind, count in Counter(map(type, events)).items():  # counted in C, not per event in Python
            EVENTS_CONSUMED.labels(type=kind.__name__).inc(count)
        shards = self.shards
        crc32 = zlib.crc32
        for rule in self.rules:
            groups: dict[int, list[Any]] = {}
            key = rule.key
            accepts = rule.accepts
            for event in events:
                if accepts(event):
                    shard = crc32(key(event, at).encode()) % shards  # = shard_of(key, shards)
                    group = groups.get(shard)
                    if group is None:
                        groups[shard] = [event]
                    else:
                        group.append(event)
            pack_many = rule.codec.pack_many
            for shard, group in groups.items():
                buffer = self._buffers[shard]
                buffer.segments.append(Segment(rule.name, ingest_ms, published_ms, pack_many(group)))
                buffer.events += len(group)
                buffer.tags.append(delivery_tag)
                self._tracker.hold(delivery_tag)
                if buffer.events >= self._max_events:
                    self._flush(shard)
        if self._timer is None and any(b.segments for b in self._buffers):
            self._timer = asyncio.get_running_loop().call_later(self._linger, self._flush_all)

    def _backlogged(self, limit: int) -> bool:
        return any(depth + flushed - confirmed > limit for depth, flushed, confirmed
                   in zip(self._depths, self._flushed, self._confirmed_at_sample))

    async def _sample_backlog(self, channel: aio_pika.abc.AbstractChannel) -> None:
        """Shard queue depths twice a second; route what is held once no queue is over the
        limit (the episode ends) or once the hold reaches the pause limit (it goes on)."""
        underlay = await channel.get_underlay_channel()
        try:
            while True:
                for shard, name in enumerate(self.queues):
                    confirmed = self._confirmed[shard]
                    declared = await underlay.queue_declare(name, passive=True)
                    self._depths[shard], self._confirmed_at_sample[shard] = declared.message_count or 0, confirmed
                backlogged = self._backlogged(self._max_backlog)
                if self._held and (not backlogged or time.monotonic() - (self._paused_at or 0) >= self._max_pause):
                    while self._held and not self._failed.is_set():
                        self._take(self._held.popleft())
                    self._paused_at = None
                    self._forced += backlogged
                if not backlogged and not self._held:
                    self._resumed()
                await asyncio.sleep(BACKLOG_SAMPLE_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. the connection died: the session restarts
            self._fail(f"shard queue depths unreadable: {exc!r}")
        finally:
            if not channel.is_closed:
                await channel.close()

    def _resumed(self) -> None:
        if self._throttled_at is not None:
            log.info("shard queues drained: routing resumed",
                     throttled_seconds=round(time.monotonic() - self._throttled_at, 1),
                     holds_released_at_the_pause_limit=self._forced)
            ROUTER_PAUSED.set(0)
        self._paused_at = self._throttled_at = None
        self._forced = 0

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat)
            self._beat()

    def _beat(self, final: bool = False) -> None:
        """Hand every buffered batch to the channel, then one heartbeat per shard behind them.

        Order: `_flush_all` spawns the batch tasks first, the heartbeat tasks after; each
        runs without suspending up to aiormq's channel lock, which is FIFO, so the frames
        go out in this order and the queue holds every earlier-stamped event before T.
        """
        if self._failed.is_set() or self._out is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._flush_all()
        clock = self._stamp()
        body = str(clock).encode()
        headers: dict[str, Any] = {ROUTER_HEADER: self.router_id}
        if final:
            headers[FINAL_HEADER] = True
        for shard in range(self.shards):  # one Properties each: aiormq writes a message id into it
            properties = spec.Basic.Properties(delivery_mode=1, content_type=HEARTBEAT, headers=dict(headers))
            self._spawn(self._publish_heartbeat(shard, body, properties))

    async def _publish_heartbeat(self, shard: int, body: bytes, properties: spec.Basic.Properties) -> None:
        assert self._out is not None
        try:
            confirm = await self._out.basic_publish(body, routing_key=self.queues[shard], mandatory=True,
                                                   properties=properties)
        except Exception as exc:  # noqa: BLE001 - the channel died: restart like a batch would
            self._fail(f"shard heartbeat not confirmed: {exc!r}")
            return
        if not isinstance(confirm, spec.Basic.Ack):  # harmless: the shard waits for the next one
            log.warning("shard heartbeat refused by the broker", shard=shard, reply=repr(confirm))

    def _flush_all(self) -> None:
        self._timer = None
        for shard, buffer in enumerate(self._buffers):
            if buffer.segments:
                self._flush(shard)

    def _flush(self, shard: int) -> None:
        buffer = self._buffers[shard]
        self._buffers[shard] = _Buffer()
        self._flushed[shard] += 1
        BATCH_EVENTS.labels(stage="shard").observe(buffer.events)
        self._spawn(self._publish(shard, encode_batch(buffer.segments), buffer.tags))

    async def _publish(self, shard: int, body: bytes, tags: list[int]) -> None:
        assert self._out is not None
        try:
            confirm = await self._out.basic_publish(
                body, routing_key=self.queues[shard], mandatory=True,  # a return is not an Ack: a failure
                properties=spec.Basic.Properties(delivery_mode=2,
                                                 content_type=SHARD_BATCH))
        except Exception as exc:  # noqa: BLE001 - the channel died: everything unacked comes back
            self._fail(f"shard batch not confirmed: {exc!r}")
            return
        if not isinstance(confirm, spec.Basic.Ack):
            self._fail(f"shard batch refused by the broker: {confirm!r}")
            return
        self._confirmed[shard] += 1
        for tag in tags:
            self._release(tag)

    async def _dead_letter_then_release(self, message: aio_pika.abc.AbstractIncomingMessage,
                                        reject: Any, delivery_tag: int) -> None:
        try:
            await self._dead_letter(message, reject)
        except Exception as exc:  # noqa: BLE001
            self._fail(f"dead-letter not confirmed: {exc!r}")
            return
        self._release(delivery_tag)

    def _release(self, delivery_tag: int) -> None:
        if self._failed.is_set():
            return
        if self._tracker.release(delivery_tag) is not None and not self._ack_scheduled:
            self._ack_scheduled = True
            asyncio.get_running_loop().call_soon(self._ack)

    def _ack(self) -> None:
        """One multiple-ack for every trade message whose outputs are all confirmed."""
        self._ack_scheduled = False
        upto = self._tracker.acked
        if upto > self._acked_sent and self._in is not None and not self._in.is_closed \
                and not self._failed.is_set():
            self._acked_sent = upto
            self._spawn(self._in.basic_ack(upto, multiple=True))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fail(self, reason: str) -> None:
        if not self._failed.is_set():
            log.error("router output failed; the session restarts and unacked input comes back",
                      reason=reason)
            self._failed.set()


def build(settings: Settings, **_: Any) -> Router:
    return Router(settings, load_rules(settings))
