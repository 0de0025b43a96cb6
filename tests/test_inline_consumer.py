"""`consume_inline`: deliveries handed to a plain function on the reader's turn (real RabbitMQ)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiormq
import aiormq.abc
import pytest

from aldebaran.io import aiormq_sources
from aldebaran.io.inline_consumer import consume_inline
from tests.support import services
from tests.support.waiting import eventually


@pytest.fixture
async def connection(vhost: services.Vhost) -> AsyncIterator[aiormq.abc.AbstractConnection]:
    connection = await aiormq.connect(vhost.amqp_url)
    yield connection
    await connection.close()


async def _queue_of(channel: aiormq.abc.AbstractChannel, bodies: list[bytes]) -> str:
    queue = (await channel.queue_declare("", exclusive=True)).queue
    assert queue is not None
    for body in bodies:
        await channel.basic_publish(body, routing_key=queue)
    return queue


def _fail(exc: BaseException) -> None:
    raise AssertionError(f"no callback here raises: {exc!r}")


async def test_messages_waiting_before_the_consume_all_arrive_in_order_without_a_task_each(
        connection: aiormq.abc.AbstractConnection) -> None:
    """The broker sends a waiting queue's first deliveries right behind its reply to the
    consume, often in one read: a consumer filed only once that reply is back lost them."""
    channel = await connection.channel()
    bodies = [f"m{i}".encode() for i in range(300)]
    queue = await _queue_of(channel, bodies)
    got: list[bytes] = []
    tasks: set[asyncio.Task | None] = set()

    def take(message: aiormq.abc.DeliveredMessage) -> None:
        got.append(message.body)
        tasks.add(asyncio.current_task())

    await consume_inline(channel, queue, take, _fail)
    await eventually(lambda: len(got) == len(bodies), lambda: f"{len(got)} of {len(bodies)} delivered")
    assert got == bodies
    assert len(tasks) == 1  # every call on the channel's reader, none in a task of its own


async def test_a_plain_consumer_on_the_same_channel_keeps_aiormqs_way(
        connection: aiormq.abc.AbstractConnection) -> None:
    channel = await connection.channel()
    inline_queue = await _queue_of(channel, [b"a", b"b"])
    plain_queue = await _queue_of(channel, [b"c", b"d"])
    inline: list[bytes] = []
    plain: list[bytes] = []

    async def plain_take(message: aiormq.abc.DeliveredMessage) -> None:
        plain.append(message.body)

    await consume_inline(channel, inline_queue, lambda m: inline.append(m.body), _fail)
    await channel.basic_consume(plain_queue, plain_take)
    await eventually(lambda: len(inline) == 2 and len(plain) == 2, lambda: f"{inline} {plain}")
    assert (inline, plain) == ([b"a", b"b"], [b"c", b"d"])


async def test_a_cancelled_inline_consumers_tag_given_to_a_plain_consumer_goes_the_plain_way(
        connection: aiormq.abc.AbstractConnection) -> None:
    channel = await connection.channel()
    queue = await _queue_of(channel, [])
    inline: list[bytes] = []
    plain: list[bytes] = []

    async def plain_take(message: aiormq.abc.DeliveredMessage) -> None:
        plain.append(message.body)

    tag = await consume_inline(channel, queue, lambda m: inline.append(m.body), _fail)
    await channel.basic_cancel(tag)
    await channel.basic_consume(queue, plain_take, consumer_tag=tag)
    for body in (b"x", b"y"):
        await channel.basic_publish(body, routing_key=queue)
    await eventually(lambda: len(plain) == 2, lambda: f"{plain} (inline: {inline})")
    assert (plain, inline) == ([b"x", b"y"], [])


@pytest.mark.parametrize("error", [RuntimeError("a bug in filing"), asyncio.CancelledError("a bug in filing")])
async def test_a_callback_that_raises_tells_its_owner_and_leaves_the_message_for_the_queue(
        connection: aiormq.abc.AbstractConnection, error: BaseException) -> None:
    channel = await connection.channel()
    await channel.basic_qos(prefetch_count=2)
    queue = (await channel.queue_declare("inline-raises", auto_delete=False)).queue
    assert queue is not None
    for body in (b"poison?", b"fine"):
        await channel.basic_publish(body, routing_key=queue)
    errors: list[BaseException] = []
    fine: list[bytes] = []

    def take(message: aiormq.abc.DeliveredMessage) -> None:
        if message.body == b"poison?":
            raise error
        fine.append(message.body)

    await consume_inline(channel, queue, take, errors.append)
    await eventually(lambda: fine, "the next delivery, the reader alive")
    assert errors == [error]
    await channel.close()  # what the owner does: its unacked messages go back
    other = await connection.channel()
    message = await other.basic_get(queue, no_ack=True)
    assert (message.body, message.delivery.redelivered) == (b"poison?", True)
    await other.queue_delete(queue)


async def test_on_an_aiormq_whose_delivery_handler_differs_the_consumer_is_a_plain_one(
        connection: aiormq.abc.AbstractConnection, monkeypatch: pytest.MonkeyPatch) -> None:
    """aiormq's own way (a task per delivery), the callback and its error handler called alike."""
    monkeypatch.setitem(aiormq_sources.KNOWN, "Channel._on_deliver_frame", "0" * 16)
    channel = await connection.channel()
    bodies = [f"m{i}".encode() for i in range(50)] + [b"poison?"]
    queue = await _queue_of(channel, bodies)
    got: list[bytes] = []
    errors: list[BaseException] = []
    tasks: set[asyncio.Task | None] = set()

    def take(message: aiormq.abc.DeliveredMessage) -> None:
        if message.body == b"poison?":
            raise RuntimeError("a bug in filing")
        got.append(message.body)
        tasks.add(asyncio.current_task())

    tag = await consume_inline(channel, queue, take, errors.append)
    await eventually(lambda: errors, lambda: f"{len(got)} of {len(bodies) - 1} delivered, no error yet")
    assert got == bodies[:-1]
    assert [str(error) for error in errors] == ["a bug in filing"]
    assert len(tasks) > 1  # each delivery in a task of aiormq's
    assert not hasattr(channel, "_aldebaran_inline_consumers")  # the handler left as aiormq has it
    assert tag in channel.consumers
