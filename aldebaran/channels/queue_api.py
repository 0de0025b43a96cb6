"""`queue-api`: put the alert JSON in the pull API's queue for HTTP consumers.

The send uses the alert_id as the queue's dedup id, checked and recorded in the same
Lua step as the enqueue, so a repeat can never create a second message. That record is
the channel's ledger record (`records_delivery`): the deliverer keeps no second one.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from aldebaran.api.pullqueue import PullQueue
from aldebaran.channels.base import Alert
from aldebaran.channels.ledger import ledger_key
from aldebaran.io.redis import Keys, Replicas
from aldebaran.io.redis import connect as connect_redis
from aldebaran.settings import QueueApiChannel, Settings


class QueueApiSink:
    targets = ("",)
    records_delivery = True  # the keyed enqueue writes the ledger record itself

    def __init__(self, config: QueueApiChannel, settings: Settings) -> None:
        self._config, self._settings = config, settings
        self._redis: aioredis.Redis | None = None
        self._queue: PullQueue | None = None

    async def start(self) -> None:
        self._redis = await connect_redis(self._settings)
        s = self._settings
        keys, channel = Keys(s.redis_key_prefix), self._config.name
        self._queue = PullQueue(self._redis, keys, self._config.queue,
                                checkout_lifetime_seconds=s.checkout_lifetime_seconds,
                                max_receive_count=s.max_receive_count, dedup_ttl_seconds=s.alert_dedup_ttl_seconds,
                                replicas=Replicas.of(s), dedup_key=lambda alert_id: ledger_key(keys, channel, alert_id))

    async def send(self, alert: Alert, target: str) -> None:
        assert self._queue is not None
        await self._queue.send(alert.body.decode(), dedup_id=alert.alert_id)

    async def send_many(self, alerts: Sequence[Alert], target: str) -> list[BaseException | None]:
        """Many enqueues in one round trip; the pipeline fails or succeeds as a whole here, and a
        resend of any of them enqueues nothing (keyed by alert_id)."""
        assert self._queue is not None
        await self._queue.send_many([(alert.body.decode(), alert.alert_id) for alert in alerts])
        return [None] * len(alerts)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()


def build(config: QueueApiChannel, settings: Settings) -> QueueApiSink:
    return QueueApiSink(config, settings)
