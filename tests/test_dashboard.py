"""The dashboard's JSON (`/api/dashboard`) and page over real HTTP, RabbitMQ and Redis.

Alerts go through the real outbox, deliveries through the channels' real ledger, dead
letters into the real dead-letter queue with their reason header, pull-queue messages
through the API itself; the dashboard must report each of them. Queue figures come from
the management API, which refreshes its statistics every few seconds: those checks poll
until the figure shows (a liveness bound, not a speed claim).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aio_pika
import httpx
import pika

from aldebaran.channels.base import park
from aldebaran.channels.ledger import DeliveryLedger
from aldebaran.core.rule import Alert, iso_utc
from aldebaran.io.alert_outbox import AlertOutbox, Emitted
from aldebaran.io.redis import Keys
from aldebaran.io.redis import connect as connect_redis
from aldebaran.settings import Settings
from declare.declarer import declare
from declare.topology import ALERT, DEAD_LETTER, REASON_HEADER
from tests.support.waiting import eventually
from tests.test_pull_api import api_server

JSON = {"Content-Type": "application/json"}
PAGER_NUMBERS = ["+15550001", "+15550002"]
WAIT_SECONDS = 30


def with_channels(settings: Settings, **changes: Any) -> Settings:
    """The test's settings plus two channels: one single-recipient, one with two recipients."""
    channels = [
        {"name": "ops-log", "kind": "log"},
        {"name": "pager", "kind": "sms", "account_sid": "AC1", "auth_token": "t", "from_number": "+15550000",
         "to_numbers": PAGER_NUMBERS},
    ]
    return Settings(**{**settings.model_dump(), "channels": channels, **changes})


def over_purchase(order_id: str) -> Alert:
    return Alert(alert_id=f"over_purchase:{order_id}", kind="over_purchase", key=order_id,
                 detected_at=iso_utc(datetime.now(UTC)),
                 fields={"order_id": order_id, "client": "Sendence", "stock": "AAPL", "requested_shares": 100,
                         "purchased_shares": 120, "purchase_ids": ["2", "3"]})


async def emit_alerts(settings: Settings, alerts: list[Alert]) -> None:
    """Through the real outbox: published to Aldebaran.Alert and listed in Redis."""
    redis = await connect_redis(settings)
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(ALERT)
        outbox = AlertOutbox(redis, exchange, Keys(settings.redis_key_prefix), settings.alert_dedup_ttl_seconds)
        for alert in alerts:
            assert await outbox.emit(alert, None) is Emitted.PUBLISHED
    finally:
        await connection.close()
        await redis.aclose()


async def park_alert(settings: Settings, channel_name: str, alert: Alert, reason: str) -> None:
    """As a channel does after its last failed attempt: into the channel's dead-letter queue."""
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await park(channel, channel_name, alert.to_json(), reason, message_id=alert.alert_id, attempts=8)
    finally:
        await connection.close()


async def mark_delivered(settings: Settings, channel: str, alert_id: str, target: str = "") -> None:
    redis = await connect_redis(settings)
    try:
        await DeliveryLedger(redis, Keys(settings.redis_key_prefix), channel, 3600).settle(
            delivered=[(alert_id, target)])
    finally:
        await redis.aclose()


def dead_letter(settings: Settings, body: bytes, reason: str, message_id: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(settings.amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", DEAD_LETTER, body, pika.BasicProperties(
            headers={REASON_HEADER: reason}, message_id=message_id, delivery_mode=2))
    finally:
        connection.close()


