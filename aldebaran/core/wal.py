"""The engine's write-ahead log: what one cycle consumed, as it came, plus its closing clock. Pure.

A cycle's record is its pipeline-time stamp and the raw bodies of the ingress messages
it applied. A cycle first closes the books whose deadline is before its stamp, then
applies its messages at that stamp, so the stamp is also its closing clock. Raw bodies
cost nothing to write (no book state re-encoded per event), and replaying the records
in order through an `Engine` rebuilds exactly the books and done markers a crash lost:
verdicts depend only on the events, their stamps and the closing times. Closing between
cycles (an idle engine's tick) is not logged: the next record closes the same books.

The log is trimmed at compaction: a record whose newest stamp is at least the longest
ttl older than the closing clock holds only events of books that are closed by then
(their keys live on in the done-marker snapshot written in the same transaction).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import msgspec

from aldebaran.core.done_markers import DoneGroup


class WalMessage(msgspec.Struct, array_like=True, gc=False):
    content_type: str  # "" when the message had none
    body: bytes
    handed_over: bool = False  # a handover from another partition's engine (not the ingress)


class WalRecord(msgspec.Struct, array_like=True, gc=False):
    """One committed cycle: its pipeline time (ms) and its messages in consumption order."""

    stamp_ms: int
    messages: list[WalMessage]


class DoneImage(msgspec.Struct, array_like=True, gc=False):
    """The done markers at a compaction, and the pipeline time they were taken at."""

    clock_ms: int
    groups: list[DoneGroup]


_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(WalRecord)
_done_decoder = msgspec.msgpack.Decoder(DoneImage)
_group_decoder = msgspec.msgpack.Decoder(DoneGroup)


def encode_record(record: WalRecord) -> bytes:
    return _encoder.encode(record)


def decode_record(data: bytes) -> WalRecord:
    return _record_decoder.decode(data)


def encode_done(image: DoneImage) -> bytes:
    return _encoder.encode(image)


def decode_done(data: bytes) -> DoneImage:
    return _done_decoder.decode(data)


def encode_group(group: DoneGroup) -> bytes:
    return _encoder.encode(group)


def image_of(clock_ms: int, groups: Iterable[bytes]) -> DoneImage:
    """The image stored group by group (one hash field each), in the order they were made."""
    return DoneImage(clock_ms, sorted((_group_decoder.decode(data) for data in groups), key=lambda g: g.seq))


class WalIndex:
    """The newest stamp of every record in the log, oldest first: what a compaction may trim."""

    def __init__(self, newest_stamps: Sequence[int] = ()) -> None:
        self._stamps: deque[int] = deque(newest_stamps)

    def __len__(self) -> int:
        return len(self._stamps)

    def appended(self, newest_stamp_ms: int) -> None:
        self._stamps.append(newest_stamp_ms)

    def trimmable(self, closed_before_ms: int, longest_ttl_ms: int) -> int:
        """How many records at the head hold only events of books closed once every deadline
        before `closed_before_ms` has passed (a book opened at s closes at s + ttl)."""
        cutoff = closed_before_ms - longest_ttl_ms
        count = 0
        for stamp in self._stamps:
            if stamp >= cutoff:
                break
            count += 1
        return count

    def trimmed(self, count: int) -> None:
        for _ in range(count):
            self._stamps.popleft()
