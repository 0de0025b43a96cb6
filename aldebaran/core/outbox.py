"""The alert outbox: each alert id is published once, and never lost between steps.

1. Record the intent in Redis (`SET alert:<id> pending:<json> NX`). If the key exists
   and says `sent`, the alert is a duplicate: suppress it.
2. Publish to the alert exchange and wait for the broker's confirm.
3. Mark it `sent`.

A crash after 1 leaves `pending`: whoever computes the alert again (a rebuilt book)
re-publishes the recorded JSON under the same `alert_id`, so nothing is lost; the only
possible repeat is a second publish of an identical alert, which the lookout and the
channels absorb by `alert_id` (docs/alerts.md walks through every window).
"""

from __future__ import annotations

import aio_pika
import aio_pika.abc
import redis.asyncio as aioredis

from aldebaran.core.rule import Alert
from aldebaran.io.amqp import persistent
from aldebaran.io.redis import Keys
from aldebaran.log import get_logger
from aldebaran.metrics import ALERTS_DEDUPLICATED, ALERTS_FIRED
from declare.topology import ALERT

log = get_logger("outbox")
_PENDING = b"pending:"
_SENT = b"sent"
RECENT_ALERTS = 100


class AlertOutbox:
    def __init__(self, redis: aioredis.Redis, exchange: aio_pika.abc.AbstractExchange,
                 keys: Keys, retention_seconds: int) -> None:
        self._redis = redis
        self._exchange = exchange
        self._keys = keys
        self._retention = retention_seconds

    async def emit(self, alert: Alert) -> bool:
        """Publish `alert` unless it was already sent; True when published by this call."""
        key = self._keys.alert(alert.alert_id)
        body = alert.to_json()
        if not await self._redis.set(key, _PENDING + body, nx=True, ex=self._retention):
            state = await self._redis.get(key)
            if state is None:  # expired between the two calls: start over
                return await self.emit(alert)
            if state == _SENT:
                ALERTS_DEDUPLICATED.inc()
                log.info("alert already sent", alert_id=alert.alert_id, order_id=alert.key)
                return False
            body = state[len(_PENDING):]
            log.warning("re-publishing a pending alert", alert_id=alert.alert_id, order_id=alert.key)
        await self._exchange.publish(
            persistent(body, message_id=alert.alert_id, content_type="application/json",
                       type=alert.kind),
            routing_key=ALERT,
        )
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(key, _SENT, ex=self._retention)
            pipe.lpush(self._keys.recent_alerts(), body)
            pipe.ltrim(self._keys.recent_alerts(), 0, RECENT_ALERTS - 1)
            await pipe.execute()
        ALERTS_FIRED.labels(kind=alert.kind).inc()
        log.info("alert published", alert_id=alert.alert_id, kind=alert.kind, order_id=alert.key)
        return True
