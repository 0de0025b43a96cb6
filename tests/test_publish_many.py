"""`publish_many`: many publishes in one write, each confirmed, nacked or returned on its own (real RabbitMQ)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiormq
import aiormq.abc
import pytest
from aiormq.exceptions import DeliveryError, PublishError
from pamqp import commands as spec

from aldebaran.io.publish_many import publish_many
from tests.support import services


@pytest.fixture
async def channel(vhost: services.Vhost) -> AsyncIterator[aiormq.abc.AbstractChannel]:
    connection = await aiormq.connect(vhost.amqp_url)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    yield channel
    await connection.close()


def props(n: int) -> list[spec.Basic.Properties]:
    return [spec.Basic.Properties(delivery_mode=2, message_id=f"m-{i}") for i in range(n)]


async def drain(channel: aiormq.abc.AbstractChannel, queue: str) -> list[tuple[str | None, bytes]]:
    got = []
    while (message := await channel.basic_get(queue, no_ack=True)).delivery_tag is not None:
        got.append((message.header.properties.message_id, message.body))
        if not message.delivery.message_count:
            break
    return got


async def test_every_message_arrives_in_order_and_is_confirmed(channel: aiormq.abc.AbstractChannel) -> None:
    await channel.queue_declare("q", durable=True)
    big = bytes(range(256)) * 2000  # 512 kB: split over several body frames
    bodies = [f"alert {i}".encode() for i in range(499)] + [big]
    confirmations = await publish_many(channel, bodies, props(500), routing_key="q")
    assert await confirmations.wait() == [None] * 500  # every message confirmed
    assert all(confirmations.answered)
    assert await drain(channel, "q") == [(f"m-{i}", body) for i, body in enumerate(bodies)]
    assert not channel.message_id_delivery_tag  # nothing left behind for returns


async def test_a_full_queue_nacks_only_what_it_refused(channel: aiormq.abc.AbstractChannel) -> None:
    await channel.queue_declare("small", durable=True, arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
    confirmations = await publish_many(channel, [b"x"] * 10, props(10), routing_key="small")
    outcomes = await confirmations.wait()
    assert [type(c) for c in outcomes] == [type(None)] * 3 + [DeliveryError] * 7
    assert all(isinstance(c, DeliveryError) and isinstance(c.frame, spec.Basic.Nack) for c in outcomes[3:])


async def test_an_unroutable_batch_is_returned_and_later_publishes_still_match(
        channel: aiormq.abc.AbstractChannel) -> None:
    returned = await (await publish_many(channel, [b"x"] * 5, props(5), routing_key="nowhere")).wait()
    assert all(isinstance(r, PublishError) for r in returned)
    await channel.queue_declare("q2", durable=True)
    assert await (await publish_many(channel, [b"y"] * 5, props(5), routing_key="q2")).wait() == [None] * 5
    assert len(await drain(channel, "q2")) == 5
    assert not channel.message_id_delivery_tag  # the returned ones were forgotten too


async def test_mixed_with_plain_publishes_on_one_channel(channel: aiormq.abc.AbstractChannel) -> None:
    await channel.queue_declare("q3", durable=True)

    async def batch(tag: str) -> list[BaseException | None]:
        properties = [spec.Basic.Properties(message_id=f"{tag}-{i}") for i in range(50)]
        return await (await publish_many(channel, [tag.encode()] * 50, properties, routing_key="q3")).wait()

    singles = [channel.basic_publish(b"one", routing_key="q3", properties=spec.Basic.Properties(message_id=f"s-{i}"))
               for i in range(20)]
    results = await asyncio.gather(batch("a"), *singles, batch("b"))
    assert results[0] == results[-1] == [None] * 50
    assert all(isinstance(c, spec.Basic.Ack) for c in results[1:-1])
    ids = [message_id for message_id, _ in await drain(channel, "q3")]
    assert sorted(ids) == sorted([f"a-{i}" for i in range(50)] + [f"b-{i}" for i in range(50)]
                                 + [f"s-{i}" for i in range(20)])
    assert ids.index("a-0") + 49 == ids.index("a-49")  # a batch is one write: its messages stay together


async def test_a_closed_channel_fails_what_it_did_not_answer(vhost: services.Vhost) -> None:
    connection = await aiormq.connect(vhost.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        # An exchange that does not exist: the broker closes the channel instead of answering.
        confirmations = await publish_many(channel, [b"x"] * 3, props(3), exchange="no-such-exchange")
        outcomes = await confirmations.wait(timeout=30)
        assert len(outcomes) == 3 and all(isinstance(o, Exception) and not isinstance(o, TimeoutError)
                                          for o in outcomes)
    finally:
        await connection.close()


async def test_a_confirm_that_never_comes_is_a_timeout(channel: aiormq.abc.AbstractChannel) -> None:
    await channel.queue_declare("q4", durable=True)
    confirmations = await publish_many(channel, [b"z"] * 2, props(2), routing_key="q4")
    outcomes = await confirmations.wait(timeout=0)  # asked before any answer could come
    assert [type(o) for o in outcomes] == [TimeoutError, TimeoutError]
    assert confirmations.answered == [True, True]


async def test_it_refuses_a_channel_without_confirms(vhost: services.Vhost) -> None:
    connection = await aiormq.connect(vhost.amqp_url)
    try:
        plain = await connection.channel(publisher_confirms=False)
        with pytest.raises(ValueError, match="confirm mode"):
            await publish_many(plain, [b"x"], props(1), routing_key="q")
    finally:
        await connection.close()
