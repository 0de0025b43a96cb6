"""The engine step: a cycle of ingress messages in, alerts and a log record out. Pure.

One `Engine` holds the books of every application it runs (a `BookStore`: books,
deadlines in arrival order, done markers). A cycle takes the messages consumed since the last one,
closes the books whose deadline is before the cycle's pipeline-time stamp, decodes the
messages and applies their events at that stamp, and returns the alerts that fired,
the unreadable elements (to dead-letter) and the write-ahead record of the cycle. The
worker commits the record and the alerts before it acks the messages; after a crash
the records, replayed through `replay`, rebuild the same books (docs/engine.md).

A cycle has two halves, `begin` (decode: the record is known, no book has changed) and
`finish` (close and apply: the alerts are known), so that the worker can send the record
to Redis while the books are applied; `cycle` is both at once.

A rule that raises on an event does so again on replay (the engine is deterministic), so
retrying cannot help: the message is dead-lettered at once with the rule's error as its
reason, its other events go on, and so does every other message of the cycle.

No I/O, no clock reads: the stamp and `now` (the alerts' `detected_at`) are passed in.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aldebaran.core.book_store import BookStore, RuleFailure
from aldebaran.core.done_markers import DoneDelta
from aldebaran.core.partitions import Partitioning
from aldebaran.core.rule import Alert, Rule, event_filter
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
    kinds: Counter[str] = field(default_factory=Counter)  # events consumed per kind (the codec's `kinds`)
    conflicts: list[tuple[str, str, str]] = field(default_factory=list)  # (app, key, event id)
    close_failures: list[RuleFailure] = field(default_factory=list)  # a rule raised closing a book
    handovers: dict[int, bytes] = field(default_factory=dict)  # partition -> its events' handover body
    handed_over: int = 0  # events handed to other partitions
    decoded: list[tuple[int, WalMessage, list[Any]]] = field(default_factory=list)  # between begin and finish


@dataclass(frozen=True, slots=True)
class Compaction:
    """Done markers changed since the last compaction, at pipeline time `clock_ms`, and how
    many of the oldest log records they make redundant (trimmed in the same transaction)."""

    clock_ms: int
    done: DoneDelta
    trim: int


@dataclass(slots=True)
class HandoverRefused:
    """A handover this engine cannot take (unreadable, or sent by an engine partitioned differently)."""

    reason: str
    raw: bytes = b""
    log_key: str = "handover refused"


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
                 done_cap: int, max_message_bytes: int, partitioning: Partitioning | None = None) -> None:
        if not rules:
            raise ValueError("an engine needs at least one rule")
        self.rules = list(rules)
        # Per rule, its filter; None for a rule that takes every event the codec yields.
        self._filters = [event_filter(rule) for rule in self.rules]
        self.books = BookStore({rule.name: rule for rule in rules}, default_ttl, done_retention, done_cap)
        self.codec = self.rules[0].codec  # the trade codec: every rule reads the same ingress
        self.max_bytes = max_message_bytes
        self.longest_ttl_ms = int(max(self.books.ttl.values()) * 1000)
        self.wal = WalIndex()
        self.partitioning = partitioning  # None: this engine owns every book
        self.last_stamp_ms = 0  # the newest cycle stamp applied
        self.resume_at_ms = 0  # the newest pipeline time restored: the clock restarts here

    def close(self, stamp_ms: int, now: datetime) -> list[Alert]:
        """Close every book whose deadline is before `stamp_ms` (an idle tick, or a cycle's start)."""
        if stamp_ms > self.last_stamp_ms:
            self.last_stamp_ms = stamp_ms
        if stamp_ms > self.resume_at_ms:
            self.resume_at_ms = stamp_ms
        return self.books.close_due((self.last_stamp_ms - 1) / 1000.0, now)

    def next_close_ms(self) -> int | None:
        """The first cycle stamp at which `close` has work (a deadline passed, a done marker
        expired), or None. An idle worker closes then rather than in the next message's cycle:
        a paced 1000-event message's step spent ~0.45 of its ~1.9 ms closing the books due since
        the previous one (`deploy/testbed/cold_step.py`)."""
        due = self.books.next_due()
        if due is None:
            return None
        # `close` takes what is due at or before (stamp - 1) / 1000, in floats: the first such stamp.
        stamp = math.floor(due * 1000) + 1
        while (stamp - 1) / 1000.0 < due:
            stamp += 1
        while (stamp - 2) / 1000.0 >= due:
            stamp -= 1
        return stamp

    def cycle(self, messages: Sequence[WalMessage], stamp_ms: int, now: datetime) -> Cycle:
        """Close what is due, then apply `messages` at `stamp_ms`; the record logs them. Each
        message is applied as soon as it is decoded, its events still in the CPU's caches
        (64 messages decoded first and applied after cost ~6 % more in a drain)."""
        out = Cycle(stamp_ms)
        self._close(out, now)
        if messages:
            logged: list[WalMessage] = []
            self._apply(self._decoded(messages, out, logged), out, now, self.last_stamp_ms, hand_over=True)
            out.record = encode_record(WalRecord(self.last_stamp_ms, logged))
            self.wal.appended(self.last_stamp_ms)
        out.conflicts, self.books.conflicts = self.books.conflicts, []
        return out

    def begin(self, messages: Sequence[WalMessage], stamp_ms: int) -> Cycle:
        """Decode `messages` (their rejects into the cycle) and write the cycle's record; no book changes."""
        out = Cycle(stamp_ms)
        if messages:
            logged: list[WalMessage] = []
            out.decoded = list(self._decoded(messages, out, logged))
            # The stamp `close` will move the clock to: the newest yet.
            out.record = encode_record(WalRecord(max(stamp_ms, self.last_stamp_ms), logged))
        return out

    def finish(self, out: Cycle, now: datetime) -> Cycle:
        """Close what is due at the cycle's stamp, then apply what `begin` decoded."""
        self._close(out, now)
        if out.record is not None:
            self._apply(out.decoded, out, now, self.last_stamp_ms, hand_over=True)
            self.wal.appended(self.last_stamp_ms)
        out.decoded = []
        out.conflicts, self.books.conflicts = self.books.conflicts, []
        return out

    def replay(self, record: WalRecord, now: datetime) -> list[Alert]:
        """Re-run a committed cycle after a crash; its rejects and conflicts were handled then.
        Its alerts come back: the record may have been logged before its alerts were recorded
        (the worker sends the record while the books are applied), and recording an alert
        that already was is a no-op (`SET NX`)."""
        out = Cycle(record.stamp_ms)
        self._close(out, now)
        self._apply(self._decoded(record.messages, out, []), out, now, record.stamp_ms)
        self.books.conflicts.clear()
        self.wal.appended(record.stamp_ms)
        return out.alerts

    def _close(self, out: Cycle, now: datetime) -> None:
        out.alerts = self.close(out.stamp_ms, now)
        out.close_failures = self.books.take_failures()

    def _decoded(self, messages: Sequence[WalMessage], out: Cycle,
                 logged: list[WalMessage]) -> Iterator[tuple[int, WalMessage, list[Any]]]:
        """Each message that held an event, with its events, decoded when it is asked for. The
        record keeps only these (`logged`): the rest changes no book on replay, and a flood of
        junk (each message up to the broker's size limit) must not fill Redis."""
        for index, message in enumerate(messages):
            events = self._events(index, message, out)
            if events:
                logged.append(message)
                yield index, message, events

    def _apply(self, decoded: Iterable[tuple[int, WalMessage, list[Any]]], out: Cycle, now: datetime,
               stamp_ms: int, hand_over: bool = False) -> None:
        """Apply the decoded messages' events. With `hand_over`, the events of other
        partitions' books go to `out.handovers` (a replay skips them: they were handed over
        before the messages were acked)."""
        at = stamp_ms / 1000.0
        offer_many, fired, rules = self.books.offer_many, out.alerts, self.rules
        foreign: dict[int, list[Any]] = {}
        for index, message, events in decoded:
            for rule, accepted in zip(rules, self._share(events, message.handed_over, foreign), strict=True):
                applied, duplicate, late = offer_many(rule.name, accepted, at, now, fired)
                out.applied += applied
                out.duplicate += duplicate
                out.late += late
            if self.books.failures:
                out.rejects.append((index, RuleReject.of(self.books.take_failures())))
        if hand_over and foreign and self.partitioning is not None:
            out.handovers = {owner: self.partitioning.handover(events) for owner, events in foreign.items()}
            out.handed_over = sum(map(len, foreign.values()))

    def _events(self, index: int, message: WalMessage, out: Cycle) -> list[Any]:
        """One message's events: decoded from the ingress (its unreadable elements to
        `out.rejects`), or taken over from another partition."""
        if message.handed_over:
            try:
                if self.partitioning is None:
                    raise ValueError("a handover reached an engine that is not partitioned")
                return self.partitioning.taken_over(message.body)
            except ValueError as exc:
                out.rejects.append((index, HandoverRefused(str(exc)[:1000])))
                return []
        decoded = self.codec.decode(message.body, message.content_type or None, self.max_bytes)
        if decoded.rejects:
            out.rejects += [(index, reject) for reject in self.codec.dead_letters(decoded, message.body)]
        events: list[Any] = decoded.events
        out.events += len(events)
        out.kinds.update(self.codec.kinds(events))
        return events

    def _share(self, events: list[Any], handed_over: bool, foreign: dict[int, list[Any]]) -> list[list[Any]]:
        """Per rule, the events of its books that this engine owns; the rest into `foreign`."""
        if self.partitioning is None:  # a lone rule is asked too: the daily limit takes purchases only
            return [events if accepts is None else [e for e in events if accepts(e)] for accepts in self._filters]
        routed = self.partitioning.route(events, handed_over)
        for owner, theirs in routed.foreign.items():
            foreign.setdefault(owner, []).extend(theirs)
        return routed.own

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
