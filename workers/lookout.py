"""The Fire Lookout: fans every alert out to each configured channel's queue, in batches.

Whatever has been delivered on `Aldebaran.Alert` (up to `BATCH` messages, each one alert or
a batch of them: CONTRACT §3) is handled at once: each channel queue gets the batch's alerts
as one batch message (a JSON array under a `batch:` id, a lone alert as itself; at most 1000
alerts a message) published on a confirm channel, and one `multiple` ack settles the batch.
An alert is acked only after every channel queue's confirm, so a crash in between re-fans it.
Copies of one alert inside a batch fan out once; copies across batches (an engine's re-publish
after a crash, a re-fan) are filtered where the design document puts it, in each Channel Boy:
its ledger (`aldebaran/channels/ledger.py`), or the queue-api channel's keyed enqueue, knows
what its recipients already have. The lookout keeps no state: Redis is not on its path.
Batches never overlap, so the multiple-ack covers exactly one batch.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

import aio_pika
import aio_pika.abc

from aldebaran.channels.base import Alert, read_alerts
from aldebaran.io.alert_bus import publish_alerts
from aldebaran.io.amqp import connect as connect_amqp
from aldebaran.io.dead_letter import dead_letter
from aldebaran.log import get_logger
from aldebaran.settings import Settings
from declare.topology import ALERT, DEAD_LETTER, channel_queue, topology
from workers.runtime import Lifecycle

PREFETCH = 1024  # room for the next batch to arrive while one is handled
BATCH = 512
RETRY_PAUSE_SECONDS = 1.0

log = get_logger("lookout")


class Lookout:
    name = "lookout"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._queues = [channel_queue(c.name) for c in settings.channels]
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._delivered: list[aio_pika.abc.AbstractIncomingMessage] = []
        self._arrived = asyncio.Event()

    async def run(self, life: Lifecycle) -> None:
        connection = await connect_amqp(self._settings, self.name)
        drainer: asyncio.Task[None] | None = None
        try:
            self._channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await self._channel.set_qos(prefetch_count=PREFETCH)
            queue = await self._declare(self._channel)

            # Consumed through aio-pika, whose robust connection re-subscribes after a reconnect.
            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                self._delivered.append(message)
                self._arrived.set()

            stopping = asyncio.Event()
            drainer = asyncio.create_task(self._drain(stopping))
            tag = await queue.consume(on_message)
            if not self._queues:
                log.warning("no channels configured: alerts are consumed and go nowhere")
            log.info("fanning out", channels=[c.name for c in self._settings.channels])
            life.ready()
            await life.wait_stopping()
            await queue.cancel(tag)
            stopping.set()  # the drainer finishes what was delivered, then returns
            self._arrived.set()
            await drainer
        finally:
            if drainer is not None and not drainer.done():
                drainer.cancel()
            await connection.close()

    async def _drain(self, stopping: asyncio.Event) -> None:
        """Handle the delivered alerts batch after batch, until stopping with nothing left."""
        while True:
            if not self._delivered:
                if stopping.is_set():
                    return
                self._arrived.clear()
                await self._arrived.wait()
                continue
            batch = self._delivered[:BATCH]
            del self._delivered[:BATCH]
            await self._handle_batch(batch)

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

    async def _handle_batch(self, batch: list[aio_pika.abc.AbstractIncomingMessage]) -> None:
        """Fan out a batch (each alert in it once), then settle every delivery of it with one ack.

        The ack goes out on the channel the last delivery came on: after a reconnect the
        batch's earlier deliveries from the old channel are requeued by the broker anyway,
        and every delivery of the new channel before it is in this batch or settled.
        """
        assert self._channel is not None
        alerts: dict[str, Alert] = {}  # alert_id -> its first copy in the batch
        try:
            # aiormq underneath aio-pika for the publishes (taken per batch: a reconnect
            # replaces it): an aio-pika Message per publish cost more than the publish.
            out = await self._channel.get_underlay_channel()
            unreadable: list[tuple[bytes, str | None, str]] = []
            received = 0
            for message in batch:
                received += _read(message.body, message.message_id, alerts, unreadable)
            await asyncio.gather(*(dead_letter(out, body, reason, ALERT, message_id)
                                   for body, message_id, reason in unreadable))
            if unreadable:
                log.error("unreadable alerts dead-lettered", count=len(unreadable),
                          reasons=sorted({reason for _, _, reason in unreadable})[:5])
            if alerts:
                ids, bodies = list(alerts), [alert.body for alert in alerts.values()]
                await asyncio.gather(*(publish_alerts(out, ids, bodies, exchange="", routing_key=queue)
                                       for queue in self._queues))
                log.debug("fanned out", count=len(ids), copies=received - len(ids), channels=len(self._queues),
                          alert_ids=ids[:20])
            await batch[-1].ack(multiple=True)
        except Exception as exc:  # noqa: BLE001 - broker or Redis trouble: the batch comes back
            log.warning("fan-out failed, requeueing", alert_ids=list(alerts)[:20], count=len(batch),
                        error=str(exc) or repr(exc))
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
            with suppress(Exception):  # channel gone: the broker requeues them anyway
                await batch[-1].nack(multiple=True, requeue=True)


def _read(body: bytes, message_id: str | None, alerts: dict[str, Alert],
          unreadable: list[tuple[bytes, str | None, str]]) -> int:
    """Add the alerts of one message to `alerts` (first copy wins) and its unreadable parts
    to `unreadable`; returns how many alerts it held."""
    found, bad = read_alerts(body, message_id)
    for alert in found:
        alerts.setdefault(alert.alert_id, alert)
    unreadable += [(raw, message_id, reason) for raw, reason in bad]
    return len(found)


def build(settings: Settings, name: str | None = None) -> Lookout:
    """The lookout for every channel in `settings.channels`."""
    return Lookout(settings)
