"""The Channel Boy: delivers one channel's queue to its recipient, once per recipient.

For each alert on `Aldebaran.Channel.<name>`: if the channel's ledger in Redis says the
recipient already has it, ack (a repeat from a re-fan or a redelivery); else deliver with
retries, record it in the ledger, then ack. After the last failed attempt the alert is
parked in the channel's dead-letter queue with the last error, so one bad alert or a
dead sink never holds the queue forever. The only window for a repeat is between "the
sink accepted" and "the ledger recorded it" (see docs/delivery.md).
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

import aio_pika
import aio_pika.abc
import redis.asyncio as aioredis

from aldebaran.channels.base import (
    Alert,
    DeliveryLedger,
    PerAlertLock,
    RetryPolicy,
    Sink,
    UnreadableAlert,
    deliver_with_retries,
    park,
)
from aldebaran.channels.registry import build_sink
from aldebaran.errors import ConfigError
from aldebaran.io.amqp import connect as connect_amqp
from aldebaran.io.redis import Keys, Replicas
from aldebaran.io.redis import connect as connect_redis
from aldebaran.log import get_logger
from aldebaran.metrics import ALERTS_DELIVERED, DELIVERY_DEAD_LETTERED, DELIVERY_RETRIES
from aldebaran.settings import Settings
from declare.topology import channel_dead_letter, channel_queue, durable_arguments
from workers.runtime import Lifecycle

PREFETCH = 16
REDIS_PAUSE_SECONDS = 1.0


class ChannelWorker:
    """Consumes one channel's queue; up to PREFETCH alerts are delivered concurrently."""

    def __init__(self, settings: Settings, channel_name: str, sink: Sink | None = None) -> None:
        self.config = settings.channel(channel_name)
        self.name = f"channel-{channel_name}"
        self._settings = settings
        self._sink = sink or build_sink(self.config, settings)
        self._policy = RetryPolicy(self.config.max_attempts, self.config.backoff_initial_seconds,
                                   self.config.backoff_max_seconds)
        self._log = get_logger("channel", channel=channel_name)
        self._per_alert = PerAlertLock()
        self._ledger: DeliveryLedger | None = None
        self._amqp_channel: aio_pika.abc.AbstractChannel | None = None
        self._stopping = asyncio.Event()

    async def run(self, life: Lifecycle) -> None:
        self._stopping = life.stopping
        redis: aioredis.Redis = await connect_redis(self._settings)
        self._ledger = DeliveryLedger(redis, Keys(self._settings.redis_key_prefix), self.config.name,
                                      self._settings.alert_dedup_ttl_seconds, Replicas.of(self._settings))
        connection = await connect_amqp(self._settings, self.name)
        in_flight: set[asyncio.Task] = set()
        try:
            await self._sink.start()
            self._amqp_channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await self._amqp_channel.set_qos(prefetch_count=PREFETCH)
            args = durable_arguments(self._settings)
            queue = await self._amqp_channel.declare_queue(channel_queue(self.config.name), durable=True,
                                                           arguments=args or None)
            await self._amqp_channel.declare_queue(channel_dead_letter(self.config.name), durable=True,
                                                   arguments=durable_arguments(self._settings, None) or None)

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                task = asyncio.create_task(self._handle(message))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)

            tag = await queue.consume(on_message)
            self._log.info("delivering", queue=channel_queue(self.config.name), kind=self.config.kind)
            life.ready()
            await life.wait_stopping()
            await queue.cancel(tag)
            if in_flight:
                await asyncio.wait(set(in_flight))
        finally:
            await self._sink.close()
            await connection.close()
            await redis.aclose()

    async def _handle(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        alert_id = message.message_id
        try:
            try:
                alert = Alert.parse(message.body, message.message_id)
            except UnreadableAlert as exc:
                await self._park(message, f"unreadable alert: {exc}", message.message_id, attempts=0)
                return
            alert_id = alert.alert_id
            async with self._per_alert.hold(alert.alert_id):
                await self._deliver(alert, message)
        except Exception as exc:  # noqa: BLE001 - Redis or broker trouble: try again later
            self._log.warning("delivery step failed, requeueing", alert_id=alert_id, error=str(exc))
            await asyncio.sleep(REDIS_PAUSE_SECONDS)
            with suppress(Exception):
                await message.nack(requeue=True)

    async def _deliver(self, alert: Alert, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        assert self._ledger is not None
        fresh = 0
        for target in self._sink.targets:
            if await self._ledger.delivered(alert.alert_id, target):
                await self._ledger.settle(alert.alert_id, target)
                continue
            outcome = await deliver_with_retries(
                self._sink, alert, target, self._policy, self._stopping,
                on_retry=lambda attempt, error: self._retrying(alert, target, attempt, error))
            if outcome.interrupted:
                await message.nack(requeue=True)  # stopping: the next run carries on
                return
            if not outcome.delivered:
                reason = f"{outcome.last_error} (after {outcome.attempts} attempts)"
                await self._park(message, reason, alert.alert_id, outcome.attempts, target)
                return
            await self._ledger.mark(alert.alert_id, target)
            fresh += 1
        if fresh:
            ALERTS_DELIVERED.labels(channel=self.config.name).inc()
            self._log.info("delivered", alert_id=alert.alert_id)
        else:
            self._log.info("already delivered, dropping the repeat", alert_id=alert.alert_id)
        await message.ack()

    def _retrying(self, alert: Alert, target: str, attempt: int, error: str) -> None:
        DELIVERY_RETRIES.labels(channel=self.config.name).inc()
        self._log.warning("delivery failed, will retry", alert_id=alert.alert_id, target=target or None,
                          attempt=attempt, error=error)

    async def _park(self, message: aio_pika.abc.AbstractIncomingMessage, reason: str, alert_id: str | None,
                    attempts: int, target: str = "") -> None:
        assert self._amqp_channel is not None
        await park(self._amqp_channel, self.config.name, message.body, reason, message_id=alert_id,
                   attempts=attempts)
        await message.ack()
        DELIVERY_DEAD_LETTERED.labels(channel=self.config.name).inc()
        self._log.error("parked in the dead-letter queue", alert_id=alert_id, target=target or None,
                        reason=reason, queue=channel_dead_letter(self.config.name))


def build(settings: Settings, name: str | None = None) -> ChannelWorker:
    """The deliverer of the channel called `name` (one of the configured `[[channels]]`)."""
    if not name:
        raise ConfigError("channel worker: name the channel")
    return ChannelWorker(settings, name)
