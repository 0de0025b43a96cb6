"""What the channel deliverer carries: messages of its queue (envelopes) and the alerts in them (items).

The lookout hands a channel one message per batch of alerts (a JSON array under a `batch:`
id, a lone alert as itself: CONTRACT §3). Each alert is delivered, parked or left in doubt on
its own; the message is settled once every alert in it is: acked, or requeued when the
deliverer stopped between two attempts of one of them (the alerts already delivered come back
as repeats, which the ledger recognises).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import aio_pika.abc

from aldebaran.channels.base import Alert, read_alerts


@dataclass(slots=True, eq=False)
class Envelope:
    """One message of the channel queue and how many of its alerts are not settled yet."""

    message: aio_pika.abc.AbstractIncomingMessage
    pending: int = 0
    requeue: bool = False  # an alert of it must come back: we stopped between two of its attempts
    handed: bool = False  # a retry task settles it
    settled: bool = False  # acked or requeued


@dataclass(slots=True, eq=False)
class Item:
    """One alert being delivered, and where it stands across the channel's recipients."""

    envelope: Envelope
    alert: Alert
    retry: list[str] = field(default_factory=list)  # recipients whose last attempt may be tried again
    attempts: dict[str, int] = field(default_factory=dict)  # sends per recipient
    errors: dict[str, str] = field(default_factory=dict)  # the last error per recipient
    failed: str = ""  # the final reason, when it cannot be delivered
    interrupted: bool = False  # we are stopping between two attempts


@dataclass(slots=True)
class Unreadable:
    """A message, or one element of a batch, that is not an alert: parked with the reason."""

    envelope: Envelope
    body: bytes
    message_id: str | None
    reason: str


def read(message: aio_pika.abc.AbstractIncomingMessage) -> tuple[Envelope, list[Item], list[Unreadable]]:
    """The alerts of one message; what cannot be read is set apart, the rest go on."""
    envelope = Envelope(message)
    alerts, bad = read_alerts(message.body, message.message_id)
    items = [Item(envelope, alert) for alert in alerts]
    envelope.pending = len(items)
    return envelope, items, [Unreadable(envelope, raw, message.message_id, reason) for raw, reason in bad]
