"""Many publishes in one socket write, each message still confirmed (or returned) on its own.

AMQP 0-9-1 has no batch publish, but a client may put many publishes' frames in one write,
as the RabbitMQ .NET client's `BasicPublishBatch` does. aiormq's `basic_publish` writes and
drains every message on its own: one syscall per message, and one small read per message
for the broker. For the `amqp` channel (one message per alert, CONTRACT §3) that cost 4× the
client's CPU and 2× the broker's per alert (`deploy/testbed/channel_drain.py`, docs/benchmarks.md).

`publish_many` does the bookkeeping `basic_publish` does (a delivery tag per message, the
message-id map a `basic.return` is matched by) under the channel's lock, so it mixes safely
with plain publishes on the same channel. The broker's answers land in one `Confirmations`
per call: a light slot per message in aiormq's confirmation map, and one future for the whole
call (an asyncio future and three callbacks per message were a quarter of the `amqp`
deliverer's CPU). It reaches into aiormq's channel attributes, which is why it lives here
alone and aiormq is pinned to 7.x; the methods it mirrors and replaces are aiormq 7.2's, known
by their source (`aldebaran/io/aiormq_sources.py`): on a release whose differ, each message is
published by aiormq's own `basic_publish`, a task each, its answer landing in the same place.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections import OrderedDict
from collections.abc import Sequence

import aiormq
import aiormq.abc
import aiormq.channel
import pamqp.frame
from aiormq.abc import ChannelFrame
from aiormq.exceptions import ChannelInvalidStateError, DeliveryError
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from aldebaran.io import aiormq_sources

_STANDS_ON = ("Channel.basic_publish", "Channel._on_confirm_frame", "Channel._on_return_frame",
              "Channel._confirm_delivery")
# A content header frame: type, channel, payload size; class id, weight, body size, property flags.
_HEADER = struct.Struct(">BHIHHQH")
_FLAGS = 0x8000 | 0x1000 | 0x0080  # content_type, delivery_mode, message_id
_UNSET = ((None,) * 11, (None,) * 10 + ("",))  # the other properties: none set (pamqp's cluster id is "")


def header_frame(props: spec.Basic.Properties, body_size: int, channel: int) -> bytes:
    """The content header frame pamqp marshals, built by hand when a message carries just a
    content type, a delivery mode and a message id (the alert bus's and the `amqp` channel's):
    pamqp's generic walk over the fourteen properties was half of a publish's client CPU."""
    ctype, mode, mid = props.content_type, props.delivery_mode, props.message_id
    if (type(ctype) is str and type(mode) is int and type(mid) is str and ctype and mid and 0 <= mode < 256
            and (props.content_encoding, props.headers, props.priority, props.correlation_id, props.reply_to,
                 props.expiration, props.timestamp, props.message_type, props.user_id, props.app_id,
                 props.cluster_id) in _UNSET):
        try:
            c, m = ctype.encode(), mid.encode()
        except UnicodeEncodeError:
            c = m = b""  # pamqp raises its own error below
        if 0 < len(c) < 256 and 0 < len(m) < 256:
            head = _HEADER.pack(2, channel, 17 + len(c) + len(m), 60, 0, body_size, _FLAGS)
            return b"".join((head, bytes((len(c),)), c, bytes((mode, len(m))), m, b"\xce"))
    return pamqp.frame.marshal(ContentHeader(properties=props, body_size=body_size), channel)


class Confirmations:
    """The broker's answer to each message of one `publish_many` call, in order.

    `outcomes[i]` is None while message i is unanswered or once it is confirmed (`Basic.Ack`),
    else the failure `basic_publish` would raise: `DeliveryError` for a nack, `PublishError`
    for a return (when the channel raises on returns), the channel's error when it closes.
    """

    def __init__(self, channel: aiormq.Channel, count: int) -> None:
        self.outcomes: list[BaseException | None] = [None] * count
        self.answered = [False] * count
        self._pending = count
        self._channel = channel
        self._plain: list[asyncio.Task[None]] = []  # aiormq's own publishes (`_publish_each`)
        # In the channel's future store: rejected with the channel's error when it closes.
        self._all = channel.create_future()
        if not count:
            self._all.set_result(None)

    async def wait(self, timeout: float | None = None) -> list[BaseException | None]:
        """Every message's outcome; one still unanswered after `timeout` is a `TimeoutError`."""
        try:
            await asyncio.wait_for(asyncio.shield(self._all), timeout)
        except TimeoutError:
            self._fail_unanswered(TimeoutError("no confirm within the timeout"))
            for task in self._plain:
                task.cancel()
        except Exception as exc:  # noqa: BLE001 - the channel closed: what it did not answer failed with it
            self._fail_unanswered(exc)
        return list(self.outcomes)

    def _answer(self, index: int, outcome: BaseException | None) -> None:
        if self.answered[index]:
            return
        self.answered[index] = True
        self.outcomes[index] = outcome
        self._pending -= 1
        if not self._pending and not self._all.done():
            self._all.set_result(None)

    def _fail_unanswered(self, error: BaseException) -> None:
        for index, answered in enumerate(self.answered):
            if not answered:
                self.answered[index] = True
                self.outcomes[index] = error
        self._pending = 0


