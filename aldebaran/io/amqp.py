"""RabbitMQ connections for workers: robust (reconnecting), named, heartbeating, masked."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import aio_pika.abc
import aiormq.exceptions

from aldebaran.errors import UnavailableError
from aldebaran.log import get_logger
from aldebaran.metrics import BROKER_RECONNECTS
from aldebaran.settings import Settings, mask_url

log = get_logger("amqp")


async def connect(settings: Settings, name: str, *, robust: bool = True,
                  url: str | None = None) -> aio_pika.abc.AbstractRobustConnection:
    """Connect to the first broker URL that answers; `UnavailableError` if none does."""
    last: BaseException | None = None
    urls = [url] if url else settings.broker_urls
    for candidate in urls:
        try:
            factory = aio_pika.connect_robust if robust else aio_pika.connect
            connection = await factory(
                candidate,
                client_properties={"connection_name": f"aldebaran-{name}"},
                timeout=10,
                heartbeat=30,
            )
        except (OSError, asyncio.TimeoutError, aiormq.exceptions.AMQPError) as exc:
            last = exc
            log.warning("broker unreachable", url=mask_url(candidate), error=mask_url(str(exc) or repr(exc)))
            continue
        if robust:
            connection.reconnect_callbacks.add(lambda *_: _reconnected(name))
        log.debug("connected to broker", url=mask_url(candidate), worker=name)
        return connection  # type: ignore[return-value]
    reason = mask_url(str(last) or repr(last))
    raise UnavailableError(f"cannot connect to RabbitMQ at {', '.join(mask_url(u) for u in urls)}: {reason}")


def _reconnected(name: str) -> None:
    BROKER_RECONNECTS.labels(component=name).inc()
    log.warning("reconnected to broker", worker=name)


def persistent(body: bytes, **properties: Any) -> aio_pika.Message:
    """A persistent message (survives a broker restart on durable queues)."""
    return aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, **properties)
