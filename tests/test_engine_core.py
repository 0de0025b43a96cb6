"""The engine's pure parts: the cycle step, crash recovery by log replay, natural batching, pipeline time."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from aldebaran.apps.trade_limits import TradeLimits, rule
from aldebaran.core.batching import NaturalBatcher
from aldebaran.core.engine import Engine
from aldebaran.core.partitions import Partitioning
from aldebaran.core.pipeline_clock import PipelineClock
from aldebaran.core.rule import accepts_everything
from aldebaran.core.wal import WalIndex, WalMessage, decode_record
from aldebaran.trades.codec import MSGPACK, encode_msgpack
from aldebaran.trades.events import Purchase, PurchaseRequest, TradeEvent
from aldebaran.trades.generator import generate
from tests.support.done_store import StoredDone

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TTL = 2.0


def _engine(ttl: float = TTL, retention: float = 30.0) -> Engine:
    return Engine([rule], default_ttl=ttl, done_retention=retention, done_cap=10**9, max_message_bytes=1 << 20)


def _state(engine: Engine) -> tuple:
    books = {key: (book.opened_at, frozenset(book.seen), book.state.purchased, book.state.alerted,
                   book.state.request) for key, book in engine.books.books["trade_limits"].items()}
    return books, frozenset(engine.books.done.of("trade_limits"))


def _messages(seed: int, orders: int = 60) -> tuple[list[WalMessage], set[str]]:
    stream = generate(orders=orders, seed=seed, orphans=0.1)
    events = stream.events
    messages = [WalMessage(MSGPACK, encode_msgpack(events[i:i + 7])) for i in range(0, len(events), 7)]
    messages.insert(len(messages) // 2, WalMessage("application/json", b'[{"id": "x"}, "junk"]'))
    return messages, stream.expected


def test_a_cycle_closes_before_it_applies_and_logs_what_it_took() -> None:
    engine = _engine()
    request = WalMessage(MSGPACK, encode_msgpack([PurchaseRequest("1", 10, "c", "s")]))
    over = WalMessage(MSGPACK, encode_msgpack([Purchase("p1", "1", 11, "c", "s"), Purchase("p2", "9", 1, "c", "s")]))
    first = engine.cycle([request], 1_000, NOW)
    assert first.alerts == [] and decode_record(first.record).stamp_ms == 1_000  # type: ignore[arg-type]
    second = engine.cycle([over], 2_000, NOW)
    assert [a.alert_id for a in second.alerts] == ["over_purchase:1"] and second.applied == 2
    # Book "9" opened at 2.0 s: its deadline (4.0 s) is not before 4_000 ms, so it is still open then.
    assert engine.cycle([], 4_000, NOW).alerts == [] and engine.cycle([], 4_001, NOW).record is None
    assert [a.alert_id for a in engine.close(4_001, NOW)] == []  # closed by the cycle at 4_001 already
    late = engine.cycle([over], 5_000, NOW)
    assert late.late == 2 and late.alerts == []


def test_junk_inside_a_batch_is_rejected_alone() -> None:
    engine = _engine()
    cycle = engine.cycle([WalMessage("application/json",
                                     b'[{"id": "1", "#shares": 5, "client": "c", "stock": "s"}, {"id": 2}]')],
                         1_000, NOW)
    assert cycle.applied == 1 and len(cycle.rejects) == 1 and "missing field" in cycle.rejects[0][1].reason


@hsettings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(1, 6), min_size=1, max_size=40),
       crash=st.floats(0.05, 0.95), compact_every=st.integers(2, 9))
def test_replaying_the_log_rebuilds_exactly_the_lost_books(seed: int, cuts: list[int], crash: float,
                                                          compact_every: int) -> None:
    """Live engine vs one rebuilt at any point from the last compaction and the log after it:
    the same books and done markers then, and the same alerts cycle by cycle from then on.
    Stamps advance 150 ms a message against a 2 s ttl, so books close, go late and compact."""
    messages, _ = _messages(seed)
    live = _engine()
    log: list[bytes] = []
    stored = StoredDone()
    stamp, taken, index = 10_000, 0, 0
    crash_at = int(len(messages) * crash)
    rebuilt: Engine | None = None
    while taken < len(messages):
        batch = messages[taken:taken + cuts[index % len(cuts)]]
        taken += len(batch)
        index += 1
        stamp += 150 * len(batch)
        cycle = live.cycle(batch, stamp, NOW)
        if rebuilt is not None:
            again = rebuilt.cycle(batch, stamp, NOW)
            assert [a.alert_id for a in again.alerts] == [a.alert_id for a in cycle.alerts]
            assert again.record == cycle.record
            continue
        log.append(cycle.record)  # type: ignore[arg-type]
        if index % compact_every == 0:
            del log[:stored.compact(live).trim]
        if taken >= crash_at:
            rebuilt = _engine()
            if stored.clock_ms:
                rebuilt.restore_done(stored.image())
            for record in log:
                rebuilt.replay(decode_record(record), NOW)
            assert _state(rebuilt) == _state(live)
            assert len(rebuilt.wal) == len(live.wal) and rebuilt.resume_at_ms == stamp
    assert rebuilt is not None
    final = stamp + int(TTL * 1000) * 3
    assert [a.alert_id for a in rebuilt.close(final, NOW)] == [a.alert_id for a in live.close(final, NOW)]


@hsettings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), crash=st.floats(0.1, 0.9))
def test_a_rebuilt_engine_fires_what_the_live_one_would_have(seed: int, crash: float) -> None:
    messages, expected = _messages(seed, orders=40)
    cut = int(len(messages) * crash)
    live, log, fired = _engine(ttl=1000.0), [], set()
    for i, message in enumerate(messages[:cut]):
        cycle = live.cycle([message], 10_000 + 100 * i, NOW)
        fired |= {a.alert_id for a in cycle.alerts}
        log.append(cycle.record)
    rebuilt = _engine(ttl=1000.0)
    for record in log:
        rebuilt.replay(decode_record(record), NOW)
    after = set()
    for i, message in enumerate(messages[cut:], start=cut):
        after |= {a.alert_id for a in rebuilt.cycle([message], 10_000 + 100 * i, NOW).alerts}
    after |= {a.alert_id for a in rebuilt.close(10_000 + 100 * len(messages) + 2_000_000, NOW)}
    # What the rebuilt engine fires again for books closed live is deduplicated by the outbox
    # (alert ids); together they are exactly the expected alerts, and nothing expected is lost.
    assert fired | after == expected


@hsettings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(1, 6), min_size=1, max_size=40),
       gaps=st.lists(st.integers(1, 900), min_size=1, max_size=40))
def test_closing_each_book_when_it_falls_due_changes_nothing_the_cycles_decide(
        seed: int, cuts: list[int], gaps: list[int]) -> None:
    """An idle worker closes at `next_close_ms` between cycles (workers/engine_session.py); an
    engine that only closes at its cycles' starts must end every cycle with the same books and
    done keys, the same record, and the same alerts, those of the idle closes coming first.
    `next_close_ms` is the first stamp with work: a millisecond earlier closes nothing.

    A done key is remembered for the retention from its book's close, and an idle close comes
    up to a gap before the cycle's: with a 30 s retention the two engines' keys expired a gap
    apart (found with seed=0, cuts=[1], gaps=[889]). Retained longer than the stream here."""
    messages, _ = _messages(seed)
    cycles_only, idle_closing = _engine(retention=1e6), _engine(retention=1e6)
    stamp, taken, index = 10_000, 0, 0
    while taken < len(messages):
        batch = messages[taken:taken + cuts[index % len(cuts)]]
        taken += len(batch)
        stamp += gaps[index % len(gaps)] * len(batch)
        index += 1
        early = []
        while (due := idle_closing.next_close_ms()) is not None and due < stamp:
            before = _state(idle_closing)
            assert idle_closing.close(due - 1, NOW) == [] and _state(idle_closing) == before
            early += idle_closing.close(due, NOW)
            assert _state(idle_closing) != before
        expected = cycles_only.cycle(batch, stamp, NOW)
        cycle = idle_closing.cycle(batch, stamp, NOW)
        assert [a.alert_id for a in early + cycle.alerts] == [a.alert_id for a in expected.alerts]
        assert cycle.record == expected.record and _state(idle_closing) == _state(cycles_only)


def test_the_log_index_trims_only_records_of_closed_books() -> None:
    index = WalIndex()
    for stamp in (1_000, 2_000, 3_000, 4_000):
        index.appended(stamp)
    # Closing every deadline before 4_500 with a 2 s ttl: books opened before 2_500 are closed.
    assert index.trimmable(4_500, 2_000) == 2
    assert index.trimmable(3_000, 2_000) == 0  # a book opened at 1_000 closes only after 3_000
    index.trimmed(2)
    assert len(index) == 2 and index.trimmable(10_000, 2_000) == 2


@hsettings(max_examples=200, deadline=None)
@given(ops=st.lists(st.sampled_from(["add", "add", "add", "take", "done"]), max_size=80),
       max_items=st.integers(1, 5), max_in_flight=st.integers(1, 3))
def test_natural_batching_keeps_order_and_never_holds_when_idle(ops: list[str], max_items: int,
                                                               max_in_flight: int) -> None:
    batcher: NaturalBatcher[int] = NaturalBatcher(max_items, max_in_flight)
    added, sent, counter = [], [], 0
    for op in ops:
        if op == "add":
            batcher.add(counter)
            added.append(counter)
            counter += 1
        elif op == "take":
            batch = batcher.take()
            assert len(batch) <= max_items
            sent += batch
        elif batcher.in_flight:
            batcher.done()
        # Nothing in flight and something pending: a batch may always leave at once.
        if batcher.in_flight == 0 and len(batcher):
            assert batcher.ready
        assert batcher.in_flight <= max_in_flight + 1
    while batcher.ready:
        sent += batcher.take()
        batcher.done()
    assert sent == added[:len(sent)]  # never reordered
    if batcher.in_flight == 0:
        assert sent == added  # never held once nothing is in flight


def test_pipeline_time_stands_still_while_the_stream_is_paused() -> None:
    clock = PipelineClock(5_000, monotonic=100.0)
    assert clock.stamp(100.5) == 5_500
    clock.pause(101.0)
    assert clock.stamp(160.0) == 6_000  # an outage adds nothing to any book's age
    clock.resume(161.0)
    assert clock.stamp(161.25) == 6_250
    assert clock.stamp(161.0) == 6_250  # never back


def test_a_lone_rule_sees_only_the_events_it_accepts() -> None:
    from aldebaran.apps.client_daily_limit import ClientDailyLimit, Options

    daily = ClientDailyLimit(Options(max_shares=100))
    engine = Engine([daily], default_ttl=TTL, done_retention=30.0, done_cap=10**9, max_message_bytes=1 << 20)
    # The request's 90 shares are not purchases: only the purchase's 20 count towards the limit.
    message = WalMessage(MSGPACK, encode_msgpack([PurchaseRequest("1", 90, "c", "s"),
                                                  Purchase("p1", "1", 20, "c", "s")]))
    cycle = engine.cycle([message], 1_000, NOW)
    assert cycle.applied == 1 and cycle.alerts == []
    (day,) = engine.books.books["client_daily_limit"].values()
    assert day.state.purchased == 20


class _Unrelated:
    """An event class the trade codec never yields."""


class _CountingLimits(TradeLimits):
    """trade_limits counting its `accepts` calls, declaring `types` (None: undeclared), taking
    purchases only when `purchases_only`."""

    def __init__(self, types: tuple[type, ...] | None, purchases_only: bool) -> None:
        self.calls = 0
        self.event_types = types  # type: ignore[assignment]
        self.purchases_only = purchases_only

    def accepts(self, event: TradeEvent) -> bool:
        self.calls += 1
        return not (self.purchases_only and event.is_request)


def test_a_rule_that_takes_every_decoded_type_is_not_asked_per_event() -> None:
    events = [PurchaseRequest("1", 10, "c", "s"), Purchase("p1", "1", 11, "c", "s")]
    for types, purchases_only, calls in (((TradeEvent,), False, 0), ((_Unrelated,), True, 2), (None, False, 2)):
        counting = _CountingLimits(types, purchases_only)
        assert accepts_everything(counting) is (calls == 0)
        engine = Engine([counting], default_ttl=TTL, done_retention=30.0, done_cap=10**9,
                        max_message_bytes=1 << 20)
        cycle = engine.cycle([WalMessage(MSGPACK, encode_msgpack(events))], 1_000, NOW)
        assert counting.calls == calls, types
        # Filtered or not, what the rule takes is applied: without requests, no over_purchase.
        assert cycle.applied == (1 if purchases_only else 2)
        assert [a.kind for a in cycle.alerts] == ([] if purchases_only else ["over_purchase"])
        assert cycle.kinds == {"PurchaseRequest": 1, "Purchase": 1}
        routed = Partitioning([counting], 0, 1).route(events, handed_over=False)
        assert counting.calls == 2 * calls and len(routed.own[0]) == cycle.applied


def test_done_markers_forgotten_by_the_cap_are_handed_to_the_counter_once() -> None:
    engine = Engine([rule], default_ttl=TTL, done_retention=30.0, done_cap=3, max_message_bytes=1 << 20)
    requests = [PurchaseRequest(str(i), 10, "c", "s") for i in range(5)]
    engine.cycle([WalMessage(MSGPACK, encode_msgpack(requests))], 1_000, NOW)
    engine.cycle([], 1_000 + int(TTL * 1000) + 1, NOW)  # the five books close: five markers, cap three
    assert engine.done_markers == 3
    assert engine.take_forgotten() == 2 and engine.take_forgotten() == 0


def test_each_book_s_conflicting_opening_event_is_logged_not_only_the_first_book_s() -> None:
    """trade_limits gives every request the event id "": a conflict of one order's request
    once silenced every later order's (logged by id alone)."""
    from structlog.testing import capture_logs

    from aldebaran.apps import load_rules
    from aldebaran.core.engine import Cycle
    from aldebaran.log import Throttle
    from aldebaran.settings import Settings
    from workers.engine import EngineWorker

    settings = Settings()
    worker = EngineWorker(settings, load_rules(settings))
    worker.throttle = Throttle(interval=0.0)  # every line the dedup lets through is written
    cycle = Cycle(0, conflicts=[("trade_limits", "A", ""), ("trade_limits", "A", ""), ("trade_limits", "B", "")])
    with capture_logs() as logs:
        worker.troubles(cycle)
    lines = [(e["order_id"], e["event_id"]) for e in logs if e["event"].startswith("conflicting duplicate")]
    assert lines == [("A", "(the book's opening event)"), ("B", "(the book's opening event)")]
