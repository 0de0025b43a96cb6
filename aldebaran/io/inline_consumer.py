"""Deliveries handed to a plain function on the channel reader's own turn.

aiormq 7 starts a task for every delivery to run its consumer coroutine: a Task, aiormq's
wrapper around it, the channel's future-store bookkeeping and a done callback, then a turn of
the loop to run it. A consumer that only files each message for a later cycle (the engine's)
pays more for that than for filing it. `consume_inline` registers a consumer whose callback
is an ordinary function, called as soon as the message's frames are read; the frames, the
message object and the acks are aiormq's own.

The callback must not block, and must take any message: the engine's files it and judges its
body in the cycle. What it raises goes to `on_error`, and the message stays unacked, as aiormq
leaves a failed consumer's: the owner ends its session, and what it never acked goes back to the
queue with the channel (a callback that raised on one message every time would end every session
on it). It is not raised into the reader: a reader that raises closes its channel from inside
itself, waits for a reply only it could read, and takes the connection down with it.

The handler replaced and the readers called are aiormq 7.2's, known by their source
(`aldebaran/io/aiormq_sources.py`): on a release whose differ, the consumer is a plain one,
with a task per delivery, and the callback is called from it the same way.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import aiormq.abc
from pamqp import commands as spec

from aldebaran.io import aiormq_sources
from aldebaran.log import get_logger

Deliver = Callable[[aiormq.abc.DeliveredMessage], None]
OnError = Callable[[BaseException], None]
_Inline = tuple[Deliver, OnError, Callable[[aiormq.abc.DeliveredMessage], Any]]  # the callback aiormq holds last
_INSTALLED = "_aldebaran_inline_consumers"
_STANDS_ON = ("Channel._on_deliver_frame", "Channel.__get_content_header", "Channel._read_content")
log = get_logger("amqp")


async def consume_inline(channel: aiormq.abc.AbstractChannel, queue: str, callback: Deliver,
                         on_error: OnError) -> str:
    """Consume `queue` on `channel` with `callback` called inline; the consumer tag."""
    if not aiormq_sources.known("inline_consumer", _STANDS_ON):
        async def deliver(message: aiormq.abc.DeliveredMessage) -> None:
            _hand(callback, on_error, message)

        consumed = await channel.basic_consume(queue, deliver)
        assert consumed.consumer_tag is not None, "the broker names every consumer it starts"
        return consumed.consumer_tag
    consumers = _install(channel)
    # Filed before the consume is sent: the broker's first deliveries can be read before the
    # reply to it reaches the caller.
    tag = f"ctag{channel.number}.{uuid.uuid4().hex}"
    placeholder = _unexpected(on_error)
    consumers[tag] = (callback, on_error, placeholder)
    try:
        await channel.basic_consume(queue, placeholder, consumer_tag=tag)
    except BaseException:
        del consumers[tag]
        raise
    return tag


def _unexpected(on_error: OnError) -> Callable[[aiormq.abc.DeliveredMessage], Any]:
    """The callback aiormq holds for an inline consumer: called only if an aiormq release stopped
    calling the replaced handler, and then the owner hears of it instead of a stalled consumer."""
    async def delivered_the_plain_way(message: aiormq.abc.DeliveredMessage) -> None:
        on_error(RuntimeError("aiormq delivered an inline consumer's message through its task per message"))
    return delivered_the_plain_way


def _install(channel: Any) -> dict[str, _Inline]:
    """The channel's inline consumers, its delivery handler replaced the first time."""
    consumers = getattr(channel, _INSTALLED, None)
    if consumers is not None:
        return consumers
    consumers = {}
    plain = channel._on_deliver_frame
    content_header = channel._Channel__get_content_header  # aiormq 7's private readers
    read_content = channel._read_content

    async def on_deliver_frame(frame: spec.Basic.Deliver) -> None:
        tag = frame.consumer_tag
        inline = consumers.get(tag)
        if inline is not None and channel.consumers.get(tag) is not inline[2]:
            del consumers[tag]  # cancelled, or its tag given since to a plain consumer
            inline = None
        if inline is None:  # aiormq's own way
            await plain(frame)
            return
        message = await read_content(frame, await content_header())
        _hand(inline[0], inline[1], message)

    channel._on_deliver_frame = on_deliver_frame
    setattr(channel, _INSTALLED, consumers)
    return consumers


def _hand(callback: Deliver, on_error: OnError, message: aiormq.abc.DeliveredMessage) -> None:
    """`callback(message)`; what it raises goes to `on_error`, and never further (module docstring)."""
    try:
        callback(message)
    except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - the owner's to handle
        try:
            on_error(exc)
        except Exception:  # never into the reader
            log.exception("an inline consumer's error handler failed", consumer_tag=message.consumer_tag)
