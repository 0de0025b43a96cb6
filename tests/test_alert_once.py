"""Per-order mode: an alert left pending by a crash reaches `Aldebaran.Alert` exactly once.

The crash is set up by hand, deterministically: the order's events wait in its book
queue (routed by a real aggregator, never consumed), the outbox record says `pending`,
and either the alert already went out before the "crash" (its copy on the tap and its
witness in the book queue, as one BCC publish leaves them) or it never did. Then a real
book manager rebuilds the book, computes the alert again and finds it in doubt.
"""

from __future__ import annotations

import pika
import pytest
import redis

from aldebaran.settings import Settings
from aldebaran.trades.events import Purchase, PurchaseRequest
from declare.topology import ALERT, book_queue_arguments
from tests.support import services
from tests.support.pipeline import TAP, alert_counts, collect_alerts, worker
from tests.support.waiting import wait_until

ORDER = "doubt"
ALERT_ID = f"over_purchase:{ORDER}"
RECORDED = (b'{"alert_id": "over_purchase:doubt", "kind": "over_purchase", "order_id": "doubt", '
            b'"client": "c", "stock": "s", "requested_shares": 100, "purchased_shares": 120, '
            b'"purchase_ids": ["d1", "d2"], "detected_at": "2026-01-01T00:00:00.000Z"}')


@pytest.mark.parametrize("went_out", [True, False], ids=["published-before-the-crash", "never-published"])
def test_an_alert_in_doubt_after_a_crash_reaches_the_bus_once(went_out: bool, broker, worker_env, redis_prefix,
                                                              tmp_path) -> None:
    env = dict(worker_env, ALDEBARAN_MODE="per-order", ALDEBARAN_BOOK_TTL_SECONDS="3")
    store = redis.Redis.from_url(services.REDIS_URL)
    queue = f"book-{ORDER}"
    with worker(env, tmp_path / "aggregator.log", "aggregator"):
        broker.publish([PurchaseRequest(ORDER, 100, "c", "s"), Purchase("d1", ORDER, 60, "c", "s"),
                        Purchase("d2", ORDER, 60, "c", "s")], batch=3)
        wait_until(lambda: broker.depth(queue) == 3, "the events in the book queue")
        # The state a book manager killed mid-publish leaves: pending in Redis, and (if the
        # publish made it) the alert on the bus with its witness behind the events.
        store.set(f"{redis_prefix}:alert:{ALERT_ID}", b"pending:" + RECORDED)
        if went_out:
            arguments = book_queue_arguments(Settings(book_ttl_seconds=3))
            broker.channel.queue_declare(queue, durable=True, arguments=arguments)
            broker.channel.queue_bind(queue, ALERT, routing_key=queue)
            broker.channel.basic_publish(ALERT, ALERT, RECORDED, pika.BasicProperties(
                message_id=ALERT_ID, content_type="application/json", delivery_mode=2, headers={"BCC": [queue]}))
        with worker(env, tmp_path / "books.log", "books"):
            wait_until(lambda: store.get(f"{redis_prefix}:book-done:trade_limits:{ORDER}") is not None,
                       "the rebuilt book to finish")
            alerts = collect_alerts(broker, expected=1, timeout=10, settle=2)
            wait_until(lambda: broker.depth(queue) == 0, "every held message acked")
    log = (tmp_path / "books.log").read_text()
    assert alert_counts(alerts) == {ALERT_ID: 1}
    assert alerts[0]["detected_at"] == "2026-01-01T00:00:00.000Z"  # the recorded alert, not a new one
    assert store.get(f"{redis_prefix}:alert:{ALERT_ID}") == b"sent"
    assert "alert in doubt: pending after a crash" in log
    if went_out:
        assert "alert in doubt settled: its witness shows it was published" in log
        assert "publishing it once" not in log
    else:
        assert "alert in doubt had no witness: publishing it once" in log
    assert broker.depth(TAP) == 0


@pytest.mark.parametrize("went_out", [True, False], ids=["published-before-the-crash", "never-published"])
def test_an_engine_alert_left_pending_by_a_crash_reaches_the_bus_once(went_out: bool, broker, worker_env,
                                                                     redis_prefix, tmp_path) -> None:
    """The engine's outbox: pending in Redis after a crash; the new owner reads the witnesses first.
    The outbox is written as an engine of before left it (an entry per alert), which a new
    engine still reads (`tests/test_engine_store.py` covers its own entries, one per cycle)."""
    from aldebaran.io.alert_witness import WITNESS_QUEUE
    from tests.support.pipeline import running

    store = redis.Redis.from_url(services.REDIS_URL)
    alert_key = f"{redis_prefix}:alert:{ALERT_ID}"
    pending = f"{redis_prefix}:engine:pending"
    store.set(alert_key, b"pending")
    store.hset(pending, alert_key, RECORDED)
    if went_out:
        broker.channel.queue_declare(WITNESS_QUEUE, durable=True)
        broker.channel.queue_bind(WITNESS_QUEUE, ALERT, routing_key=WITNESS_QUEUE)
        broker.channel.basic_publish(ALERT, ALERT, RECORDED, pika.BasicProperties(
            message_id=ALERT_ID, content_type="application/json", delivery_mode=2, headers={"BCC": [WITNESS_QUEUE]}))
    with running(dict(worker_env, ALDEBARAN_MODE="engine"), tmp_path / "up.log") as pipeline:
        wait_until(lambda: not store.exists(pending), "the outbox settled")
        alerts = collect_alerts(broker, expected=1, timeout=10, settle=2)
        wait_until(lambda: broker.depth(WITNESS_QUEUE) == 0 or not went_out, "the witness read and acked")
        log = pipeline.log()
    assert alert_counts(alerts) == {ALERT_ID: 1}
    assert store.exists(alert_key)  # the alert's id stays taken: it fires once, ever
    if went_out:
        assert "were on the bus (witnessed): not published again" in log
        assert "re-published alerts left pending by a crash" not in log
    else:
        assert "re-published alerts left pending by a crash" in log
