"""What the engine worker carries from a cycle to its confirm-and-ack: deliveries, outputs, payloads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from aldebaran.core.engine import Cycle
from aldebaran.core.rule import Alert
from aldebaran.core.wal import WalMessage
from declare.topology import engine_partition_queue


@dataclass(slots=True)
class Delivery:
    """One ingress message as consumed: its tag, its logged form, its publisher's stamp (0: none)."""

    tag: int
    message: WalMessage
    published_ms: float


@dataclass(slots=True)
class CycleOutput:
    """What must be confirmed before the cycle's messages are acked (up to `last_tag`)."""

    last_tag: int
    rejects: list[tuple[bytes, str, str]]  # (the element's bytes, the reason, its log throttle key)
    oldest_published_ms: float
    handovers: list[tuple[str, bytes]]  # (the owning partition's queue, the events of its books)
    alert_ids: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    entry: str | None = None  # the outbox entry of its new alerts, dropped once they are confirmed
    messages: int = 0  # the cycle's ingress messages (unacked at the broker until its round is done)

    @classmethod
    def of(cls, cycle: Cycle, batch: Sequence[Delivery]) -> CycleOutput:
        rejects = [(reject.raw or batch[index].message.body, reject.reason,
                    getattr(reject, "log_key", None) or reject.reason[:80]) for index, reject in cycle.rejects]
        published = [d.published_ms for d in batch if d.published_ms]
        handovers = [(engine_partition_queue(owner), body) for owner, body in sorted(cycle.handovers.items())]
        return cls(batch[-1].tag if batch else 0, rejects, min(published) if published else 0, handovers,
                   messages=len(batch))


def alert_payloads(alerts: Sequence[Alert]) -> tuple[list[str], list[bytes]]:
    """The alerts' ids and wire bodies (CONTRACT §3), in firing order."""
    return [alert.alert_id for alert in alerts], [alert.to_json() for alert in alerts]
