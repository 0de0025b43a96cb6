"""Deliveries handed to a plain function on the channel reader's own turn.

aiormq 7 starts a task for every delivery to run its consumer coroutine: a Task, aiormq's
wrapper around it, the channel's future-store bookkeeping and a done callback, then a turn of
the loop to run it. A consumer that only files each message for a later cycle (the engine's)
pays more for that than for filing it. `consume_inline` registers a consumer whose callback
is an ordinary function, called as soon as the message's frames are read; the frames, the
message object and the acks are aiormq's own.

The callback must not block. What it raises goes to `on_error`, and the message stays unacked,
as aiormq leaves a failed consumer's message: the owner ends its session, and what it never
acked goes back to the queue with the channel. It is not raised into the reader: a reader that
raises closes its channel from inside itself, waits for a reply only it could read, and takes
the connection down with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import aiormq.abc
from pamqp import commands as spec

Deliver = Callable[[aiormq.abc.DeliveredMessage], None]
_INSTALLED = "_aldebaran_inline_consumers"


async def consume_inline(channel: aiormq.abc.AbstractChannel, queue: str, callback: Deliver,
                         on_error: Callable[[BaseException], None]) -> str:
    """Consume `queue` on `channel` with `callback` called inline; the consumer tag."""
    consumers = _install(channel)
    # Filed before the consume is sent: the broker's first deliveries can be read before the
    # reply to it reaches the caller.
    tag = f"ctag{channel.number}.{uuid.uuid4().hex}"
    consumers[tag] = (callback, on_error)
    try:
        await channel.basic_consume(queue, _never_called, consumer_tag=tag)
    except BaseException:
        del consumers[tag]
        raise
    return tag


async def _never_called(message: aiormq.abc.DeliveredMessage) -> None:
    raise AssertionError("an inline consumer's deliveries never reach aiormq's task per message")


def _install(channel: Any) -> dict[str, tuple[Deliver, Callable[[BaseException], None]]]:
    """The channel's inline consumers, its delivery handler replaced the first time."""
    consumers = getattr(channel, _INSTALLED, None)
    if consumers is not None:
        return consumers
    consumers = {}
    plain = channel._on_deliver_frame
    content_header = channel._Channel__get_content_header  # aiormq 7's private readers
    read_content = channel._read_content

    async def on_deliver_frame(frame: spec.Basic.Deliver) -> None:
        inline = consumers.get(frame.consumer_tag) if frame.consumer_tag in channel.consumers else None
        if inline is None:  # another consumer's, or one cancelled: aiormq's own way
            await plain(frame)
            return
        message = await read_content(frame, await content_header())
        callback, on_error = inline
        try:
            callback(message)
        except Exception as exc:  # noqa: BLE001 - the owner's to handle (module docstring)
            on_error(exc)

    channel._on_deliver_frame = on_deliver_frame
    setattr(channel, _INSTALLED, consumers)
    return consumers
