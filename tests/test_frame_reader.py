"""`frame_reader`: frames decoded as pamqp decodes them, off a real broker too."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from typing import Any

import aiormq
import aiormq.abc
import aiormq.connection
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from aldebaran.io import frame_reader
from tests.support import services
from tests.support.waiting import eventually

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40).filter(
    lambda text: len(text.encode()) <= 255)
exchange_names = st.from_regex(r"[a-zA-Z0-9_.:-]{0,40}", fullmatch=True)
delivers = st.builds(commands.Basic.Deliver, consumer_tag=names, delivery_tag=st.integers(0, 2**63 - 1),
                     redelivered=st.booleans(), exchange=exchange_names, routing_key=names)
field_values = st.one_of(st.integers(-(2**31), 2**31 - 1), st.booleans(), names, st.none())
properties = st.builds(
    commands.Basic.Properties, content_type=st.none() | names, content_encoding=st.none() | names,
    headers=st.none() | st.dictionaries(st.text("abcdefgh_", min_size=1, max_size=12), field_values, max_size=4),
    delivery_mode=st.none() | st.sampled_from([1, 2]), priority=st.none() | st.integers(0, 9),
    correlation_id=st.none() | names, reply_to=st.none() | names,
    expiration=st.none() | st.from_regex(r"[0-9]{1,8}", fullmatch=True), message_id=st.none() | names,
    timestamp=st.none() | st.integers(0, 2**32 - 1).map(lambda s: datetime.datetime.fromtimestamp(s, datetime.UTC)),
    message_type=st.none() | names, user_id=st.none() | names, app_id=st.none() | names)
headers = st.builds(ContentHeader, weight=st.just(0), body_size=st.integers(0, 2**63 - 1), properties=properties)
bodies = st.builds(ContentBody, st.binary(min_size=1, max_size=300))


def _state(value: Any) -> Any:
    """A frame as plain data: its class and every attribute, properties included."""
    slots = getattr(value, "__slots__", None) or list(vars(value))
    return (type(value).__name__, {name: _state(getattr(value, name)) if hasattr(getattr(value, name), "__slots__")
                                   else getattr(value, name) for name in slots if name != "__dict__"})


def _outcome(decode: Any, data: bytes) -> Any:
    """What decoding `data` gives: the frame's state, or the class of what it raised."""
    try:
        consumed, channel, value = decode(data)
    except Exception as exc:  # noqa: BLE001 - the class is the outcome compared
        return type(exc).__name__
    return consumed, channel, _state(value)


def _ours(data: bytes) -> tuple[int, int, Any]:
    return frame_reader.decode_frame(data[:7], data[7:])


@given(st.one_of(delivers, headers, bodies), st.integers(1, 2047))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_the_three_frames_of_a_delivery_decode_as_pamqp_decodes_them(value: Any, channel: int) -> None:
    data = frame.marshal(value, channel)
    assert _outcome(_ours, data) == _outcome(frame.unmarshal, data)
    assert _state(_ours(data)[2]) == _state(value) or isinstance(value, ContentHeader)  # pamqp sets class_id


@given(st.one_of(delivers, headers), st.data())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_a_damaged_frame_gets_pamqps_answer(value: Any, data: st.DataObject) -> None:
    """Truncated, padded or overwritten payloads (the frame's size kept true to its bytes)."""
    payload = bytearray(frame.marshal(value, 1)[7:-1])
    cut = data.draw(st.integers(0, len(payload)))
    payload = payload[:cut] + data.draw(st.binary(max_size=12))
    if payload and data.draw(st.booleans()):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    raw = frame._marshal(1 if isinstance(value, commands.Basic.Deliver) else 2, 1, bytes(payload))
    assert _outcome(_ours, raw) == _outcome(frame.unmarshal, raw)


@pytest.mark.parametrize("value", [Heartbeat(), commands.Basic.Ack(delivery_tag=7, multiple=True),
                                   commands.Channel.CloseOk(), commands.Basic.GetEmpty()])
def test_every_other_frame_is_pamqps(value: Any) -> None:
    data = frame.marshal(value, 0 if isinstance(value, Heartbeat) else 3)
    assert _outcome(_ours, data) == _outcome(frame.unmarshal, data)


def test_a_frame_without_its_end_octet_is_refused_as_pamqp_refuses_it() -> None:
    data = frame.marshal(ContentBody(b"abc"), 1)[:-1] + b"\x00"
    assert _outcome(_ours, data) == _outcome(frame.unmarshal, data) == "UnmarshalingException"


def test_install_replaces_the_reader_once() -> None:
    frame_reader.install()
    installed = aiormq.connection.FrameReceiver.get_frame
    frame_reader.install()
    assert aiormq.connection.FrameReceiver.get_frame is installed
    assert getattr(installed, "_aldebaran_lean", False)


@pytest.fixture
async def connection(vhost: services.Vhost) -> AsyncIterator[aiormq.abc.AbstractConnection]:
    frame_reader.install()
    connection = await aiormq.connect(vhost.amqp_url)
    yield connection
    await connection.close()


async def test_messages_off_a_broker_keep_their_bodies_properties_and_tags(
        connection: aiormq.abc.AbstractConnection) -> None:
    channel = await connection.channel()
    await channel.confirm_delivery()
    queue = (await channel.queue_declare("", exclusive=True)).queue
    assert queue is not None
    sent = [(bytes([i % 256]) * (i * 997 % 300_000 + 1),
             commands.Basic.Properties(content_type="application/json", delivery_mode=2, message_id=f"m{i}",
                                       headers={"published_ms": 1_733_000_000_000 + i, "n": i}))
            for i in range(40)]  # bodies up to 300 kB: several body frames each
    for body, props in sent:
        await channel.basic_publish(body, routing_key=queue, properties=props)
    got: list[aiormq.abc.DeliveredMessage] = []

    async def take(message: aiormq.abc.DeliveredMessage) -> None:
        got.append(message)

    await channel.basic_consume(queue, take)
    await eventually(lambda: len(got) == len(sent), lambda: f"{len(got)} of {len(sent)} delivered")
    assert [m.body for m in got] == [body for body, _ in sent]
    assert [m.header.properties.headers for m in got] == [props.headers for _, props in sent]
    assert [m.header.properties.message_id for m in got] == [f"m{i}" for i in range(40)]
    assert [m.delivery_tag for m in got] == list(range(1, 41))
    assert all(m.routing_key == queue and m.exchange == "" and not m.redelivered for m in got)
    await channel.basic_ack(got[-1].delivery_tag, multiple=True)
    ok = await channel.queue_declare(queue, passive=True)
    assert ok.message_count == 0 and ok.consumer_count == 1


async def test_a_closed_connection_still_ends_its_reader(connection: aiormq.abc.AbstractConnection) -> None:
    """The broker closing the connection (a bad exchange on a channel is only a channel close,
    so the connection is closed by its owner here) leaves no reader running."""
    channel = await connection.channel()
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        await channel.basic_publish(b"x", exchange="no-such-exchange", routing_key="x")
        await channel.queue_declare("", exclusive=True)
    fresh = await connection.channel()  # the connection reads on after a channel's close
    assert (await fresh.queue_declare("", exclusive=True)).queue
    await connection.close()
    await eventually(lambda: connection.is_closed, lambda: "connection still open")
    await asyncio.sleep(0)
