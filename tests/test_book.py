"""The book state machine (CONTRACT §1), without a broker, against a ten-line reference."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from aldebaran.apps.trade_limits import rule
from aldebaran.core.book import Book, Outcome
from aldebaran.trades.events import Purchase, PurchaseRequest

NOW = datetime(2026, 11, 22, tzinfo=UTC)


def run_book(events, ttl: float = 60.0, close: bool = True) -> list[tuple[str, int]]:
    book = Book(rule, "1", opened_at=0.0, ttl=ttl)
    alerts = []
    for event in events:
        alerts += book.offer(event, at=1.0, now=NOW).alerts
    if close:
        alerts += book.close(NOW)
    return [(a.alert_id, a.fields["purchased_shares"]) for a in alerts]


def reference(events) -> list[tuple[str, int]]:
    """CONTRACT §1 in ten lines: distinct events, first prefix over the limit, close."""
    limit, fills, alerts = None, {}, []
    for e in events:
        if e.is_request:
            limit = e.shares if limit is None else limit
        else:
            fills.setdefault(e.id, e.shares)
        if limit is not None and not alerts and sum(fills.values()) > limit:
            alerts.append(("over_purchase:1", sum(fills.values())))
    if limit is None and fills:
        alerts.append(("purchase_without_request:1", sum(fills.values())))
    return alerts


def test_design_document_example() -> None:
    events = [PurchaseRequest("1", 100, "Sendence", "AAPL"), Purchase("2", "1", 90, "Sendence", "AAPL"),
              Purchase("3", "1", 30, "Sendence", "AAPL"), Purchase("4", "1", 10, "Sendence", "AAPL")]
    book = Book(rule, "1", opened_at=0.0, ttl=60)
    fired = [book.offer(e, at=1.0, now=NOW).alerts for e in events]
    assert [len(a) for a in fired] == [0, 0, 1, 0]
    alert = fired[2][0]
    assert alert.alert_id == "over_purchase:1"
    assert alert.fields == {"order_id": "1", "client": "Sendence", "stock": "AAPL", "requested_shares": 100,
                            "purchased_shares": 120, "purchase_ids": ["2", "3"]}
    assert book.final and list(book.close(NOW)) == []
    assert alert.to_json().startswith(b'{"alert_id":"over_purchase:1","kind":"over_purchase","order_id":"1"')


def test_equal_fill_does_not_fire_one_more_share_does() -> None:
    request = PurchaseRequest("1", 100, "c", "s")
    assert run_book([request, Purchase("a", "1", 60, "c", "s"), Purchase("b", "1", 40, "c", "s")]) == []
    assert run_book([request, Purchase("a", "1", 60, "c", "s"), Purchase("b", "1", 41, "c", "s")]) == [
        ("over_purchase:1", 101)]


def test_purchases_before_request_fire_when_it_arrives() -> None:
    book = Book(rule, "1", opened_at=0.0, ttl=60)
    assert book.offer(Purchase("a", "1", 80, "c", "s"), at=1, now=NOW).alerts == []
    assert book.offer(Purchase("b", "1", 30, "c", "s"), at=1, now=NOW).alerts == []
    fired = book.offer(PurchaseRequest("1", 100, "c", "s"), at=1, now=NOW).alerts
    assert [a.alert_id for a in fired] == ["over_purchase:1"]


def test_duplicates_count_once_and_say_so() -> None:
    book = Book(rule, "1", opened_at=0.0, ttl=60)
    purchase = Purchase("a", "1", 60, "c", "s")
    outcomes = [book.offer(purchase, at=1, now=NOW).outcome for _ in range(3)]
    assert outcomes == [Outcome.APPLIED, Outcome.DUPLICATE, Outcome.DUPLICATE]
    assert book.offer(PurchaseRequest("1", 100, "c", "s"), at=1, now=NOW).alerts == []


def test_request_and_purchase_with_the_same_id_are_different_events() -> None:
    assert run_book([PurchaseRequest("1", 10, "c", "s"), Purchase("1", "1", 11, "c", "s")]) == [
        ("over_purchase:1", 11)]


def test_purchase_without_request_fires_once_at_close() -> None:
    book = Book(rule, "1", opened_at=0.0, ttl=60)
    book.offer(Purchase("a", "1", 5, "c", "s"), at=1, now=NOW)
    fired = book.close(NOW)
    assert [(a.kind, a.fields["requested_shares"]) for a in fired] == [("purchase_without_request", None)]
    assert list(book.close(NOW)) == []


def test_events_after_the_deadline_are_late_and_change_nothing() -> None:
    book = Book(rule, "1", opened_at=0.0, ttl=10)
    book.offer(PurchaseRequest("1", 10, "c", "s"), at=1, now=NOW)
    offer = book.offer(Purchase("a", "1", 50, "c", "s"), at=10.5, now=NOW)
    assert offer.outcome is Outcome.LATE and offer.alerts == ()
    assert list(book.close(NOW)) == []


ids = st.sampled_from(["a", "b", "c", "d", "e"])
events = st.one_of(
    st.builds(PurchaseRequest, id=st.just("1"), shares=st.integers(1, 200), client=st.just("c"), stock=st.just("s")),
    st.builds(Purchase, id=ids, order_id=st.just("1"), shares=st.integers(1, 120), client=st.just("c"),
              stock=st.just("s")),
)


@given(st.lists(events, max_size=30), st.randoms())
def test_any_interleaving_with_duplicates_matches_the_reference(stream, rnd) -> None:
    # Redeliver some events (same id, same content) at random places.
    noisy = list(stream)
    for event in stream:
        if rnd.random() < 0.3:
            noisy.insert(rnd.randrange(len(noisy) + 1), event)
    # The first copy of each id wins in both the book and the reference.
    assert run_book(noisy) == reference(noisy)
