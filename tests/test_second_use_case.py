"""The second application on the same core, end to end: configuration only, the same `aldebaran up`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from aldebaran.trades.events import Purchase, PurchaseRequest
from declare.topology import book_queue
from tests.support.pipeline import alert_counts, collect_alerts, running


def utc_day() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


@pytest.mark.parametrize("mode", ["engine", "per-order"])
def test_trade_limits_and_client_daily_limit_run_side_by_side(mode, broker, worker_env, tmp_path) -> None:
    env = dict(worker_env, ALDEBARAN_APPS='["trade_limits", "client_daily_limit"]', ALDEBARAN_MODE=mode,
               ALDEBARAN_APP_OPTIONS='{"client_daily_limit": {"max_shares": 100}}')
    days = {utc_day()}
    with running(env, tmp_path / "up.log") as pipeline:
        # acme: one order over its request (110 of 100) and the day over the limit (110 > 100)
        broker.publish([PurchaseRequest("o1", 100, "acme", "AAPL"), Purchase("p1", "o1", 60, "acme", "AAPL"),
                        Purchase("p2", "o1", 50, "acme", "AAPL")], batch=3)
        # zen: no order over its request, but three orders add up to 105 in the day
        broker.publish([PurchaseRequest("o2", 200, "zen", "MSFT"), PurchaseRequest("o3", 50, "zen", "IBM"),
                        Purchase("z1", "o2", 80, "zen", "MSFT"), Purchase("z2", "o2", 10, "zen", "MSFT")], batch=2)
        broker.publish([Purchase("z3", "o3", 15, "zen", "IBM")])
        # calm: exactly the limit in the day (100), spread over two orders: nothing fires
        broker.publish([PurchaseRequest("o4", 100, "calm", "AAPL"), PurchaseRequest("o5", 100, "calm", "AAPL"),
                        Purchase("c1", "o4", 70, "calm", "AAPL"), Purchase("c2", "o5", 30, "calm", "AAPL")])
        # redeliveries of counted purchases change nothing, in either application
        broker.publish([Purchase("p2", "o1", 50, "acme", "AAPL"), Purchase("z3", "o3", 15, "zen", "IBM"),
                        Purchase("c2", "o5", 30, "calm", "AAPL")] * 2, batch=3)
        alerts = collect_alerts(broker, expected=3, timeout=40, settle=3)
        days.add(utc_day())
        if mode == "per-order":  # each application's books live on their own queues (passive declare)
            acme_day = next((a["day"] for a in alerts if a.get("client") == "acme" and "day" in a), min(days))
            for queue in (book_queue("book-", "o1"), book_queue("daily-", f"{acme_day}:acme")):
                assert broker.channel.queue_declare(queue, passive=True).method.message_count == 0
        log = pipeline.log()
    counts = alert_counts(alerts)
    assert set(counts.values()) == {1}, counts
    daily = {a["alert_id"] for a in alerts if a["kind"] == "client_daily_limit"}
    over = {a["alert_id"] for a in alerts if a["kind"] == "over_purchase"}
    assert over == {"over_purchase:o1"}
    assert {alert_id.rsplit(":", 1)[0] for alert_id in daily} == {"client_daily_limit:acme", "client_daily_limit:zen"}
    assert {alert_id.rsplit(":", 1)[1] for alert_id in daily} <= days
    by_client = {a["client"]: a for a in alerts if a["kind"] == "client_daily_limit"}
    assert (by_client["acme"]["purchased_shares"], by_client["acme"]["max_shares"]) == (110, 100)
    assert by_client["zen"]["purchased_shares"] == 105
    assert sorted(by_client["zen"]["purchase_ids"]) == ["z1", "z2", "z3"]
    assert '"apps": ["trade_limits", "client_daily_limit"]' in log
