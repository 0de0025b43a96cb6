"""The lookout fans each alert out to every channel queue; repeats reach recipients once."""

from __future__ import annotations

import json

import pika

from aldebaran.api.pullqueue import PullQueue
from aldebaran.io.redis import Keys
from aldebaran.io.redis import client as redis_client
from aldebaran.settings import Settings
from declare.declarer import declare
from declare.topology import ALERT, DEAD_LETTER, REASON_HEADER, channel_queue
from tests.support import services
from tests.support.processes import free_port
from tests.support.waiting import eventually
from tests.test_channels import (
    SmtpRecorder,
    delivered_key_exists,
    get_all,
    http_peer,
    make_alert,
    publish,
    queue_depth,
    running,
    with_channels,
)
from workers.channel import ChannelWorker
from workers.lookout import Lookout


async def test_an_alert_reaches_every_channel_queue_as_itself(settings: Settings) -> None:
    s = with_channels(settings, {"name": "one", "kind": "log"}, {"name": "two", "kind": "log"})
    declare(s, echo=lambda _: None)
    alert = make_alert("7")
    publish(s, alert)
    async with running(Lookout(s)):
        await eventually(lambda: all(queue_depth(s.amqp_url, channel_queue(n)) == 1 for n in ("one", "two")),
                         "the alert on both channel queues")
        await eventually(lambda: queue_depth(s.amqp_url, ALERT) == 0, "the alert queue to drain")
    assert queue_depth(s.amqp_url, ALERT) == 0  # nothing left unacked after a graceful stop
    for name in ("one", "two"):
        [(props, body)] = get_all(s.amqp_url, channel_queue(name))
        assert json.loads(body) == alert
        assert props.message_id == "over_purchase:7"
        assert props.content_type == "application/json"
        assert props.delivery_mode == 2


async def test_repeats_across_batches_are_fanned_out_and_the_channel_boy_filters_them(settings: Settings) -> None:
    """The lookout keeps no state: a copy of an alert in a later batch (an engine's re-publish
    after a crash) reaches the channel queue again, and the channel's ledger lets one through."""
    async with http_peer() as peer:
        s = with_channels(settings, {"name": "hook", "kind": "webhook", "url": peer.url})
        declare(s, echo=lambda _: None)
        alert = make_alert("8")
        async with running(Lookout(s)):
            publish(s, alert)
            await eventually(lambda: queue_depth(s.amqp_url, channel_queue("hook")) == 1, "the first fan-out")
            publish(s, alert, times=2)
            await eventually(lambda: queue_depth(s.amqp_url, ALERT) == 0, "the alert queue to drain")
        assert queue_depth(s.amqp_url, channel_queue("hook")) >= 2  # it did re-fan
        async with running(ChannelWorker(s, "hook")):
            await eventually(lambda: queue_depth(s.amqp_url, channel_queue("hook")) == 0, "the channel to drain")
    assert len(peer.requests) == 1
    assert delivered_key_exists(s, "hook", alert["alert_id"])


async def test_an_unreadable_alert_goes_to_the_dead_letter_queue_with_the_reason(settings: Settings) -> None:
    s = with_channels(settings, {"name": "one", "kind": "log"})
    declare(s, echo=lambda _: None)
    connection = pika.BlockingConnection(pika.URLParameters(s.amqp_url))
    connection.channel().basic_publish(ALERT, ALERT, b"{not json")
    connection.close()
    async with running(Lookout(s)):
        await eventually(lambda: queue_depth(s.amqp_url, DEAD_LETTER) == 1, "the dead letter")
    [(props, body)] = get_all(s.amqp_url, DEAD_LETTER)
    assert body == b"{not json"
    assert props.headers[REASON_HEADER].startswith("unreadable alert")
    assert queue_depth(s.amqp_url, channel_queue("one")) == 0


