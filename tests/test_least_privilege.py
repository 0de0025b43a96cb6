"""Least privilege, shipped: `aldebaran declare --publisher-user` makes a user that cannot forge alerts.

The workers run as the `--workers-user`, in both modes; the publisher's trade data alerts
once, and its forged alert and its writes to internal queues are refused with 403.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from urllib.parse import quote, urlsplit, urlunsplit

import pika
import pika.exceptions
import pytest

from aldebaran.trades.codec import encode_json
from aldebaran.trades.events import Purchase, PurchaseRequest
from declare.topology import ALERT, TRADE_DATA, WORK_QUEUE, book_queue
from tests.support import services
from tests.support.pipeline import Broker, alert_counts, collect_alerts, running


def _as(user: str, password: str, amqp_url: str) -> str:
    parts = urlsplit(amqp_url)
    return urlunsplit((parts.scheme, f"{quote(user)}:{quote(password)}@{parts.hostname}:{parts.port or 5672}",
                       parts.path, "", ""))


@pytest.fixture
def users(vhost, worker_env, tmp_path) -> Iterator[tuple[str, str, str]]:
    """`aldebaran declare` with a publisher and a workers user: (publisher URL, workers URL, its stdout)."""
    suffix = uuid.uuid4().hex[:8]
    publisher, workers = f"pub-{suffix}", f"wrk-{suffix}"
    (tmp_path / "pub").write_text("pub-secret\n")
    (tmp_path / "wrk").write_text("wrk-secret\n")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "aldebaran.cli", "declare", "--publisher-user", f"{publisher}={tmp_path / 'pub'}",
             "--workers-user", f"{workers}={tmp_path / 'wrk'}"],
            env=worker_env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "pub-secret" not in result.stdout + result.stderr and "wrk-secret" not in result.stdout
        assert f"user {publisher} (publisher)" in result.stdout
        yield (_as(publisher, "pub-secret", vhost.amqp_url), _as(workers, "wrk-secret", vhost.amqp_url),
               result.stdout)
    finally:
        with services._management() as http:
            for user in (publisher, workers):
                http.delete(f"/api/users/{user}")


def _refused(connection: pika.BlockingConnection, exchange: str, key: str, body: bytes) -> int:
    """The reply code when publishing `body` to `exchange`/`key` (0: accepted)."""
    channel = connection.channel()
    try:
        channel.basic_publish(exchange, key, body)
        channel.confirm_delivery()  # a round trip: a refusal arrives by then
    except pika.exceptions.ChannelClosedByBroker as refused:
        return refused.reply_code
    channel.close()
    return 0


def test_a_publisher_user_writes_trade_data_and_gets_403_on_the_alert_exchange(users, vhost) -> None:
    publisher_url, workers_url, _ = users
    connection = pika.BlockingConnection(pika.URLParameters(publisher_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(TRADE_DATA, TRADE_DATA, b'{"id": "1", "#shares": 1, "client": "c", "stock": "s"}')
        for exchange, key in ((ALERT, ALERT), ("", WORK_QUEUE)):
            assert _refused(connection, exchange, key, b'{"alert_id": "over_purchase:REAL-1"}') == 403
    finally:
        connection.close()
    # the workers' user may do what workers do in this vhost
    connection = pika.BlockingConnection(pika.URLParameters(workers_url))
    try:
        connection.channel().basic_publish(ALERT, ALERT, b"{}")
        assert connection.channel().queue_declare(TRADE_DATA, passive=True).method.message_count == 1
    finally:
        connection.close()


@pytest.mark.parametrize("mode", ["engine", "per-order"])
def test_workers_run_as_their_user_and_a_forged_alert_never_lands(mode, users, vhost, worker_env, tmp_path) -> None:
    """Issue 19, row 6: a forged `over_purchase:REAL-1` once replaced the real one on every channel."""
    publisher_url, workers_url, _ = users
    env = dict(worker_env, ALDEBARAN_AMQP_URL=workers_url, ALDEBARAN_MODE=mode, ALDEBARAN_BOOK_TTL_SECONDS="3")
    tap = Broker(vhost.amqp_url)
    tap.tap_alerts()
    forged = {"alert_id": "over_purchase:REAL-1", "kind": "over_purchase", "order_id": "REAL-1", "client": "forger",
              "stock": "s", "requested_shares": 1, "purchased_shares": 999, "purchase_ids": ["x"],
              "detected_at": "2026-01-01T00:00:00.000Z"}
    publisher = pika.BlockingConnection(pika.URLParameters(publisher_url))
    try:
        with running(env, tmp_path / "up.log"):
            channel = publisher.channel()
            channel.confirm_delivery()
            orders = [("REAL-1", "real")] + [(f"plain-{n}", f"c{n}") for n in range(5)]
            codes = {name: _refused(publisher, exchange, key, json.dumps(forged).encode()) for name, exchange, key in (
                ("alert exchange", ALERT, ALERT), ("alert queue", "", ALERT), ("work queue", "", WORK_QUEUE),
                ("book queue", "", book_queue("book-", "REAL-1")))}
            for order, client in orders:
                channel.basic_publish(TRADE_DATA, TRADE_DATA, encode_json(
                    [PurchaseRequest(order, 10, client, "s"), Purchase(f"{order}-p", order, 12, client, "s")]),
                    pika.BasicProperties(content_type="application/json"))
            alerts = collect_alerts(tap, expected=len(orders), timeout=60, settle=2)
    finally:
        publisher.close()
        tap.close()
    assert codes == {"alert exchange": 403, "alert queue": 403, "work queue": 403, "book queue": 403}
    assert alert_counts(alerts) == {f"over_purchase:{order}": 1 for order, _ in orders}
    real = next(a for a in alerts if a["order_id"] == "REAL-1")
    assert (real["client"], real["purchased_shares"]) == ("real", 12)
