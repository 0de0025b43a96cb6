"""The per-order mode's watermark in Redis: aggregators write it, book managers close books on it.

Each aggregator stamps events with pipeline time (`aldebaran.core.pipeline_clock`) and,
every `RECORD_SECONDS`, writes to one Redis hash:

- `wm:<instance>`: its watermark, the pipeline time before which every event it stamped
  is confirmed in its book queue; `seen:<instance>`: Redis's own clock at that write;
- `last`: the newest stamp any aggregator handed out, plus one recording interval (a
  restarted aggregator starts there, so stamps never go back and the downtime adds
  nothing to any book's age).

A book manager reads the stream's watermark: the smallest `wm` among aggregators seen in
the last `watermark_stale_seconds` (Redis's clock, so hosts' clocks never matter). It
never goes back. A paused aggregator (no broker) keeps writing its frozen watermark, so
books wait; a dead one stops writing and drops out; with no aggregator at all the
watermark stands still until one starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import uuid

import redis.asyncio as aioredis
import redis.exceptions

from aldebaran.log import Throttle, get_logger

log = get_logger("watermark")
RECORD_SECONDS = 0.1  # how often an aggregator writes its watermark
POLL_SECONDS = 0.1  # how often a book manager reads the stream's
FORGET_SECONDS = 3600  # an instance silent this long is removed from the hash
REDIS_ERRORS = (redis.exceptions.RedisError, OSError)

# KEYS[1]: the hash. ARGV: instance, watermark, newest stamp + interval, forget_ms.
_RECORD = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[1], 'wm:' .. ARGV[1], ARGV[2], 'seen:' .. ARGV[1], now_ms)
local last = tonumber(redis.call('HGET', KEYS[1], 'last') or '0')
if tonumber(ARGV[3]) > last then redis.call('HSET', KEYS[1], 'last', ARGV[3]) end
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local name = fields[i]
  if string.sub(name, 1, 5) == 'seen:' and now_ms - tonumber(fields[i + 1]) > tonumber(ARGV[4]) then
    local id = string.sub(name, 6)
    redis.call('HDEL', KEYS[1], name, 'wm:' .. id)
  end
end
return now_ms
"""

# KEYS[1]: the hash. ARGV[1]: stale_ms. The smallest fresh watermark, or false.
_READ = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local fields = redis.call('HGETALL', KEYS[1])
local seen, marks = {}, {}
for i = 1, #fields, 2 do
  local name = fields[i]
  if string.sub(name, 1, 5) == 'seen:' then seen[string.sub(name, 6)] = tonumber(fields[i + 1]) end
  if string.sub(name, 1, 3) == 'wm:' then marks[string.sub(name, 4)] = tonumber(fields[i + 1]) end
end
local low = false
for id, mark in pairs(marks) do
  local at = seen[id]
  if at and now_ms - at <= tonumber(ARGV[1]) and (not low or mark < low) then low = mark end
end
return low
"""


async def restart_stamp(redis: aioredis.Redis, key: str) -> int | None:
    """Where a starting aggregator's pipeline time begins (None: the first aggregator ever)."""
    last = await redis.hget(key, "last")
    return int(last) if last is not None else None


class WatermarkWriter:
    """One aggregator's record: `write` it every `RECORD_SECONDS`."""

    def __init__(self, redis: aioredis.Redis, key: str) -> None:
        self._redis = redis
        self._key = key
        self.instance = uuid.uuid4().hex[:12]
        self._throttle = Throttle()

    async def write(self, watermark_ms: int, newest_ms: int) -> bool:
        """Record this aggregator's watermark and newest stamp; False when Redis failed (logged)."""
        promise = newest_ms + int(RECORD_SECONDS * 1000)
        try:
            await self._redis.eval(_RECORD, 1, self._key, self.instance, watermark_ms, promise,
                                   FORGET_SECONDS * 1000)
        except REDIS_ERRORS as exc:
            held = self._throttle.allow("record")
            if held is not None:
                log.warning("cannot record the pipeline watermark; books wait meanwhile", error=str(exc),
                            similar_not_logged=held)
            return False
        return True


class WatermarkReader:
    """The stream's watermark as book managers see it, and books waiting on it."""

    def __init__(self, redis: aioredis.Redis, key: str, stale_seconds: float) -> None:
        self._redis = redis
        self._key = key
        self._stale_ms = int(stale_seconds * 1000)
        self.value: int | None = None  # ms of pipeline time; never goes back
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._throttle = Throttle()

    async def poll(self) -> None:
        """Read the watermark once and release the books it reached."""
        try:
            low = await self._redis.eval(_READ, 1, self._key, self._stale_ms)
        except REDIS_ERRORS as exc:
            held = self._throttle.allow("read")
            if held is not None:
                log.warning("cannot read the pipeline watermark; books wait meanwhile", error=str(exc),
                            similar_not_logged=held)
            return
        if low is not None and (self.value is None or int(low) > self.value):
            self.advance(int(low))

    def advance(self, value: int) -> None:
        """Move the watermark forward (never back) and wake the books it reached."""
        if self.value is not None and value <= self.value:
            return
        self.value = value
        while self._waiters and self._waiters[0][0] <= value:
            future = heapq.heappop(self._waiters)[2]
            if not future.done():
                future.set_result(None)

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=POLL_SECONDS)

    def reached(self, target_ms: int) -> asyncio.Future[None]:
        """A future done once the watermark is at or past `target_ms`."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.value is not None and self.value >= target_ms:
            future.set_result(None)
        else:
            heapq.heappush(self._waiters, (target_ms, next(self._order), future))
        return future