class _Slot:
    """What aiormq's confirmation map holds for one message: the part of a future it calls."""

    __slots__ = ("_confirmations", "_index", "_message_id", "_tag")

    def __init__(self, confirmations: Confirmations, index: int, message_id: str, tag: int) -> None:
        self._confirmations, self._index, self._message_id, self._tag = confirmations, index, message_id, tag

    def done(self) -> bool:
        return self._confirmations.answered[self._index]

    def cancelled(self) -> bool:
        return self.done()  # answered early (a timeout): a late confirm is logged at debug level

    def set_result(self, result: object) -> None:
        # A returned message arrives here when the channel does not raise on returns.
        self._settle(_outcome(result))

    def set_exception(self, error: BaseException) -> None:
        self._settle(error)

    def _settle(self, outcome: BaseException | None) -> None:
        channel = self._confirmations._channel
        if channel.message_id_delivery_tag.get(self._message_id) == self._tag:
            del channel.message_id_delivery_tag[self._message_id]
        self._confirmations._answer(self._index, outcome)


def _outcome(answer: object) -> BaseException | None:
    """A message's outcome from the broker's answer to it: None for `Basic.Ack`, else the
    `DeliveryError` `basic_publish` raises (a nack, or a return when returns do not raise)."""
    return None if isinstance(answer, spec.Basic.Ack) else DeliveryError(None, answer)  # type: ignore[arg-type]


def _confirm_prefix(channel: aiormq.Channel) -> None:
    """Give `channel` a confirm handler that settles a `multiple` confirm in O(messages settled).

    aiormq's walks the whole confirmation map and schedules one loop callback per settled tag:
    with hundreds of alerts in flight that was ~6 % of the `amqp` deliverer's CPU. The map holds
    tags in publish order, but for a returned message, which aiormq re-inserts at the end as a
    `Returning` marker: those are moved to the front, where the walk passes over the ones the
    confirm does not cover, and stops at the first other tag it does not cover.
    """
    if getattr(channel, "_confirm_prefix", False):
        return
    confirmations = channel.confirmations
    assert isinstance(confirmations, OrderedDict), "aiormq 7 keeps confirms in an OrderedDict"
    for key in [k for k, c in confirmations.items() if isinstance(c, aiormq.channel.Returning)]:
        confirmations.move_to_end(key, last=False)  # returned before this (a plain publish's)
    on_return = channel._on_return_frame

    async def on_return_frame(frame: spec.Basic.Return) -> None:
        await on_return(frame)  # aiormq's: the returned tag, re-inserted last as a Returning marker
        last = next(reversed(confirmations), None)
        if last is not None and isinstance(confirmations[last], aiormq.channel.Returning):
            confirmations.move_to_end(last, last=False)  # the front is right for any marker

    async def on_confirm_frame(frame: spec.Basic.Ack | spec.Basic.Nack | spec.Basic.Reject) -> None:
        tag = frame.delivery_tag
        if tag not in confirmations:
            aiormq.channel.log.error("Unexpected confirmation frame %r from broker", frame)
            return
        if not getattr(frame, "multiple", False):
            channel._confirm_delivery(tag, frame)
            return
        settled = []
        for key, confirmation in confirmations.items():
            if key <= tag:
                settled.append(key)
            elif not isinstance(confirmation, aiormq.channel.Returning):
                break
        for key in settled:
            channel._confirm_delivery(key, frame)

    channel._on_return_frame = on_return_frame  # type: ignore[method-assign]
    channel._on_confirm_frame = on_confirm_frame  # type: ignore[method-assign]
    channel._confirm_prefix = True  # type: ignore[attr-defined]


