"""A book: one key's state under a rule, with dedup by event id and a lifetime. Pure.

The book never touches I/O. Its lifetime is measured on the ingest timestamps carried by
the events, not on the wall clock of the process holding it, so a book rebuilt from
redelivered messages on another host reaches the same verdicts.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic

from aldebaran.core.rule import Alert, Rule, State


class Outcome(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    LATE = "late"


@dataclass(slots=True)
class Offer:
    outcome: Outcome
    alerts: Sequence[Alert] = ()


@dataclass(slots=True)
class Book(Generic[State]):
    """Holds one key's state from its first event until `opened_at + ttl` (seconds)."""

    rule: Rule[State]
    key: str
    opened_at: float
    ttl: float
    state: State = field(init=False)
    seen: set[str] = field(default_factory=set)
    closed: bool = False

    def __post_init__(self) -> None:
        self.state = self.rule.new_state(self.key)

    @property
    def deadline(self) -> float:
        return self.opened_at + self.ttl

    @property
    def final(self) -> bool:
        """Nothing more can fire: held messages may be acked."""
        return self.closed or self.rule.is_final(self.state)

    def offer(self, event: Any, at: float, now: datetime) -> Offer:
        """Take one delivered event that entered the pipeline at `at` (epoch seconds)."""
        if self.closed or at > self.deadline:
            return Offer(Outcome.LATE)
        event_id = self.rule.event_id(event)
        if event_id in self.seen:
            return Offer(Outcome.DUPLICATE)
        self.seen.add(event_id)
        return Offer(Outcome.APPLIED, self.rule.apply(self.state, event, now))

    def close(self, now: datetime) -> Sequence[Alert]:
        """End the book's life; returns what closing fires (at most once)."""
        if self.closed:
            return ()
        self.closed = True
        return self.rule.close(self.state, now)
