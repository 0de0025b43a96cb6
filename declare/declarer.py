"""Declare the topology on a broker, idempotently, and explain conflicts by name."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import pika
import pika.exceptions

from aldebaran.errors import TopologyConflict, UnavailableError
from aldebaran.settings import Settings, mask_url
from declare.topology import Topology, topology

if TYPE_CHECKING:  # aio-pika is imported where it runs: the blocking declarer does not need it
    import aio_pika.abc


def describe(top: Topology) -> list[str]:
    """One line per declaration, as `--dry-run` prints them."""
    lines = [f"exchange {e.name} ({e.type}, durable)" for e in top.exchanges]
    for q in top.queues:
        args = ", ".join(f"{k}={v}" for k, v in sorted(q.arguments.items()))
        bound = f", bound to {q.bind_to} with key {q.name}" if q.bind_to else ""
        lines.append(f"queue {q.name} (durable{', ' + args if args else ''}{bound})")
    return lines


def open_blocking(url: str) -> pika.BlockingConnection:
    """A pika connection with short timeouts; unreachable brokers raise `UnavailableError`."""
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.blocked_connection_timeout = 30
    try:
        return pika.BlockingConnection(params)
    except pika.exceptions.ProbableAuthenticationError as exc:
        raise UnavailableError(f"RabbitMQ at {mask_url(url)} refused the credentials: {exc}") from None
    except (pika.exceptions.AMQPError, OSError) as exc:
        detail = str(exc) or (repr(exc.args[0]) if exc.args else type(exc).__name__)
        reason = mask_url(detail)
        raise UnavailableError(f"cannot connect to RabbitMQ at {mask_url(url)}: {reason}") from None


def declare(settings: Settings, echo: Callable[[str], None] = print) -> int:
    """Declare everything; returns how many objects were declared."""
    top = topology(settings)
    url = settings.broker_urls[0]
    connection = open_blocking(url)
    try:
        channel = connection.channel()
        for exchange in top.exchanges:
            _guarded(f"exchange {exchange.name}", partial(
                channel.exchange_declare, exchange=exchange.name, exchange_type=exchange.type, durable=True))
        for queue in top.queues:
            _guarded(f"queue {queue.name}", partial(
                channel.queue_declare, queue=queue.name, durable=True, arguments=queue.arguments or None))
            if queue.bind_to:
                channel.queue_bind(queue=queue.name, exchange=queue.bind_to, routing_key=queue.name)
        for line in describe(top):
            echo(f"declared {line}")
        return len(top.exchanges) + len(top.queues)
    finally:
        if connection.is_open:
            connection.close()


def _guarded(what: str, action: Callable[[], object]) -> None:
    """Run one declaration; a 406 (it exists with other arguments) says which one, by name."""
    try:
        action()
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 406:
            raise TopologyConflict(
                f"{what} already exists with different arguments: {exc.reply_text}. "
                "Delete it or align the settings (queue_type, ingress_max_length, ...)."
            ) from None
        raise


async def declare_async(channel: aio_pika.abc.AbstractChannel, settings: Settings) -> None:
    """The same topology from a worker's own aio-pika channel, so no worker needs a hand-made broker."""
    import aio_pika

    top = topology(settings)
    exchanges = {}
    for exchange in top.exchanges:
        exchanges[exchange.name] = await channel.declare_exchange(
            exchange.name, aio_pika.ExchangeType(exchange.type), durable=True)
    for queue in top.queues:
        declared = await channel.declare_queue(queue.name, durable=True, arguments=queue.arguments or None)
        if queue.bind_to:
            await declared.bind(exchanges[queue.bind_to], routing_key=queue.name)
