"""The engine step: a cycle of ingress messages in, alerts and a log record out. Pure.

One `Engine` holds the books of every application it runs (a `BookStore`: books,
deadlines in arrival order, done markers). A cycle takes the messages consumed since the last one,
closes the books whose deadline is before the cycle's pipeline-time stamp, decodes the
messages and applies their events at that stamp, and returns the alerts that fired,
the unreadable elements (to dead-letter) and the write-ahead record of the cycle. The
worker commits the record and the alerts before it acks the messages; after a crash
the records, replayed through `replay`, rebuild the same books (docs/engine.md).

A rule that raises on an event does so again on replay (the engine is deterministic), so
retrying cannot help: the message is dead-lettered at once with the rule's error as its
reason, its other events go on, and so does every other message of the cycle.

No I/O, no clock reads: the stamp and `now` (the alerts' `detected_at`) are passed in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aldebaran.core.book_store import BookStore, RuleFailure
from aldebaran.core.done_markers import DoneDelta
from aldebaran.core.rule import Alert, Rule
from aldebaran.core.wal import DoneImage, WalIndex, WalMessage, WalRecord, encode_record


@dataclass(slots=True)
class Cycle:
    """What one cycle produced, for the worker to commit, publish and count."""

    stamp_ms: int
    alerts: list[Alert] = field(default_factory=list)
    rejects: list[tuple[int, Any]] = field(default_factory=list)  # (message index, DecodeError)
    record: bytes | None = None  # the write-ahead record (None: no message to log)
    events: int = 0
    applied: int = 0
    duplicate: int = 0
    late: int = 0
    kinds: Counter[type] = field(default_factory=Counter)  # events consumed per event class
    conflicts: list[tuple[str, str, str]] = field(default_factory=list)  # (app, key, event id)
    close_failures: list[RuleFailure] = field(default_factory=list)  # a rule raised closing a book


@dataclass(frozen=True, slots=True)
class Compaction:
    """Done markers changed since the last compaction, at pipeline time `clock_ms`, and how
    many of the oldest log records they make redundant (trimmed in the same transaction)."""

    clock_ms: int
    done: DoneDelta
    trim: int


@dataclass(slots=True)
class RuleReject:
    """A message a rule raised on: dead-lettered whole (`raw` empty) with the rule's error."""

    reason: str
    app: str
    failures: int
    log_key: str  # what the worker's log throttle groups by: the application and the error type
    raw: bytes = b""
    index: int | None = None

    @classmethod
    def of(cls, failures: Sequence[RuleFailure]) -> RuleReject:
        first = failures[0]
        where = f"book {first.key[:200]!r}" if first.key is not None else "its key"
        more = f" (and {len(failures) - 1} more of its events)" if len(failures) > 1 else ""
        reason = (f"application {first.app} failed on an event of this message at {where}{more}: "
                  f"{first.error}; its other events counted")
        return cls(reason[:1000], first.app, len(failures), f"{first.app}:{first.error.split(':')[0]}")


