"""No poison message stalls anything else: a rule that raises, a conflicting duplicate, an
alert id too long for AMQP, in the pure engine and through the real pipeline in both modes.

A rule that raises on an event raises again on every retry and every replay (the engine is
deterministic), so the message is dead-lettered at once with the rule's error as its reason
and everything around it goes on; the log says so once per kind, with a count.
"""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from aldebaran.apps import load_rule
from aldebaran.apps.trade_limits import rule as trade_limits
from aldebaran.core.engine import Engine, RuleReject
from aldebaran.core.rule import MAX_ALERT_ID_BYTES, Alert, bounded_alert_id
from aldebaran.core.wal import WalMessage, decode_record
from aldebaran.trades.codec import JSON, MSGPACK, encode_json, encode_msgpack
from aldebaran.trades.events import Purchase, PurchaseRequest, TradeEvent
from declare.topology import DEAD_LETTER
from tests.support.explodes_app import rule as explodes
from tests.support.pipeline import alert_counts, collect_alerts, running
from tests.support.processes import free_port

NOW = datetime(2026, 1, 1, tzinfo=UTC)
APPS = '["trade_limits", "tests.support.explodes_app"]'


def _engine(*rules: object) -> Engine:
    return Engine(list(rules or (trade_limits, explodes)), default_ttl=2.0, done_retention=30.0, done_cap=10**6,
                  max_message_bytes=1 << 20)


def _msg(*events: TradeEvent) -> WalMessage:
    return WalMessage(MSGPACK, encode_msgpack(list(events)))


def test_a_rule_error_rejects_its_message_and_the_rest_goes_on() -> None:
    engine = _engine()
    poisoned = _msg(PurchaseRequest("m", 10, "c", "s"), Purchase("b1", "m", 6, "boom", "s"),
                    Purchase("b2", "m", 5, "c", "s"))
    plain = _msg(PurchaseRequest("p", 1, "c", "s"), Purchase("p1", "p", 2, "c", "s"))
    cycle = engine.cycle([poisoned, plain, _msg(Purchase("boom-at-close", "z", 1, "c", "s"))], 1_000, NOW)
    assert sorted(a.alert_id for a in cycle.alerts) == ["over_purchase:m", "over_purchase:p"]
    [(index, reject)] = cycle.rejects
    assert index == 0 and isinstance(reject, RuleReject) and reject.raw == b""  # the whole message
    assert reject.reason.startswith("application explodes failed on an event of this message at book 'm'")
    assert "ValueError: boom on purchase b1; its other events counted" in reject.reason
    assert engine.books.books["explodes"]["m"].state == ["b2"]  # its neighbour counted
    closing = engine.cycle([], 3_500, NOW)  # the books close: explodes raises on "z", the others close
    assert [a.alert_id for a in closing.alerts] == ["purchase_without_request:z"]
    assert ([(f.app, f.key, f.error) for f in closing.close_failures]
            == [("explodes", "z", "RuntimeError: boom at close")])
    assert engine.open_books == 0
    # Replay of the logged cycle: the same error again, swallowed, the same books.
    rebuilt = _engine()
    rebuilt.replay(decode_record(cycle.record), NOW)  # type: ignore[arg-type]
    assert rebuilt.books.books["explodes"]["m"].state == ["b2"] and not rebuilt.books.failures


def test_a_conflicting_duplicate_is_reported_once_per_copy_and_never_counted() -> None:
    engine = _engine(trade_limits)
    first = engine.cycle([_msg(PurchaseRequest("o", 100, "c", "s"), Purchase("x", "o", 60, "c", "s"))], 1_000, NOW)
    assert first.conflicts == []
    again = engine.cycle([_msg(Purchase("x", "o", 60, "c", "s")),  # a true redelivery
                          WalMessage(JSON, encode_json([Purchase("x", "o", 50, "c", "s")]))], 1_100, NOW)
    assert again.duplicate == 2 and again.conflicts == [("trade_limits", "o", "x")]
    assert engine.books.books["trade_limits"]["o"].state.purchased == 60  # the first copy counts


