"""Remember which queues were declared recently, so an aggregator declares each once.

Entries expire (a book queue can vanish through `x-expires` after its book closes) and
the cache is bounded (LRU). Concurrent callers for the same queue share one declaration
and return in the order they called.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable


class QueueCache:
    def __init__(self, max_entries: int, lifetime_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: OrderedDict[str, float] = OrderedDict()
        self._lines: dict[str, _Line] = {}
        self._max = max_entries
        self._lifetime = lifetime_seconds
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def fresh(self, name: str) -> bool:
        expires = self._entries.get(name)
        if expires is None:
            return False
        if expires < self._clock():
            del self._entries[name]
            return False
        self._entries.move_to_end(name)
        return True

    def forget(self, name: str) -> None:
        """Drop `name`: a publish found it gone, so the next use declares it again."""
        self._entries.pop(name, None)

    async def ensure(self, name: str, declare: Callable[[str], Awaitable[None]]) -> bool:
        """Declare `name` unless recently declared; True when this call declared it.

        Callers for one name return in the order they called: an aggregator routes an order's
        events in arrival order through here, and a caller that found the queue fresh while
        earlier ones still waited for its declaration overtook them (their wake-up is a loop
        turn later), so a later copy of an event could reach the book first.
        """
        line = self._lines.get(name)
        if line is None:
            if self.fresh(name):
                return False
            line = self._lines[name] = _Line()
        line.callers += 1
        try:
            async with line.lock:  # FIFO, and no newcomer passes a waiter being woken
                if self.fresh(name):
                    return False
                await declare(name)
                self._entries[name] = self._clock() + self._lifetime
                self._entries.move_to_end(name)
                while len(self._entries) > self._max:
                    self._entries.popitem(last=False)
                return True
        finally:
            line.callers -= 1
            if not line.callers:
                del self._lines[name]


class _Line:
    """The callers of `ensure` for one name that have not returned yet, in arrival order."""

    __slots__ = ("callers", "lock")

    def __init__(self) -> None:
        self.callers = 0
        self.lock = asyncio.Lock()
