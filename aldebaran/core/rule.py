"""What an application plugs into the core: a rule that keys events and turns them into alerts.

A rule is pure: given a state, an event and the time, it says which alerts fire. The
core owns everything else (queues, dedup by event id, book lifetimes, crash recovery).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

import msgspec

State = TypeVar("State")
# An alert id travels as the AMQP `message_id` (a short string: at most 255 bytes), a
# Redis key and an HTTP header. `trade_limits` ids fit (`<kind>:<id of <= 200 bytes>`);
# an application keyed by a free-text label (a client name of 200 emoji) would not.
MAX_ALERT_ID_BYTES = 255
_KEPT_BYTES = 180  # the readable head of a shortened id; with `#` and 64 hex digits: 245


def bounded_alert_id(alert_id: str) -> str:
    """The alert id itself when every transport can carry it, else a shortened form.

    Over 255 bytes of UTF-8 (or not encodable as UTF-8), the id becomes its first 180
    bytes, `#` and the SHA-256 of the whole id: deterministic, so an alert keeps one id in
    every mode and after every restart, and distinct ids stay distinct.
    """
    if len(alert_id) <= MAX_ALERT_ID_BYTES // 4 and alert_id.isascii():
        return alert_id
    try:
        raw = alert_id.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no transport takes it as it is
        raw = alert_id.encode("utf-8", "surrogatepass")
    else:
        if len(raw) <= MAX_ALERT_ID_BYTES:
            return alert_id
    head = raw[:_KEPT_BYTES].decode("utf-8", "ignore")  # cut at a character boundary
    return f"{head}#{hashlib.sha256(raw).hexdigest()}"
Event = Any  # a rule's own event type (msgspec Structs in practice)


class Alert(msgspec.Struct, frozen=True, kw_only=True):
    """An alert as the core moves it: a stable id, a kind, and the rule's own fields."""

    alert_id: str
    kind: str
    key: str
    detected_at: str
    fields: dict[str, Any] = {}

    def __post_init__(self) -> None:
        # Bounded at birth: no rule can make an id that a message_id or a header refuses.
        bounded = bounded_alert_id(self.alert_id)
        if bounded is not self.alert_id:
            msgspec.structs.force_setattr(self, "alert_id", bounded)

    def to_json(self) -> bytes:
        """The wire form: a flat JSON object (CONTRACT §3)."""
        return msgspec.json.encode(
            {"alert_id": self.alert_id, "kind": self.kind, **self.fields, "detected_at": self.detected_at}
        )


@functools.lru_cache(maxsize=8)
def iso_utc(moment: datetime) -> str:
    """ISO 8601 with a Z suffix and millisecond precision. Cached: every alert of an engine
    cycle carries the cycle's `now` (strftime per alert was 6 % of an alert-heavy engine)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class Rule(Protocol, Generic[State]):
    """An application of the core. See docs/extending.md for a walk-through."""

    name: str
    queue_prefix: str
    codec: Any  # decode(body, content_type, max_bytes) -> Decoded; dead_letters(decoded, body); kinds(events);
    # pack/unpack; describe (aldebaran/trades/codec.py TradeCodec)

    def accepts(self, event: Event) -> bool:
        """Whether this rule wants the event at all."""

    def key(self, event: Event, at: float) -> str:
        """The book the event belongs to (an order id, a client and day, ...).

        `at` is the event's ingest time (epoch seconds) as the routing worker stamps it, so
        a time-windowed key (a client's UTC day) is derived from the pipeline's clock, not
        from a clock the rule would have to read itself. Rules keyed by identity ignore it.
        """

    # Optional, for partitioned engines: `partition_key(event) -> str`, what `key` is built on
    # without time (an order, a client); absent, `key(event, 0.0)` (docs/engine.md, "Scaling out").
    # Optional: `event_types`, the classes `accepts` takes every instance of; when they cover the
    # codec's own `event_types`, the engine skips the per-event call (`accepts_everything`).

    def event_id(self, event: Event) -> str:
        """The identity an event counts once by, however often it is delivered: unique among
        the events of one book (it is only ever compared within the book `key` names)."""

    def opens(self, event: Event) -> bool:
        """Whether the event announces its book on the work queue (iteration 5: requests)."""

    def ttl_seconds(self, default: float) -> float:
        """How long a book lives from its first event."""

    def new_state(self, key: str) -> State:
        """A fresh, empty state for one book."""

    def apply(self, state: State, event: Event, now: datetime) -> Sequence[Alert]:
        """Count one new (never seen) event; return the alerts it fires."""

    def close(self, state: State, now: datetime) -> Sequence[Alert]:
        """The book's time is up; return the alerts that closing fires."""

    def is_final(self, state: State) -> bool:
        """True when no later event can fire anything (the book may ack eagerly)."""


def accepts_everything(rule: Rule[Any]) -> bool:
    """Whether the rule takes every event its codec can decode, as both declare (optional
    `event_types` on each): then nothing needs filtering, and calling `accepts` once per event
    was ~5 % of the engine step."""
    decoded = getattr(rule.codec, "event_types", None)
    taken = getattr(rule, "event_types", None)
    return decoded is not None and taken is not None and set(decoded) <= set(taken)


def event_filter(rule: Rule[Any]) -> Callable[[Any], bool] | None:
    """The rule's per-event filter (`accepts`), or None when it takes everything (`accepts_everything`)."""
    return None if accepts_everything(rule) else rule.accepts