async def test_every_channel_kind_gets_an_alert_published_three_times_exactly_once(
        settings: Settings, tmp_path) -> None:
    """End to end: Aldebaran.Alert -> lookout -> eight channel deliverers -> eight real peers."""
    recorder = SmtpRecorder()
    from aiosmtpd.controller import Controller

    smtp = Controller(recorder, hostname="127.0.0.1", port=free_port())
    smtp.start()
    other = services.create_vhost("sink")
    nagios = tmp_path / "nagios.cmd"
    nagios.write_text("")
    connection = pika.BlockingConnection(pika.URLParameters(other.amqp_url))
    connection.channel().queue_declare("downstream", durable=True)
    connection.close()
    try:
        async with http_peer() as hook, http_peer() as sms, http_peer() as push:
            s = with_channels(
                settings,
                {"name": "hook", "kind": "webhook", "url": hook.url + "/in"},
                {"name": "sms", "kind": "sms", "base_url": sms.url, "account_sid": "AC1", "auth_token": "t",
                 "from_number": "+1", "to_numbers": ["+2"]},
                {"name": "push", "kind": "push", "base_url": push.url, "token": "k", "devices": ["d1"]},
                {"name": "mail", "kind": "email", "host": "127.0.0.1", "port": smtp.port,
                 "recipients": ["ops@example.org"]},
                {"name": "nagios", "kind": "nagios", "command_file": str(nagios)},
                {"name": "bus", "kind": "amqp", "url": other.amqp_url, "routing_key": "downstream"},
                {"name": "log", "kind": "log"},
                {"name": "pull", "kind": "queue-api", "queue": "downstream"},
            )
            declare(s, echo=lambda _: None)
            alert = make_alert("42")
            publish(s, alert, times=3)
            names = [c.name for c in s.channels]
            workers = [Lookout(s), *(ChannelWorker(s, name) for name in names)]
            async with running(*workers):
                await eventually(lambda: all(delivered_key_exists(s, n, alert["alert_id"]) for n in names
                                             if n not in ("sms", "push")), "every channel's delivery")
                await eventually(lambda: sms.accepted() and push.accepted(), "sms and push")
                await eventually(lambda: all(queue_depth(s.amqp_url, q) == 0
                                             for q in [ALERT, *map(channel_queue, names)]), "drained queues")
            # Graceful stop: anything still unprocessed would now be back in a queue.
            for queue in [ALERT, *map(channel_queue, names)]:
                assert queue_depth(s.amqp_url, queue) == 0, queue
            assert len(hook.requests) == len(sms.requests) == len(push.requests) == 1
            assert len(recorder.envelopes) == 1
            assert len(nagios.read_text().splitlines()) == 1
            assert len(get_all(other.amqp_url, "downstream")) == 1
            client = redis_client(s)
            try:
                queue = PullQueue(client, Keys(s.redis_key_prefix), "downstream",
                                  checkout_lifetime_seconds=60, max_receive_count=3)
                received = await queue.receive(10)
            finally:
                await client.aclose()
            assert [json.loads(m.message)["alert_id"] for m in received] == ["over_purchase:42"]
    finally:
        smtp.stop()
        services.delete_vhost(other)


async def test_an_alert_batch_and_a_single_alert_reach_each_channel_once(settings: Settings) -> None:
    """CONTRACT §3: a batch message (a JSON array under a batch id) and a lone alert are both read;
    a copy inside another batch is a duplicate; the amqp channel still emits one alert per message."""
    other = services.create_vhost("sink")
    connection = pika.BlockingConnection(pika.URLParameters(other.amqp_url))
    connection.channel().queue_declare("downstream", durable=True)
    connection.close()
    try:
        s = with_channels(settings, {"name": "bus", "kind": "amqp", "url": other.amqp_url, "routing_key": "downstream"},
                          {"name": "pull", "kind": "queue-api", "queue": "alerts"})
        declare(s, echo=lambda _: None)
        alerts = [make_alert(str(n)) for n in (1, 2, 3)]
        batch = json.dumps([alerts[0], alerts[1], {"kind": "no id"}, alerts[2]]).encode()
        publish(s, alerts[1])  # a lone alert, also inside the batch
        raw = pika.BlockingConnection(pika.URLParameters(s.amqp_url))
        channel = raw.channel()
        channel.confirm_delivery()
        for message_id in ("batch:a", "batch:b"):  # the same batch twice: a redelivered publish
            channel.basic_publish(ALERT, ALERT, batch, pika.BasicProperties(
                message_id=message_id, content_type="application/json", delivery_mode=2), mandatory=True)
        raw.close()
        workers = [Lookout(s), ChannelWorker(s, "bus"), ChannelWorker(s, "pull")]
        async with running(*workers):
            await eventually(lambda: all(delivered_key_exists(s, name, a["alert_id"]) for name in ("bus", "pull")
                                         for a in alerts), "every alert on both channels")
            await eventually(lambda: queue_depth(s.amqp_url, ALERT) == 0, "the alert queue to drain")
        downstream = get_all(other.amqp_url, "downstream")
        assert sorted(props.message_id for props, _ in downstream) == sorted(a["alert_id"] for a in alerts)
        assert all(json.loads(body)["alert_id"] == props.message_id for props, body in downstream)
        client = redis_client(s)
        try:
            queue = PullQueue(client, Keys(s.redis_key_prefix), "alerts", checkout_lifetime_seconds=60,
                              max_receive_count=3)
            received = await queue.receive(10)
        finally:
            await client.aclose()
        assert sorted(json.loads(m.message)["alert_id"] for m in received) == sorted(a["alert_id"] for a in alerts)
        dead = get_all(s.amqp_url, DEAD_LETTER)
        assert len(dead) == 2 and all("no alert_id" in props.headers[REASON_HEADER] for props, _ in dead)
    finally:
        services.delete_vhost(other)
