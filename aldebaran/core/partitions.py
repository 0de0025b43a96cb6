"""Which engine process owns which books, when several share the work. Pure.

With `partitions` engine processes, a book belongs to partition `partition_of(rule's
partition key)`: a stable hash, the same in every process and every release. Every engine
consumes the ingress; it applies the events whose books it owns and hands the others to
their owners (`Routed.foreign`), which apply every event of theirs, from the ingress and
from the other engines alike. An event handed over is never handed on again (its sender
handed it to each of its owners). A handover from an engine partitioned or configured
differently is refused whole (`Partitioning.taken_over`), to be dead-lettered with the
reason, never bounced back.

A rule's partition key must not depend on time: `key(event, at)` may (a client's UTC day),
but two engines stamp an event at different moments, so they could disagree on its book
near midnight. `partition_key(event)` names what the book key is built on (the order, the
client); a rule without it is partitioned by `key(event, 0.0)`, right for identity keys.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from aldebaran.core.rule import Rule, event_filter


def partition_of(key: str, partitions: int) -> int:
    """The partition owning `key`: CRC-32 of its UTF-8 (any id, lone surrogates included)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


def partition_key_of(rule: Rule[Any]) -> Callable[[Any], str]:
    """The rule's time-independent partition key (module docstring)."""
    own = getattr(rule, "partition_key", None)
    if own is not None:
        return own
    key = rule.key
    return lambda event: key(event, 0.0)


@dataclass(slots=True)
class Routed:
    """One message's events sorted by owner: per rule the ones this partition applies, and
    the others per owning partition (each event once per owner)."""

    own: list[list[Any]]
    foreign: dict[int, list[Any]] = field(default_factory=dict)


class Handover(msgspec.Struct, array_like=True, gc=False):
    """Events one engine hands to the owner of their books, as one message."""

    partitions: int
    apps: list[str]
    events: bytes  # the codec's `pack_many`


class Partitioning:
    """This engine's share of the books: partition `index` of `count`."""

    def __init__(self, rules: Sequence[Rule[Any]], index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ValueError(f"partition {index} is not one of 0..{count - 1}")
        self.index, self.count = index, count
        self.apps = [rule.name for rule in rules]
        self._rules = [(event_filter(rule), partition_key_of(rule)) for rule in rules]
        self._codec = rules[0].codec

    def handover(self, events: list[Any]) -> bytes:
        """The body of a handover message holding `events`."""
        return _encode(Handover(self.count, self.apps, self._codec.pack_many(events)))

    def taken_over(self, body: bytes) -> list[Any]:
        """The events of a handover message; ValueError when it is unreadable or its sender
        partitions or runs applications differently."""
        try:
            handover = _decode_handover(body)
            events: list[Any] = self._codec.unpack_many(handover.events)
        except (msgspec.DecodeError, ValueError) as exc:
            raise ValueError(f"unreadable handover from another engine: {exc}") from None
        if handover.partitions != self.count or handover.apps != self.apps:
            raise ValueError(f"handed over by an engine with partitions={handover.partitions} apps={handover.apps}; "
                             f"this one has partitions={self.count} apps={self.apps}: the engines must share "
                             f"[engine] partitions and apps")
        return events

    def route(self, events: Sequence[Any], handed_over: bool) -> Routed:
        """Sort `events` (a message's, in order) by the partition owning each rule's book."""
        routed = Routed([[] for _ in self._rules])
        count, index = self.count, self.index
        foreign = routed.foreign
        for event in events:
            targets: set[int] = set()
            for (accepts, partition_key), own in zip(self._rules, routed.own, strict=True):
                if accepts is not None and not accepts(event):
                    continue
                owner = partition_of(partition_key(event), count)
                if owner == index:
                    own.append(event)
                else:
                    targets.add(owner)
            if handed_over:  # its sender handed it to every other owner: never on again
                continue
            for owner in targets:
                foreign.setdefault(owner, []).append(event)
        return routed


_encode = msgspec.msgpack.Encoder().encode
_decode_handover = msgspec.msgpack.Decoder(Handover).decode
