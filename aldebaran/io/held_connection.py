"""One connection of a client's pool, held by one caller whose scripts sit on its critical path.

The engine sends each cycle's log record to Redis before it applies the cycle's books, so that
Redis appends it meanwhile (workers/engine_session.py, `_log`). Through the client, a request
first goes through the pool, the retry loop and the observability hooks, and then waits for a
task of its own (on Python 3.11 redis-py writes under `asyncio.wait_for`): in a paced engine the
1000-event message's record held its books back 0.21–0.22 ms at the median and 0.57–0.62 at the
99th percentile. Held here, the request is written to the socket in the caller's own turn (0.14
and 0.49 ms: what is left is mostly the record's copy to the socket and the wake-up of Redis),
and the reply is read on the same connection; the engine at 1,000 100-event messages a second
spends 8–11 % less CPU.

Anything out of the ordinary (a dropped connection, a timeout, a new master without the script,
a demoted master) drops the held connection and runs the script once more through the client,
which retries as every other write does (`aldebaran/io/redis.py`); the next request takes a
fresh connection from the pool. A script run this way must therefore be idempotent, as every
retried write here is. A script's own error (a fenced engine) is raised as it is. Closing the
client closes the held connection with the rest of its pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from aldebaran.log import get_logger

log = get_logger("redis")

# What the client's retrying path handles better than a held connection can.
_HAND_BACK = (RedisConnectionError, RedisTimeoutError, OSError, NoScriptError, ReadOnlyError)


class HeldConnection:
    """Scripts of one caller on a connection of its own; one request at a time."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._connection: AbstractConnection | None = None
        self._lock = asyncio.Lock()  # uncontended, taking it does not yield
        self.handed_back = 0  # requests the client ran instead (for tests and logs)

    async def run_script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """`script(keys, args)`, its request written before the first await that waits."""
        async with self._lock:
            try:
                connection = self._connection or await self._take()
                if send_now(connection, connection.pack_command("EVALSHA", script.sha, len(keys), *keys, *args)):
                    await connection.send_packed_command([], check_health=False)  # the client's send drains the rest
                return await connection.read_response()
            except _HAND_BACK as exc:
                await self._drop()
                self.handed_back += 1
                log.debug("held Redis connection handed a request back to the client", error=repr(exc))
        return await script(keys=keys, args=args)

    async def _take(self) -> AbstractConnection:
        connection: AbstractConnection = await self.redis.connection_pool.get_connection()
        self._connection = connection
        return connection

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            await connection.disconnect(nowait=True)
        finally:
            await self.redis.connection_pool.release(connection)


def send_now(connection: AbstractConnection, command: list[bytes]) -> int:
    """Write a packed command to the connection's socket in this turn of the loop; the bytes the
    transport still holds after it (the socket's buffer was full), 0 as a rule.

    redis-py's connections keep their stream writer as `_writer` (7.x and 8.x), the one place
    this module reaches into them; the write is synchronous there, as in every asyncio stream.
    Not connected, `ConnectionError`."""
    writer = getattr(connection, "_writer", None)
    if writer is None or writer.transport.is_closing():
        raise RedisConnectionError("the held Redis connection is not connected")
    writer.writelines(command)
    return int(writer.transport.get_write_buffer_size())
