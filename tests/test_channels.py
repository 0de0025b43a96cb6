"""Channel deliverers against real local peers: HTTP servers, SMTP, a Nagios file, a vhost.

Also the delivery guarantees: repeats reach the recipient once, a sink that recovers gets
the alert once, a sink that never recovers ends in the channel's dead-letter queue.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import pika
import pytest
import redis
import uvicorn
from aiosmtpd.controller import Controller
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from aldebaran.api.pullqueue import PullQueue
from aldebaran.channels.base import Alert, RetryPolicy
from aldebaran.channels.email import message_id
from aldebaran.channels.ledger import ledger_key
from aldebaran.io.redis import Keys
from aldebaran.io.redis import client as redis_client
from aldebaran.settings import Settings
from declare.declarer import declare
from declare.topology import ALERT, REASON_HEADER, channel_dead_letter, channel_queue
from tests.support import services
from tests.support.processes import free_port
from tests.support.waiting import eventually
from workers.channel import ChannelWorker
from workers.runtime import Lifecycle, Worker

WAIT_SECONDS = 30
FAST = {"backoff_initial_seconds": 0.01, "backoff_max_seconds": 0.05}


def make_alert(order: str = "1") -> dict[str, Any]:
    return {"alert_id": f"over_purchase:{order}", "kind": "over_purchase", "order_id": order, "client": "c1",
            "stock": "ACME", "requested_shares": 100, "purchased_shares": 150, "purchase_ids": ["2", "3"],
            "detected_at": "2026-01-01T00:00:00Z"}


def publish(settings: Settings, alert: dict[str, Any], *, times: int = 1, exchange: str = ALERT,
            routing_key: str = ALERT) -> None:
    """Publish as the pipeline does (persistent, message_id = alert_id, JSON)."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        props = pika.BasicProperties(message_id=alert["alert_id"], content_type="application/json", delivery_mode=2)
        for _ in range(times):
            channel.basic_publish(exchange, routing_key, json.dumps(alert).encode(), props, mandatory=True)
    finally:
        connection.close()


def queue_depth(amqp_url: str, queue: str) -> int:
    """Ready messages (passive declare): unacked ones are counted once their consumer stops."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def get_all(amqp_url: str, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    out = []
    try:
        channel = connection.channel()
        while True:
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append((props, body))
    finally:
        connection.close()


@asynccontextmanager
async def running(*workers: Worker) -> AsyncIterator[None]:
    """Run workers in this loop; on exit stop them gracefully (in-flight work finishes)."""
    lives = [Lifecycle() for _ in workers]
    tasks = [asyncio.create_task(w.run(life)) for w, life in zip(workers, lives, strict=True)]
    try:
        ready = asyncio.gather(*(life._ready.wait() for life in lives))
        done, _ = await asyncio.wait([asyncio.ensure_future(ready), *tasks], timeout=WAIT_SECONDS,
                                     return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task in done:
                task.result()  # a worker that ended early raises here
        yield
    finally:
        for life in lives:
            life.stopping.set()
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_SECONDS)


@dataclass
class HttpPeer:
    """A real HTTP server on loopback that records requests and fails the first `fail_first`."""

    fail_first: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def accepted(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["accepted"]]

    async def _endpoint(self, request: Request) -> JSONResponse:
        body = await request.body()
        accepted = len(self.requests) >= self.fail_first
        self.requests.append({"path": request.url.path, "headers": dict(request.headers), "body": body,
                              "form": _form(request, body),
                              "accepted": accepted})
        return JSONResponse({"ok": True}) if accepted else JSONResponse({"error": "down"}, status_code=503)


def _form(request: Request, body: bytes) -> dict[str, str] | None:
    if request.headers.get("content-type") != "application/x-www-form-urlencoded":
        return None
    return {k: v[0] for k, v in parse_qs(body.decode()).items()}


@asynccontextmanager
async def http_peer(fail_first: int = 0) -> AsyncIterator[HttpPeer]:
    peer = HttpPeer(fail_first=fail_first)
    app = Starlette(routes=[Route("/{path:path}", peer._endpoint, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    peer.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started, "the HTTP peer to start")
    try:
        yield peer
    finally:
        server.should_exit = True
        await task


class SmtpRecorder:
    def __init__(self) -> None:
        self.envelopes: list[Any] = []

    async def handle_DATA(self, server, session, envelope):
        self.envelopes.append(envelope)
        return "250 OK"


def with_channels(settings: Settings, *channels: dict[str, Any]) -> Settings:
    return Settings.model_validate({**settings.model_dump(), "channels": list(channels)})


def delivered_key_exists(settings: Settings, channel: str, alert_id: str) -> bool:
    client = redis.Redis.from_url(settings.redis_url)
    return bool(client.exists(Keys(settings.redis_key_prefix).delivered(channel, alert_id)))


# --- one test per kind, each against a real peer ---------------------------------------

async def deliver_one(settings: Settings, channel: str, alert: dict[str, Any], done, times: int = 1) -> None:
    """Put `alert` on the channel's queue `times` times and run its deliverer until `done()`."""
    declare(settings, echo=lambda _: None)
    publish(settings, alert, times=times, exchange="", routing_key=channel_queue(channel))
    async with running(ChannelWorker(settings, channel)):
        await eventually(done, f"delivery on {channel}")
        await eventually(lambda: queue_depth(settings.amqp_url, channel_queue(channel)) == 0, "a drained queue")


