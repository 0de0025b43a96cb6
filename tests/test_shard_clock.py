"""The sharded mode's closing clock (router heartbeats), pure: no broker, no Redis, no sleeping."""

from __future__ import annotations

from datetime import datetime, timezone

from aldebaran.apps.trade_limits import rule
from aldebaran.core.book import Outcome
from aldebaran.core.shard_state import ShardBooks, ShardClock
from aldebaran.trades.events import Purchase, PurchaseRequest

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
EXPIRY = 2.5  # 10 heartbeats of 250 ms
MARGIN = 30.0
WALL = 1_000_000.0  # epoch s: the wall clock in these tests


def test_watermark_is_the_minimum_over_routers_and_never_ahead_of_the_clock() -> None:
    clock = ShardClock(EXPIRY, MARGIN, monotonic=0.0)
    assert clock.watermark(WALL, 0.1) is None  # no router heard yet: close nothing
    clock.heartbeat("a", WALL - 1.0, 0.2)
    clock.heartbeat("b", WALL - 3.0, 0.3)
    assert clock.watermark(WALL, 0.4) == WALL - 3.0
    clock.heartbeat("b", WALL + 0.5, 0.5)  # b's clock is ahead of ours: a is the minimum now
    assert clock.watermark(WALL, 0.6) == WALL - 1.0
    clock.heartbeat("a", WALL + 5.0, 0.7)
    assert clock.watermark(WALL, 0.8) == WALL  # never ahead of the local wall clock
    clock.heartbeat("a", WALL - 9.0, 0.9)  # an older heartbeat (redelivered) does not move a back
    assert clock.watermark(WALL + 1, 1.0) == WALL + 0.5


def test_a_silent_router_is_forgotten_on_both_clocks_not_on_one() -> None:
    clock = ShardClock(EXPIRY, MARGIN, monotonic=0.0)
    clock.heartbeat("a", WALL, 0.0)
    clock.heartbeat("b", WALL, 0.0)
    # b's clock runs 3 s behind a's (skew), but b keeps talking: it stays, and holds the minimum.
    for step in range(1, 20):
        clock.heartbeat("a", WALL + step * 0.25 + 3.0, step * 0.25)
        clock.heartbeat("b", WALL + step * 0.25, step * 0.25)
    assert set(clock.routers) == {"a", "b"}
    assert clock.watermark(WALL + 10, 19 * 0.25) == WALL + 19 * 0.25

    # A lagging worker: locally nothing from b for 4 s, but in the queue b's heartbeats are
    # still right behind a's (router clocks close): b is alive, not forgotten.
    lag = ShardClock(EXPIRY, MARGIN, monotonic=0.0)
    lag.heartbeat("a", WALL, 0.0)
    lag.heartbeat("b", WALL, 0.0)
    lag.heartbeat("a", WALL + 0.25, 4.0)
    assert set(lag.routers) == {"a", "b"}
    assert lag.watermark(WALL + 10, 4.1) == WALL

    # b died: a's heartbeats go on, on a's clock and locally, for more than the expiry.
    for step in range(1, 12):
        lag.heartbeat("a", WALL + 0.25 + step * 0.25, 4.0 + step * 0.25)
    assert set(lag.routers) == {"a"}
    assert lag.watermark(WALL + 10, 7.0) == WALL + 0.25 + 11 * 0.25


def test_a_final_heartbeat_forgets_the_router_at_once() -> None:
    clock = ShardClock(EXPIRY, MARGIN, monotonic=0.0)
    clock.heartbeat("a", WALL - 5.0, 0.0)
    clock.heartbeat("b", WALL - 1.0, 0.0)
    assert clock.watermark(WALL, 0.1) == WALL - 5.0
    clock.heartbeat("a", WALL - 4.0, 0.2, final=True)
    assert clock.watermark(WALL, 0.3) == WALL - 1.0


