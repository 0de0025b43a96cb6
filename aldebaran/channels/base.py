"""What every channel shares: the sink interface, the retry policy, parking.

A sink only knows how to hand one alert to one recipient, and whether a failure proves
the recipient did not get it (`NotDelivered`). Whether to try again, how long to wait,
and where an undeliverable alert goes are decided once, for every channel, by the
deliverer (`workers/channel.py`) and the ledger (`aldebaran/channels/ledger.py`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import aio_pika
import aio_pika.abc
import msgspec

from aldebaran.io.alert_bus import split_alerts
from aldebaran.io.amqp import persistent
from declare.topology import REASON_HEADER, channel_dead_letter

MAX_REASON_CHARS = 1000
_decode = msgspec.json.Decoder().decode
MAX_ALERT_ID_BYTES = 255  # the pipeline's own alert ids are bounded so (CONTRACT §1 ids <= 200 bytes)


class UnreadableAlert(ValueError):
    """The message is not an alert (no JSON object, no alert_id): retrying cannot help."""


class NotDelivered(Exception):
    """The recipient certainly did not take the alert: nothing was sent (no connection, a refused
    address) or it answered no. Safe to try again, even at most once; `permanent` when trying
    again cannot help (a 4xx). A sink raises anything else when the alert may have arrived."""

    def __init__(self, reason: str, *, permanent: bool = False) -> None:
        super().__init__(reason)
        self.permanent = permanent


class _Head(msgspec.Struct):
    """What every reader of an alert needs from it; the other fields stay in the bytes."""

    alert_id: Any = None


_decode_head = msgspec.json.Decoder(_Head).decode


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert as received: its id and the exact bytes to forward."""

    alert_id: str
    body: bytes

    @property
    def fields(self) -> dict[str, Any]:
        """The alert's fields (CONTRACT §3), decoded when a sink formats them: the lookout and
        most sinks only forward the bytes, so they never pay for a dict per alert."""
        fields: dict[str, Any] = _decode(self.body)
        return fields

    @classmethod
    def parse(cls, body: bytes, message_id: str | None = None) -> Alert:
        try:
            head = _decode_head(body)
        except msgspec.ValidationError:
            raise UnreadableAlert("not a JSON object") from None
        except msgspec.DecodeError as exc:
            raise UnreadableAlert(f"not JSON: {exc}") from None
        alert_id = head.alert_id or message_id
        if not isinstance(alert_id, str) or not alert_id:
            raise UnreadableAlert("no alert_id")
        if len(alert_id.encode()) > MAX_ALERT_ID_BYTES:  # it travels as an AMQP message_id (a shortstr)
            raise UnreadableAlert(f"alert_id over {MAX_ALERT_ID_BYTES} bytes")
        return cls(alert_id, body)

    def summary(self) -> str:
        """One line for people (SMS, push, Nagios, e-mail subject)."""
        # Generic over applications: every scalar field the rule put on its alert.
        skip = {"alert_id", "kind", "detected_at"}
        fields = self.fields
        details = " ".join(f"{name}={value}" for name, value in fields.items()
                           if name not in skip and isinstance(value, (str, int, float, type(None))))
        return f"{fields.get('kind', 'alert')}: {details} ({self.alert_id})"


_decode_heads = msgspec.json.Decoder(list[_Head]).decode
_decode_raws = msgspec.json.Decoder(list[msgspec.Raw]).decode
_SURELY_SHORT = MAX_ALERT_ID_BYTES // 4  # characters: no UTF-8 encoding of these is over the bound


def read_alerts(body: bytes, message_id: str | None) -> tuple[list[Alert], list[tuple[bytes, str]]]:
    """The alerts of one message (an object, or a batch array: CONTRACT §3) and its unreadable
    parts, each with the reason it is parked for; never raises.

    A batch is decoded twice in C (the elements' bytes, then their ids) instead of once per
    alert in Python: 1.1 against 2.6 µs per alert. Whatever that path cannot judge at a glance
    goes through `Alert.parse`, which alone words the reasons.
    """
    if body.lstrip()[:1] == b"[":
        try:
            raws, heads = _decode_raws(body), _decode_heads(body)
        except msgspec.DecodeError:  # not JSON, or an element that is no object: judged one by one
            pass
        else:
            lone = message_id if len(raws) == 1 else None
            alerts: list[Alert] = []
            unreadable: list[tuple[bytes, str]] = []
            for raw, head in zip(raws, heads, strict=True):
                alert_id = head.alert_id or lone
                if alert_id.__class__ is str and 0 < len(alert_id) <= _SURELY_SHORT:
                    alerts.append(Alert(alert_id, bytes(raw)))
                else:
                    _read_one(bytes(raw), lone, alerts, unreadable)
            return alerts, unreadable
    return _read_slowly(body, message_id)


def _read_slowly(body: bytes, message_id: str | None) -> tuple[list[Alert], list[tuple[bytes, str]]]:
    alerts: list[Alert] = []
    unreadable: list[tuple[bytes, str]] = []
    try:
        parts = split_alerts(body)
    except (msgspec.DecodeError, ValueError) as exc:
        return alerts, [(body, f"unreadable alert: not JSON: {exc}")]
    lone = message_id if len(parts) == 1 else None
    for raw in parts:
        _read_one(raw, lone, alerts, unreadable)
    return alerts, unreadable


def _read_one(raw: bytes, message_id: str | None, alerts: list[Alert], unreadable: list[tuple[bytes, str]]) -> None:
    try:
        alerts.append(Alert.parse(raw, message_id))
    except UnreadableAlert as exc:
        unreadable.append((raw, f"unreadable alert: {exc}"))


class Sink(Protocol):
    """One delivery channel's recipient side.

    `targets` lists the independent recipients (phone numbers, devices); the deliverer
    records each one separately, so a retry after a partial failure only repeats the
    recipients that did not get the alert. Sinks with a single recipient use `("",)`.
    `send` raises on any failure; the message becomes the parked alert's reason.
    Optional: `send_many(alerts, target)` (one call for a round, a list of failures or None),
    and `records_delivery = True` for a sink whose send is keyed by alert id and writes the
    channel's ledger record itself (the deliverer then neither claims nor settles).
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

    def busy(self, alert_id: str) -> bool:
        """Whether a copy of the alert holds or awaits the lock (counted from `reserve`)."""
        return alert_id in self._users

    def reserve(self, alert_id: str) -> AbstractAsyncContextManager[None]:
        """Count a user at once (so `busy` is true from now on); the context holds the lock.
        Enter the context it returns: the count drops when it exits."""
        lock = self._locks.setdefault(alert_id, asyncio.Lock())
        self._users[alert_id] = self._users.get(alert_id, 0) + 1
        return self._hold(alert_id, lock)

    @asynccontextmanager
    async def _hold(self, alert_id: str, lock: asyncio.Lock) -> AsyncIterator[None]:
        try:
            async with lock:
                yield
        finally:
            self._users[alert_id] -= 1
            if not self._users[alert_id]:
                del self._users[alert_id], self._locks[alert_id]
