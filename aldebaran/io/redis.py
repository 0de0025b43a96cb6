"""Redis for workers: one async client per process, and the key names in one place."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from aldebaran.errors import UnavailableError
from aldebaran.settings import Settings, mask_url


def client(settings: Settings) -> aioredis.Redis:
    """A client that retries transient failures with jittered backoff."""
    # A blocking pool: thousands of books wait for one of a few connections instead of
    # failing with "Too many connections".
    tls: dict[str, str] = {}
    if settings.redis_url.startswith("rediss://") and settings.tls_ca_file:
        tls["ssl_ca_certs"] = settings.tls_ca_file
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url,
        **tls,
        max_connections=64,
        timeout=30,
        health_check_interval=15,
        socket_timeout=10,
        socket_connect_timeout=5,
        retry=Retry(ExponentialWithJitterBackoff(cap=2.0, base=0.05), retries=8),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    return aioredis.Redis.from_pool(pool)


async def connect(settings: Settings) -> aioredis.Redis:
    """A client that has answered a PING; `UnavailableError` otherwise."""
    redis = client(settings)
    try:
        await redis.ping()
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        await redis.aclose()
        raise UnavailableError(f"cannot connect to Redis at {mask_url(settings.redis_url)}: {exc}") from None
    return redis


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

    def recent_alerts(self) -> str:
        return f"{self.prefix}:recent-alerts"

    def engine(self, part: str) -> str:
        """The engine's durable state: `owner` (the lease), `wal`, `done`, `pending` (the outbox)."""
        return f"{self.prefix}:engine:{part}"

    def pull_queue(self, queue: str) -> str:
        """Root of the AweQ-style pull queue's keys."""
        return f"{self.prefix}:pullq:{queue}"