async def test_webhook_posts_the_alert_json_with_an_idempotency_key(settings: Settings) -> None:
    async with http_peer() as peer:
        s = with_channels(settings, {"name": "hook", "kind": "webhook", "url": peer.url + "/alerts",
                                     "headers": {"X-Team": "ops"}})
        alert = make_alert("w1")
        await deliver_one(s, "hook", alert, lambda: peer.accepted())
    [request] = peer.requests
    assert request["path"] == "/alerts"
    assert json.loads(request["body"]) == alert
    assert request["headers"]["idempotency-key"] == "over_purchase:w1"
    assert request["headers"]["content-type"] == "application/json"
    assert request["headers"]["x-team"] == "ops"
    assert delivered_key_exists(s, "hook", "over_purchase:w1")


async def test_sms_is_shaped_like_twilio_one_request_per_number(settings: Settings) -> None:
    async with http_peer() as peer:
        s = with_channels(settings, {"name": "sms", "kind": "sms", "base_url": peer.url, "account_sid": "AC123",
                                     "auth_token": "secret", "from_number": "+15550000",
                                     "to_numbers": ["+15551111", "+15552222"]})
        await deliver_one(s, "sms", make_alert("s1"), lambda: len(peer.accepted()) == 2)
    assert {r["path"] for r in peer.requests} == {"/2010-04-01/Accounts/AC123/Messages.json"}
    assert sorted(r["form"]["To"] for r in peer.requests) == ["+15551111", "+15552222"]
    for request in peer.requests:
        assert request["form"]["From"] == "+15550000"
        assert "over_purchase:s1" in request["form"]["Body"]
        assert request["headers"]["authorization"] == "Basic QUMxMjM6c2VjcmV0"  # AC123:secret


async def test_push_posts_json_with_the_bearer_token_per_device(settings: Settings) -> None:
    async with http_peer() as peer:
        s = with_channels(settings, {"name": "push", "kind": "push", "base_url": peer.url, "token": "tok",
                                     "devices": ["dev-a", "dev-b"]})
        await deliver_one(s, "push", make_alert("p1"), lambda: len(peer.accepted()) == 2)
    assert {r["path"] for r in peer.requests} == {"/v1/push"}
    bodies = sorted((json.loads(r["body"]) for r in peer.requests), key=lambda b: b["to"])
    assert [b["to"] for b in bodies] == ["dev-a", "dev-b"]
    assert bodies[0]["data"]["alert_id"] == "over_purchase:p1"
    assert all(r["headers"]["authorization"] == "Bearer tok" for r in peer.requests)
    assert {r["headers"]["idempotency-key"] for r in peer.requests} == {
        "over_purchase:p1/dev-a", "over_purchase:p1/dev-b"}


