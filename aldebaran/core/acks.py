"""Ack bookkeeping for a consumer whose messages finish out of order.

The router acks a trade message only once every shard batch holding its events is
confirmed. Confirms arrive per batch, batches mix messages, so completion is out of
order; AMQP's `multiple` ack wants the highest tag below which *everything* is done.
This tracker gives exactly that, in O(1) amortised per message. Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict


class AckTracker:
    """Counts outstanding holds per delivery tag (tags are added in increasing order)."""

    def __init__(self) -> None:
        self._holds: OrderedDict[int, int] = OrderedDict()
        self.acked = 0  # highest tag reported as ackable

    def __len__(self) -> int:
        return len(self._holds)

    def add(self, tag: int) -> None:
        """A new delivery, held once by its own processing."""
        self._holds[tag] = 1

    def hold(self, tag: int) -> None:
        self._holds[tag] += 1

    def release(self, tag: int) -> int | None:
        """Drop one hold; returns the new highest fully-done tag when it advanced."""
        holds = self._holds
        left = holds[tag] - 1
        holds[tag] = left
        if left or next(iter(holds)) != tag:
            return None
        last = None
        while holds:
            first = next(iter(holds))
            if holds[first]:
                break
            holds.popitem(last=False)
            last = first
        if last is not None:
            self.acked = last
        return last
