"""`amqp`: publish the alert to an exchange on this or another broker, confirmed.

`message_id` is the alert_id (the receiver's idempotency key) and the publish is
mandatory, so an unroutable alert is a failure (retried, then parked), never a silent drop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aio_pika.abc
from aio_pika.exceptions import DeliveryError
from pamqp import commands as spec

from aldebaran.channels.base import Alert, NotDelivered
from aldebaran.io.amqp import connect, persistent
from aldebaran.io.publish_many import publish_many
from aldebaran.settings import AmqpChannel, Settings, mask_url


class AmqpSink:
    targets = ("",)

    def __init__(self, config: AmqpChannel, settings: Settings) -> None:
        self._config, self._settings = config, settings
        self._connection: aio_pika.abc.AbstractRobustConnection | None = None
        self._exchange: aio_pika.abc.AbstractExchange | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._opening = asyncio.Lock()

    async def start(self) -> None:
        return None  # connected on first send: a downstream broker that is down is a retry, not a crash

    async def _open(self) -> aio_pika.abc.AbstractExchange:
        async with self._opening:  # concurrent first sends share one connection
            if self._exchange is None:
                connection = await connect(self._settings, f"channel-{self._config.name}-sink", url=self._config.url)
                try:
                    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                    exchange = (await channel.get_exchange(self._config.exchange, ensure=False)
                                if self._config.exchange else channel.default_exchange)
                except BaseException:
                    await connection.close()
                    raise
                self._connection, self._channel, self._exchange = connection, channel, exchange
            return self._exchange

    async def send(self, alert: Alert, target: str) -> None:
        try:
            exchange = self._exchange or await self._open()
        except Exception as exc:  # noqa: BLE001 - no connection: nothing was published
            raise NotDelivered(f"cannot reach the broker: {type(exc).__name__}: {mask_url(str(exc))}") from None
        message = persistent(alert.body, message_id=alert.alert_id, content_type="application/json")
        try:
            await exchange.publish(message, routing_key=self._config.routing_key, mandatory=True,
                                   timeout=self._config.timeout_seconds)
        except DeliveryError as exc:  # the broker answered: nacked, or returned as unroutable
            raise NotDelivered(f"the broker refused the alert: {exc!r}") from None

    async def send_many(self, alerts: Sequence[Alert], target: str) -> list[BaseException | None]:
        """Many alerts, one message each, written at once and confirmed each on its own
        (`publish_many`: a write and a future per alert cost 4× the CPU)."""
        try:
            if self._exchange is None:
                await self._open()
            assert self._channel is not None
            raw = await self._channel.get_underlay_channel()
            confirmations = await publish_many(
                raw, [alert.body for alert in alerts],
                [spec.Basic.Properties(delivery_mode=2, message_id=alert.alert_id, content_type="application/json")
                 for alert in alerts], exchange=self._config.exchange, routing_key=self._config.routing_key)
        except Exception as exc:  # noqa: BLE001 - no connection, or the write never happened: nothing was published
            return [NotDelivered(f"cannot reach the broker: {type(exc).__name__}: {mask_url(str(exc))}")] * len(alerts)
        return [NotDelivered(f"the broker refused the alert: {outcome!r}") if isinstance(outcome, DeliveryError)
                else outcome for outcome in await confirmations.wait(self._config.timeout_seconds)]

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()


def build(config: AmqpChannel, settings: Settings) -> AmqpSink:
    return AmqpSink(config, settings)
