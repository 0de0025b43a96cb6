"""The bench's events: generated once, encoded once, replayed in relabelled rounds.

Generating tens of millions of events would take longer than the runs themselves, so a
base stream is generated once and encoded into batch bodies; round k relabels every
order id (`o123` -> `<letter>123`) inside the encoded msgpack bytes, which keeps the
stream's shape and makes every round's orders (and expected alerts) distinct.
"""

from __future__ import annotations

import re
import string
from bisect import bisect_left
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

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

    def round_expected(self, round_index: int, bodies: int | None = None) -> set[str]:
        """The alerts of round `round_index`, or of only its first `bodies` bodies (a cut round)."""
        end = len(self.bodies) if bodies is None else min(bodies, len(self.bodies))
        return self.range_expected(round_index, 0, end)

    def range_expected(self, round_index: int, start: int, end: int) -> set[str]:
        """The alerts of bodies [start, end) of round `round_index` published alone: exact when no
        order straddles `start` (a clean boundary) and the bodies after `end` are never published."""
        if (start, end) == (0, len(self.bodies)):
            alerts = self.expected
        else:
            alerts = expected_alerts(self.events[self.offsets[start]:self.offsets[end]])
        if round_index == 0:
            return set(alerts)
        letter = LETTERS[round_index - 1]
        return {alert.replace(":o", f":{letter}", 1) for alert in alerts}

    @cached_property
    def offsets(self) -> list[int]:
        """Events before each body boundary: boundary i lies before body i."""
        return list(accumulate((body.events for body in self.bodies), initial=0))

    @cached_property
    def clean(self) -> list[int]:
        """The body boundaries no order straddles, ascending: a publisher may pause there
        without leaving any order's book waiting for events that come a pause later."""
        return clean_boundaries(self.events, self.offsets)

    def next_clean(self, index: int) -> int:
        """The first clean boundary at or after `index` (the round's end at the latest)."""
        return self.clean[bisect_left(self.clean, index)]

    @property
    def max_rounds(self) -> int:
        return len(LETTERS) + 1


def clean_boundaries(events: list[TradeEvent], offsets: list[int]) -> list[int]:
    """Boundaries i (before body i, `offsets[i]` events in) such that no order has events in
    bodies both before and after i; 0 and the last are always clean. O(events): each order's
    first and last body, then a difference array of the boundaries it straddles."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for body in range(len(offsets) - 1):
        for event in events[offsets[body]:offsets[body + 1]]:
            first.setdefault(event.order_id, body)
            last[event.order_id] = body
    straddling = [0] * len(offsets)
    for order, begin in first.items():
        if last[order] > begin:
            straddling[begin + 1] += 1
            straddling[last[order] + 1] -= 1
    return [boundary for boundary, open_orders in enumerate(accumulate(straddling)) if open_orders == 0]


def build(orders: int, batch: int, seed: int = 2026) -> Workload:
    stream = generate(orders=orders, seed=seed, orphans=0.02)
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
