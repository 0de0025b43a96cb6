"""The per-client daily limit, pure: through the core's Book, against a tiny reference model."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from aldebaran.apps import load_rule, load_rules, trade_limits
from aldebaran.apps.client_daily_limit import ClientDailyLimit, Options, make_rule
from aldebaran.core.book import Book, Outcome
from aldebaran.errors import ConfigError
from aldebaran.settings import load_settings
from aldebaran.trades.events import Purchase, PurchaseRequest, TradeEvent

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
MIDNIGHT = datetime(2026, 11, 22, tzinfo=UTC).timestamp()  # 2026-11-22T00:00:00Z
DAY = 86400.0


def feed(rule: ClientDailyLimit, deliveries: list[tuple[TradeEvent, float]]) -> list:
    """What the workers do, without them: key by ingest time, one Book per key, offer in order."""
    books: dict[str, Book] = {}
    alerts = []
    for event, at in deliveries:
        if not rule.accepts(event):
            continue
        key = rule.key(event, at)
        book = books.setdefault(key, Book(rule, key, opened_at=at, ttl=rule.ttl_seconds(60.0)))
        alerts += book.offer(event, at=at, now=NOW).alerts
    for book in books.values():
        alerts += book.close(NOW)
    return alerts


def reference(limit: int, deliveries: list[tuple[TradeEvent, float]]) -> dict[str, int]:
    """The rule in a few lines: per client and UTC day of ingest, distinct purchases, first sum over."""
    fills: dict[tuple[str, str], dict[tuple[str, str], int]] = {}
    fired: dict[str, int] = {}
    for event, at in deliveries:
        if not event.is_request:
            day = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d")
            group = fills.setdefault((event.client, day), {})
            group.setdefault((event.order_id, event.id), event.shares)
            alert_id = f"client_daily_limit:{event.client}:{day}"
            if alert_id not in fired and sum(group.values()) > limit:
                fired[alert_id] = sum(group.values())
    return fired


def test_fires_once_when_the_day_goes_over_and_names_client_and_day() -> None:
    rule = make_rule(Options(max_shares=100))
    deliveries = [(PurchaseRequest("o1", 500, "acme", "AAPL"), MIDNIGHT + 10),
                  (Purchase("p1", "o1", 60, "acme", "AAPL"), MIDNIGHT + 20),
                  (Purchase("p2", "o2", 40, "acme", "MSFT"), MIDNIGHT + 30),   # 100: equal, no alert
                  (Purchase("p3", "o3", 1, "acme", "IBM"), MIDNIGHT + 40),     # 101: alert
                  (Purchase("p4", "o3", 50, "acme", "IBM"), MIDNIGHT + 50)]    # already alerted
    alerts = feed(rule, deliveries)
    assert len(alerts) == 1
    alert = alerts[0]
    assert alert.alert_id == "client_daily_limit:acme:2026-11-22" and alert.kind == "client_daily_limit"
    assert alert.fields == {"client": "acme", "day": "2026-11-22", "max_shares": 100,
                            "purchased_shares": 101, "purchase_ids": ["p1", "p2", "p3"]}
    wire = json.loads(alert.to_json())
    assert wire["alert_id"] == alert.alert_id and wire["detected_at"].endswith("Z")


def test_days_and_clients_are_separate_books() -> None:
    rule = make_rule(Options(max_shares=100))
    deliveries = [(Purchase("a", "o1", 80, "acme", "s"), MIDNIGHT - 1),        # 2026-11-21
                  (Purchase("b", "o1", 80, "acme", "s"), MIDNIGHT),            # 2026-11-22
                  (Purchase("c", "o2", 80, "zenith", "s"), MIDNIGHT + 5)]
    assert feed(rule, deliveries) == []
    assert rule.key(deliveries[0][0], MIDNIGHT - 1) == "2026-11-21:acme"
    assert rule.key(deliveries[1][0], MIDNIGHT) == "2026-11-22:acme"


def test_the_same_purchase_redelivered_counts_once_but_same_id_in_another_order_counts() -> None:
    rule = make_rule(Options(max_shares=100))
    key = rule.key(Purchase("p", "o1", 60, "c", "s"), MIDNIGHT)
    book = Book(rule, key, opened_at=MIDNIGHT, ttl=rule.ttl_seconds(60))
    outcomes = [book.offer(Purchase("p", "o1", 60, "c", "s"), at=MIDNIGHT + i, now=NOW).outcome for i in range(3)]
    assert outcomes == [Outcome.APPLIED, Outcome.DUPLICATE, Outcome.DUPLICATE]
    offer = book.offer(Purchase("p", "o2", 41, "c", "s"), at=MIDNIGHT + 4, now=NOW)
    assert [a.fields["purchased_shares"] for a in offer.alerts] == [101]
    assert book.final and list(book.close(NOW)) == []


def test_client_names_with_separators_keep_the_alert_id_exact() -> None:
    rule = make_rule(Options(max_shares=1))
    alerts = feed(rule, [(Purchase("p", "o", 2, "a:b c", "s"), MIDNIGHT + 1)])
    assert [(a.alert_id, a.fields["client"]) for a in alerts] == [("client_daily_limit:a:b c:2026-11-22", "a:b c")]


@given(opened=st.floats(0, DAY - 1e-3), later=st.floats(0, 1))
def test_a_book_lives_through_the_rest_of_its_day(opened: float, later: float) -> None:
    """Every event keyed to a day is stamped within it, so none is late while the day lasts."""
    rule = make_rule(Options(max_shares=10))
    book = Book(rule, "2026-11-22:c", opened_at=MIDNIGHT + opened, ttl=rule.ttl_seconds(60))
    at = MIDNIGHT + opened + (DAY - 1e-3 - opened) * later
    assert book.offer(Purchase("p", "o", 1, "c", "s"), at=at, now=NOW).outcome is Outcome.APPLIED
    assert book.offer(Purchase("q", "o", 1, "c", "s"), at=book.deadline + 1, now=NOW).outcome is Outcome.LATE


purchases = st.builds(Purchase, id=st.sampled_from("abc"), order_id=st.sampled_from(["o1", "o2", "o3"]),
                      shares=st.integers(1, 60), client=st.sampled_from(["acme", "zen", "a:b"]),
                      stock=st.just("s"))
requests = st.builds(PurchaseRequest, id=st.sampled_from(["o1", "o2"]), shares=st.integers(1, 100),
                     client=st.sampled_from(["acme", "zen"]), stock=st.just("s"))
# Ingest times over two days and a bit, crossing midnights; redeliveries are just repeats.
deliveries = st.lists(st.tuples(st.one_of(purchases, requests), st.floats(MIDNIGHT - 3600, MIDNIGHT + 2 * DAY)),
                      max_size=40).map(lambda xs: sorted(xs, key=lambda x: x[1]))


@hsettings(max_examples=300, deadline=None)
@given(limit=st.integers(1, 150), stream=deliveries)
def test_matches_the_reference_model(limit: int, stream: list) -> None:
    rule = make_rule(Options(max_shares=limit))
    alerts = feed(rule, stream)
    got = {a.alert_id: a.fields["purchased_shares"] for a in alerts}
    assert len(got) == len(alerts)  # at most one alert per client and day
    assert got == reference(limit, stream)


def test_trade_limits_ignores_the_ingest_time() -> None:
    purchase = Purchase("p", "o1", 1, "c", "s")
    assert trade_limits.rule.key(purchase, MIDNIGHT) == trade_limits.rule.key(purchase, MIDNIGHT + 3 * DAY) == "o1"


def test_options_are_validated_with_their_key_in_the_message() -> None:
    assert load_rule("client_daily_limit", {"max_shares": 10000}).max_shares == 10000
    with pytest.raises(ConfigError, match=r"app_options\.client_daily_limit\.max_shares: Field required"):
        load_rule("client_daily_limit")
    with pytest.raises(ConfigError, match=r"app_options\.client_daily_limit\.max_shares: Input should be greater"):
        load_rule("client_daily_limit", {"max_shares": 0})
    with pytest.raises(ConfigError, match=r"app_options\.client_daily_limit\.max_share: unknown option"):
        load_rule("client_daily_limit", {"max_shares": 5, "max_share": 5})
    with pytest.raises(ConfigError, match=r"app_options\.trade_limits: application 'trade_limits' takes no options"):
        load_rule("trade_limits", {"x": 1})


def test_configuration_from_toml_and_environment(tmp_path, monkeypatch) -> None:
    for name in [k for k in __import__("os").environ if k.startswith("ALDEBARAN_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "aldebaran.toml"
    config.write_text('apps = ["trade_limits", "client_daily_limit"]\n\n'
                      "[app_options.client_daily_limit]\nmax_shares = 10000\n")
    monkeypatch.setenv("ALDEBARAN_CONFIG", str(config))
    rules = load_rules(load_settings())
    assert [r.name for r in rules] == ["trade_limits", "client_daily_limit"]
    assert rules[1].max_shares == 10000 and rules[1].queue_prefix != rules[0].queue_prefix
    monkeypatch.setenv("ALDEBARAN_APP_OPTIONS", '{"client_daily_limit": {"max_shares": 7}}')
    assert load_rules(load_settings())[1].max_shares == 7
    monkeypatch.setenv("ALDEBARAN_APPS", '["trade_limits"]')
    with pytest.raises(ConfigError, match="app_options for applications not in apps: client_daily_limit"):
        load_settings()