async def test_sms_partial_failure_retries_only_the_number_that_failed(settings: Settings) -> None:
    async with http_peer(fail_first=1) as peer:  # the first request (one number) fails once
        s = with_channels(settings, {"name": "sms", "kind": "sms", "base_url": peer.url, "account_sid": "AC1",
                                     "auth_token": "t", "from_number": "+1", "to_numbers": ["+2", "+3"], **FAST})
        await deliver_one(s, "sms", make_alert("s2"), lambda: len(peer.accepted()) == 2)
    assert sorted(r["form"]["To"] for r in peer.accepted()) == ["+2", "+3"]
    assert len(peer.requests) == 3


async def test_email_through_a_real_smtp_server_with_the_alert_message_id(settings: Settings) -> None:
    recorder = SmtpRecorder()
    controller = Controller(recorder, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        s = with_channels(settings, {"name": "mail", "kind": "email", "host": "127.0.0.1",
                                     "port": controller.port, "sender": "alerts@example.org",
                                     "recipients": ["ops@example.org", "risk@example.org"]})
        await deliver_one(s, "mail", make_alert("e1"), lambda: recorder.envelopes, times=2)
    finally:
        controller.stop()
    [envelope] = recorder.envelopes
    assert envelope.mail_from == "alerts@example.org"
    assert envelope.rcpt_tos == ["ops@example.org", "risk@example.org"]
    content = envelope.content.decode()
    assert 'Message-ID: <"over_purchase:e1"@aldebaran>' in content
    assert message_id("purchase_without_request.7") == "<purchase_without_request.7@aldebaran>"
    assert '"order_id": "e1"' in content


async def test_nagios_writes_the_passive_check_line(settings: Settings, tmp_path) -> None:
    command_file = tmp_path / "nagios.cmd"
    command_file.write_text("")
    s = with_channels(settings, {"name": "nagios", "kind": "nagios", "command_file": str(command_file),
                                 "host_name": "trading", "service_description": "Trade limits",
                                 "return_code": 2})
    await deliver_one(s, "nagios", make_alert("n1"), lambda: command_file.read_text(), times=2)
    [line] = command_file.read_text().splitlines()
    stamp, command = line.split(" ", 1)
    assert stamp.startswith("[") and stamp.endswith("]") and stamp[1:-1].isdigit()
    assert command.startswith("PROCESS_SERVICE_CHECK_RESULT;trading;Trade limits;2;over_purchase: order_id=n1 ")
    assert command.endswith("(over_purchase:n1)")


async def test_nagios_without_its_command_file_is_parked_with_the_error(settings: Settings, tmp_path) -> None:
    s = with_channels(settings, {"name": "nagios", "kind": "nagios", "command_file": str(tmp_path / "absent"),
                                 "max_attempts": 2, **FAST})
    declare(s, echo=lambda _: None)
    publish(s, make_alert("n2"), exchange="", routing_key=channel_queue("nagios"))
    async with running(ChannelWorker(s, "nagios")):
        await eventually(lambda: queue_depth(s.amqp_url, channel_dead_letter("nagios")) == 1, "the parked alert")
    assert not (tmp_path / "absent").exists()  # never created where Nagios expects its FIFO
    [(props, _)] = get_all(s.amqp_url, channel_dead_letter("nagios"))
    assert "FileNotFoundError" in props.headers[REASON_HEADER]


async def test_amqp_publishes_to_another_vhost_with_the_alert_id_as_message_id(settings: Settings) -> None:
    other = services.create_vhost("sink")
    try:
        connection = pika.BlockingConnection(pika.URLParameters(other.amqp_url))
        connection.channel().queue_declare("downstream", durable=True)
        connection.close()
        s = with_channels(settings, {"name": "bus", "kind": "amqp", "url": other.amqp_url,
                                     "exchange": "", "routing_key": "downstream"})
        alert = make_alert("a1")
        await deliver_one(s, "bus", alert, lambda: queue_depth(other.amqp_url, "downstream") >= 1, times=3)
        [(props, body)] = get_all(other.amqp_url, "downstream")
    finally:
        services.delete_vhost(other)
    assert props.message_id == "over_purchase:a1"
    assert props.content_type == "application/json"
    assert props.delivery_mode == 2
    assert json.loads(body) == alert


async def test_amqp_to_an_unroutable_destination_is_parked_not_dropped(settings: Settings) -> None:
    s = with_channels(settings, {"name": "bus", "kind": "amqp", "exchange": "", "routing_key": "nowhere",
                                 "max_attempts": 2, **FAST})
    declare(s, echo=lambda _: None)
    publish(s, make_alert("a2"), exchange="", routing_key=channel_queue("bus"))
    async with running(ChannelWorker(s, "bus")):
        await eventually(lambda: queue_depth(s.amqp_url, channel_dead_letter("bus")) == 1, "the parked alert")
    [(props, _)] = get_all(s.amqp_url, channel_dead_letter("bus"))
    assert props.message_id == "over_purchase:a2"
    assert "after 2 attempts" in props.headers[REASON_HEADER]


async def test_log_channel_delivers_and_records(settings: Settings) -> None:
    s = with_channels(settings, {"name": "audit-log", "kind": "log"})
    await deliver_one(s, "audit-log", make_alert("l1"),
                      lambda: delivered_key_exists(s, "audit-log", "over_purchase:l1"))
    assert delivered_key_exists(s, "audit-log", "over_purchase:l1")


async def test_queue_api_channel_lands_the_alert_once_in_the_pull_queue(settings: Settings) -> None:
    s = with_channels(settings, {"name": "pull", "kind": "queue-api", "queue": "downstream"})
    keys = Keys(s.redis_key_prefix)
    client = redis_client(s)
    # The channel's enqueue is keyed by the alert id, its record is the channel's ledger record.
    queue = PullQueue(client, keys, "downstream", checkout_lifetime_seconds=60, max_receive_count=5,
                      dedup_key=lambda alert_id: ledger_key(keys, "pull", alert_id))
    try:
        await deliver_one(s, "pull", make_alert("q1"),
                          lambda: delivered_key_exists(s, "pull", "over_purchase:q1"), times=3)
        # A fourth copy sent straight to the queue (as a deliverer's retry would) enqueues nothing.
        key, created = await queue.send(json.dumps(make_alert("q1")), dedup_id="over_purchase:q1")
        assert not created
        [received] = await queue.receive(10)
    finally:
        await client.aclose()
    assert received.key == key
    assert json.loads(received.message) == make_alert("q1")


# --- guarantees ------------------------------------------------------------------------

async def test_repeats_on_the_channel_queue_reach_the_recipient_once(settings: Settings) -> None:
    async with http_peer() as peer:
        s = with_channels(settings, {"name": "hook", "kind": "webhook", "url": peer.url})
        await deliver_one(s, "hook", make_alert("r1"), lambda: peer.accepted(), times=3)
    assert len(peer.requests) == 1


async def test_a_sink_that_recovers_gets_the_alert_once(settings: Settings) -> None:
    async with http_peer(fail_first=4) as peer:
        s = with_channels(settings, {"name": "hook", "kind": "webhook", "url": peer.url, "max_attempts": 10,
                                     **FAST})
        await deliver_one(s, "hook", make_alert("f1"), lambda: peer.accepted())
    assert len(peer.accepted()) == 1
    assert len(peer.requests) == 5
    assert {r["headers"]["idempotency-key"] for r in peer.requests} == {"over_purchase:f1"}
    assert queue_depth(s.amqp_url, channel_dead_letter("hook")) == 0


async def test_a_sink_that_never_recovers_ends_in_the_dead_letter_queue(settings: Settings) -> None:
    async with http_peer(fail_first=10**9) as peer:
        s = with_channels(settings, {"name": "hook", "kind": "webhook", "url": peer.url, "max_attempts": 3,
                                     **FAST})
        declare(s, echo=lambda _: None)
        publish(s, make_alert("d1"), exchange="", routing_key=channel_queue("hook"))
        async with running(ChannelWorker(s, "hook")):
            await eventually(lambda: queue_depth(s.amqp_url, channel_dead_letter("hook")) == 1, "the parked alert")
    assert len(peer.requests) == 3
    [(props, body)] = get_all(s.amqp_url, channel_dead_letter("hook"))
    assert json.loads(body) == make_alert("d1")
    assert props.message_id == "over_purchase:d1"
    assert "HTTP 503" in props.headers[REASON_HEADER]
    assert "after 3 attempts" in props.headers[REASON_HEADER]
    assert queue_depth(s.amqp_url, channel_queue("hook")) == 0
    assert not delivered_key_exists(s, "hook", "over_purchase:d1")


async def test_an_unreadable_message_is_parked_with_the_reason(settings: Settings) -> None:
    s = with_channels(settings, {"name": "audit-log", "kind": "log"})
    declare(s, echo=lambda _: None)
    connection = pika.BlockingConnection(pika.URLParameters(s.amqp_url))
    connection.channel().basic_publish("", channel_queue("audit-log"), b"not json")
    connection.close()
    async with running(ChannelWorker(s, "audit-log")):
        await eventually(lambda: queue_depth(s.amqp_url, channel_dead_letter("audit-log")) == 1, "parking")
    [(props, body)] = get_all(s.amqp_url, channel_dead_letter("audit-log"))
    assert body == b"not json"
    assert props.headers[REASON_HEADER].startswith("unreadable alert: not JSON")


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap() -> None:
    import random

    policy = RetryPolicy(max_attempts=10, initial_seconds=0.1, max_seconds=2.0)
    rng = random.Random(7)
    for failures, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (5, 1.6), (6, 2.0), (30, 2.0)]:
        delays = [policy.delay(failures, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jitter


def test_alert_parse_rejects_what_is_not_an_alert() -> None:
    from aldebaran.channels.base import UnreadableAlert

    assert Alert.parse(b'{"alert_id": "x:1"}').alert_id == "x:1"
    assert Alert.parse(b'{"kind": "k"}', message_id="x:2").alert_id == "x:2"
    for bad in (b"[]", b"\xff", b"{}", b'{"alert_id": 5}', json.dumps({"alert_id": "é" * 128}).encode()):
        with pytest.raises(UnreadableAlert):
            Alert.parse(bad)  # the last: 256 bytes, longer than an AMQP message_id can carry
    assert Alert.parse(json.dumps({"alert_id": "é" * 127}).encode()).alert_id == "é" * 127


async def test_an_unreachable_downstream_broker_is_retried_then_parked_not_a_crash(settings: Settings) -> None:
    s = with_channels(settings, {"name": "bus", "kind": "amqp", "url": "amqp://guest:guest@127.0.0.1:1/",
                                 "routing_key": "downstream", "max_attempts": 2, **FAST})
    declare(s, echo=lambda _: None)
    publish(s, make_alert("a3"), exchange="", routing_key=channel_queue("bus"))
    async with running(ChannelWorker(s, "bus")):
        await eventually(lambda: queue_depth(s.amqp_url, channel_dead_letter("bus")) == 1, "the parked alert")
    [(props, _)] = get_all(s.amqp_url, channel_dead_letter("bus"))
    reason = props.headers[REASON_HEADER]
    assert "UnavailableError" in reason and "guest:***@" in reason  # the password stays masked
