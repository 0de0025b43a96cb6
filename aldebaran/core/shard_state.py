"""One shard's books in memory: many generic Books, a deadline heap, done markers. Pure.

The shard worker feeds events in delivery order; this class says what fires, closes
books when their deadline (ingest time + ttl) has passed, and produces the delta and
snapshot images the worker checkpoints. A shard rebuilt from its images and fed the
redelivered tail of its queue reaches the same verdicts: books dedup by event id, and
done markers turn events of closed books into late ones.
"""

from __future__ import annotations

import heapq
from datetime import datetime
from typing import Any, Mapping, Sequence

import msgspec

from aldebaran.core.book import Book, Offer, Outcome
from aldebaran.core.done_markers import DoneMarkers
from aldebaran.core.rule import Alert, Rule
from aldebaran.core.snapshot import DoneGroup, ShardImage

BookId = tuple[str, str]  # (app, key)
_LATE = Offer(Outcome.LATE)


class _LiveRecord(msgspec.Struct, array_like=True, gc=False):
    """A `BookRecord` as it is written: the same array, with the live state and seen set inline.

    Encodes to exactly the bytes of `BookRecord(app, key, opened_at, list(seen),
    encode_state(state))` (tests/test_sharded.py checks it), in one encoder pass for the
    whole image instead of one `encode` call and one `Raw` copy per book; `decode_image`
    reads it back as `BookRecord`s.
    """

    app: str
    key: str
    opened_at: float
    seen: Any  # the book's set of event ids: a msgpack array, like list(seen)
    state: Any  # the rule's state object: msgspec encodes it as encode_state would


class _LiveImage(msgspec.Struct, array_like=True, gc=False):
    books: list[_LiveRecord]
    done: list[Any]  # the per-key form of older images: always written empty
    groups: list[DoneGroup]


_image_encoder = msgspec.msgpack.Encoder()


