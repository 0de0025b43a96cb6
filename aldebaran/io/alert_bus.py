"""Publishing alerts in batches: one message per batch, confirmed (CONTRACT §3).

A batch of alerts travels as one message whose body is a JSON array of alert objects
and whose `message_id` is a batch id; a lone alert travels as the object itself with
its `alert_id` as `message_id`, as it always did. Readers accept both (`parse_alerts`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import aiormq.abc
import msgspec
from aiormq.exceptions import DeliveryError
from pamqp import commands as spec
from pamqp.common import FieldTable

from aldebaran.io.publish_many import publish_many
from declare.topology import ALERT

MAX_ALERTS_PER_MESSAGE = 1000
BATCH_CONTENT_TYPE = "application/json"


class AlertsRefused(Exception):
    """The broker did not confirm an alert batch: the alerts stay pending in the outbox."""


def batch_body(bodies: Sequence[bytes]) -> bytes:
    """The JSON array of already-encoded alert objects."""
    return b"[" + b",".join(bodies) + b"]"


async def publish_alerts(channel: aiormq.abc.AbstractChannel, alert_ids: Sequence[str],
                         bodies: Sequence[bytes], *, witness: str | None = None, exchange: str = ALERT,
                         routing_key: str = ALERT) -> None:
    """Publish the alerts (persistent, mandatory) in as few messages as allowed; wait for every confirm.

    `Aldebaran.Alert` by default; the lookout hands each channel's queue its batch the same way
    (the default exchange, the queue's name as routing key). `witness`: a queue bound to the
    alert exchange under its own name that gets a copy of each message through a `BCC` header
    (one publish routed to both: both hold it or neither), so an owner restarting after a
    crash can tell what went out.
    """
    headers: FieldTable | None = {"BCC": [witness]} if witness else None
    messages, properties = [], []
    for start in range(0, len(bodies), MAX_ALERTS_PER_MESSAGE):
        chunk = bodies[start:start + MAX_ALERTS_PER_MESSAGE]
        if len(chunk) == 1:
            body, message_id = chunk[0], alert_ids[start]
        else:
            body, message_id = batch_body(chunk), f"batch:{uuid.uuid4().hex}"
        messages.append(body)
        properties.append(spec.Basic.Properties(delivery_mode=2, message_id=message_id,
                                                content_type=BATCH_CONTENT_TYPE, headers=headers))
    if not messages:
        return
    confirmations = await publish_many(channel, messages, properties, exchange=exchange, routing_key=routing_key)
    for outcome in await confirmations.wait():
        if isinstance(outcome, DeliveryError):  # a nack or a return: the broker does not hold every message
            raise AlertsRefused(f"alert batch not confirmed: {outcome!r}") from None
        if outcome is not None:  # the channel closed under it
            raise outcome


def split_alerts(body: bytes) -> list[bytes]:
    """The alert objects of a message on `Aldebaran.Alert`, each as its own JSON bytes.

    Raises `msgspec.DecodeError` when the body is neither a JSON object nor an array.
    """
    value = msgspec.json.decode(body, type=msgspec.Raw)
    raw = bytes(value).lstrip()
    if raw[:1] == b"[":
        return [bytes(item) for item in msgspec.json.decode(raw, type=list[msgspec.Raw])]
    return [raw]
