"""The per-order alert outbox: each alert id goes onto `Aldebaran.Alert` once, and is never lost.

1. Record the intent in Redis (`SET alert:<id> pending:<json> NX`). A key that says
   `sent` is a repeat: suppressed.
2. Publish once to the alert exchange, with a `BCC` to the book's own queue (bound to the
   exchange under its own name), and wait for the broker's confirm. One publish routed
   to two queues is atomic: either `Aldebaran.Alert` and the book queue both hold it or
   neither does. The copy in the book queue is the *witness* that the alert went out.
3. Mark it `sent`.

A crash between 1 and 3 leaves `pending`. The rebuilt book computes the alert again and
finds it pending: *in doubt*. It reads its queue: a witness settles the alert as sent
(nothing is published); a queue read to the end without one proves the publish never
happened, and the recorded JSON is published now (with a witness again). Before this,
an in-doubt alert was always published again, and `Aldebaran.Alert` carried it twice
whenever the crash fell between the confirm and step 3 (docs/alerts.md).

A witness proves only a confirmed publish. A nack, or a connection lost before the
confirm, may leave the copy in one queue and not in another (a full queue that rejects
publishes, a quorum queue without a leader), so step 2's failure turns the record into
`refused:<json>`: no witness settles it, and the next attempt publishes it again.
"""

from __future__ import annotations

import enum

import aio_pika
import aio_pika.abc
import redis.asyncio as aioredis

from aldebaran.core.rule import Alert
from aldebaran.io.amqp import persistent
from aldebaran.io.redis import Keys, as_bytes
from aldebaran.log import get_logger
from aldebaran.metrics import ALERTS_DEDUPLICATED, ALERTS_FIRED, ALERTS_RECOVERED, ALERTS_UNCONFIRMED
from declare.topology import ALERT

log = get_logger("outbox")
_PENDING = b"pending:"
_REFUSED = b"refused:"  # a publish not confirmed: pending, and no witness counts
_SENT = b"sent"
RECENT_ALERTS = 100
BCC = "BCC"  # RabbitMQ's sender-selected distribution: extra routing keys, stripped on delivery


class Emitted(enum.Enum):
    PUBLISHED = "published"  # on Aldebaran.Alert now, for the first time
    ALREADY_SENT = "already sent"  # a repeat: suppressed
    IN_DOUBT = "in doubt"  # pending from a crashed attempt: the caller looks for its witness


def is_witness(message: aio_pika.abc.AbstractIncomingMessage) -> bool:
    """An alert's copy in its book queue (from the alert exchange), not an event."""
    return message.exchange == ALERT


