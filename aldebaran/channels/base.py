"""What every channel shares: the sink interface, retries, per-channel dedup, parking.

A sink only knows how to hand one alert to one recipient. Whether to try again, how
long to wait, whether the recipient already has the alert and where an undeliverable
alert goes are decided here, once, so every channel behaves the same way.
"""

from __future__ import annotations

import asyncio
import json
import random
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol

import aio_pika
import aio_pika.abc
import redis.asyncio as aioredis

from aldebaran.io.amqp import persistent
from aldebaran.io.redis import Keys, Replicas, set_replicated
from aldebaran.settings import mask_url
from declare.topology import REASON_HEADER, channel_dead_letter

MAX_REASON_CHARS = 1000


class UnreadableAlert(ValueError):
    """The message is not an alert (no JSON object, no alert_id): retrying cannot help."""


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert as received: the fields (CONTRACT §3) and the exact bytes to forward."""

    alert_id: str
    fields: dict[str, Any]
    body: bytes

    @classmethod
    def parse(cls, body: bytes, message_id: str | None = None) -> Alert:
        try:
            fields = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise UnreadableAlert(f"not JSON: {exc}") from None
        if not isinstance(fields, dict):
            raise UnreadableAlert("not a JSON object")
        alert_id = fields.get("alert_id") or message_id
        if not isinstance(alert_id, str) or not alert_id:
            raise UnreadableAlert("no alert_id")
        return cls(alert_id, fields, body)

    def summary(self) -> str:
        """One line for people (SMS, push, Nagios, e-mail subject)."""
        # Generic over applications: every scalar field the rule put on its alert.
        skip = {"alert_id", "kind", "detected_at"}
        details = " ".join(f"{name}={value}" for name, value in self.fields.items()
                           if name not in skip and isinstance(value, (str, int, float, type(None))))
        return f"{self.fields.get('kind', 'alert')}: {details} ({self.alert_id})"


class Sink(Protocol):
    """One delivery channel's recipient side.

    `targets` lists the independent recipients (phone numbers, devices); the deliverer
    records each one separately, so a retry after a partial failure only repeats the
    recipients that did not get the alert. Sinks with a single recipient use `("",)`.
    `send` raises on any failure; the message becomes the parked alert's reason.
    """

    targets: tuple[str, ...]

    async def start(self) -> None: ...

    async def send(self, alert: Alert, target: str) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with equal jitter and a cap, for `max_attempts` tries."""

    max_attempts: int
    initial_seconds: float
    max_seconds: float

    def delay(self, failed_attempts: int, rng: random.Random | None = None) -> float:
        """Wait after the n-th failure: half fixed (progress), half random (no herds)."""
        ceiling = min(self.max_seconds, self.initial_seconds * 2 ** (failed_attempts - 1))
        return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


@dataclass(frozen=True, slots=True)
class Outcome:
    delivered: bool
    attempts: int
    last_error: str | None = None
    interrupted: bool = False


async def deliver_with_retries(sink: Sink, alert: Alert, target: str, policy: RetryPolicy,
                               stopping: asyncio.Event, on_retry: Any = None) -> Outcome:
    """Try until the sink accepts, the attempts run out, or the process is stopping."""
    last_error = None
    for attempt in range(1, policy.max_attempts + 1):
        try:
            await sink.send(alert, target)
            return Outcome(True, attempt)
        except Exception as exc:  # noqa: BLE001 - any sink failure is retried, then parked
            last_error = mask_url(f"{type(exc).__name__}: {exc}")[:MAX_REASON_CHARS]
        if attempt == policy.max_attempts:
            break
        if on_retry is not None:
            on_retry(attempt, last_error)
        try:
            await asyncio.wait_for(stopping.wait(), policy.delay(attempt))
            return Outcome(False, attempt, last_error, interrupted=True)
        except asyncio.TimeoutError:
            pass
    return Outcome(False, policy.max_attempts, last_error)


class DeliveryLedger:
    """Per-channel (and per-recipient) record in Redis of alerts that reached their recipient."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, channel: str, ttl_seconds: int,
                 replicas: Replicas = Replicas()) -> None:
        self._redis, self._keys, self._channel, self._ttl = redis, keys, channel, ttl_seconds
        self._replicas = replicas  # the mark is on this many replicas before the alert is acked

    def _key(self, alert_id: str, target: str) -> str:
        # `/` cannot occur in a channel name, so a recipient's key never collides with a channel's.
        scope = f"{self._channel}/{target}" if target else self._channel
        return self._keys.delivered(scope, alert_id)

    async def delivered(self, alert_id: str, target: str = "") -> bool:
        return bool(await self._redis.exists(self._key(alert_id, target)))

    async def mark(self, alert_id: str, target: str = "") -> None:
        await set_replicated(self._redis, self._key(alert_id, target), "1", self._ttl, self._replicas)

    async def settle(self, alert_id: str, target: str = "") -> None:
        """A mark found, before a repeat is acked: with replicas required, make sure they have it
        (it may be a mark whose replication failed just before a requeue)."""
        if self._replicas.count:
            await self.mark(alert_id, target)


async def park(channel: aio_pika.abc.AbstractChannel, channel_name: str, body: bytes, reason: str,
               *, message_id: str | None = None, attempts: int = 0) -> None:
    """Publish to the channel's dead-letter queue (confirmed) with the last error as the reason."""
    headers = {REASON_HEADER: reason[:MAX_REASON_CHARS], "x-aldebaran-attempts": attempts}
    message = persistent(body, headers=headers, message_id=message_id, content_type="application/json")
    await channel.default_exchange.publish(message, routing_key=channel_dead_letter(channel_name), mandatory=True)


class PerAlertLock:
    """Serialises the copies of one alert inside a process, so the second copy sees the
    first one's Redis record instead of racing it (different alerts run in parallel)."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    @asynccontextmanager
    async def hold(self, alert_id: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(alert_id, asyncio.Lock())
        self._users[alert_id] = self._users.get(alert_id, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[alert_id] -= 1
            if not self._users[alert_id]:
                del self._users[alert_id], self._locks[alert_id]
