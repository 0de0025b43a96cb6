"""Natural batching: a batch leaves at once when nothing is in flight, and grows while something is. Pure.

A fixed linger adds its delay to every item at low load and still splits a surge into
many small batches. Here a batch leaves as soon as fewer than `max_in_flight` batches
are awaiting their completion (a confirm, a Redis reply): at low load that is at once,
one round trip of latency; under load the items that arrive during a round trip form
the next batch, so batches grow with the load and no knob needs tuning. A batch that
reaches `max_items` may leave early, up to `max_in_flight + 1` in flight. Items leave in
the order they were added.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class NaturalBatcher(Generic[T]):
    """The pending items and the batches in flight; the caller sends and reports completions."""

    def __init__(self, max_items: int, max_in_flight: int = 1) -> None:
        if max_items < 1 or max_in_flight < 1:
            raise ValueError("max_items and max_in_flight must be at least 1")
        self.max_items = max_items
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self._pending: deque[T] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, item: T) -> None:
        self._pending.append(item)

    @property
    def ready(self) -> bool:
        """Whether `take` would hand out a batch now."""
        if not self._pending:
            return False
        if self.in_flight < self.max_in_flight:
            return True
        return len(self._pending) >= self.max_items and self.in_flight <= self.max_in_flight

    def take(self) -> list[T]:
        """The next batch (oldest items first), now counted in flight; [] when none may leave."""
        if not self.ready:
            return []
        pending = self._pending
        size = min(len(pending), self.max_items)
        batch = [pending.popleft() for _ in range(size)]
        self.in_flight += 1
        return batch

    def done(self) -> None:
        """A batch handed out by `take` completed."""
        if self.in_flight <= 0:
            raise RuntimeError("done() without a batch in flight")
        self.in_flight -= 1