class AlertOutbox:
    def __init__(self, redis: aioredis.Redis, exchange: aio_pika.abc.AbstractExchange,
                 keys: Keys, retention_seconds: int) -> None:
        self._redis = redis
        self._exchange = exchange  # on a confirm channel that raises on returns
        self._keys = keys
        self._retention = retention_seconds

    async def emit(self, alert: Alert, queue: aio_pika.abc.AbstractQueue | None) -> Emitted:
        """Publish `alert` unless it was sent or may have been; `queue` receives the witness.

        Without a queue (no book to hold a witness) an in-doubt alert is published again.
        """
        key = self._keys.alert(alert.alert_id)
        body = alert.to_json()
        if await self._redis.set(key, _PENDING + body, nx=True, ex=self._retention):
            await self._publish(alert, body, queue)
            return Emitted.PUBLISHED
        state = await self._redis.get(key)
        if state is None:  # expired between the two calls: start over
            return await self.emit(alert, queue)
        state = as_bytes(state)
        if state == _SENT:
            ALERTS_DEDUPLICATED.inc()
            log.info("alert already sent", alert_id=alert.alert_id, order_id=alert.key)
            return Emitted.ALREADY_SENT
        if queue is None or state.startswith(_REFUSED):
            await self._publish(alert, state.partition(b":")[2], queue)
            return Emitted.PUBLISHED
        log.warning("alert in doubt: pending after a crash; looking for its witness in the book queue",
                    alert_id=alert.alert_id, order_id=alert.key)
        return Emitted.IN_DOUBT

    async def settle(self, alert_id: str) -> bool:
        """A witness was read: the alert is on `Aldebaran.Alert`; pending becomes sent.

        False when its publish was refused: that witness proves nothing."""
        settled = int(await self._redis.eval(_SETTLE, 2, self._keys.alert(alert_id), self._keys.recent_alerts(),
                                             self._retention, RECENT_ALERTS))
        if settled == 1:
            ALERTS_RECOVERED.labels(outcome="witnessed").inc()
            log.warning("alert in doubt settled: its witness shows it was published", alert_id=alert_id)
        return settled >= 0

    async def publish_unwitnessed(self, alert: Alert, queue: aio_pika.abc.AbstractQueue) -> bool:
        """The book queue was read to its end without a witness: publish the recorded alert now.

        True when published by this call (False: it was settled as sent meanwhile)."""
        state = await self._redis.get(self._keys.alert(alert.alert_id))
        state = as_bytes(state) if state is not None else None
        if state is not None and not state.startswith((_PENDING, _REFUSED)):
            return False
        body = state.partition(b":")[2] if state is not None else alert.to_json()
        ALERTS_RECOVERED.labels(outcome="published").inc()
        log.warning("alert in doubt had no witness: publishing it once", alert_id=alert.alert_id)
        await self._publish(alert, body, queue)
        return True

    async def _publish(self, alert: Alert, body: bytes, queue: aio_pika.abc.AbstractQueue | None) -> None:
        headers: dict[str, list[str]] = {}
        if queue is not None:
            # Bound under its own name at every publish (idempotent, one round trip per alert):
            # a book queue that expired and came back has lost its binding.
            await queue.bind(ALERT, routing_key=queue.name)
            headers[BCC] = [queue.name]
        try:
            await self._exchange.publish(
                persistent(body, message_id=alert.alert_id, content_type="application/json",
                           type=alert.kind, headers=headers),
                routing_key=ALERT,
            )
        except Exception:
            await self._refused(alert, body)
            raise
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._keys.alert(alert.alert_id), _SENT, ex=self._retention)
            pipe.lpush(self._keys.recent_alerts(), body)
            pipe.ltrim(self._keys.recent_alerts(), 0, RECENT_ALERTS - 1)
            await pipe.execute()
        ALERTS_FIRED.labels(kind=alert.kind).inc()
        log.info("alert published", alert_id=alert.alert_id, kind=alert.kind, order_id=alert.key)

    async def _refused(self, alert: Alert, body: bytes) -> None:
        """The publish was not confirmed: its witness, if any, proves nothing."""
        try:
            await self._redis.set(self._keys.alert(alert.alert_id), _REFUSED + body, xx=True, ex=self._retention)
        except Exception as exc:  # noqa: BLE001 - the publish's failure is the one raised
            log.error("alert publish not confirmed and not recorded as refused: a witness may settle it "
                      "after a restart", alert_id=alert.alert_id, error=repr(exc))
            return
        ALERTS_UNCONFIRMED.inc()
        log.warning("alert publish not confirmed: published again at the next attempt", alert_id=alert.alert_id)


# KEYS: an alert record, the recent-alerts list; ARGV: retention, list length.
# pending -> sent (its JSON listed as recent); 1 when it changed, -1 when the publish was refused.
_SETTLE = """
local state = redis.call('GET', KEYS[1])
if state and string.sub(state, 1, 8) == 'refused:' then return -1 end
if state and string.sub(state, 1, 8) == 'pending:' then
  redis.call('SET', KEYS[1], 'sent', 'EX', ARGV[1])
  redis.call('LPUSH', KEYS[2], string.sub(state, 9))
  redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
  return 1
end
return 0
"""
