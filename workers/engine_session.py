"""One broker connection's worth of engine: ownership, recovery, then cycles until it ends.

`workers/engine.py` is the process (the worker, its metrics and logs); this is what one
session does with the connection it is given, in the order the engine's docstring lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import aio_pika.abc
import aiormq.abc

from aldebaran.core.batching import NaturalBatcher
from aldebaran.core.engine import Cycle, Engine
from aldebaran.core.pipeline_clock import PipelineClock
from aldebaran.core.wal import WalMessage
from aldebaran.io.alert_bus import publish_alerts
from aldebaran.io.alert_witness import declare_witness, read_witnesses, witness_queue
from aldebaran.io.engine_store import Committed, Outbox
from aldebaran.io.inline_consumer import consume_inline
from aldebaran.io.latency_samples import BOOK, DELIVERED, STARTED
from aldebaran.io.publisher import published_ms
from aldebaran.log import get_logger
from aldebaran.metrics import ALERTS_DEDUPLICATED, ALERTS_UNCONFIRMED, BATCH_EVENTS, PROCESSING_LATENCY
from aldebaran.runtime_tuning import collect_when_idle
from declare.declarer import declare_async
from declare.topology import TRADE_DATA, engine_partition_queue
from workers.engine_compactions import Compactions
from workers.engine_cycle import CycleOutput, Delivery, alert_payloads
from workers.engine_output import OutputRounds
from workers.runtime import Lifecycle
from workers.wakeup import Wakeup

if TYPE_CHECKING:
    from workers.engine import EngineWorker

log = get_logger("engine")
REPORT_SECONDS = 1.0
EARLY_RECORD_BYTES = 256 * 1024  # a cycle up to this size sends its record before applying its books
SEND_TURNS = 1  # event loop turns given to the record's Redis call before the books are applied


class Session:
    """One broker connection's worth of engine: ownership, recovery, then cycles until it ends."""

    def __init__(self, worker: EngineWorker, connection: aio_pika.abc.AbstractConnection,
                 ended: asyncio.Event, life: Lifecycle) -> None:
        self.worker = worker
        self.config = worker.config
        self.store = worker.store
        self.connection = connection
        self.ended = ended
        self.life = life
        # One cycle at a time; what arrives during it forms the next (`aldebaran/core/batching.py`).
        self.batcher: NaturalBatcher[Delivery] = NaturalBatcher(self.config.max_cycle_messages)
        # Confirms and acks, apart from the cycles. While it holds `max_cycles_in_flight` full cycles'
        # worth of messages the next cycle waits: in a drain the prefetch window keeps room for a full
        # cycle (fuller cycles, fewer alert batches), and a paced engine's one-message cycles never wait.
        self.output_room = self.config.max_cycles_in_flight * self.config.max_cycle_messages
        self.rounds = OutputRounds(self, self.output_room, on_round=self._wake_if_ready)
        self.wakeup = Wakeup()  # a batch is ready, or the session ended
        self.failed: BaseException | None = None
        self.compactions = Compactions(self, self.config.compact_seconds, time.monotonic())
        self.witness_queue = witness_queue(worker.settings)

    async def run(self) -> None:
        if not await self._own():
            return
        engine, outbox = await self.worker.recover()
        self.worker.engine = engine
        start_ms = engine.resume_at_ms or int(time.time() * 1000)
        self.clock = PipelineClock(start_ms, time.monotonic())
        out = await self.connection.channel(publisher_confirms=True)
        await declare_async(out, self.worker.settings)
        self.out = await out.get_underlay_channel()
        # Its own channel: reading witnesses (one round trip each) never holds up a publish.
        self.witness = await (await self.connection.channel()).get_underlay_channel()
        await declare_witness(self.witness, self.worker.settings)
        await self._republish(outbox)
        inbound = await self.connection.channel()
        await inbound.set_qos(prefetch_count=self.config.prefetch)
        self.inbound = await inbound.get_underlay_channel()
        # One channel for the ingress and (partitioned) the handovers: a cycle's one multiple-ack covers both.
        consumers = [(TRADE_DATA, self._on_delivery)]
        if self.worker.partition is not None:
            consumers.append((engine_partition_queue(self.worker.partition), self._on_handover))
        tags = [await consume_inline(self.inbound, queue, callback, lambda exc: self.fail(exc, "delivery"))
                for queue, callback in consumers]
        log.info("consuming", queues=[queue for queue, _ in consumers], mode="engine", prefetch=self.config.prefetch)
        self.life.ready()
        await self._serve(engine, tags)

    async def _serve(self, engine: Engine, tags: list[str]) -> None:
        """The cycles, then the parts beside them: drained when the cycles end, cut short when
        they raise (a round still confirming on a dead channel, a compaction still storing, must
        not outlive the session into the next one)."""
        try:
            await self._cycles(engine)
        except BaseException:
            self._abandon()
            raise
        finally:
            if not self.inbound.is_closed:
                with contextlib.suppress(Exception):  # the channel died meanwhile
                    for tag in tags:
                        await self.inbound.basic_cancel(tag)
        await self._finish()

    async def _own(self) -> bool:
        """Hold the lease, or wait as standby until it is free (or the session ends)."""
        waited = False
        while not self.ended.is_set():
            if await self.store.acquire():
                if waited:
                    log.warning("standby took over the engine lease")
                return True
            if not waited:
                log.info("another engine holds the lease: standing by", lease_seconds=self.config.lease_seconds)
                self.life.ready()
                waited = True
            await _wait(self.ended, self.config.lease_seconds / 4)
        return False

    def _on_delivery(self, message: aiormq.abc.DeliveredMessage) -> None:
        self._take(message, handed_over=False)

    def _on_handover(self, message: aiormq.abc.DeliveredMessage) -> None:
        """Events of this partition's books, handed over by another engine."""
        self._take(message, handed_over=True)

    def _take(self, message: aiormq.abc.DeliveredMessage, handed_over: bool) -> None:
        properties = message.header.properties
        tag = message.delivery_tag
        assert tag is not None, "a consumed message always carries its delivery tag"
        delivery = Delivery(tag, WalMessage(properties.content_type or "", message.body, handed_over),
                            0.0 if handed_over else published_ms(properties.headers))
        self.batcher.add(delivery)
        if self.worker.samples.enabled:
            for latency in _since_published([delivery]):
                self.worker.samples.add(DELIVERED, latency)
        self._wake_if_ready()

    def _has_room(self) -> bool:
        """The output path holds fewer messages than `output_room`."""
        return self.rounds.messages < self.output_room

    def _may_start(self) -> bool:
        """A batch is waiting, and the output path has room."""
        return self.batcher.ready and self._has_room()

    def _wake_if_ready(self) -> None:
        if self._may_start():
            self.wakeup.wake()

    async def _cycles(self, engine: Engine) -> None:
        """Cycle after cycle until the session ends; an idle engine closes books as they fall due."""
        tick = self.config.tick_ms / 1000
        renew_every = self.config.lease_seconds / 3  # an idle engine wakes in time for it
        last_report = last_renewal = time.monotonic()
        watch = self.wakeup.wake_when(self.ended)
        try:
            while not self.ended.is_set() and self.failed is None:
                batch = self.batcher.take() if self._has_room() else []
                if not batch:
                    collect_when_idle()  # nothing waits on this thread: the collector's pause lands here
                    await self.wakeup.wait(idle_wait(engine.next_close_ms(), self.clock.stamp(time.monotonic()),
                                                     tick, renew_every))
                    if self._may_start() or self.ended.is_set():
                        continue
                monotonic = time.monotonic()
                stamp = self.clock.stamp(monotonic)
                if self.worker.samples.enabled:
                    self._sample_start(batch)
                now = datetime.now(UTC)
                cycle, logged = await self._step(engine, [d.message for d in batch], stamp, now)
                if batch or cycle.alerts or monotonic - last_renewal >= renew_every:
                    await self._commit(cycle, batch, now, logged)
                    last_renewal = monotonic
                if batch:
                    self.batcher.done()  # committed: its confirms and ack are the output path's
                    self.worker.count(cycle)
                if cycle.conflicts or cycle.rejects or cycle.close_failures:
                    self.worker.troubles(cycle)
                self.compactions.maybe_start(engine, monotonic)  # stored beside the cycles
                if monotonic - last_report >= REPORT_SECONDS:
                    self.worker.report()
                    last_report = monotonic
        finally:
            watch.cancel()
        if self.failed is not None:
            raise ConnectionError(f"engine session failed beside the cycles: {self.failed!r}")

    async def _step(self, engine: Engine, messages: list[WalMessage], stamp: int,
                    now: datetime) -> tuple[Cycle, asyncio.Task[Committed] | None]:
        """The cycle; a small one's record is sent to Redis before its books are applied, and
        Redis appends it meanwhile (the task to wait for). A big one is decoded and applied
        message by message, its record and alerts committed in one call after: decoding 64
        messages first and applying them after cost a drain ~6 %, more than a round trip saves."""
        if not messages or sum(len(message.body) for message in messages) > EARLY_RECORD_BYTES:
            return engine.cycle(messages, stamp, now), None
        cycle = engine.begin(messages, stamp)
        assert cycle.record is not None, "a cycle with messages always has a record"
        logged = await self._log(cycle.record)
        return engine.finish(cycle, now), logged

    async def _log(self, record: bytes) -> asyncio.Task[Committed]:
        """Send the cycle's record now, without waiting for the reply."""
        task = asyncio.ensure_future(self.store.commit(record, [], []))
        # One loop turn: the task writes the request on the store's held connection, then waits for
        # the reply while the books are applied (`aldebaran/io/held_connection.py`).
        for _ in range(SEND_TURNS):
            await asyncio.sleep(0)
        return task

    async def _commit(self, cycle: Cycle, batch: list[Delivery], now: datetime,
                      logged: asyncio.Task[Committed] | None) -> None:
        """Log the cycle (or wait for its record, sent early) and record its alerts, then hand its
        output to the output path (`workers/engine_output.py`), which confirms and acks it. A crash
        between an early record and its alerts leaves a logged cycle whose alerts were never
        recorded: recovery replays it and records them then (`EngineWorker.recover`)."""
        output = CycleOutput.of(cycle, batch)
        ids, bodies = alert_payloads(cycle.alerts)
        if logged is not None:
            await logged
            self._book_latency(batch)  # applied and logged: recording the alerts is the alert path's
            committed = await self.store.commit(None, ids, bodies) if ids else Committed([])
        else:
            committed = await self.store.commit(cycle.record, ids, bodies) if (cycle.record or ids) else Committed([])
            if not cycle.record and not ids:
                await self.store.renew()
            self._book_latency(batch)
        new = [i for i, is_new in enumerate(committed.fresh) if is_new]
        output.entry = committed.entry
        if len(new) < len(ids):
            ALERTS_DEDUPLICATED.inc(len(ids) - len(new))
        output.alert_ids = [ids[i] for i in new]
        output.bodies = [bodies[i] for i in new]
        output.kinds = [cycle.alerts[i].kind for i in new]
        if batch:
            BATCH_EVENTS.labels(stage="ingress").observe(cycle.events)
        if batch or output.alert_ids:
            self.rounds.put(output)

    def _sample_start(self, batch: list[Delivery]) -> None:
        """Publish -> cycle start of each message, beside publish -> delivered and -> book: where a
        slow message waited (in the broker, for a cycle, or in its own)."""
        for latency in _since_published(batch):
            self.worker.samples.add(STARTED, latency)

    def _book_latency(self, batch: list[Delivery]) -> None:
        """Publish -> book of each message: its events are applied and its cycle is logged."""
        if not batch:
            return
        histogram = PROCESSING_LATENCY.labels(stage="book")
        for latency in _since_published(batch):
            histogram.observe(latency / 1000)
            if self.worker.samples.enabled:
                self.worker.samples.add(BOOK, latency)

    def fail(self, exc: BaseException, part: str) -> None:
        """A part running beside the cycles (`output`, `compaction`, `delivery`) failed: the session ends, and
        unacked input comes back from the broker."""
        if self.failed is None:
            log.error("engine session failed; it restarts and unacked input comes back", part=part, error=repr(exc))
            self.failed = exc
            self.ended.set()

    async def publish(self, entries: list[str], alert_ids: list[str], bodies: list[bytes]) -> None:
        """Publish outbox entries' alerts with their witness. Unconfirmed (a nack, a connection
        lost), the witness proves nothing: one queue may hold the batch and another not, so the
        entries are listed as refused before the failure ends the session, and are published again."""
        try:
            await publish_alerts(self.out, alert_ids, bodies, witness=self.witness_queue)
        except Exception as exc:
            try:
                await self.store.refuse(entries)
            except Exception as store_exc:  # noqa: BLE001 - the publish's failure is the one raised
                log.error("alert publish not confirmed and not recorded as refused: a witness may settle "
                          "these alerts after a restart", entries=entries, error=repr(store_exc))
            else:
                ALERTS_UNCONFIRMED.inc(len(alert_ids))
                log.warning("alert publish not confirmed: published again after the restart",
                            count=len(alert_ids), error=repr(exc))
            raise

    async def _republish(self, outbox: Outbox) -> None:
        """Alerts recorded but never marked sent (a crash in between), as recovery loaded them:
        those a witness shows on the bus are marked sent; the others never went out and are
        published now. Only these entries are touched: a new owner's are never ours to drop."""
        witnesses = await read_witnesses(self.witness, self.witness_queue, limit=None)
        if witnesses:
            seen = {alert_id: raw for witness in witnesses for alert_id, raw in witness.alerts.items()}
            settled = await self.store.settle(outbox, seen)  # in Redis (fenced) before the witnesses go
            await self.witness.basic_ack(witnesses[-1].tag, multiple=True)
            if settled:
                log.warning("alerts left pending by a crash were on the bus (witnessed): not published again",
                            count=settled)
            outbox = outbox.without(seen)
        if not outbox.entries:
            return
        pending = outbox.alerts
        ids, bodies = list(pending), list(pending.values())
        await self.publish(list(outbox.entries), ids, bodies)  # an entry is never empty
        await self.store.mark_sent(list(outbox.entries), bodies)
        log.warning("re-published alerts left pending by a crash", count=len(ids), alert_ids=ids)

    async def _finish(self) -> None:
        """Wait for the cycles in flight (confirms, acks); what was not processed comes back from the broker."""
        await self.rounds.drained(self.worker.settings.shutdown_grace_seconds)
        self._abandon()
        if self.life.stopping.is_set() and self.failed is None:
            await self.store.release()

    def _abandon(self) -> None:
        """Stop the rounds and the compaction in flight; what they did not ack comes back from the broker."""
        self.rounds.cancel()
        self.compactions.cancel()
        self.worker.report()


def idle_wait(due_ms: int | None, stamp_ms: int, tick: float, renew_every: float) -> float:
    """Seconds an idle engine waits for a message. Until the next book falls due (`due_ms`, a
    pipeline stamp): closed while idle, its close is off the next message's critical path (a
    paced 1000-event message's step spent ~0.5 of its ~2.5 ms closing the books due since the
    one before). At most `tick`, and at most `renew_every`, the lease's renewal interval: waking renews it."""
    longest = min(tick, renew_every)
    if due_ms is None:
        return longest
    return min(longest, max(due_ms - stamp_ms, 1) / 1000)


def _since_published(batch: list[Delivery]) -> list[float]:
    """Milliseconds from each stamped message's publish to now (a handover carries no stamp)."""
    wall_ms = time.time() * 1000
    return [max(0.0, wall_ms - delivery.published_ms) for delivery in batch if delivery.published_ms]


async def _wait(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=timeout)