async def poll_dashboard(http: httpx.AsyncClient, until: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    last: dict[str, Any] = {}

    async def shown() -> dict[str, Any] | None:
        response = await http.get("/api/dashboard")
        assert response.status_code == 200, response.text
        last.clear()
        last.update(response.json())
        return dict(last) if until(last) else None

    return await eventually(shown, lambda: f"{what}; last snapshot:\n{json.dumps(last, indent=1)}",
                            WAIT_SECONDS, pause=0.3)


def queue(data: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((q for q in data["queues"] or [] if q["name"] == name), None)


async def test_dashboard_reports_queues_alerts_delivery_pull_queue_and_dead_letters(settings: Settings) -> None:
    settings = with_channels(settings)
    assert declare(settings, echo=lambda _: None) > 0  # how many things it declared
    first, second = over_purchase("1"), over_purchase("7")
    await emit_alerts(settings, [first, second])
    await mark_delivered(settings, "ops-log", first.alert_id)
    await mark_delivered(settings, "pager", first.alert_id, PAGER_NUMBERS[0])
    await park_alert(settings, "pager", second, "HTTPStatusError: 503 (after 8 attempts)")
    dead_letter(settings, b"id:1\n# shares: -5", "invalid: # shares must be positive", "bad-1")

    async with api_server(settings) as http:
        for n in range(2):
            assert (await http.post("/send-message", json={"message": f"job-{n}"})).status_code == 200
        data = await poll_dashboard(
            http, lambda d: (queue(d, ALERT) or {}).get("messages") == 2 and (d["dead_letters"] or {}).get("count") == 1
            and (queue(d, "Aldebaran.Channel.pager.Dead_Letter") or {}).get("messages") == 1,
            "the management API to show 2 alerts queued, 1 dead letter and 1 parked alert")

    assert data["problems"] == []
    assert data["vhost"] == settings.amqp_url.rsplit("/", 1)[1]
    names = {q["name"] for q in data["queues"]}
    assert {"Aldebaran.Trade_Data", "Aldebaran.Purchase_Request", ALERT, DEAD_LETTER,
            "Aldebaran.Channel.ops-log", "Aldebaran.Channel.pager"} <= names
    assert all({"ready", "unacked", "consumers", "publish_rate", "deliver_rate", "ack_rate"} <= set(q)
               for q in data["queues"])
    assert data["open_books"] == 0 and data["book_queues"] == 0

    assert [a["alert_id"] for a in data["alerts"]] == [second.alert_id, first.alert_id]  # newest first
    newest, oldest = data["alerts"]
    assert (oldest["order_id"], oldest["purchased_shares"], oldest["requested_shares"]) == ("1", 120, 100)
    assert oldest["delivery"] == {
        "ops-log": {"status": "delivered", "delivered": 1, "recipients": 1},
        "pager": {"status": "partial", "delivered": 1, "recipients": 2},
    }
    assert newest["delivery"] == {
        "ops-log": {"status": "pending", "delivered": 0, "recipients": 1},
        "pager": {"status": "parked", "delivered": 0, "recipients": 2,
                  "reason": "HTTPStatusError: 503 (after 8 attempts)"},
    }

    assert [(c["name"], c["kind"], c["recipients"], c["parked"]) for c in data["channels"]] == [
        ("ops-log", "log", 1, 0), ("pager", "sms", 2, 1)]
    assert {k: data["pull_queue"][k] for k in ("name", "queue_length", "checkouts_count", "dead_letter_count")} == {
        "name": settings.api_queue, "queue_length": 2, "checkouts_count": 0, "dead_letter_count": 0}
    assert data["dead_letters"]["peek"] == [{"reason": "invalid: # shares must be positive", "message_id": "bad-1",
                                             "body": "id:1\n# shares: -5", "queue": DEAD_LETTER}]
    [parked] = data["dead_letters"]["parked"]
    assert (parked["channel"], parked["queue"], parked["alert_id"], parked["reason"]) == (
        "pager", "Aldebaran.Channel.pager.Dead_Letter", second.alert_id, "HTTPStatusError: 503 (after 8 attempts)")
    assert parked["body"].startswith(f'{{"alert_id":"{second.alert_id}"')  # the alert, cut at 200 chars


async def test_page_and_its_assets_are_served_and_nothing_else(settings: Settings) -> None:
    async with api_server(settings) as http:
        page = await http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "/dashboard/dashboard.js" in page.text and "/dashboard/dashboard.css" in page.text
        assert "http://" not in page.text and "https://" not in page.text  # nothing from a CDN: works offline
        script = await http.get("/dashboard/dashboard.js")
        assert script.status_code == 200 and "/api/dashboard" in script.text
        assert (await http.get("/dashboard/dashboard.css")).status_code == 200
        assert (await http.get("/dashboard/dashboard.py")).status_code == 404
        assert (await http.get("/dashboard/..%2Fapp.py")).status_code == 404


async def test_the_data_needs_the_token_when_the_api_has_one(settings: Settings) -> None:
    async with api_server(with_channels(settings, api_token="s3cret")) as http:
        assert (await http.get("/")).status_code == 200  # the page holds no data
        assert (await http.get("/api/dashboard")).status_code == 401
        wrong = await http.get("/api/dashboard", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = await http.get("/api/dashboard", headers={"Authorization": "Bearer s3cret"})
        assert right.status_code == 200 and right.json()["pull_queue"]["queue_length"] == 0


async def test_an_unreachable_management_api_is_a_problem_line_not_an_error(settings: Settings) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    async with api_server(with_channels(settings, management_url=f"http://guest:guest@127.0.0.1:{port}/")) as http:
        response = await http.get("/api/dashboard")
    assert response.status_code == 200
    data = response.json()
    assert data["queues"] is None and data["dead_letters"] is None
    assert any("management API" in p and "unreachable" in p for p in data["problems"]), data["problems"]
    assert "guest:guest" not in json.dumps(data)  # passwords masked
    assert data["pull_queue"]["queue_length"] == 0 and data["alerts"] == []  # Redis still answers