class Engine:
    """Books of every configured rule, driven cycle by cycle."""

    def __init__(self, rules: Sequence[Rule[Any]], default_ttl: float, done_retention: float,
                 done_cap: int, max_message_bytes: int) -> None:
        if not rules:
            raise ValueError("an engine needs at least one rule")
        self.rules = list(rules)
        self.books = BookStore({rule.name: rule for rule in rules}, default_ttl, done_retention, done_cap)
        self.codec = self.rules[0].codec  # the trade codec: every rule reads the same ingress
        self.max_bytes = max_message_bytes
        self.longest_ttl_ms = int(max(self.books.ttl.values()) * 1000)
        self.wal = WalIndex()
        self.last_stamp_ms = 0  # the newest cycle stamp applied
        self.resume_at_ms = 0  # the newest pipeline time restored: the clock restarts here

    def close(self, stamp_ms: int, now: datetime) -> list[Alert]:
        """Close every book whose deadline is before `stamp_ms` (an idle tick, or a cycle's start)."""
        if stamp_ms > self.last_stamp_ms:
            self.last_stamp_ms = stamp_ms
        if stamp_ms > self.resume_at_ms:
            self.resume_at_ms = stamp_ms
        return self.books.close_due((self.last_stamp_ms - 1) / 1000.0, now)

    def cycle(self, messages: Sequence[WalMessage], stamp_ms: int, now: datetime) -> Cycle:
        """Close what is due, then apply `messages` at `stamp_ms`; the record logs them."""
        out = Cycle(stamp_ms)
        out.alerts = self.close(stamp_ms, now)
        out.close_failures = self.books.take_failures()
        if messages:
            # The record keeps the cycle's stamp and only the messages that held an event: the
            # rest changes no book on replay, and a flood of junk (each message up to the
            # broker's size limit) must not fill Redis.
            logged = self._apply(messages, out, now, self.last_stamp_ms)
            out.record = encode_record(WalRecord(self.last_stamp_ms, logged))
            self.wal.appended(self.last_stamp_ms)
        out.conflicts, self.books.conflicts = self.books.conflicts, []
        return out

    def replay(self, record: WalRecord, now: datetime) -> None:
        """Re-run a committed cycle after a crash; its alerts, rejects and conflicts were handled then."""
        self.close(record.stamp_ms, now)
        self.books.take_failures()
        self._apply(record.messages, Cycle(record.stamp_ms), now, record.stamp_ms)
        self.books.conflicts.clear()
        self.wal.appended(record.stamp_ms)

    def _apply(self, messages: Sequence[WalMessage], out: Cycle, now: datetime, stamp_ms: int) -> list[WalMessage]:
        """Apply the messages' events; the messages that held any (what the log must keep)."""
        at = stamp_ms / 1000.0
        decode, dead_letters, max_bytes, rules = self.codec.decode, self.codec.dead_letters, self.max_bytes, self.rules
        offer_many, fired = self.books.offer_many, out.alerts
        logged: list[WalMessage] = []
        for index, message in enumerate(messages):
            decoded = decode(message.body, message.content_type or None, max_bytes)
            if decoded.rejects:
                out.rejects += [(index, reject) for reject in dead_letters(decoded, message.body)]
            events = decoded.events
            if not events:
                continue
            logged.append(message)
            out.events += len(events)
            out.kinds.update(map(type, events))
            for rule in rules:  # a lone rule is asked too: the daily limit takes purchases only
                accepts = rule.accepts
                accepted = [e for e in events if accepts(e)]
                applied, duplicate, late = offer_many(rule.name, accepted, at, now, fired)
                out.applied += applied
                out.duplicate += duplicate
                out.late += late
            if self.books.failures:
                out.rejects.append((index, RuleReject.of(self.books.take_failures())))
        return logged

    def restore_done(self, image: DoneImage) -> None:
        """Start from the done markers of the last compaction (before replaying the log)."""
        self.books.done.restore(image.groups, image.clock_ms / 1000.0)
        self.resume_at_ms = max(self.resume_at_ms, image.clock_ms)

    def compaction(self) -> Compaction:
        """What to store now: the done markers changed since the last compaction (not all of
        them: millions of markers rewritten every few seconds stalled the cycles), and how many
        log records they make redundant."""
        return Compaction(self.last_stamp_ms, self.books.done.delta(),
                          self.wal.trimmable(self.last_stamp_ms, self.longest_ttl_ms))

    def compacted(self, compaction: Compaction) -> None:
        """`compaction` is stored: its records are trimmed, its markers need not be written again."""
        self.wal.trimmed(compaction.trim)
        self.books.done.written(compaction.done)

    @property
    def open_books(self) -> int:
        return len(self.books)

    @property
    def done_markers(self) -> int:
        return len(self.books.done)

    def take_forgotten(self) -> int:
        """Done markers the cap forgot before their retention since the last take (for the counter)."""
        return self.books.done.take_evicted()
