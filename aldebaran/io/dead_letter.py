"""The one dead-letter path: the message's bytes, its reason and where it came from, confirmed.

Every worker that refuses input calls `dead_letter`; the reason travels in
`x-aldebaran-reason`, the source queue in `x-aldebaran-source`, and the metric gets a
low-cardinality class of the reason. Bad input is never dropped: the caller acks the
refused message only after this publish is confirmed.
"""

from __future__ import annotations

from typing import Any

import aiormq.abc
from pamqp import commands as spec

from aldebaran.metrics import DEAD_LETTERED
from declare.topology import DEAD_LETTER, REASON_HEADER

SOURCE_HEADER = "x-aldebaran-source"
MAX_REASON_CHARS = 1000
_CLASSES = (("exceeds the limit", "oversized"), ("missing field", "missing_field"), ("#shares", "bad_shares"),
            ("not valid", "not_parseable"), ("neither JSON", "not_parseable"), ("nested", "too_deep"))


class DeadLetterRefused(Exception):
    """The broker did not confirm a dead letter: the refused message must not be acked."""


def reason_class(reason: str) -> str:
    """A low-cardinality label for the dead-letter metric."""
    for marker, label in _CLASSES:
        if marker in reason:
            return label
    return "invalid"


async def dead_letter(channel: aiormq.abc.AbstractChannel, body: bytes, reason: str, source: str,
                      message_id: str | None = None, **headers: Any) -> None:
    """Publish `body` to the dead-letter queue with its reason and wait for the confirm."""
    reason = reason[:MAX_REASON_CHARS]
    properties = spec.Basic.Properties(delivery_mode=2, message_id=message_id,
                                       headers={REASON_HEADER: reason, SOURCE_HEADER: source, **headers})
    confirm = await channel.basic_publish(body, routing_key=DEAD_LETTER, mandatory=True, properties=properties)
    if confirm is not None and not isinstance(confirm, spec.Basic.Ack):
        raise DeadLetterRefused(f"dead letter not confirmed: {confirm!r}")
    DEAD_LETTERED.labels(reason=reason_class(reason)).inc()
