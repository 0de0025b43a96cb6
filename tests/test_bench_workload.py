"""The overload bench's feed, without a broker: clean boundaries, cuts, and the alerts of exactly what was published."""

from __future__ import annotations

from aldebaran.bench.overload import _Feed
from aldebaran.bench.workload import Workload, build
from aldebaran.io.publisher import Body
from aldebaran.trades.codec import MSGPACK, decode_message, encode_msgpack
from aldebaran.trades.events import TradeEvent
from aldebaran.trades.generator import expected_alerts, generate


def _mildly_shuffled(orders: int = 300, batch: int = 7) -> Workload:
    """Small shuffle windows and bodies: many boundaries are clean, many are not."""
    stream = generate(orders=orders, seed=11, orphans=0.05, shuffle_window=4, duplicates=0.02)
    chunks = [stream.events[i:i + batch] for i in range(0, len(stream.events), batch)]
    return Workload(stream.events, stream.expected, [Body(encode_msgpack(c), len(c), MSGPACK) for c in chunks], batch)


def _orders(bodies: list[Body]) -> set[str]:
    return {e.order_id for body in bodies for e in decode_message(body.data, body.content_type).events}


def _events(bodies: list[Body]) -> list[TradeEvent]:
    return [e for body in bodies for e in decode_message(body.data, body.content_type).events]


def test_clean_boundaries_are_exactly_those_no_order_straddles() -> None:
    for workload in (build(300, 20), _mildly_shuffled()):
        n = len(workload.bodies)
        assert workload.clean[0] == 0 and workload.clean[-1] == n
        straddled = {i for i in range(n + 1) if _orders(workload.bodies[:i]) & _orders(workload.bodies[i:])}
        assert set(workload.clean) == set(range(n + 1)) - straddled
    assert 2 < len(_mildly_shuffled().clean) < len(_mildly_shuffled().bodies)  # the test covers both kinds


def test_a_cut_skips_to_the_next_clean_boundary_and_the_expected_alerts_are_those_published() -> None:
    workload = _mildly_shuffled()
    dirty = next(i for i in range(1, len(workload.bodies)) if i not in workload.clean)
    feed = _Feed(workload)
    taken = list(feed.take(lambda: feed.index >= dirty))
    feed.cut()
    resume = workload.next_clean(dirty)
    assert resume > dirty and feed.index == resume
    rest = list(feed.take(lambda: feed.round == 1 and feed.index >= 9))
    published = taken + rest
    assert len(published) == dirty + (len(workload.bodies) - resume) + 9
    assert feed.expected() == expected_alerts(_events(published))
    skipped = _orders(workload.bodies[dirty:resume]) - _orders(published)
    assert skipped and not {alert.split(":", 1)[1] for alert in feed.expected()} & skipped
    assert feed.ranges == [(0, 0, dirty), (0, resume, len(workload.bodies))]


def test_without_a_clean_boundary_left_a_cut_starts_the_next_round() -> None:
    workload = build(300, 20)
    feed = _Feed(workload)
    published = list(feed.take(lambda: feed.index >= 30))
    feed.cut()
    assert (feed.round, feed.index) == (1, 0)
    feed.cut()
    assert (feed.round, feed.index) == (1, 0)  # nothing taken since: nothing skipped
    published += list(feed.take(lambda: feed.index >= 5))
    assert feed.expected() == expected_alerts(_events(published))
    assert feed.expected() == workload.round_expected(0, bodies=30) | workload.range_expected(1, 0, 5)


def test_range_expected_relabels_like_round_expected() -> None:
    workload = _mildly_shuffled()
    assert workload.range_expected(3, 0, len(workload.bodies)) == workload.round_expected(3)
    start, end = workload.clean[1], workload.clean[2]
    bodies = [workload.round_body(3, i) for i in range(start, end)]
    assert workload.range_expected(3, start, end) == expected_alerts(_events(bodies))