async def publish_many(channel: aiormq.abc.AbstractChannel, bodies: Sequence[bytes],
                       properties: Sequence[spec.Basic.Properties], *, exchange: str = "",
                       routing_key: str = "", mandatory: bool = True) -> Confirmations:
    """Publish each body with its properties in one write; the broker's answers come in the
    returned `Confirmations` (await its `wait`, with the caller's timeout).

    Messages without a `message_id` get one (returns are matched by it).
    """
    if not isinstance(channel, aiormq.Channel):
        raise TypeError(f"publish_many needs an aiormq channel, not {type(channel).__name__}")
    if not channel.publisher_confirms:
        raise ValueError("publish_many needs a channel in confirm mode")
    if len(bodies) != len(properties):
        raise ValueError("one properties object per body")
    if not aiormq_sources.known("publish_many", _STANDS_ON):
        return _publish_each(channel, bodies, properties, exchange, routing_key, mandatory)
    _confirm_prefix(channel)
    number, limit = channel.number, channel.max_content_size
    publish = pamqp.frame.marshal(spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                     mandatory=mandatory), number)
    confirmations = Confirmations(channel, len(bodies))
    async with channel.lock:  # delivery tags in the order the broker sees the messages
        parts: list[bytes] = []
        tags: list[tuple[str, int]] = []
        try:
            for index, (body, props) in enumerate(zip(bodies, properties, strict=True)):
                if not props.message_id:
                    props.message_id = uuid.uuid4().hex
                parts.append(publish)
                parts.append(header_frame(props, len(body), number))  # raises on a property pamqp refuses
                parts += [pamqp.frame.marshal(ContentBody(body[i:i + limit]), number)
                          for i in range(0, len(body), limit)]
                channel.delivery_tag += 1
                tag = channel.delivery_tag
                channel.confirmations[tag] = _Slot(confirmations, index, props.message_id, tag)  # type: ignore[assignment]
                channel.message_id_delivery_tag[props.message_id] = tag
                tags.append((props.message_id, tag))
            await channel.write_queue.put(ChannelFrame(payload=b"".join(parts), should_close=False))
        except BaseException:  # nothing reached the broker: its tags are free again, as in `basic_publish`
            channel.delivery_tag -= len(tags)
            for message_id, tag in tags:
                channel.confirmations.pop(tag, None)
                if channel.message_id_delivery_tag.get(message_id) == tag:
                    del channel.message_id_delivery_tag[message_id]
            if not confirmations._all.done():
                confirmations._all.cancel()
            raise
    return confirmations


def _publish_each(channel: aiormq.Channel, bodies: Sequence[bytes], properties: Sequence[spec.Basic.Properties],
                  exchange: str, routing_key: str, mandatory: bool) -> Confirmations:
    """`publish_many` by aiormq's own `basic_publish`, one task per message, started in order
    (they take the channel's lock in that order); each one's answer or error is its outcome.
    A closed channel raises here, as the shortcut's lock does: nothing was written."""
    if channel.is_closed:
        raise ChannelInvalidStateError(f"{channel!r} closed")
    confirmations = Confirmations(channel, len(bodies))

    async def publish(index: int, body: bytes, props: spec.Basic.Properties) -> None:
        try:
            answer = await channel.basic_publish(body, exchange=exchange, routing_key=routing_key,
                                                 properties=props, mandatory=mandatory)
        except Exception as exc:  # noqa: BLE001 - a nack, a return, the channel's end: this message's outcome
            confirmations._answer(index, exc)
        else:
            confirmations._answer(index, _outcome(answer))

    confirmations._plain = [asyncio.ensure_future(publish(index, body, props))
                            for index, (body, props) in enumerate(zip(bodies, properties, strict=True))]
    return confirmations
