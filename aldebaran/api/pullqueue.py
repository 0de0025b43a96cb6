"""The AweQ-style pull queue on Redis: at-least-once with a visibility timeout.

Layout under `Keys.pull_queue(name)` (the AweQ document's lists, sorted sets, hashes):
`:ready` (list of keys, FIFO), `:checkouts` (sorted set, key -> visibility deadline in
ms), `:bodies` (hash, key -> JSON {timestamp, message}), `:retries` (hash, key -> times
it came back; no entry until it first does), `:dead` (list of keys received
`max_receive_count` times, never deleted) and `:sent:<dedup id>` (a sender's idempotency
record; its owner may keep it elsewhere: the queue-api channel's is its ledger record). Every step that
touches more than one key is one Lua script, so a crash between two commands (the
document's prototype's gap) cannot lose or duplicate a message.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources

import msgspec
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from aldebaran.io.redis import Keys, Replicas, as_bytes, run_script


def _script(redis: aioredis.Redis, name: str) -> AsyncScript:
    """One of the package's Lua scripts, loaded once per client (EVALSHA afterwards)."""
    return redis.register_script(resources.files("aldebaran.api").joinpath(name).read_text())


class _Body(msgspec.Struct):
    """What `:bodies` holds per key: the enqueue time and the message."""

    timestamp: int
    message: str


_encode_body = msgspec.json.Encoder().encode


def new_keys(count: int) -> list[str]:
    """`count` random (version 4) UUIDs as text, the message keys of one enqueue: from one read
    of the system's entropy and one hex conversion, 1.1 against 3.8 µs each through `uuid.UUID`."""
    entropy = bytearray(os.urandom(16 * count))
    entropy[6::16] = bytes(0x40 | (byte & 0x0F) for byte in entropy[6::16])  # the version
    entropy[8::16] = bytes(0x80 | (byte & 0x3F) for byte in entropy[8::16])  # the RFC 4122 variant
    text = entropy.hex()
    return [f"{text[i:i + 8]}-{text[i + 8:i + 12]}-{text[i + 12:i + 16]}-{text[i + 16:i + 20]}-{text[i + 20:i + 32]}"
            for i in range(0, 32 * count, 32)]