class ShardBooks:
    """The open books and recently closed keys of one shard, for one or more rules."""

    def __init__(self, rules: Mapping[str, Rule[Any]], default_ttl: float, done_retention: float,
                 done_cap: int = 2**62) -> None:
        self.rules = dict(rules)
        self.ttl = {name: rule.ttl_seconds(default_ttl) for name, rule in self.rules.items()}
        self.retention = done_retention
        self.books: dict[BookId, Book[Any]] = {}
        self.done = DoneMarkers(done_cap)
        self._deadlines: list[tuple[float, BookId]] = []
        self._dirty: set[BookId] = set()
        self._closed: list[DoneGroup] = []
        self._state_decoders = {name: msgspec.msgpack.Decoder(type(rule.new_state("")))
                                for name, rule in self.rules.items()}

    @property
    def changed(self) -> bool:
        """Whether a delta would hold anything."""
        return bool(self._dirty or self._closed)

    def offer(self, app: str, event: Any, at: float, now: datetime) -> Offer:
        """One delivered event of rule `app` that entered the pipeline at `at` (epoch s)."""
        rule = self.rules[app]
        bid = (app, rule.key(event, at))
        if bid in self.done:
            return _LATE
        book = self.books.get(bid)
        if book is None:
            book = Book(rule, bid[1], opened_at=at, ttl=self.ttl[app])
            self.books[bid] = book
            heapq.heappush(self._deadlines, (book.deadline, bid))
        offer = book.offer(event, at=at, now=now)
        if offer.outcome is Outcome.APPLIED:
            self._dirty.add(bid)
        return offer

    def offer_many(self, app: str, events: Sequence[Any], at: float, now: datetime,
                   fired: list[Alert]) -> tuple[int, int, int]:
        """`offer` for the events of one segment (same ingest time): (applied, duplicate, late).

        Appends the alerts they fire to `fired`, in order. Why a batch call: per event,
        `offer` costs a call, a `Book.offer` call, an `Offer` and a `deadline` property —
        a third of the shard worker's CPU. This is `Book.offer`'s logic inlined, check for
        check (done marker, closed or past the deadline, seen id, apply), on the same
        `Book` objects; tests/test_sharded.py checks it against `offer` on random streams.
        """
        rule = self.rules[app]
        key_of, event_id, apply = rule.key, rule.event_id, rule.apply
        books, done, dirty = self.books, self.done.of(app), self._dirty
        applied = duplicate = late = 0
        for event in events:
            key = key_of(event, at)
            if key in done:
                late += 1
                continue
            bid = (app, key)
            book = books.get(bid)
            if book is None:
                book = Book(rule, bid[1], at, self.ttl[app])
                books[bid] = book
                heapq.heappush(self._deadlines, (at + book.ttl, bid))
            elif book.closed or at > book.opened_at + book.ttl:
                late += 1
                continue
            seen = book.seen
            ident = event_id(event)
            if ident in seen:
                duplicate += 1
                continue
            seen.add(ident)
            applied += 1
            dirty.add(bid)
            alerts = apply(book.state, event, now)
            if alerts:
                fired.extend(alerts)
        return applied, duplicate, late

    def close_due(self, now_ts: float, now: datetime) -> list[Alert]:
        """Close every book whose deadline passed; forget done markers that expired."""
        alerts: list[Alert] = []
        heap = self._deadlines
        if heap and heap[0][0] <= now_ts:
            # Locals bound once: thousands of books close per tick under load.
            books, dirty = self.books, self._dirty
            closed: dict[str, list[str]] = {}
            heappop = heapq.heappop
            while heap and heap[0][0] <= now_ts:
                bid = heappop(heap)[1]
                book = books.pop(bid, None)
                if book is None:
                    continue
                fired = book.close(now)
                if fired:
                    alerts.extend(fired)
                keys = closed.get(bid[0])
                if keys is None:
                    keys = closed[bid[0]] = []
                keys.append(bid[1])
                dirty.discard(bid)
            expires_at = now_ts + self.retention
            for app, keys in closed.items():
                self.done.add(app, keys, expires_at)
                self._closed.append(DoneGroup(app, expires_at, keys))
        self.done.expire(now_ts)
        return alerts

    def take_delta(self) -> bytes:
        """The books changed and closed since the last take, encoded now (they keep changing)."""
        books = self.books
        records = [_LiveRecord(app, key, book.opened_at, book.seen, book.state)
                   for app, key in self._dirty if (book := books.get((app, key))) is not None]
        image = _LiveImage(records, [], self._closed)
        self._dirty = set()
        self._closed = []
        return _image_encoder.encode(image)

    def take_snapshot(self) -> bytes:
        """Every open book and live done marker (replaces the snapshot and all deltas)."""
        self._dirty = set()
        self._closed = []
        records = [_LiveRecord(app, key, book.opened_at, book.seen, book.state)
                   for (app, key), book in self.books.items()]
        return _image_encoder.encode(_LiveImage(records, [], self.done.groups()))

    def restore(self, images: Sequence[ShardImage], now_ts: float) -> None:
        """Rebuild from a snapshot followed by its deltas, in order."""
        for image in images:
            for record in image.books:
                rule = self.rules.get(record.app)
                if rule is None:
                    continue  # an application no longer configured: its books are gone
                bid = (record.app, record.key)
                if bid in self.done:
                    continue
                book = Book(rule, record.key, opened_at=record.opened_at, ttl=self.ttl[record.app])
                book.state = self._state_decoders[record.app].decode(record.state)
                book.seen = set(record.seen)
                self.books[bid] = book
            groups = [DoneGroup(m.app, m.expires_at, [m.key]) for m in image.done] + image.groups
            for group in groups:
                for key in group.keys:
                    self.books.pop((group.app, key), None)
            self.done.restore(groups, now_ts)
        self._deadlines = [(book.deadline, bid) for bid, book in self.books.items()]
        heapq.heapify(self._deadlines)
        self._dirty = set()
        self._closed = []


