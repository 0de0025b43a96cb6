"""The aggregator alone, in process, against the real broker: routing edge cases."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions

from aldebaran.apps import load_rules
from aldebaran.metrics import UNROUTABLE
from aldebaran.settings import Settings
from aldebaran.trades.codec import encode_json
from aldebaran.trades.events import Purchase, PurchaseRequest, TradeEvent
from declare.topology import TRADE_DATA, WORK_QUEUE
from tests.support.waiting import eventually
from workers.aggregator import Aggregator
from workers.runtime import Lifecycle


async def _depth(connection: aio_pika.abc.AbstractConnection, queue: str) -> int | None:
    """Messages ready in `queue`, or None when it does not exist."""
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
        return declared.declaration_result.message_count
    except aiormq.exceptions.ChannelNotFoundEntity:
        return None
    finally:
        if not channel.is_closed:
            await channel.close()


async def _until(connection: aio_pika.abc.AbstractConnection, queue: str, count: int, timeout: float = 30) -> None:
    held: list[int | None] = [None]

    async def there() -> bool:
        held[0] = await _depth(connection, queue)
        return held[0] == count

    await eventually(there, lambda: f"{count} messages in {queue} (it holds {held[0]})", timeout, pause=0.1)


async def test_a_book_queue_gone_while_cached_is_declared_again_not_published_into_nowhere(
        settings: Settings) -> None:
    """A cached book queue can vanish (x-expires, a failover to a node that lost it).

    The default exchange drops a message for a missing queue and still confirms it; the
    aggregator publishes mandatory, so the broker returns it instead, and the aggregator
    forgets the queue, declares it again and re-publishes: the event is not lost.
    """
    aggregator = Aggregator(settings, load_rules(settings))
    life = Lifecycle()
    running = asyncio.create_task(aggregator.run(life))
    returned = UNROUTABLE.labels(publisher="aggregator")
    returned_before = returned._value.get()
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        await asyncio.wait_for(life._ready.wait(), timeout=60)
        channel = await connection.channel(publisher_confirms=True)
        trades = await channel.get_exchange(TRADE_DATA)

        async def publish(event: TradeEvent) -> None:
            await trades.publish(aio_pika.Message(encode_json([event]), content_type="application/json"),
                                 routing_key=TRADE_DATA)

        await publish(PurchaseRequest("gone", 100, "c", "s"))
        await _until(connection, "book-gone", 1)
        await _until(connection, WORK_QUEUE, 1)
        await channel.queue_delete("book-gone")  # the aggregator still has it cached

        await publish(Purchase("p1", "gone", 101, "c", "s"))
        await _until(connection, "book-gone", 1)  # declared again, the purchase inside
        await _until(connection, WORK_QUEUE, 2)  # and announced again, so a book consumes it
        assert returned._value.get() > returned_before
        assert await _depth(connection, TRADE_DATA) == 0  # acked once routed
    finally:
        life.stopping.set()
        await asyncio.wait_for(running, timeout=60)
        await connection.close()
