"""The bench's events: generated once, encoded once, replayed in relabelled rounds.

Generating tens of millions of events would take longer than the runs themselves, so a
base stream is generated once and encoded into batch bodies; round k relabels every
order id (`o123` -> `<letter>123`) inside the encoded msgpack bytes, which keeps the
stream's shape and makes every round's orders (and expected alerts) distinct.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

import msgspec

from aldebaran.io.publisher import Body
from aldebaran.trades.codec import MSGPACK, encode_json, encode_msgpack
from aldebaran.trades.events import TradeEvent
from aldebaran.trades.generator import expected_alerts, generate

LETTERS = [c for c in string.ascii_letters if c != "o"]
# A msgpack fixstr header (0xa0-0xbf) followed by the base prefix `o`: an order or purchase id.
_ID = re.compile(rb"([\xa0-\xbf])o")


@dataclass
class Workload:
    events: list[TradeEvent]
    expected: set[str]
    bodies: list[Body]
    batch: int

    def round_bodies(self, round_index: int) -> list[Body]:
        """The base bodies with every id relabelled for round `round_index` (0 = as generated)."""
        if round_index == 0:
            return self.bodies
        return [self.round_body(round_index, i) for i in range(len(self.bodies))]

    def round_body(self, round_index: int, index: int) -> Body:
        """One body of round `round_index`: relabelling body by body keeps a paced publisher smooth."""
        body = self.bodies[index]
        if round_index == 0:
            return body
        letter = LETTERS[round_index - 1].encode()
        return Body(_ID.sub(rb"\1" + letter, body.data), body.events, body.content_type)

    def round_expected(self, round_index: int) -> set[str]:
        """The alerts of round `round_index`: the base stream's, relabelled."""
        if round_index == 0:
            return set(self.expected)
        letter = LETTERS[round_index - 1]
        return {alert.replace(":o", f":{letter}", 1) for alert in self.expected}

    def rebatched(self, batch: int) -> Workload:
        """The same stream in msgpack bodies of `batch` events (a publisher flushing smaller batches)."""
        events = self.events
        bodies = [Body(encode_msgpack(events[i:i + batch]), len(events[i:i + batch]), MSGPACK)
                  for i in range(0, len(events), batch)]
        return Workload(events, self.expected, bodies, batch)

    @property
    def max_rounds(self) -> int:
        return len(LETTERS) + 1


def build(orders: int, batch: int, seed: int = 2026, over_share: float = 0.35, orphans: float = 0.02) -> Workload:
    """`orders` orders in msgpack batch bodies of `batch` events; `over_share` of them over-purchase."""
    stream = generate(orders=orders, seed=seed, orphans=orphans, over_share=over_share)
    bodies = [Body(encode_msgpack(stream.events[i:i + batch]), len(stream.events[i:i + batch]), MSGPACK)
              for i in range(0, len(stream.events), batch)]
    return Workload(stream.events, stream.expected, bodies, batch)


def prefix(workload: Workload, events: int, batch: int | None = None) -> tuple[list[Body], set[str], int]:
    """The first `events` events as bodies of `batch` (1 = one JSON object per message)."""
    chunk = workload.events[:events]
    size = batch or workload.batch
    if size == 1:
        bodies = [Body(msgspec.json.encode(e.to_wire()), 1) for e in chunk]
    else:
        bodies = [Body(encode_json(chunk[i:i + size]), len(chunk[i:i + size])) for i in range(0, len(chunk), size)]
    return bodies, expected_alerts(chunk), len(chunk)
