"""Per-channel delivery guarantees (CONTRACT §5): at-most-once never sends twice on its own,
at-least-once sends again; an interrupted attempt is *in doubt* until the operator settles it.

Real RabbitMQ and Redis, a real HTTP recipient on loopback that can answer, refuse, or hold
a request without answering; the kill test SIGKILLs a real `aldebaran run channel` process
while the recipient holds its request.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import redis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from aldebaran.channels.ledger import statuses
from aldebaran.io.redis import Keys
from aldebaran.ops.delivery import in_doubt, settle
from aldebaran.ops.stats import channel_rows
from aldebaran.settings import Settings
from declare.declarer import declare
from declare.topology import REASON_HEADER, channel_dead_letter, channel_queue
from tests.support.waiting import eventually
from tests.test_channels import FAST, get_all, make_alert, publish, queue_depth, running, with_channels
from workers.channel import ChannelWorker

ALDEBARAN = str(Path(sys.executable).with_name("aldebaran"))


@dataclass
class Recipient:
    """An HTTP recipient whose n-th request gets `script[n]`: a status code, or "hold" (never answers
    until `release`); past the script every request gets 200."""

    script: list[Any] = field(default_factory=list)
    requests: list[dict[str, str]] = field(default_factory=list)
    url: str = ""
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def endpoint(self, request: Request) -> JSONResponse:
        await request.body()
        step = self.script[len(self.requests)] if len(self.requests) < len(self.script) else 200
        self.requests.append(dict(request.headers))
        if step == "hold":
            await self.released.wait()
            step = 200
        return JSONResponse({"status": step}, status_code=step)


@asynccontextmanager
async def recipient(*script: Any) -> AsyncIterator[Recipient]:
    peer = Recipient(list(script))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    peer.url = f"http://127.0.0.1:{sock.getsockname()[1]}/alerts"
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/alerts", peer.endpoint, methods=["POST"])]),
                                           log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started, "the recipient to start")
    try:
        yield peer
    finally:
        peer.released.set()
        server.should_exit = True
        await task


def hook(settings: Settings, url: str, **options: Any) -> Settings:
    return with_channels(settings, {"name": "hook", "kind": "webhook", "url": url, "max_attempts": 4,
                                    **FAST, **options})


def ledger_statuses(settings: Settings, alert_ids: list[str]) -> list[str | None]:
    client = redis.Redis.from_url(settings.redis_url)
    try:
        keys = Keys(settings.redis_key_prefix)
        return statuses(client, keys, [keys.delivered("hook", a) for a in alert_ids])
    finally:
        client.close()


def ledger_status(settings: Settings, alert_id: str) -> str | None:
    return ledger_statuses(settings, [alert_id])[0]


async def test_at_most_once_a_send_without_an_answer_is_in_doubt_and_never_repeated(settings: Settings) -> None:
    async with recipient("hold") as peer:
        s = hook(settings, peer.url, timeout_seconds=0.5)
        declare(s, echo=lambda _: None)
        publish(s, make_alert("amo"), exchange="", routing_key=channel_queue("hook"))
        async with running(ChannelWorker(s, "hook")):
            await eventually(lambda: ledger_status(s, "over_purchase:amo") == "in-doubt", "the alert in doubt")
        assert len(peer.requests) == 1  # the request left, no answer came: never sent again
        assert queue_depth(s.amqp_url, channel_queue("hook")) == 0  # settled, not requeued
        [entry] = in_doubt(s)["hook"]
        assert entry.alert_id == "over_purchase:amo" and "no complete answer" in entry.reason
        [row] = channel_rows(s)
        assert (row["delivery"], row["in_doubt"]) == ("at-most-once", 1)


async def test_at_least_once_sends_again_with_the_same_idempotency_key(settings: Settings) -> None:
    async with recipient("hold") as peer:
        s = hook(settings, peer.url, timeout_seconds=0.5, delivery="at-least-once")
        declare(s, echo=lambda _: None)
        publish(s, make_alert("alo"), exchange="", routing_key=channel_queue("hook"))
        async with running(ChannelWorker(s, "hook")):
            await eventually(lambda: ledger_status(s, "over_purchase:alo") == "delivered", "the delivery")
        assert len(peer.requests) == 2
        assert {r["idempotency-key"] for r in peer.requests} == {"over_purchase:alo"}
        assert in_doubt(s)["hook"] == []


async def test_what_certainly_did_not_arrive_is_retried_even_at_most_once(settings: Settings) -> None:
    async with recipient(503, 429) as peer:
        s = hook(settings, peer.url)
        declare(s, echo=lambda _: None)
        publish(s, make_alert("retry"), exchange="", routing_key=channel_queue("hook"))
        async with running(ChannelWorker(s, "hook")):
            await eventually(lambda: ledger_status(s, "over_purchase:retry") == "delivered", "the delivery")
        assert len(peer.requests) == 3 and in_doubt(s)["hook"] == []


async def test_a_refusal_that_retrying_cannot_fix_is_parked_at_once(settings: Settings) -> None:
    async with recipient(400) as peer:
        s = hook(settings, peer.url)
        declare(s, echo=lambda _: None)
        publish(s, make_alert("bad"), exchange="", routing_key=channel_queue("hook"))
        async with running(ChannelWorker(s, "hook")):
            await eventually(lambda: queue_depth(s.amqp_url, channel_dead_letter("hook")) == 1, "the parked alert")
        assert len(peer.requests) == 1 and ledger_status(s, "over_purchase:bad") is None


async def _start(env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(ALDEBARAN, "run", "channel", "hook", env=env,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)


async def _kill_mid_send(settings: Settings, worker_env: dict[str, str], tmp_path: Path, delivery: str,
                         peer: Recipient) -> dict[str, str]:
    """Start `aldebaran run channel hook`, SIGKILL it while the recipient holds the alert's request,
    release the recipient, and start a new deliverer. Returns the environment it runs with."""
    config = tmp_path / "hook.toml"
    config.write_text(f'[[channels]]\nname = "hook"\nkind = "webhook"\nurl = "{peer.url}"\n'
                      f'delivery = "{delivery}"\ntimeout_seconds = 60\n')
    env = {**worker_env, "ALDEBARAN_CONFIG": str(config)}
    declare(hook(settings, peer.url), echo=lambda _: None)
    publish(settings, make_alert("kill"), exchange="", routing_key=channel_queue("hook"))
    first = await _start(env)
    try:
        await eventually(lambda: len(peer.requests) == 1, "the request held by the recipient", timeout=60)
    finally:
        first.send_signal(signal.SIGKILL)
        await first.wait()
    peer.released.set()  # the recipient got the alert; the killed deliverer never heard so
    return env


async def test_sigkill_mid_send_at_most_once_lists_it_in_doubt_until_the_operator_settles_it(
        settings: Settings, worker_env: dict[str, str], tmp_path: Path) -> None:
    async with recipient("hold") as peer:
        env = await _kill_mid_send(settings, worker_env, tmp_path, "at-most-once", peer)
        s = hook(settings, peer.url)
        second = await _start(env)
        try:
            await eventually(lambda: [e.alert_id for e in in_doubt(s)["hook"]] == ["over_purchase:kill"],
                             "the interrupted attempt listed in doubt", timeout=60)
            await eventually(lambda: queue_depth(s.amqp_url, channel_queue("hook")) == 0, "the message settled")
            assert len(peer.requests) == 1  # not sent again on its own
            settle(s, "hook", "over_purchase:kill", "", send_again=True)
            await eventually(lambda: ledger_status(s, "over_purchase:kill") == "delivered", "the second send")
        finally:
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 60) == 0
    assert len(peer.requests) == 2 and in_doubt(s)["hook"] == []


async def test_sigkill_mid_send_at_least_once_sends_it_again_with_the_same_key(
        settings: Settings, worker_env: dict[str, str], tmp_path: Path) -> None:
    async with recipient("hold") as peer:
        env = await _kill_mid_send(settings, worker_env, tmp_path, "at-least-once", peer)
        s = hook(settings, peer.url, delivery="at-least-once")
        second = await _start(env)
        try:
            await eventually(lambda: ledger_status(s, "over_purchase:kill") == "delivered", "the second send",
                             timeout=60)
        finally:
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 60) == 0
    assert [r["idempotency-key"] for r in peer.requests] == ["over_purchase:kill"] * 2
    assert in_doubt(s)["hook"] == []


async def test_settled_as_delivered_an_alert_is_never_sent_again(settings: Settings) -> None:
    async with recipient("hold") as peer:
        s = hook(settings, peer.url, timeout_seconds=0.5)
        declare(s, echo=lambda _: None)
        publish(s, make_alert("told"), exchange="", routing_key=channel_queue("hook"))
        async with running(ChannelWorker(s, "hook")):
            await eventually(lambda: ledger_status(s, "over_purchase:told") == "in-doubt", "the alert in doubt")
            settle(s, "hook", "over_purchase:told", "", send_again=False)
            publish(s, make_alert("told"), exchange="", routing_key=channel_queue("hook"))  # a later repeat
            await eventually(lambda: queue_depth(s.amqp_url, channel_queue("hook")) == 0, "the repeat acked")
    assert ledger_status(s, "over_purchase:told") == "delivered"
    assert len(peer.requests) == 1 and in_doubt(s)["hook"] == []
    assert json.loads(json.dumps(channel_rows(s)))[0]["in_doubt"] == 0


async def test_rounds_of_many_alerts_with_copies_and_refusals_reach_each_recipient_once(settings: Settings) -> None:
    """Several rounds of the batched path, copies inside and across rounds, and every 7th request
    refused (the retry path running beside later rounds): every alert arrives exactly once."""
    script = [503 if n % 7 == 3 else 200 for n in range(2000)]
    async with recipient(*script) as peer:
        s = with_channels(settings, {"name": "hook", "kind": "webhook", "url": peer.url, "max_in_flight": 32,
                                     "max_attempts": 10, **FAST},
                          {"name": "pull", "kind": "queue-api", "queue": "many", **FAST})
        declare(s, echo=lambda _: None)
        orders = [str(n) for n in range(600)]
        alerts = [make_alert(order) for order in orders for _ in range(2 if int(order) % 10 == 0 else 1)]
        connection = pika.BlockingConnection(pika.URLParameters(s.amqp_url))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            for queue in ("hook", "pull"):
                for alert in alerts:
                    channel.basic_publish("", channel_queue(queue), json.dumps(alert).encode(),
                                          pika.BasicProperties(message_id=alert["alert_id"], delivery_mode=2))
        finally:
            connection.close()
        expected = {f"over_purchase:{order}" for order in orders}
        async with running(ChannelWorker(s, "hook"), ChannelWorker(s, "pull")):
            await eventually(lambda: set(ledger_statuses(s, sorted(expected))) == {"delivered"},
                             "every webhook delivery", timeout=120)
            await eventually(lambda: all(queue_depth(s.amqp_url, channel_queue(q)) == 0 for q in ("hook", "pull")),
                             "both queues drained")
        keys = [r["idempotency-key"] for r, status in zip(peer.requests, script, strict=False) if status == 200]
        assert sorted(keys) == sorted(expected)  # each accepted once; refusals were retried
        client = redis.Redis.from_url(s.redis_url)
        try:
            bodies = client.hvals(f"{s.redis_key_prefix}:pullq:many:bodies")
        finally:
            client.close()
        assert sorted(json.loads(json.loads(b)["message"])["alert_id"] for b in bodies) == sorted(expected)
        assert in_doubt(s) == {"hook": [], "pull": []}


async def test_a_batch_message_is_delivered_alert_by_alert_and_its_bad_parts_parked_alone(settings: Settings) -> None:
    """The lookout hands a channel batches (CONTRACT §3 arrays): one alert refused for good and one
    element that is no alert are parked each on its own; the others arrive; the message is settled."""
    async with recipient(200, 400, 200) as peer:
        s = hook(settings, peer.url)
        declare(s, echo=lambda _: None)
        batch = [make_alert("b1"), make_alert("b2"), {"no": "alert id"}, make_alert("b3")]
        connection = pika.BlockingConnection(pika.URLParameters(s.amqp_url))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", channel_queue("hook"), json.dumps(batch).encode(),
                                  pika.BasicProperties(message_id="batch:test", delivery_mode=2))
        finally:
            connection.close()
        async with running(ChannelWorker(s, "hook")):
            await eventually(lambda: queue_depth(s.amqp_url, channel_dead_letter("hook")) == 2, "two parked parts")
            await eventually(lambda: queue_depth(s.amqp_url, channel_queue("hook")) == 0, "the message settled")
    parked = {props.message_id: (json.loads(body), props.headers[REASON_HEADER])
              for props, body in get_all(s.amqp_url, channel_dead_letter("hook"))}
    assert parked["over_purchase:b2"][0] == make_alert("b2") and "HTTP 400" in parked["over_purchase:b2"][1]
    assert parked["batch:test"][0] == {"no": "alert id"} and "no alert_id" in parked["batch:test"][1]
    assert sorted(r["idempotency-key"] for r in peer.requests) == [f"over_purchase:b{n}" for n in (1, 2, 3)]
    assert ledger_statuses(s, ["over_purchase:b1", "over_purchase:b2", "over_purchase:b3"]) == [
        "delivered", None, "delivered"]
