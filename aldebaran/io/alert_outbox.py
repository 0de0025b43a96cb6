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

import asyncio
from typing import Sequence

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq
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

    async def emit_many(self, alerts: Sequence[Alert]) -> list[bool]:
        """`emit` for a batch: the same three steps and guarantees, in two Redis calls.

        Why: a burst of closing books fires thousands of alerts per second; one round trip per
        step per alert (or a pipeline of one command per alert) made Redis and the
        client's command encoding the bottleneck. Each step is one Lua call for the batch.
        """
        if not alerts:
            return []
        keys = [self._keys.alert(alert.alert_id) for alert in alerts]
        bodies = [alert.to_json() for alert in alerts]
        states = await self._redis.eval(_RECORD_PENDING, len(keys), *keys, self._retention,
                                        *[_PENDING + body for body in bodies])
        publish: list[int] = []
        published = [False] * len(alerts)
        for i, state in enumerate(states):
            if state == 1:  # recorded pending by this call
                publish.append(i)
                continue
            alert = alerts[i]
            if state == _SENT:
                ALERTS_DEDUPLICATED.inc()
                log.info("alert already sent", alert_id=alert.alert_id, order_id=alert.key)
            else:
                bodies[i] = state[len(_PENDING):]
                publish.append(i)
                log.warning("re-publishing a pending alert", alert_id=alert.alert_id, order_id=alert.key)
        if not publish:
            return published
        # The channel under aio-pika: a batch of confirms costs a third of the CPU this way.
        channel = await self._exchange.channel.get_underlay_channel()
        confirms = await asyncio.gather(*(channel.basic_publish(
            bodies[i], exchange=ALERT, routing_key=ALERT, mandatory=True,  # unbound: returned, not an Ack
            properties=aiormq.spec.Basic.Properties(
                delivery_mode=2, message_id=alerts[i].alert_id, content_type="application/json",
                message_type=alerts[i].kind)) for i in publish))
        if any(not isinstance(confirm, aiormq.spec.Basic.Ack) for confirm in confirms):
            # Still pending in Redis: whoever recomputes them re-publishes.
            raise aio_pika.exceptions.DeliveryError(None, None)
        recent = [bodies[i] for i in publish[-RECENT_ALERTS:]]
        await self._redis.eval(_MARK_SENT, len(publish) + 1, self._keys.recent_alerts(),
                               *[keys[i] for i in publish], self._retention, RECENT_ALERTS, *recent)
        kinds: dict[str, int] = {}
        for i in publish:
            published[i] = True
            kind = alerts[i].kind
            kinds[kind] = kinds.get(kind, 0) + 1
        for kind, count in kinds.items():  # one metric update per kind, not per alert
            ALERTS_FIRED.labels(kind=kind).inc(count)
        log.info("alerts published", count=len(publish),
                 alert_ids=[alerts[i].alert_id for i in publish[:20]])
        return published


# KEYS: alert keys; ARGV[1]: retention; ARGV[1+i]: "pending:<json>" of KEYS[i].
# Returns per key 1 (recorded now) or the existing value ("sent" or "pending:<json>").
_RECORD_PENDING = """
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[i + 1], 'NX', 'EX', ARGV[1]) then
    out[i] = 1
  else
    out[i] = redis.call('GET', key) or 1
    if out[i] == 1 then redis.call('SET', key, ARGV[i + 1], 'EX', ARGV[1]) end
  end
end
return out
"""

# KEYS[1]: recent-alerts list; KEYS[2..]: alert keys. ARGV: retention, list length, bodies.
_MARK_SENT = """
for i = 2, #KEYS do redis.call('SET', KEYS[i], 'sent', 'EX', ARGV[1]) end
for i = 3, #ARGV do redis.call('LPUSH', KEYS[1], ARGV[i]) end
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
return #KEYS - 1
"""
