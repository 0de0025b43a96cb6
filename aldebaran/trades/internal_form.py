"""The compact form trade events take inside Aldebaran: book queues and engine handovers.

It is the event's own msgpack form (the public field names, a request without
`initial_order_id`). Until 2026-12-02 each event was tagged with its class instead
(`"type": "request"` or `"purchase"`, fields `shares` and `order_id`); messages in that form
may still wait in book queues and handovers when an upgraded worker starts, so both are read.
"""

from __future__ import annotations

from typing import Any

import msgspec

from aldebaran.trades.events import TradeEvent


class _TaggedRequest(msgspec.Struct, frozen=True, gc=False, tag="request"):
    id: str
    shares: int
    client: str
    stock: str


class _TaggedPurchase(msgspec.Struct, frozen=True, gc=False, tag="purchase"):
    id: str
    order_id: str
    shares: int
    client: str
    stock: str


_Tagged = _TaggedRequest | _TaggedPurchase
_encoder = msgspec.msgpack.Encoder()
_one = msgspec.msgpack.Decoder(TradeEvent)
_many = msgspec.msgpack.Decoder(list[TradeEvent])
_tagged_one = msgspec.msgpack.Decoder(_Tagged)
_tagged_many = msgspec.msgpack.Decoder(list[_Tagged])


def _untagged(old: _Tagged) -> TradeEvent:
    if isinstance(old, _TaggedRequest):
        return TradeEvent(old.id, old.shares, old.client, old.stock)
    return TradeEvent(old.id, old.shares, old.client, old.stock, old.order_id)


def pack(event: TradeEvent) -> bytes:
    return _encoder.encode(event)


def pack_many(events: list[TradeEvent]) -> bytes:
    return _encoder.encode(events)


def unpack(data: bytes) -> TradeEvent:
    """One packed event, in either form; msgspec.DecodeError (a ValueError) when neither."""
    try:
        return _one.decode(data)
    except msgspec.ValidationError as error:
        return _untagged(_tagged(error, _tagged_one, data))


def unpack_many(data: bytes) -> list[TradeEvent]:
    """Packed events, in either form; msgspec.DecodeError (a ValueError) when neither."""
    try:
        return _many.decode(data)
    except msgspec.ValidationError as error:
        return [_untagged(old) for old in _tagged(error, _tagged_many, data)]


def _tagged(error: msgspec.ValidationError, decoder: msgspec.msgpack.Decoder[Any], data: bytes) -> Any:
    """`data` in the tagged form; when it is not, an error naming what the current form found
    wrong (a dead letter's reason) and then the tagged form's complaint."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as old:
        raise msgspec.ValidationError(f"{error} (nor the tagged form of earlier workers: {old})") from None