def test_alert_ids_are_bounded_for_every_transport() -> None:
    long_client = "\U0001F600" * 200
    rule = load_rule("client_daily_limit", {"max_shares": 1})
    day = rule.new_state(f"2026-01-01:{long_client}")
    [alert] = rule.apply(day, Purchase("p", "o", 2, long_client, "s"), NOW)
    assert (len(alert.alert_id.encode()) <= MAX_ALERT_ID_BYTES
            and alert.alert_id.startswith("client_daily_limit:\U0001F600"))
    assert alert.fields["client"] == long_client  # the body keeps the whole label
    assert bounded_alert_id(f"client_daily_limit:{long_client}:2026-01-01") == alert.alert_id  # deterministic
    assert bounded_alert_id(f"client_daily_limit:{long_client}:2026-01-02") != alert.alert_id
    for short in ("over_purchase:1", "purchase_without_request:" + "\U0001F4A5" * 50, "é" * 127):
        assert (bounded_alert_id(short) == short
                and Alert(alert_id=short, kind="k", key="k", detected_at="t").alert_id == short)
    assert len(bounded_alert_id("x" * 256).encode()) <= MAX_ALERT_ID_BYTES
    assert bounded_alert_id("a\ud800").isascii()  # not UTF-8 encodable: shortened to a form that is


@pytest.mark.parametrize("mode", ["engine", "per-order"])
def test_a_rule_that_raises_stalls_nothing(mode, broker, worker_env, tmp_path) -> None:
    env = dict(worker_env, ALDEBARAN_BOOK_TTL_SECONDS="3", ALDEBARAN_MODE=mode, ALDEBARAN_DELIVERY_LIMIT="2",
               ALDEBARAN_APPS=APPS)
    port = free_port()
    with running(env, tmp_path / "up.log", "--metrics-port", str(port)) as pipeline:
        for n in range(5):
            broker.publish([PurchaseRequest(f"mixed-{n}", 10, "c", "s"),
                            Purchase(f"b{n}", f"mixed-{n}", 6, "boom", "s"),
                            Purchase(f"ok{n}", f"mixed-{n}", 5, "c", "s")], batch=3)
            broker.publish([PurchaseRequest(f"plain-{n}", 10, "c", "s"), Purchase(f"p{n}", f"plain-{n}", 11, "c", "s")],
                           batch=2)
        broker.publish([Purchase("boom-at-close-1", "closing", 1, "c", "s")])
        expected = {f"over_purchase:{kind}-{n}" for kind in ("mixed", "plain") for n in range(5)}
        expected.add("purchase_without_request:closing")
        alerts = collect_alerts(broker, expected=len(expected), timeout=90, settle=2)
        # per-order: the "closing" book fails at its close twice, then its work item is dead-lettered
        dead = broker.drain_until(DEAD_LETTER, 5 + (mode == "per-order"))
        samples = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        alive = pipeline.process.poll() is None  # type: ignore[union-attr]
        log = pipeline.log()
    assert alive
    assert alert_counts(alerts) == {alert_id: 1 for alert_id in expected}
    reasons = [props.headers["x-aldebaran-reason"] for props, _ in dead]
    boom = sorted(r for r in reasons if "ValueError: boom on purchase" in r)
    assert len(boom) == 5 and all(r.startswith("application explodes failed on") for r in boom), reasons
    errors = 6 if mode == "engine" else 5  # per-order counts the failed close as a failed book instead
    assert f'aldebaran_rule_errors_total{{app="explodes"}} {errors}.0' in samples
    if mode == "engine":
        assert len(dead) == 5 and "Traceback" not in log
        assert log.count("application failed closing a book") == 1
        assert log.count('"event": "dead-lettered"') == 1  # one line for the kind, the rest counted
    else:
        assert len(dead) == 6 and sum(r.startswith("book failed 2 times: boom at close") for r in reasons) == 1, reasons
        assert log.count('"event": "dead-lettered"') <= 2


def test_junk_is_dead_lettered_but_never_kept_in_the_log() -> None:
    """A junk flood (each message up to the broker's size limit) must not fill Redis: the
    cycle's record keeps its stamp and only the messages that held an event."""
    engine = _engine(trade_limits)
    junk = WalMessage(JSON, b"[" + b",".join([b"0"] * 3000) + b"]")
    huge = WalMessage(JSON, b"[" + b" " * (2 << 20) + b"]")  # over max_message_bytes
    good = _msg(PurchaseRequest("g", 1, "c", "s"))
    cycle = engine.cycle([junk, huge, good], 1_000, NOW)
    record = decode_record(cycle.record)  # type: ignore[arg-type]
    assert record.stamp_ms == 1_000 and record.messages == [good]
    assert [index for index, _ in cycle.rejects] == [0, 1]  # both still dead-lettered, whole
    only_junk = engine.cycle([huge], 1_100, NOW)
    assert only_junk.record is not None and len(only_junk.record) < 100
    assert decode_record(only_junk.record).messages == [] and only_junk.rejects
