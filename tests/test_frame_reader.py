"""`frame_reader`: frames decoded as pamqp decodes them, off a real broker too."""

from __future__ import annotations

import asyncio
import datetime
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import aiormq
import aiormq.abc
import aiormq.connection
import pytest
from aiormq.exceptions import AMQPConnectionError, ConnectionClosed, InvalidFrameError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat
from structlog.testing import capture_logs

from aldebaran.io import aiormq_sources, frame_reader
from tests.support import services
from tests.support.waiting import eventually

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40).filter(
    lambda text: len(text.encode()) <= 255)
exchange_names = st.from_regex(r"[a-zA-Z0-9_.:-]{0,40}", fullmatch=True)
delivers = st.builds(commands.Basic.Deliver, consumer_tag=names, delivery_tag=st.integers(0, 2**63 - 1),
                     redelivered=st.booleans(), exchange=exchange_names, routing_key=names)
field_values = st.one_of(st.integers(-(2**31), 2**31 - 1), st.booleans(), names, st.none())
some = names.filter(bool)  # pamqp sends no property that is empty, so none comes back
properties = st.builds(
    commands.Basic.Properties, content_type=st.none() | some, content_encoding=st.none() | some,
    headers=st.none() | st.dictionaries(st.text("abcdefgh_", min_size=1, max_size=12), field_values, max_size=4),
    delivery_mode=st.none() | st.sampled_from([1, 2]), priority=st.none() | st.integers(1, 9),
    correlation_id=st.none() | some, reply_to=st.none() | some,
    expiration=st.none() | st.from_regex(r"[0-9]{1,8}", fullmatch=True), message_id=st.none() | some,
    timestamp=st.none() | st.integers(0, 2**32 - 1).map(lambda s: datetime.datetime.fromtimestamp(s, datetime.UTC)),
    message_type=st.none() | some, user_id=st.none() | some, app_id=st.none() | some)
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


@contextmanager
def _pamqp_unasked() -> Iterator[None]:
    """Fails what asks pamqp to decode a frame meanwhile: the fast path must answer alone."""
    with mock.patch.object(frame_reader.frame, "unmarshal", side_effect=AssertionError("decoded by pamqp")):
        yield


@given(st.one_of(delivers, headers, bodies), st.integers(1, 2047))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_the_three_frames_of_a_delivery_decode_as_pamqp_decodes_them(value: Any, channel: int) -> None:
    data = frame.marshal(value, channel)
    expected = _outcome(frame.unmarshal, data)
    with _pamqp_unasked():
        ours = _ours(data)
    assert (ours[0], ours[1], _state(ours[2])) == expected
    if isinstance(value, ContentHeader):
        value.class_id = 60  # set by decoding, None in a header built to send
    assert _state(ours[2]) == _state(value)


def _header(flags: int, fields: bytes) -> bytes:
    return frame._marshal(2, 1, struct.pack(">HHQH", 60, 0, 5, flags) + fields)


@pytest.mark.parametrize(("data", "field", "value"), [
    (_header(0x0004, b"\x02c1"), "cluster_id", "c1"),  # pamqp only reads it: its Properties refuse one to send
    (_header(0x000C, b"\x03app\x02c1"), "app_id", "app"),
    (_header(0x0040, struct.pack(">Q", 1_733_000_000_000)), "timestamp",  # milliseconds, as pamqp reads them
     datetime.datetime(2024, 11, 30, 20, 53, 20, tzinfo=datetime.UTC)),
    (_header(0x0040, struct.pack(">Q", 1_733_000_000)), "timestamp",
     datetime.datetime(2024, 11, 30, 20, 53, 20, tzinfo=datetime.UTC))])
def test_header_fields_a_publisher_rarely_sets_are_read_on_the_fast_path(data: bytes, field: str, value: Any) -> None:
    expected = _outcome(frame.unmarshal, data)
    with _pamqp_unasked():
        ours = _ours(data)
    assert (ours[0], ours[1], _state(ours[2])) == expected
    assert getattr(ours[2].properties, field) == value


@pytest.mark.parametrize("data", [_header(0x0001, b"\x00\x00"), _header(0x0002, b""), _header(0x0003, b"\x00\x00"),
                                  frame._marshal(2, 1, struct.pack(">HHQH", 50, 0, 5, 0))])
def test_a_header_this_does_not_know_field_for_field_is_pamqps(data: bytes) -> None:
    """A continued flag word, the reserved bit, another class: pamqp decides what they mean."""
    expected = _outcome(frame.unmarshal, data)
    with mock.patch.object(frame_reader.frame, "unmarshal", wraps=frame.unmarshal) as pamqp:
        assert _outcome(_ours, data) == expected
    assert pamqp.call_count == 1


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


class _Failing:
    """A reader whose socket fails on the first read."""

    def __init__(self, error: OSError) -> None:
        self.error = error

    async def readexactly(self, n: int) -> bytes:
        raise self.error


def _stream(*chunks: bytes, eof: bool = False) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    if eof:
        reader.feed_eof()
    return reader


