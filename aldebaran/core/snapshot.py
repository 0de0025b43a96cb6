"""The durable form of a shard's books: full snapshots and per-checkpoint deltas. Pure.

A record carries everything a `Book` needs to continue exactly where it was: the rule
state (a msgspec-encodable dataclass or Struct: the rule's own type), the event ids
already counted, the ingest time it opened at, and whether it is closed. Closed books
are kept only as done markers (key -> expiry, epoch seconds) so late events change
nothing, written as groups of keys sharing an expiry. A delta holds the books changed
since the previous checkpoint and the keys closed meanwhile; a snapshot holds every open
book and every live done marker.
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
    """One closed key: the form images were written in before `DoneGroup` (still read)."""

    app: str
    key: str
    expires_at: float


class DoneGroup(msgspec.Struct, array_like=True, gc=False):
    """Keys of one application closed together, forgotten together: one array, not one per key."""

    app: str
    expires_at: float
    keys: list[str]


class ShardImage(msgspec.Struct, array_like=True, gc=False):
    """A delta (changed books, newly done) or a snapshot (every open book, every marker)."""

    books: list[BookRecord]
    done: list[DoneMarker]
    groups: list[DoneGroup] = []


_encoder = msgspec.msgpack.Encoder()
_image_decoder = msgspec.msgpack.Decoder(ShardImage)


def encode_state(state: object) -> msgspec.Raw:
    return msgspec.Raw(_encoder.encode(state))


def encode_image(image: ShardImage) -> bytes:
    return _encoder.encode(image)


def decode_image(data: bytes) -> ShardImage:
    return _image_decoder.decode(data)