# --- the closing clock: router heartbeats ------------------------------------------------

HEARTBEAT = "application/x-aldebaran-shard-heartbeat"  # content type; body: the router's clock, epoch ms (ASCII)
ROUTER_HEADER = "x-aldebaran-router"  # which router sent a heartbeat (one id per router process)
FINAL_HEADER = "x-aldebaran-final"  # true on a router's last heartbeat (graceful stop): forget it at once


class ShardClock:
    """When a shard may close books: the minimum, over live routers, of their last heartbeat.

    A router publishes to every shard queue, in order behind its batches, a heartbeat
    carrying its ingest clock T: every event it stamps from then on is stamped at T or
    later, and every event it stamped earlier is already ahead in the queue. So once a
    shard has processed heartbeats T_r of every live router r, no event stamped before
    min(T_r) can still arrive: books whose deadline is below it may close. A starved or
    lagging shard worker simply reads the heartbeats later; it never closes early.

    A router that sent nothing for `expiry` seconds is forgotten, so a dead router cannot
    stall closing forever. "Sent nothing" holds on both clocks: on the routers' own (the
    newest heartbeat of any router is `expiry` ahead of its last one, i.e. it missed its
    turn in the queue, which a lagging worker does not fake) and locally (nothing from it
    processed for `expiry`, which clock skew between routers does not fake). When nothing
    at all (heartbeat or batch) was processed for `expiry` and the worker has seen its
    queue empty since — every router gone — the clock is the wall clock minus `margin`.
    Pure; times are passed in.
    """

    def __init__(self, expiry: float, margin: float, monotonic: float) -> None:
        self.expiry = expiry
        self.margin = margin
        self.routers: dict[str, float] = {}  # router id -> its newest heartbeat clock (epoch s)
        self.heard: dict[str, float] = {}  # router id -> local monotonic time it was last processed
        self.last_message = monotonic  # anything processed on this shard (monotonic)
        self._floor = float("-inf")  # the clock never goes back

    def message(self, monotonic: float) -> None:
        """A batch was processed: the queue is not silent."""
        self.last_message = monotonic

    def heartbeat(self, router: str, clock: float, monotonic: float, final: bool = False) -> None:
        """Router `router` will stamp nothing earlier than `clock` (epoch s) from now on."""
        self.last_message = monotonic
        if final:
            self.routers.pop(router, None)
            self.heard.pop(router, None)
            return
        if clock > self.routers.get(router, float("-inf")):
            self.routers[router] = clock
        self.heard[router] = monotonic
        self._expire(monotonic)

    def _expire(self, monotonic: float) -> None:
        if not self.routers:
            return
        newest = max(self.routers.values())
        for router, clock in list(self.routers.items()):
            if newest - clock > self.expiry and monotonic - self.heard[router] > self.expiry:
                del self.routers[router]
                del self.heard[router]

    def silent(self, monotonic: float) -> bool:
        """Nothing processed for the expiry: every router gone, or this worker starved."""
        return monotonic - self.last_message >= self.expiry

    def watermark(self, now_ts: float, monotonic: float, drained: bool = False) -> float | None:
        """The clock to close books on (epoch s, never ahead of `now_ts`), or None: not yet.

        `drained`: the worker found its queue empty after the last message it processed.
        Only then does silence mean "every router is gone" and allow the wall clock; a
        silent worker whose queue still holds messages is lagging (a stall under a
        backlog), and the wall clock would close books whose events are still queued.
        """
        if drained and self.silent(monotonic):
            value = now_ts - self.margin
        else:
            self._expire(monotonic)
            if not self.routers:
                return None if self._floor == float("-inf") else self._floor
            value = min(min(self.routers.values()), now_ts)
        if value > self._floor:
            self._floor = value
        return self._floor
