"""Redis for every process: clients for a plain or a Sentinel URL, replicated writes, key names.

A Sentinel URL (`aldebaran/redis_url.py`) gives clients whose connections ask the
sentinels for the master each time they connect. A command that fails with a
connection error, a timeout or READONLY (a demoted master) is retried on a fresh
connection, so after a failover the retry lands on the new master.

`run_script` / `set_replicated` are the writes a worker acks a broker message on: with
`Settings.redis_replicas_required` > 0 they send `WAIT` behind the write, on the same
connection and in the same round trip, and fail unless enough replicas have it. A retry
after a failover re-sends the write itself (every such write is idempotent), never only
the `WAIT`, which would vouch for nothing on a new master (docs/operations.md, Sentinel).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import hiredis
import redis
import redis.asyncio as aioredis
import redis.sentinel
from redis.asyncio.connection import SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

from aldebaran.errors import UnavailableError
from aldebaran.metrics import REDIS_NOT_REPLICATED
from aldebaran.redis_url import SentinelTarget, is_sentinel_url, parse_sentinel_url
from aldebaran.settings import Settings, mask_url

SENTINEL_TIMEOUT_SECONDS = 1.0  # one sentinel's answer; a dead one must not hold discovery up


class NotReplicated(RedisError):
    """Fewer replicas than required acknowledged a write in time: what it stands for stays unacked."""


@dataclass(frozen=True, slots=True)
class Replicas:
    """How many replicas must hold a write before it counts (0: do not wait), and for how long."""

    count: int = 0
    timeout_ms: int = 2000

    @classmethod
    def of(cls, settings: Settings) -> Replicas:
        return cls(settings.redis_replicas_required, int(settings.redis_replica_ack_timeout_seconds * 1000))


class BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """Master discovery through the sentinels, and callers wait for a free connection."""


class DiscoveringConnection(SentinelManagedConnection):
    """A master connection that asks the sentinels where the master is at every (re)connect.

    redis-py's own class discovers only in `connect()`, which the pool calls when it
    hands a connection out. A command retried after a connection error reconnects
    through `connect_check_health` instead, to the address it had: the dead master,
    until the retries run out, or the old master back as a replica. Measured with
    redis-py 8.1: a commit stalled 13 s after a failover that took 4 s.
    """

    async def connect(self) -> None:
        await self.retry.call_with_retry(self._discover_and_connect, lambda error: asyncio.sleep(0))

    async def _discover_and_connect(self) -> None:
        await self.connect_check_health(check_health=self.connection_pool.check_connection)

    async def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if self.is_connected:
            return
        if self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        # No retry at one address here: the caller's retry comes back through discovery.
        await super().connect_check_health(check_health=check_health, retry_socket_connect=False)


class DiscoveringSSLConnection(DiscoveringConnection, SSLConnection):
    """The same over TLS (`rediss+sentinel://`)."""


LARGE_ARGUMENT = 16 * 1024  # bytes past this go to the socket as they are, never copied into a packed run


class HiredisPacking:
    """Commands packed in C by hiredis, as redis-py's synchronous connection packs them: its
    asyncio connection packs in Python and re-joins its buffer at every argument (486 against
    137 µs for a 256-alert pull-queue enqueue, 1,028 arguments; the same bytes). hiredis copies
    every argument, and slowly past a few tens of kB (180 µs for 256 kB, 4.2 ms for 4 MB): a
    large bytes argument (an engine cycle's log record) is sent as a chunk of its own, uncopied,
    as redis-py sends it."""

    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0]
        if isinstance(name, str):  # a command name of more than one word is sent as separate words
            args = (*name.encode().split(), *args[1:])
        elif isinstance(name, bytes) and b" " in name:
            args = (*name.split(), *args[1:])
        try:
            chunks = [b"*%d\r\n" % len(args)]
            start = 0
            for index, arg in enumerate(args):
                if type(arg) is bytes and len(arg) > LARGE_ARGUMENT:
                    if index > start:
                        chunks.append(_packed_run(args[start:index]))
                    chunks += (b"$%d\r\n" % len(arg), arg, b"\r\n")
                    start = index + 1
            if start < len(args):
                chunks.append(_packed_run(args[start:]))
            return chunks
        except TypeError:  # not str, bytes, int or float: redis-py encodes some (bytearray), refuses the rest
            return super().pack_command(*args)  # type: ignore[misc]


def _packed_run(args: tuple[Any, ...]) -> bytes:
    """Arguments in the protocol, without the count line that opens a command."""
    packed: bytes = hiredis.pack_command(args)
    return packed[packed.index(b"\n") + 1:]


_PACKING: dict[type, type] = {}


def _packing(connection_class: type) -> type:
    """`connection_class` with its commands packed by hiredis (one class per base, made once)."""
    if connection_class not in _PACKING:
        _PACKING[connection_class] = type(f"Hiredis{connection_class.__name__}", (HiredisPacking, connection_class), {})
    return _PACKING[connection_class]


class _SentinelRedis(aioredis.Redis):
    """A master client that also closes its connections to the sentinels."""

    discovery: Sentinel | None = None  # the sentinels that found the master (not the SENTINEL command)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.discovery is not None:
            await self.discovery.aclose()


class _SyncSentinelRedis(redis.Redis):
    """The synchronous twin of `_SentinelRedis`."""

    discovery: redis.sentinel.Sentinel | None = None

    def close(self) -> None:
        super().close()
        for sentinel in self.discovery.sentinels if self.discovery is not None else ():
            sentinel.close()


def client(settings: Settings) -> aioredis.Redis:
    """A client that retries transient failures with jittered backoff (plain or Sentinel URL)."""
    # A blocking pool: thousands of books wait for one of a few connections instead of
    # failing with "Too many connections".
    common: dict[str, Any] = dict(
        max_connections=64,
        timeout=30,
        health_check_interval=15,
        # A WAIT must come back before the socket gives up on it.
        socket_timeout=max(10.0, settings.redis_replica_ack_timeout_seconds + 5),
        socket_connect_timeout=5,
        retry=Retry(ExponentialWithJitterBackoff(cap=2.0, base=0.05), retries=8),
        retry_on_error=[RedisConnectionError, RedisTimeoutError, ReadOnlyError],
    )
    if not is_sentinel_url(settings.redis_url):
        if settings.redis_url.startswith("rediss://") and settings.tls_ca_file:
            common["ssl_ca_certs"] = settings.tls_ca_file
        pool = aioredis.BlockingConnectionPool.from_url(settings.redis_url, **common)
        pool.connection_class = _packing(pool.connection_class)
        return aioredis.Redis.from_pool(pool)
    target = parse_sentinel_url(settings.redis_url)
    sentinel = Sentinel(target.sentinels, sentinel_kwargs=_sentinel_kwargs(target, settings.tls_ca_file, Retry))
    master = sentinel.master_for(target.service_name, redis_class=_SentinelRedis,
                                 connection_pool_class=BlockingSentinelPool,
                                 connection_class=_packing(DiscoveringSSLConnection if target.tls
                                                           else DiscoveringConnection),
                                 **_master_kwargs(target, settings.tls_ca_file), **common)
    master.discovery = sentinel
    return master


def sync_client(url: str, *, timeout: float, tls_ca_file: str | None = None) -> redis.Redis:
    """A short-lived synchronous client (stats, health, the dashboard) that fails fast."""
    common: dict[str, Any] = dict(socket_timeout=timeout, socket_connect_timeout=timeout,
                                  retry=SyncRetry(NoBackoff(), 0))
    if not is_sentinel_url(url):
        if url.startswith("rediss://") and tls_ca_file:
            common["ssl_ca_certs"] = tls_ca_file
        return redis.Redis.from_url(url, **common)
    target = parse_sentinel_url(url)
    sentinel = redis.sentinel.Sentinel(target.sentinels,
                                       sentinel_kwargs=_sentinel_kwargs(target, tls_ca_file, SyncRetry))
    master = sentinel.master_for(target.service_name, redis_class=_SyncSentinelRedis,
                                 **_master_kwargs(target, tls_ca_file), **common)
    master.discovery = sentinel
    return master


def _master_kwargs(target: SentinelTarget, tls_ca_file: str | None) -> dict[str, Any]:
    tls = {"ssl": True, "ssl_ca_certs": tls_ca_file} if target.tls else {}
    return {"db": target.db, "username": target.username, "password": target.password, **tls}


def _sentinel_kwargs(target: SentinelTarget, tls_ca_file: str | None, retry: type) -> dict[str, Any]:
    tls = {"ssl": True, "ssl_ca_certs": tls_ca_file} if target.tls else {}
    return {"socket_timeout": SENTINEL_TIMEOUT_SECONDS, "socket_connect_timeout": SENTINEL_TIMEOUT_SECONDS,
            "retry": retry(NoBackoff(), 0), "username": target.sentinel_username,
            "password": target.sentinel_password, **tls}


def describe(settings: Settings) -> str:
    """The Redis URL for logs and errors: password masked, a Sentinel URL spelled out."""
    if is_sentinel_url(settings.redis_url):
        return parse_sentinel_url(settings.redis_url).describe()
    return mask_url(settings.redis_url)


async def connect(settings: Settings) -> aioredis.Redis:
    """A client that has answered a PING; `UnavailableError` otherwise."""
    redis = client(settings)
    try:
        await redis.ping()
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        await redis.aclose()
        raise UnavailableError(f"cannot connect to Redis at {describe(settings)}: {mask_url(str(exc))}") from None
    return redis


async def run_script(redis: aioredis.Redis, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any],
                     replicas: Replicas) -> Any:
    """Run a Lua script; with replicas required, WAIT for them in the same round trip."""
    if not replicas.count:
        return await script(keys=keys, args=args)
    for attempt in (1, 2):
        async with redis.pipeline(transaction=False) as pipe:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", replicas.count, replicas.timeout_ms)
            result, acked = await pipe.execute(raise_on_error=False)
        if isinstance(result, NoScriptError) and attempt == 1:  # a new master, a flushed script cache
            await redis.script_load(script.script)
            continue
        if isinstance(result, Exception):
            raise result
        check_replicated(acked, replicas)
        return result
    raise AssertionError("unreachable")


async def set_replicated(redis: aioredis.Redis, key: str, value: str, ttl_seconds: int,
                         replicas: Replicas) -> None:
    """SET with a TTL; with replicas required, WAIT for them in the same round trip."""
    if not replicas.count:
        await redis.set(key, value, ex=ttl_seconds)
        return
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(key, value, ex=ttl_seconds)
        pipe.execute_command("WAIT", replicas.count, replicas.timeout_ms)
        _, acked = await pipe.execute()
    check_replicated(acked, replicas)


def wait_replicas(pipe: Any, replicas: Replicas) -> None:
    """Queue a WAIT at the end of a pipeline when replicas are required (its reply comes last)."""
    if replicas.count:
        pipe.execute_command("WAIT", replicas.count, replicas.timeout_ms)


def check_replicated(acked: Any, replicas: Replicas) -> None:
    """Raise `NotReplicated` (and count it) when a WAIT's reply is short of the replicas required."""
    if int(acked) < replicas.count:
        REDIS_NOT_REPLICATED.inc()
        raise NotReplicated(f"{acked} of {replicas.count} Redis replicas acknowledged within "
                            f"{replicas.timeout_ms} ms (redis_min_replicas_acked)")


def as_bytes(value: bytes | str) -> bytes:
    """A reply as bytes: our clients never decode replies, but redis-py's types allow `str`."""
    return value if isinstance(value, bytes) else value.encode()


class Keys:
    """Every Redis key Aldebaran writes, under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def alert(self, alert_id: str) -> str:
        """The alert outbox record: pending (with the payload) or sent."""
        return f"{self.prefix}:alert:{alert_id}"

    def book_done(self, app: str, key: str) -> str:
        """A book that closed or can fire nothing more; later events change nothing."""
        return f"{self.prefix}:book-done:{app}:{key}"

    def pipeline_clock(self) -> str:
        """The per-order mode's pipeline time: each aggregator's watermark and the newest stamp."""
        return f"{self.prefix}:pipeline-clock"

    def delivered(self, channel: str, alert_id: str) -> str:
        """One channel's record that an alert reached its recipient."""
        return f"{self.prefix}:delivered:{channel}:{alert_id}"

    def delivered_attempt(self, attempt: str) -> str:
        """An at-most-once deliverer's attempt (`<worker token>/<n>`) whose sends all arrived."""
        return f"{self.prefix}:delivered-attempt:{attempt}"

    def in_doubt(self, channel: str) -> str:
        """One at-most-once channel's alerts in doubt after an interrupted attempt (a hash)."""
        return f"{self.prefix}:in-doubt:{channel}"

    def recent_alerts(self) -> str:
        return f"{self.prefix}:recent-alerts"

    def engine(self, part: str, partition: int | None = None) -> str:
        """The engine's durable state: `owner` (the lease), `wal`, `done`, `pending` (the outbox),
        `last-op`, `compact-op`; with partitioned engines, each partition's own (`partition`)."""
        scope = "" if partition is None else f"p{partition}:"
        return f"{self.prefix}:engine:{scope}{part}"

    def pull_queue(self, queue: str) -> str:
        """Root of the AweQ-style pull queue's keys."""
        return f"{self.prefix}:pullq:{queue}"
