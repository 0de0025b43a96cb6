"""Which shard a book lives on, and the batch format between the router and the shard workers.

The shard is a *stable* hash of the book key (crc32, not Python's salted `hash`), so every
router process and every restart sends one order to the same shard queue. A shard batch
is a list of segments; a segment is the events of one trade message for one application,
with that message's ingest timestamp (books measure their lifetime on it) and publish
timestamp (latency measurement). Pure: no I/O.
"""

from __future__ import annotations

import zlib

import msgspec

SHARD_BATCH = "application/x-aldebaran-shard-batch"


def shard_of(key: str, shards: int) -> int:
    """The shard of book `key` among `shards` (stable across processes and versions)."""
    return zlib.crc32(key.encode()) % shards


class Segment(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """Events of one trade message for one application, already packed by the rule's codec."""

    app: str
    ingest_ms: int
    published_ms: int  # 0 when the producer did not say
    events: bytes


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[Segment])


def encode_batch(segments: list[Segment]) -> bytes:
    return _encoder.encode(segments)


def decode_batch(body: bytes) -> list[Segment]:
    """Raises msgspec.DecodeError / ValidationError on a body that is not a shard batch."""
    return _decoder.decode(body)
