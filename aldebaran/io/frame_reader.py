"""AMQP frames read off the socket at a delivery's price, not a generic frame's.

aiormq 7 reads every frame the same way: a `BytesIO`, an `asyncio.Lock`, three `readexactly`
calls, then pamqp's generic unmarshal, which decodes a method or a content header field by
field through lookups by type name and builds the object with its defaults validated first.
A consumed message is three frames (`Basic.Deliver`, its content header, its body), and a
delivery cost a consumer 29 µs of CPU, about a third of what a 100-event JSON message costs
the engine outside its step; read here, 20 (docs/benchmarks.md, 2026-12-04). `install`
replaces `FrameReceiver.get_frame` in this process with `read_frame`: two reads per frame,
and those three frame kinds decoded here into the very objects pamqp builds (same classes,
same attribute values, unvalidated as pamqp leaves decoded values); every other frame, and
every content header this does not know field for field, goes to pamqp. The first frame of a
connection (`Connection.Start`, where aiormq checks for a protocol header) is read by aiormq.

The lock is not kept: frames are read one call after another, by `connect()` for the rest of
the handshake and then by the connection's one reader task. The method replaced is aiormq
7.2's, known by its source (`aldebaran/io/aiormq_sources.py`): where another release's differs,
`install` keeps aiormq's reader and logs why, rather than drop whatever that release changed.
"""

from __future__ import annotations

import asyncio
import functools
import struct
from typing import Any

import aiormq.connection
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError
from pamqp import commands, decode, frame
from pamqp.body import ContentBody
from pamqp.exceptions import PAMQPException
from pamqp.header import ContentHeader

from aldebaran.io import aiormq_sources

_HEAD = struct.Struct(">BHI")
_DELIVER_TAIL = struct.Struct(">qB")  # delivery tag (signed, as pamqp reads it), the redelivered bit
_HEADER_HEAD = struct.Struct(">HHQH")  # class id, weight, body size, property flags
_METHOD, _HEADER, _BODY, _FRAME_END = 1, 2, 3, 0xCE
_DELIVER_ID = struct.pack(">HH", 60, 60)
_Deliver, _Properties = commands.Basic.Deliver, commands.Basic.Properties

# The content header's properties in wire order, with their flag bits (AMQP 0-9-1 Basic class).
_SHORT, _OCTET, _TABLE, _TIME = range(4)
_FIELDS = (("content_type", 0x8000, _SHORT), ("content_encoding", 0x4000, _SHORT), ("headers", 0x2000, _TABLE),
           ("delivery_mode", 0x1000, _OCTET), ("priority", 0x0800, _OCTET), ("correlation_id", 0x0400, _SHORT),
           ("reply_to", 0x0200, _SHORT), ("expiration", 0x0100, _SHORT), ("message_id", 0x0080, _SHORT),
           ("timestamp", 0x0040, _TIME), ("message_type", 0x0020, _SHORT), ("user_id", 0x0010, _SHORT),
           ("app_id", 0x0008, _SHORT), ("cluster_id", 0x0004, _SHORT))
_DEFAULTS: dict[str, Any] = {name: None for name, _, _ in _FIELDS} | {"cluster_id": ""}  # as `Basic.Properties()`
_KNOWN_FLAGS = sum(bit for _, bit, _ in _FIELDS)
_STANDS_ON = ("FrameReceiver.get_frame",)


def decode_frame(head: bytes, payload: bytes) -> tuple[int, int, Any]:
    """(bytes consumed, channel, frame) of one frame, as `pamqp.frame.unmarshal` answers it:
    `head` its 7 header bytes, `payload` the rest up to and including the frame end octet."""
    kind, channel, size = _HEAD.unpack(head)
    if len(payload) == size + 1 and payload[size] == _FRAME_END:
        if kind == _BODY and size:
            return size + 8, channel, ContentBody(payload[:size])
        try:
            if kind == _METHOD and payload[:4] == _DELIVER_ID:
                known: Any = _deliver(payload, size)
            else:
                known = _content_header(payload, size) if kind == _HEADER else None
        except Exception:  # noqa: BLE001 - whatever this cannot read, pamqp reads or words
            known = None
        if known is not None:
            return size + 8, channel, known
    return frame.unmarshal(head + payload)