def test_nothing_heard_for_the_expiry_falls_back_to_the_clock_minus_the_margin() -> None:
    clock = ShardClock(EXPIRY, MARGIN, monotonic=0.0)
    assert clock.watermark(WALL, EXPIRY + 0.1) is None  # silent, but the queue may still hold messages
    assert clock.watermark(WALL, EXPIRY + 0.1, drained=True) == WALL - MARGIN  # no router ever: not stuck
    clock.heartbeat("a", WALL - 40.0, 5.0)  # an old heartbeat from the backlog: the clock never goes back
    assert clock.watermark(WALL, 5.1) == WALL - MARGIN
    clock.heartbeat("a", WALL - 1.0, 5.2)
    assert clock.watermark(WALL, 5.3) == WALL - 1.0
    clock.message(6.0)  # batches alone keep it "heard" ...
    assert clock.watermark(WALL + 1, 8.0) == WALL - 1.0
    assert clock.watermark(WALL + 40, 8.6) == WALL - 1.0  # silence alone: maybe a lagging worker
    assert clock.watermark(WALL + 40, 8.6, drained=True) == WALL + 40 - MARGIN  # silent and drained: it died


def test_a_starved_worker_does_not_close_a_book_whose_events_are_still_queued() -> None:
    """The bench failure: the worker stalls > 2 s; events stamped before the deadline are queued.

    Queue order (what the router publishes): request (t=100.0), heartbeat 100.25, ...,
    heartbeat 102.75, purchase (t=102.9, before the deadline 103.0), heartbeat 103.25.
    The worker processes the request, then starves for 3 s of wall clock; on waking, its
    tick must not close the book, whatever the wall clock says.
    """
    books = ShardBooks({"trade_limits": rule}, default_ttl=3, done_retention=60)
    clock = ShardClock(EXPIRY, MARGIN, monotonic=0.0)
    clock.message(0.0)
    assert books.offer("trade_limits", PurchaseRequest("o", 100, "c", "s"), 100.0, NOW).outcome is Outcome.APPLIED
    clock.heartbeat("r", 100.25, 0.0)

    def tick(wall: float, monotonic: float) -> list:
        mark = clock.watermark(wall, monotonic)
        return [] if mark is None else books.close_due(mark - 0.5, NOW)

    assert tick(100.3, 0.05) == [] and books.books
    # Starved: 3 s pass on both clocks with nothing processed (wall 103.3 > deadline 103.0).
    assert tick(103.3, 3.05) == [] and books.books
    for n in range(2, 12):  # the queued heartbeats up to 102.75
        clock.heartbeat("r", 100.0 + n * 0.25, 3.1)
        assert tick(103.4, 3.1) == []
    clock.message(3.2)
    offered = books.offer("trade_limits", Purchase("p", "o", 150, "c", "s"), 102.9, NOW)
    assert offered.outcome is Outcome.APPLIED
    assert [a.alert_id for a in offered.alerts] == ["over_purchase:o"]
    clock.heartbeat("r", 103.25, 3.3)
    assert tick(103.6, 3.3) == []  # 103.25 - 0.5 is not past the deadline yet
    clock.heartbeat("r", 104.0, 3.4)
    assert tick(104.1, 3.4) == [] and not books.books  # closed; nothing more fires
    late = books.offer("trade_limits", Purchase("q", "o", 1, "c", "s"), 103.5, NOW)
    assert late.outcome is Outcome.LATE  # classification by stamp is unchanged


def test_a_worker_lagging_past_the_margin_never_falls_back_while_its_queue_holds_messages() -> None:
    """The overload bench's wrong alerts: a shard 60 s behind its queue stalls for 3 s.

    On the old rule the silence alone switched the clock to wall - margin (30 s), past the
    deadline of books whose events were still queued 60 s deep. Silence means "every
    router is gone" only when the queue is also drained; a lagging worker is told it is not.
    """
    books = ShardBooks({"trade_limits": rule}, default_ttl=3, done_retention=60)
    clock = ShardClock(EXPIRY, MARGIN, monotonic=0.0)
    clock.message(0.0)
    books.offer("trade_limits", PurchaseRequest("o", 100, "c", "s"), 100.0, NOW)
    clock.heartbeat("r", 100.25, 0.0)
    wall = 160.0  # the queue's head is 60 s old
    for stall in (3.0, 10.0, 100.0):
        mark = clock.watermark(wall + stall, stall, drained=False)
        assert mark == 100.25  # the heartbeats read so far, not the wall clock
        assert books.close_due(mark - 0.5, NOW) == [] and books.books
    clock.message(100.1)
    offered = books.offer("trade_limits", Purchase("p", "o", 150, "c", "s"), 102.9, NOW)
    assert [a.alert_id for a in offered.alerts] == ["over_purchase:o"]
    # Every router gone and the queue drained: the fallback still un-sticks the shard.
    assert clock.watermark(wall + 200, 200.0, drained=True) == wall + 200 - MARGIN
