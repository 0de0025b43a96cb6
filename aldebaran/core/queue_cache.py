"""Remember which queues were declared recently, so an aggregator declares each once.

Entries expire (a book queue can vanish through `x-expires` after its book closes) and
the cache is bounded (LRU). Concurrent callers for the same queue share one declaration.
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
        self._inflight: dict[str, asyncio.Future[bool]] = {}
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
        """Declare `name` unless recently declared; True when this call declared it."""
        if self.fresh(name):
            return False
        pending = self._inflight.get(name)
        if pending is not None:
            await asyncio.shield(pending)
            return False
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._inflight[name] = future
        try:
            await declare(name)
            self._entries[name] = self._clock() + self._lifetime
            self._entries.move_to_end(name)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
            future.set_result(True)
            return True
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._inflight[name]
