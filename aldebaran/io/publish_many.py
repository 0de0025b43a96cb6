"""Many publishes in one socket write, each message still confirmed (or returned) on its own.

AMQP 0-9-1 has no batch publish, but a client may put many publishes' frames in one write,
as the RabbitMQ .NET client's `BasicPublishBatch` does. aiormq's `basic_publish` writes and
drains every message on its own: one syscall per message, and one small read per message
for the broker. For the `amqp` channel (one message per alert, CONTRACT §3) that cost 4× the
client's CPU and 2× the broker's per alert (`deploy/testbed/channel_drain.py`, docs/benchmarks.md).

`publish_many` does the bookkeeping `basic_publish` does (a delivery tag and a confirmation
future per message, the message-id map a `basic.return` is matched by) under the channel's
lock, so it mixes safely with plain publishes on the same channel. It reaches into aiormq's
channel attributes, which is why it lives here alone and aiormq is pinned to 7.x.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from functools import partial

import aiormq
import aiormq.abc
import pamqp.frame
from aiormq.abc import ChannelFrame
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader


async def publish_many(channel: aiormq.abc.AbstractChannel, bodies: Sequence[bytes],
                       properties: Sequence[spec.Basic.Properties], *, exchange: str = "",
                       routing_key: str = "", mandatory: bool = True) -> list[asyncio.Future[object]]:
    """Publish each body with its properties in one write; one future per message, in order.

    A future ends with `Basic.Ack`, or raises as `basic_publish` would: `DeliveryError` for a
    nack, `PublishError` for a return (when `mandatory` and the channel raises on returns),
    the channel's error when it closes. The caller awaits them, with its own timeout.
    Messages without a `message_id` get one (returns are matched by it).
    """
    if not isinstance(channel, aiormq.Channel):
        raise TypeError(f"publish_many needs an aiormq channel, not {type(channel).__name__}")
    if not channel.publisher_confirms:
        raise ValueError("publish_many needs a channel in confirm mode")
    if len(bodies) != len(properties):
        raise ValueError("one properties object per body")
    number, limit = channel.number, channel.max_content_size
    publish = pamqp.frame.marshal(spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                     mandatory=mandatory), number)
    futures: list[asyncio.Future[object]] = []
    async with channel.lock:  # delivery tags in the order the broker sees the messages
        parts: list[bytes] = []
        tags: list[tuple[str, int]] = []
        for body, props in zip(bodies, properties, strict=True):
            if not props.message_id:
                props.message_id = uuid.uuid4().hex
            parts.append(publish)
            parts.append(pamqp.frame.marshal(ContentHeader(properties=props, body_size=len(body)), number))
            parts += [pamqp.frame.marshal(ContentBody(body[i:i + limit]), number) for i in range(0, len(body), limit)]
            channel.delivery_tag += 1
            future = channel.create_future()
            channel.confirmations[channel.delivery_tag] = future
            channel.message_id_delivery_tag[props.message_id] = channel.delivery_tag
            tags.append((props.message_id, channel.delivery_tag))
            futures.append(future)
        try:
            await channel.write_queue.put(ChannelFrame(payload=b"".join(parts), should_close=False))
        except BaseException:  # nothing reached the broker: its tags are free again, as in `basic_publish`
            channel.delivery_tag -= len(futures)
            for future, (message_id, tag) in zip(futures, tags, strict=True):
                channel.confirmations.pop(tag, None)
                _forget(channel, message_id, tag)
                future.cancel()
            raise
    for future, (message_id, tag) in zip(futures, tags, strict=True):
        future.add_done_callback(partial(_forget, channel, message_id, tag))
    return futures


def _forget(channel: aiormq.Channel, message_id: str, tag: int, _: object = None) -> None:
    """Drop a settled message from the return map (as `basic_publish` does)."""
    if channel.message_id_delivery_tag.get(message_id) == tag:
        del channel.message_id_delivery_tag[message_id]
