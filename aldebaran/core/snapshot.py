"""The durable form of a shard's books: full snapshots and per-checkpoint deltas. Pure.

A record carries everything a `Book` needs to continue exactly where it was: the rule
state (a msgspec-encodable dataclass or Struct: the rule's own type), the event ids
already counted, the ingest time it opened at, and whether it is closed. Closed books
are kept only as done markers (key -> expiry, epoch seconds) so late events change
nothing. A delta holds the books changed since the previous checkpoint and the keys
closed meanwhile; a snapshot holds every open book and every live done marker.
"""

from __future__ import annotations

import msgspec


class BookRecord(msgspec.Struct, array_like=True, gc=False):
    app: str
    key: str
    opened_at: float
    seen: list[str]
    state: msgspec.Raw


class DoneMarker(msgspec.Struct, array_like=True, gc=False):
    app: str
    key: str
    expires_at: float


class ShardImage(msgspec.Struct, array_like=True, gc=False):
    """A delta (changed books, newly done) or a snapshot (every open book, every marker)."""

    books: list[BookRecord]
    done: list[DoneMarker]


_encoder = msgspec.msgpack.Encoder()
_image_decoder = msgspec.msgpack.Decoder(ShardImage)


def encode_state(state: object) -> msgspec.Raw:
    return msgspec.Raw(_encoder.encode(state))


def encode_image(image: ShardImage) -> bytes:
    return _encoder.encode(image)


def decode_image(data: bytes) -> ShardImage:
    return _image_decoder.decode(data)