async def test_read_frame_reads_a_frame_and_words_a_stream_ending_inside_the_next() -> None:
    deliver = commands.Basic.Deliver(consumer_tag="c", delivery_tag=9, exchange="x", routing_key="k")
    reader = _stream(frame.marshal(deliver, 4), frame.marshal(ContentBody(b"body"), 4)[:5], eof=True)
    _consumed, channel, value = await frame_reader.read_frame(reader)  # type: ignore[arg-type]
    assert (channel, value.delivery_tag, value.routing_key) == (4, 9, "k")
    with pytest.raises(AMQPConnectionError, match="Read 5 bytes but 7 bytes expected"):
        await frame_reader.read_frame(reader)  # type: ignore[arg-type]


async def test_read_frame_refuses_a_frame_without_its_end_octet() -> None:
    reader = _stream(frame.marshal(ContentBody(b"abc"), 1)[:-1] + b"\x00")
    with pytest.raises(InvalidFrameError):
        await frame_reader.read_frame(reader)


@pytest.mark.parametrize(("error", "words"), [(ConnectionResetError(104, "reset"), "reset"),
                                              (ConnectionRefusedError(111, "refused"), "refused"),
                                              (BrokenPipeError(32, "pipe"), "error"),
                                              (OSError(5, "io"), "communication error")])
async def test_a_failing_socket_is_a_connection_error_as_aiormq_words_it(error: OSError, words: str) -> None:
    with pytest.raises(AMQPConnectionError, match=words):
        await frame_reader.read_frame(_Failing(error))  # type: ignore[arg-type]


def _aiormqs_reader() -> Any:
    installed = aiormq.connection.FrameReceiver.get_frame
    return getattr(installed, "__wrapped__", installed)  # the suite's own install (tests/conftest.py)


async def test_the_first_frame_is_aiormqs_the_rest_read_here_and_the_end_of_the_stream_ends_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    read = mock.AsyncMock(wraps=frame_reader.read_frame)
    monkeypatch.setattr(frame_reader, "read_frame", read)
    deliver = commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q")
    start = commands.Connection.Start(server_properties={}, mechanisms="PLAIN", locales="en_US")
    receiver = aiormq.connection.FrameReceiver(_stream(frame.marshal(start, 0), frame.marshal(deliver, 1), eof=True))
    assert isinstance((await receiver.get_frame())[2], commands.Connection.Start)
    assert receiver.started and read.await_count == 0
    assert (await receiver.get_frame())[2].routing_key == "q"
    assert read.await_count == 1
    with pytest.raises(StopAsyncIteration):
        await receiver.get_frame()


def test_install_knows_the_aiormq_it_replaces_and_replaces_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails on an aiormq whose reader differs from the one read here: read its change first."""
    plain = _aiormqs_reader()
    assert aiormq_sources.source_digest(plain) == aiormq_sources.KNOWN["FrameReceiver.get_frame"]
    monkeypatch.setattr(aiormq.connection.FrameReceiver, "get_frame", plain)
    assert frame_reader.install()
    installed = aiormq.connection.FrameReceiver.get_frame
    assert installed is not plain and getattr(installed, "_aldebaran_lean", False)
    assert frame_reader.install()
    assert aiormq.connection.FrameReceiver.get_frame is installed


def test_another_aiormqs_reader_is_kept_and_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _aiormqs_reader()
    monkeypatch.setattr(aiormq.connection.FrameReceiver, "get_frame", plain)
    monkeypatch.setitem(aiormq_sources.KNOWN, "FrameReceiver.get_frame", "0" * 16)
    monkeypatch.setattr(aiormq_sources, "_warned", set())
    with capture_logs() as logs:
        assert not frame_reader.install()
    assert aiormq.connection.FrameReceiver.get_frame is plain
    assert [entry["log_level"] for entry in logs] == ["warning"]


@pytest.fixture
async def connection(vhost: services.Vhost) -> AsyncIterator[aiormq.abc.AbstractConnection]:
    assert frame_reader.install()  # these connections read their frames here, not through aiormq's reader
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


async def test_the_broker_closing_the_connection_ends_its_reader(
        vhost: services.Vhost, connection: aiormq.abc.AbstractConnection) -> None:
    """A channel's close is read on; the broker's close of the connection (its vhost deleted)
    ends the reader with the broker's reason."""
    channel = await connection.channel()
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        await channel.basic_publish(b"x", exchange="no-such-exchange", routing_key="x")
        await channel.queue_declare("", exclusive=True)
    fresh = await connection.channel()
    assert (await fresh.queue_declare("", exclusive=True)).queue
    services.delete_vhost(vhost)
    reader: asyncio.Task[Any] = connection._reader_task  # type: ignore[attr-defined]
    await eventually(lambda: reader.done(), lambda: "the reader still runs")
    assert connection.is_closed
    assert isinstance(reader.exception(), ConnectionClosed)
    assert reader.exception().args[0] == 320  # type: ignore[union-attr]
