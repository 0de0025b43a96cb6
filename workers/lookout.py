"""The Fire Lookout: fans every alert out to each configured channel's queue.

An alert is acked only after every channel queue's publisher confirm, so a crash in
between re-fans it (the channels' ledgers absorb the repeats). After the confirms the
lookout records the alert_id in Redis and acks; a later copy of the same alert (a
redelivery, a second publish) is then acked without fanning out again.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

import aio_pika
import aio_pika.abc
import redis.asyncio as aioredis

from aldebaran.channels.base import Alert, PerAlertLock, UnreadableAlert
from aldebaran.io.amqp import connect as connect_amqp
from aldebaran.io.amqp import persistent
from aldebaran.io.redis import Keys
from aldebaran.io.redis import connect as connect_redis
from aldebaran.log import get_logger
from aldebaran.metrics import DEAD_LETTERED
from aldebaran.settings import Settings
from declare.topology import ALERT, DEAD_LETTER, REASON_HEADER, channel_queue, topology
from workers.runtime import Lifecycle

PREFETCH = 64
RETRY_PAUSE_SECONDS = 1.0
# `:` cannot occur in a channel name, so this ledger never collides with a channel's.
FANNED_OUT = "lookout:fanout"

log = get_logger("lookout")


class Lookout:
    name = "lookout"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._queues = [channel_queue(c.name) for c in settings.channels]
        self._keys = Keys(settings.redis_key_prefix)
        self._redis: aioredis.Redis | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._per_alert = PerAlertLock()

    async def run(self, life: Lifecycle) -> None:
        self._redis = await connect_redis(self._settings)
        connection = await connect_amqp(self._settings, self.name)
        in_flight: set[asyncio.Task] = set()
        try:
            self._channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await self._channel.set_qos(prefetch_count=PREFETCH)
            queue = await self._declare(self._channel)

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                task = asyncio.create_task(self._handle(message))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)

            tag = await queue.consume(on_message)
            if not self._queues:
                log.warning("no channels configured: alerts are consumed and go nowhere")
            log.info("fanning out", channels=[c.name for c in self._settings.channels])
            life.ready()
            await life.wait_stopping()
            await queue.cancel(tag)
            if in_flight:
                await asyncio.wait(set(in_flight))
        finally:
            await connection.close()
            await self._redis.aclose()

    async def _declare(self, channel: aio_pika.abc.AbstractChannel) -> aio_pika.abc.AbstractQueue:
        """Declare what the lookout touches (as `aldebaran declare` does): no hand-made broker."""
        wanted = {ALERT, DEAD_LETTER, *self._queues}
        exchange = await channel.declare_exchange(ALERT, aio_pika.ExchangeType.DIRECT, durable=True)
        declared: dict[str, aio_pika.abc.AbstractQueue] = {}
        for spec in topology(self._settings).queues:
            if spec.name in wanted:
                declared[spec.name] = await channel.declare_queue(spec.name, durable=True,
                                                                  arguments=spec.arguments or None)
        await declared[ALERT].bind(exchange, routing_key=ALERT)
        return declared[ALERT]

    async def _handle(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        assert self._redis is not None and self._channel is not None
        try:
            alert = Alert.parse(message.body, message.message_id)
        except UnreadableAlert as exc:
            try:
                await self._dead_letter(message, f"unreadable alert: {exc}")
            except Exception as error:  # noqa: BLE001 - broker trouble: it comes back, judged again
                log.warning("dead-lettering failed, requeueing", alert_id=message.message_id, error=str(error))
                with suppress(Exception):
                    await message.nack(requeue=True)
            return
        async with self._per_alert.hold(alert.alert_id):
            await self._fan_out(alert, message)

    async def _fan_out(self, alert: Alert, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        assert self._redis is not None
        fanned_key = self._keys.delivered(FANNED_OUT, alert.alert_id)
        try:
            if await self._redis.exists(fanned_key):
                log.info("already fanned out, dropping the repeat", alert_id=alert.alert_id)
            else:
                await asyncio.gather(*(self._publish(alert, queue) for queue in self._queues))
                await self._redis.set(fanned_key, "1", ex=self._settings.alert_dedup_ttl_seconds)
                log.info("fanned out", alert_id=alert.alert_id, channels=len(self._queues))
            await message.ack()
        except Exception as exc:  # noqa: BLE001 - broker or Redis trouble: the alert comes back
            log.warning("fan-out failed, requeueing", alert_id=alert.alert_id, error=str(exc))
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
            with suppress(Exception):  # channel gone: the broker requeues it anyway
                await message.nack(requeue=True)

    async def _publish(self, alert: Alert, queue: str) -> None:
        assert self._channel is not None
        message = persistent(alert.body, message_id=alert.alert_id, content_type="application/json")
        await self._channel.default_exchange.publish(message, routing_key=queue, mandatory=True)

    async def _dead_letter(self, message: aio_pika.abc.AbstractIncomingMessage, reason: str) -> None:
        assert self._channel is not None
        headers = {REASON_HEADER: reason}
        await self._channel.default_exchange.publish(
            persistent(message.body, headers=headers, message_id=message.message_id), routing_key=DEAD_LETTER,
            mandatory=True)
        await message.ack()
        DEAD_LETTERED.labels(reason="unreadable_alert").inc()
        log.error("unreadable alert dead-lettered", alert_id=message.message_id, reason=reason)


def build(settings: Settings, name: str | None = None) -> Lookout:
    """The lookout for every channel in `settings.channels`."""
    return Lookout(settings)