def wall_clock_ms() -> int:
    """Milliseconds since the epoch: deadlines are compared across API processes."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Received:
    key: str
    timestamp: int
    retry_count: int
    message: str


@dataclass(frozen=True, slots=True)
class Stats:
    queue_length: int
    checkouts_count: int
    dead_letter_count: int


class PullQueue:
    """One named pull queue; safe to share between coroutines and processes."""

    RESCUE_BATCH = 1000

    def __init__(self, redis: aioredis.Redis, keys: Keys, name: str, *, checkout_lifetime_seconds: float,
                 max_receive_count: int, dedup_ttl_seconds: int = 7 * 86400,
                 clock: Callable[[], int] = wall_clock_ms, replicas: Replicas = Replicas(),
                 dedup_key: Callable[[str], str] | None = None) -> None:
        root = keys.pull_queue(name)
        # Where a sender's idempotency record for a dedup id lives (`:sent:<id>` unless its owner says).
        self._dedup_key = dedup_key or (lambda dedup_id: f"{root}:sent:{dedup_id}")
        self.name = name
        self._ready, self._checkouts = f"{root}:ready", f"{root}:checkouts"
        self._bodies, self._retries, self._dead = f"{root}:bodies", f"{root}:retries", f"{root}:dead"
        self._redis = redis
        self._lifetime_ms = max(1, int(checkout_lifetime_seconds * 1000))
        self._max_receive = max_receive_count
        self._dedup_ttl = dedup_ttl_seconds
        self._clock = clock
        self._replicas = replicas  # an enqueue is on this many replicas before `send` returns
        self._send_many = _script(redis, "send_many.lua")
        self._receive = _script(redis, "receive.lua")
        self._rescue = _script(redis, "rescue.lua")
        self._delete = _script(redis, "delete.lua")

    async def send(self, message: str, dedup_id: str | None = None) -> tuple[str, bool]:
        """Enqueue; returns (key, created). With `dedup_id`, a repeat returns the first key."""
        [(key, created)] = await self.send_many([(message, dedup_id)])
        return key, created

    async def send_many(self, messages: Sequence[tuple[str, str | None]]) -> list[tuple[str, bool]]:
        """`send` for many (message, dedup id) pairs in one script call, each enqueue as `send`'s."""
        if not messages:
            return []
        keys: list[str] = [self._ready, self._bodies]
        args: list[str | bytes] = [str(self._dedup_ttl)]
        stamp = self._clock()
        fresh = new_keys(len(messages))
        for key, (message, dedup_id) in zip(fresh, messages, strict=True):
            keys.append(self._dedup_key(dedup_id) if dedup_id is not None else self._ready)
            args += [key, _encode_body(_Body(stamp, message)), "1" if dedup_id is not None else "0"]
        flags, *repeats = await run_script(self._redis, self._send_many, keys, args, self._replicas)
        first_keys = iter(repeats)
        return [(key, True) if flag == ord("1") else (_text(next(first_keys)), False)
                for key, flag in zip(fresh, as_bytes(flags), strict=True)]

    async def receive(self, count: int = 1) -> list[Received]:
        """Check out up to `count` messages for one visibility window (oldest first)."""
        await self.rescue()
        raw = await self._receive(keys=[self._ready, self._checkouts, self._bodies, self._retries],
                                  args=[self._clock(), self._lifetime_ms, count])
        out = []
        for i in range(0, len(raw), 3):
            body = json.loads(raw[i + 2])
            out.append(Received(_text(raw[i]), int(body["timestamp"]), int(raw[i + 1]), body["message"]))
        return out

    async def peek(self, start: int, count: int) -> list[str]:
        """The messages at positions `start`.. of the ready list, left where they are: for an
        observer (the bench) that must not do a consumer's work on Redis."""
        keys = await self._redis.lrange(self._ready, start, start + count - 1)
        if not keys:
            return []
        bodies = await self._redis.hmget(self._bodies, keys)
        return [json.loads(body)["message"] for body in bodies if body is not None]

    async def delete(self, key: str) -> bool:
        """Acknowledge a processed message; False if no such message exists."""
        removed = await self._delete(
            keys=[self._ready, self._checkouts, self._bodies, self._retries, self._dead], args=[key])
        return bool(removed)

    async def rescue(self) -> tuple[int, int]:
        """Return expired checkouts to the queue; returns (rescued, dead-lettered)."""
        rescued, dead = await self._rescue(keys=[self._ready, self._checkouts, self._retries, self._dead],
                                           args=[self._clock(), self._max_receive, self.RESCUE_BATCH])
        return int(rescued), int(dead)

    async def stats(self) -> Stats:
        """Lengths read in one MULTI, so they describe one moment."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.llen(self._ready)
            pipe.zcard(self._checkouts)
            pipe.llen(self._dead)
            ready, checkouts, dead = await pipe.execute()
        return Stats(int(ready), int(checkouts), int(dead))

    async def dead_letters(self) -> list[str]:
        """Keys of the messages that exhausted their receives (for operators and tests)."""
        return [_text(k) for k in await self._redis.lrange(self._dead, 0, -1)]

    async def snapshot(self) -> dict[str, list[str]]:
        """Every key by place (ready in order, checkouts by deadline, dead): for checks."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.lrange(self._ready, 0, -1)
            pipe.zrange(self._checkouts, 0, -1)
            pipe.lrange(self._dead, 0, -1)
            ready, checkouts, dead = await pipe.execute()
        return {"ready": [_text(k) for k in ready], "checkouts": [_text(k) for k in checkouts],
                "dead": [_text(k) for k in dead]}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
