"""The engine's books: per application, open books by key, deadlines in arrival order, done markers. Pure.

Why not a heap of deadlines: the engine stamps events with pipeline time, which never
goes back, and a book's deadline is its first stamp plus its application's ttl, so
books open in deadline order. Each cycle's new books form one group at the tail of a
FIFO; closing pops whole groups from the head. No per-book heap entry, no tuple key.

Callers close before they offer (`close_due(stamp - ε)`, then `offer_many(.., stamp)`),
as `Engine.cycle` does, so an open book is never past its deadline when offered to.

A rule that raises on one event (or at one book's close) must not stall every other
book: the error is caught per event, kept in `failures` for the caller to dead-letter
and count, and the next event goes on. A repeat of a counted event id with other
content is kept in `conflicts` (the first copy still wins).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from aldebaran.core.done_markers import DoneMarkers
from aldebaran.core.rule import Alert, Rule
from aldebaran.core.segments import MASK, SegmentedDict


class OpenBook(msgspec.Struct, gc=False):
    """One key's state under a rule, the events it counted by id, and when it opened (epoch s)."""

    opened_at: float
    state: Any
    seen: dict[str, Any]  # event id -> the copy counted (a small dict costs less than a set)


@dataclass(slots=True)
class RuleFailure:
    """A rule raised: on `event` (None: at the book's close) of book `key` under `app`."""

    app: str
    key: str | None
    event: Any
    error: str  # "<exception type>: <message>"

    @classmethod
    def of(cls, app: str, key: str | None, event: Any, exc: Exception) -> RuleFailure:
        return cls(app, key, event, f"{type(exc).__name__}: {exc}")


class BookStore:
    """The open books and recently closed keys of every configured rule."""

    def __init__(self, rules: Mapping[str, Rule[Any]], default_ttl: float, done_retention: float,
                 done_cap: int) -> None:
        self.rules = dict(rules)
        self.ttl = {name: rule.ttl_seconds(default_ttl) for name, rule in self.rules.items()}
        self.retention = done_retention
        self.books: dict[str, SegmentedDict[str, OpenBook]] = {name: SegmentedDict() for name in self.rules}
        self.done = DoneMarkers(done_cap)
        self.failures: list[RuleFailure] = []  # the caller takes them (`take_failures`)
        self.conflicts: list[tuple[str, str, str]] = []  # (app, key, event id) of conflicting repeats
        self._groups: dict[str, deque[tuple[float, list[str]]]] = {name: deque() for name in self.rules}

    def __len__(self) -> int:
        return sum(len(books) for books in self.books.values())

    def offer_many(self, app: str, events: Sequence[Any], at: float, now: datetime,
                   fired: list[Alert]) -> tuple[int, int, int]:
        """Events of rule `app` stamped `at` (epoch s): (applied, duplicate, late); alerts go to `fired`."""
        rule = self.rules[app]
        key_of, event_id, apply, new_state = rule.key, rule.event_id, rule.apply, rule.new_state
        tables, done, ttl = self.books[app].tables, self.done.of(app).tables, self.ttl[app]
        group: list[str] | None = None
        applied = duplicate = late = 0
        for event in events:
            key = None
            try:  # free unless a rule raises (Python 3.11)
                key = key_of(event, at)
                segment = hash(key) & MASK  # the same table index for the open books and the done markers
                books = tables[segment]
                book = books.get(key)
                if book is None:
                    if key in done[segment]:
                        late += 1
                        continue
                    book = books[key] = OpenBook(at, new_state(key), {})
                    if group is None:
                        group = self._group(app, at + ttl)
                    group.append(key)
                elif at > book.opened_at + ttl:
                    late += 1
                    continue
                ident = event_id(event)
                seen = book.seen
                counted = seen.get(ident)
                if counted is not None:
                    duplicate += 1
                    if counted != event:
                        self.conflicts.append((app, key, ident))
                    continue
                seen[ident] = event
                applied += 1
                alerts = apply(book.state, event, now)
                if alerts:
                    fired.extend(alerts)
            except Exception as exc:  # noqa: BLE001 - one event's trouble must not stall the others
                self.failures.append(RuleFailure.of(app, key, event, exc))
        return applied, duplicate, late

    def take_failures(self) -> list[RuleFailure]:
        """The rule failures since the last call (the caller dead-letters or logs them)."""
        failures, self.failures = self.failures, []
        return failures

    def _group(self, app: str, deadline: float) -> list[str]:
        groups = self._groups[app]
        if groups and groups[-1][0] == deadline:
            return groups[-1][1]
        if groups and groups[-1][0] > deadline:
            raise ValueError(f"books must open in deadline order ({deadline} after {groups[-1][0]})")
        keys: list[str] = []
        groups.append((deadline, keys))
        return keys

    def next_due(self) -> float | None:
        """The earliest time (epoch s) at which `close_due` has work: a book's deadline or a
        done marker's expiry; None when there is neither."""
        times = [groups[0][0] for groups in self._groups.values() if groups]
        expiry = self.done.next_expiry()
        if expiry is not None:
            times.append(expiry)
        return min(times, default=None)

    def close_due(self, now_ts: float, now: datetime) -> list[Alert]:
        """Close every book whose deadline is at or before `now_ts`; forget expired done markers."""
        alerts: list[Alert] = []
        for app, groups in self._groups.items():
            if not groups or groups[0][0] > now_ts:
                continue
            tables, close = self.books[app].tables, self.rules[app].close
            closed: list[str] = []
            while groups and groups[0][0] <= now_ts:
                keys = groups.popleft()[1]
                for key in keys:
                    book = tables[hash(key) & MASK].pop(key)
                    try:
                        fired = close(book.state, now)
                    except Exception as exc:  # noqa: BLE001 - the other books still close
                        self.failures.append(RuleFailure.of(app, key, None, exc))
                        continue
                    if fired:
                        alerts.extend(fired)
                closed += keys
            self.done.add(app, closed, now_ts + self.retention)
        self.done.expire(now_ts)
        return alerts
