"""The Channel Boy: delivers one channel's queue to its recipients, with the channel's guarantee.

The lookout hands the queue `Aldebaran.Channel.<name>` one message per batch of alerts (or
one alert per message); the deliverer takes whole messages, about half its send window of
alerts a round, several rounds overlapping, and handles each alert on its own
(`workers/channel_items.py`), `max_in_flight` sends at a time, per recipient of the channel:
1. **claim** them in the channel's ledger, one Redis call per round
   (`aldebaran/channels/ledger.py`): repeats are acked; alerts already in doubt stay with
   the operator; an **at-most-once** channel records each attempt here, before its send;
2. **send** them (concurrently, or in one call for sinks that batch: the pull queue);
3. **settle** the outcomes in one Redis call, then each message once all its alerts are: `delivered`;
   `NotDelivered` (the recipient certainly did not get it) is tried again with backoff in a
   task of its own, and parked in the channel's dead-letter queue after `max_attempts`
   (at once when the refusal is final); any other failure is *in doubt* at most once
   (listed, never sent again on its own) and tried again at least once.

A crash mid-send leaves an at-most-once attempt recorded: the next deliverer finds it and
lists the alert in doubt (at most `max_in_flight` per crash). An at-least-once channel
sends it again instead, with the same `Idempotency-Key` / `message_id` (docs/delivery.md).
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext, suppress

import aio_pika
import aio_pika.abc
import redis.asyncio as aioredis

from aldebaran.channels.base import MAX_REASON_CHARS, NotDelivered, PerAlertLock, RetryPolicy, Sink, park
from aldebaran.channels.ledger import Claim, Claimed, DeliveryLedger
from aldebaran.channels.registry import build_sink
from aldebaran.errors import ConfigError
from aldebaran.io.amqp import connect as connect_amqp
from aldebaran.io.redis import Keys, Replicas
from aldebaran.io.redis import connect as connect_redis
from aldebaran.log import get_logger
from aldebaran.metrics import ALERTS_DELIVERED, DELIVERY_DEAD_LETTERED, DELIVERY_IN_DOUBT, DELIVERY_RETRIES
from aldebaran.settings import Settings, mask_url
from declare.topology import channel_dead_letter, channel_queue, durable_arguments
from workers.channel_items import Envelope, Item, Unreadable, read
from workers.runtime import Lifecycle

ROUNDS_IN_FLIGHT = 4  # rounds under way at once; the send window (`max_in_flight`) bounds their sends
REDIS_PAUSE_SECONDS = 1.0
INTERRUPTED = "an earlier attempt was interrupted (its deliverer stopped or crashed mid-send)"


class ChannelWorker:
    """Consumes one channel's queue; at most `max_in_flight` sends are under way at once."""

    def __init__(self, settings: Settings, channel_name: str, sink: Sink | None = None) -> None:
        self.config = settings.channel(channel_name)
        self.name = f"channel-{channel_name}"
        self.at_most_once = self.config.guarantee == "at-most-once"
        self._settings = settings
        self._sink = sink or build_sink(self.config, settings)
        # A sink whose keyed send writes the ledger record itself (queue-api): no claim, no settle.
        self._records_delivery = bool(getattr(self._sink, "records_delivery", False))
        self._policy = RetryPolicy(self.config.max_attempts, self.config.backoff_initial_seconds,
                                   self.config.backoff_max_seconds)
        self._log = get_logger("channel", channel=channel_name)
        self._per_alert = PerAlertLock()
        self._slots = asyncio.Semaphore(self.config.in_flight)
        self._acquiring = asyncio.Lock()
        self._token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._ledger: DeliveryLedger | None = None
        self._amqp_channel: aio_pika.abc.AbstractChannel | None = None
        self._stopping = asyncio.Event()
        self._delivered: list[aio_pika.abc.AbstractIncomingMessage] = []
        self._arrived = asyncio.Event()
        self._retrying: set[asyncio.Task[None]] = set()
        self._holding: dict[str, asyncio.Future[None]] = {}  # alert id -> the round sending its first copy
        # Half the send window: a round's size, and a chunk's (one chunk's claim and send
        # overlap the other's wait for answers).
        self._half_window = max(1, self.config.in_flight // 2)

    async def run(self, life: Lifecycle) -> None:
        self._stopping = life.stopping
        redis: aioredis.Redis = await connect_redis(self._settings)
        self._ledger = DeliveryLedger(redis, Keys(self._settings.redis_key_prefix), self.config.name,
                                      self._settings.alert_dedup_ttl_seconds, self._token, Replicas.of(self._settings))
        connection = await connect_amqp(self._settings, self.name)
        drained = asyncio.Event()
        drainer: asyncio.Task[None] | None = None
        try:
            await self._sink.start()
            queue = await self._declare(connection)

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                self._delivered.append(message)
                self._arrived.set()

            drainer = asyncio.create_task(self._drain(drained))
            tag = await queue.consume(on_message)
            self._log.info("delivering", queue=channel_queue(self.config.name), kind=self.config.kind,
                           delivery=self.config.guarantee, max_in_flight=self.config.in_flight)
            life.ready()
            await life.wait_stopping()
            await queue.cancel(tag)
            drained.set()  # the drainer finishes what was delivered, then returns
            self._arrived.set()
            await drainer
            if self._retrying:
                await asyncio.wait(set(self._retrying))
        finally:
            if drainer is not None and not drainer.done():
                drainer.cancel()
            await self._sink.close()
            await connection.close()
            await redis.aclose()

    async def _declare(self, connection: aio_pika.abc.AbstractConnection) -> aio_pika.abc.AbstractQueue:
        self._amqp_channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        # Messages, not alerts: a batch message holds up to 1000 alerts, a lone alert one.
        await self._amqp_channel.set_qos(prefetch_count=min(max(64, self.config.in_flight), 1024))
        queue = await self._amqp_channel.declare_queue(channel_queue(self.config.name), durable=True,
                                                       arguments=durable_arguments(self._settings) or None)
        await self._amqp_channel.declare_queue(channel_dead_letter(self.config.name), durable=True,
                                               arguments=durable_arguments(self._settings, None) or None)
        return queue

    async def _drain(self, drained: asyncio.Event) -> None:
        """Rounds of what was delivered, overlapping, until stopping with nothing left.

        A round takes whole messages, about half the send window of alerts, and runs as a task
        of its own: the next round claims and sends while the one before waits for its answers
        (a barrier per round left the window idle for most of each round trip). Copies of an
        alert that a round still holds wait for it (`_holding`), as copies within one round do.
        """
        rounds: set[asyncio.Task[None]] = set()
        depth = asyncio.Semaphore(ROUNDS_IN_FLIGHT)
        while True:
            if not self._delivered:
                if drained.is_set():
                    break
                self._arrived.clear()
                await self._arrived.wait()
                continue
            await depth.acquire()
            envelopes: list[Envelope] = []
            items: list[Item] = []
            unreadable: list[Unreadable] = []
            while self._delivered and len(items) < self._half_window:  # whole messages, about that many alerts
                envelope, alerts, bad = read(self._delivered.pop(0))
                envelopes.append(envelope)
                items += alerts
                unreadable += bad
            held = asyncio.get_running_loop().create_future()
            firsts, later = self._split(items, held)
            task = asyncio.create_task(self._guarded_round(envelopes, firsts, later, unreadable, held))
            rounds.add(task)
            task.add_done_callback(rounds.discard)
            task.add_done_callback(lambda _: depth.release())
        if rounds:
            await asyncio.wait(set(rounds))

    def _split(self, items: list[Item], held: asyncio.Future[None]) -> tuple[dict[str, Item], list[Item]]:
        """A round's first copy of each alert no one else holds (now held by this round until
        `held` is done), and the rest: copies, or alerts another round or a retry holds."""
        firsts: dict[str, Item] = {}
        later: list[Item] = []
        for item in items:
            alert_id = item.alert.alert_id
            if alert_id in firsts or alert_id in self._holding or self._per_alert.busy(alert_id):
                later.append(item)
            else:
                firsts[alert_id] = item
                self._holding[alert_id] = held
        return firsts, later

    async def _guarded_round(self, envelopes: list[Envelope], firsts: dict[str, Item], later: list[Item],
                             unreadable: list[Unreadable], held: asyncio.Future[None]) -> None:
        """One round; on Redis or broker trouble what it left unsettled goes back to the queue."""
        try:
            await self._round(envelopes, firsts, later, unreadable, held)
        except Exception as exc:  # noqa: BLE001 - Redis or broker trouble: what is unsettled comes back
            self._log.warning("delivery round failed, requeueing", count=len(envelopes), error=str(exc))
            self._release(firsts, held)
            await asyncio.sleep(REDIS_PAUSE_SECONDS)
            for envelope in envelopes:
                if not (envelope.settled or envelope.handed):
                    with suppress(Exception):
                        await envelope.message.nack(requeue=True)

    def _release(self, firsts: dict[str, Item], held: asyncio.Future[None]) -> None:
        """The round no longer holds its alerts: copies waiting for them go on."""
        for alert_id in firsts:
            if self._holding.get(alert_id) is held:
                del self._holding[alert_id]
        if not held.done():
            held.set_result(None)

    async def _round(self, envelopes: list[Envelope], firsts: dict[str, Item], later: list[Item],
                     unreadable: list[Unreadable], held: asyncio.Future[None]) -> None:
        """First attempts for a round: claim, send, settle per recipient; then settle, park or retry each."""
        for bad in unreadable:
            await self._park(bad.body, bad.reason, bad.message_id, attempts=0)
        # Never more than `max_in_flight` sends under way (each chunk takes its slots).
        step = self._half_window
        for target in self._sink.targets:
            live = [item for item in firsts.values() if not item.failed]
            outcomes = await asyncio.gather(*(self._attempt(live[start:start + step], target)
                                              for start in range(0, len(live), step)), return_exceptions=True)
            for outcome in outcomes:  # every chunk has finished: the caller may requeue what is unsettled
                if isinstance(outcome, BaseException):
                    raise outcome
        retries = [item for item in firsts.values() if item.retry and not item.failed]
        for item in retries:
            self._spawn_retry(item)  # reserved before the round lets go: copies queue behind it
        self._release(firsts, held)
        for item in firsts.values():
            if not (item.retry and not item.failed):
                await self._done(item)
        for item in later:
            self._spawn_retry(item, after=self._holding.get(item.alert.alert_id))
        for envelope in envelopes:
            if not envelope.pending and not envelope.settled:  # nothing readable in it
                await self._settle(envelope)

    async def _attempt(self, chunk: Sequence[Item], target: str) -> None:
        """One attempt for each item's alert to `target`, under a slot each: claimed, sent, settled."""
        assert self._ledger is not None
        async with self._acquiring:  # a chunk takes all its slots before the next one takes any
            for _ in chunk:
                await self._slots.acquire()
        try:
            ids = [(item.alert.alert_id, target) for item in chunk]
            claimed = (Claimed([Claim.NEW] * len(chunk)) if self._records_delivery  # a repeat is a no-op there
                       else await self._ledger.claim(ids, record_attempt=self.at_most_once))
            claims = claimed.claims
            sending = [item for item, claim in zip(chunk, claims, strict=True) if claim is Claim.NEW]
            for item in sending:
                item.attempts[target] = item.attempts.get(target, 0) + 1
            doubt = [(item.alert.alert_id, target, INTERRUPTED, item.alert.body)
                     for item, claim in zip(chunk, claims, strict=True) if claim is Claim.INTERRUPTED]
            errors = await self._send(sending, target)
            delivered, released = [], []
            for item, error in zip(sending, errors, strict=True):
                if error is None:
                    delivered.append((item.alert.alert_id, target))
                    continue
                reason = _reason(error)
                item.errors[target] = reason
                if isinstance(error, NotDelivered):
                    released.append((item.alert.alert_id, target))
                    if error.permanent:
                        item.failed = f"{reason} (after {item.attempts[target]} attempts)"
                    else:
                        item.retry.append(target)
                elif self.at_most_once:
                    doubt.append((item.alert.alert_id, target, reason, item.alert.body))
                else:
                    item.retry.append(target)
            if not self._records_delivery:
                await self._ledger.settle(delivered, released if self.at_most_once else (), doubt, claimed.attempt)
            if delivered:
                ALERTS_DELIVERED.labels(channel=self.config.name).inc(len(delivered))
            self._in_doubt(doubt)
        finally:
            for _ in chunk:
                self._slots.release()

    async def _send(self, items: Sequence[Item], target: str) -> list[BaseException | None]:
        """Each item's alert to `target`: None where it was taken, else the failure."""
        if not items:
            return []
        alerts = [item.alert for item in items]
        send_many = getattr(self._sink, "send_many", None)
        if send_many is not None:
            try:
                return list(await send_many(alerts, target))
            except Exception as exc:  # noqa: BLE001 - the whole call failed: each alert did
                return [exc] * len(alerts)
        results = await asyncio.gather(*(self._sink.send(alert, target) for alert in alerts), return_exceptions=True)
        return [result if isinstance(result, BaseException) else None for result in results]

    def _in_doubt(self, doubt: list[tuple[str, str, str, bytes]]) -> None:
        if not doubt:
            return
        DELIVERY_IN_DOUBT.labels(channel=self.config.name).inc(len(doubt))
        for alert_id, target, reason, _ in doubt:
            self._log.warning("delivery in doubt: not sent again; settle it with `aldebaran delivery`",
                              alert_id=alert_id, target=target or None, reason=reason)

    def _spawn_retry(self, item: Item, after: asyncio.Future[None] | None = None) -> None:
        """The item's remaining attempts in a task of its own, holding its alert's lock (once the
        round that holds the alert, `after`, let go of it)."""
        hold = self._per_alert.reserve(item.alert.alert_id)
        item.envelope.handed = True  # its retry tasks settle it, whatever happens to this round
        task = asyncio.create_task(self._retry(item, hold, after))
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)

    async def _retry(self, item: Item, hold: AbstractAsyncContextManager[None],
                     after: asyncio.Future[None] | None) -> None:
        try:
            if after is not None:
                await asyncio.shield(after)
            async with hold:
                targets = item.retry or list(self._sink.targets)  # a later copy re-claims every recipient
                item.retry = []
                for target in targets:
                    if not await self._retry_target(item, target):
                        break
        except Exception as exc:  # noqa: BLE001 - Redis or broker trouble: the message comes back
            self._log.warning("delivery step failed, requeueing", alert_id=item.alert.alert_id, error=str(exc))
            await asyncio.sleep(REDIS_PAUSE_SECONDS)
            item.interrupted = True
        await self._done(item)

    async def _retry_target(self, item: Item, target: str) -> bool:
        """Attempts with backoff until one settles the alert for `target`; False once it failed or we stop."""
        while True:
            attempts = item.attempts.get(target, 0)
            if target in item.errors:  # the last attempt failed in a way that may be tried again
                if attempts >= self._policy.max_attempts:
                    item.failed = f"{item.errors[target]} (after {attempts} attempts)"
                    return False
                DELIVERY_RETRIES.labels(channel=self.config.name).inc()
                self._log.warning("delivery failed, will retry", alert_id=item.alert.alert_id,
                                  target=target or None, attempt=attempts, error=item.errors[target])
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self._policy.delay(attempts))
                    item.interrupted = True  # stopping: the message goes back for the next deliverer
                    return False
            await self._attempt([item], target)
            if item.failed:
                return False
            if target not in item.retry:
                return True
            item.retry.remove(target)

    async def _done(self, item: Item) -> None:
        """One alert is settled (parked when it cannot be delivered); its message once all of its are."""
        if item.failed:
            await self._park(item.alert.body, item.failed, item.alert.alert_id, max(item.attempts.values(), default=0))
        envelope = item.envelope
        envelope.requeue |= item.interrupted
        envelope.pending -= 1
        if not envelope.pending:
            await self._settle(envelope)

    async def _settle(self, envelope: Envelope) -> None:
        with suppress(Exception) if envelope.requeue else nullcontext():  # a closed channel requeues anyway
            if envelope.requeue:
                await envelope.message.nack(requeue=True)
            else:
                await envelope.message.ack()
        envelope.settled = True

    async def _park(self, body: bytes, reason: str, alert_id: str | None, attempts: int) -> None:
        assert self._amqp_channel is not None
        await park(self._amqp_channel, self.config.name, body, reason, message_id=alert_id, attempts=attempts)
        DELIVERY_DEAD_LETTERED.labels(channel=self.config.name).inc()
        self._log.error("parked in the dead-letter queue", alert_id=alert_id, reason=reason,
                        queue=channel_dead_letter(self.config.name))


def _reason(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, NotDelivered) else f"{type(exc).__name__}: {exc}"
    return mask_url(text)[:MAX_REASON_CHARS]


def build(settings: Settings, name: str | None = None) -> ChannelWorker:
    """The deliverer of the channel called `name` (one of the configured `[[channels]]`)."""
    if not name:
        raise ConfigError("channel worker: name the channel")
    return ChannelWorker(settings, name)