def _short(data: bytes, at: int, end: int) -> tuple[str, int] | None:
    """A short string at `at` and the offset after it, or None when it runs past `end`."""
    if at >= end or at + 1 + data[at] > end:
        return None
    after = at + 1 + data[at]
    return data[at + 1:after].decode("utf-8"), after


def _deliver(payload: bytes, size: int) -> commands.Basic.Deliver | None:
    """A `Basic.Deliver` method, or None for pamqp to judge (truncated, or trailing bytes)."""
    tag = _short(payload, 4, size)
    if tag is None or tag[1] + 9 > size:
        return None
    delivery_tag, bits = _DELIVER_TAIL.unpack_from(payload, tag[1])
    exchange = _short(payload, tag[1] + 9, size)
    if exchange is None:
        return None
    routing_key = _short(payload, exchange[1], size)
    if routing_key is None or routing_key[1] != size:
        return None
    deliver = _Deliver.__new__(_Deliver)
    deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered = tag[0], delivery_tag, bool(bits & 1)
    deliver.exchange, deliver.routing_key = exchange[0], routing_key[0]
    return deliver


def _content_header(payload: bytes, size: int) -> ContentHeader | None:
    """A Basic content header, or None for pamqp to judge (another class, a continued flag
    word, reserved bits, or a property that does not fit the frame)."""
    if size < 14:
        return None
    class_id, weight, body_size, flags = _HEADER_HEAD.unpack_from(payload)
    if class_id != 60 or flags & ~_KNOWN_FLAGS:
        return None
    values = dict(_DEFAULTS)
    at = 14
    for name, bit, kind in _FIELDS:
        if not flags & bit:
            continue
        if kind == _SHORT:
            short = _short(payload, at, size)
            if short is None:
                return None
            values[name], at = short
        elif kind == _OCTET:
            if at >= size:
                return None
            values[name], at = payload[at], at + 1
        else:
            consumed, values[name] = (decode.field_table if kind == _TABLE else decode.timestamp)(payload[at:size])
            at += consumed
    if at != size:
        return None
    properties = _Properties.__new__(_Properties)
    for name, value in values.items():
        setattr(properties, name, value)
    header = ContentHeader.__new__(ContentHeader)
    header.class_id, header.weight, header.body_size, header.properties = class_id, weight, body_size, properties
    return header


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, int, Any]:
    """The next frame off `reader`, with the errors aiormq's reader raises for the same failures."""
    try:
        head = await reader.readexactly(7)
        payload = await reader.readexactly(_HEAD.unpack(head)[2] + 1)
    except asyncio.IncompleteReadError as exc:
        raise AMQPConnectionError(f"Server connection unexpectedly closed. Read {len(exc.partial)} bytes but "
                                  f"{exc.expected} bytes expected") from exc
    except ConnectionRefusedError as exc:
        raise AMQPConnectionError(f"Server connection refused: {exc!r}") from exc
    except ConnectionResetError as exc:
        raise AMQPConnectionError(f"Server connection reset: {exc!r}") from exc
    except ConnectionError as exc:
        raise AMQPConnectionError(f"Server connection error: {exc!r}") from exc
    except OSError as exc:
        raise AMQPConnectionError(f"Server communication error: {exc!r}") from exc
    try:
        return decode_frame(head, payload)
    except PAMQPException as exc:
        raise InvalidFrameError(str(exc)) from exc


def install() -> bool:
    """Read frames with `read_frame` on every aiormq connection of this process, after each
    connection's first frame (idempotent); False when aiormq's reader is kept (module docstring)."""
    receiver = aiormq.connection.FrameReceiver
    plain = receiver.get_frame
    if getattr(plain, "_aldebaran_lean", False):
        return True
    if not aiormq_sources.known("frame_reader", _STANDS_ON):
        return False

    @functools.wraps(plain)
    async def get_frame(self: aiormq.connection.FrameReceiver) -> tuple[int, int, Any]:
        if not self.started:
            return await plain(self)
        if self.reader.at_eof():
            del self.reader
            raise StopAsyncIteration
        return await read_frame(self.reader)

    get_frame._aldebaran_lean = True  # type: ignore[attr-defined]
    receiver.get_frame = get_frame  # type: ignore[method-assign]
    return True
