"""`aldebaran declare` against a real broker, in a fresh virtual host per test."""

from __future__ import annotations

import json
import subprocess
import sys

import pika

from declare.topology import DEAD_LETTER

CONTRACT_QUEUES = {"Aldebaran.Trade_Data", "Aldebaran.Purchase_Request", "Aldebaran.Alert", DEAD_LETTER}
CONTRACT_EXCHANGES = {"Aldebaran.Trade_Data", "Aldebaran.Alert"}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aldebaran.cli", "declare", *args],
                          env=env, capture_output=True, text=True, timeout=120)


def test_declares_every_contract_name_and_is_idempotent(vhost, worker_env) -> None:
    first = run(worker_env)
    assert first.returncode == 0, first.stderr
    queues, exchanges = vhost.queues(), vhost.exchanges()
    assert set(queues) >= CONTRACT_QUEUES
    assert set(exchanges) >= CONTRACT_EXCHANGES
    assert all(q["durable"] for q in queues.values())
    assert exchanges["Aldebaran.Trade_Data"]["type"] == "direct"

    second = run(worker_env)
    assert second.returncode == 0, second.stderr
    assert {n: q["arguments"] for n, q in vhost.queues().items()} == {n: q["arguments"] for n, q in queues.items()}
    assert set(vhost.exchanges()) == set(exchanges)


def test_alerts_and_channels_have_the_contracts_shape(vhost, worker_env) -> None:
    """CONTRACT §2: the alert exchange is direct and routes its key to its queue; each channel
    has its durable queue, and its parking queue beside it."""
    env = dict(worker_env, ALDEBARAN_CHANNELS=json.dumps([{"name": "ops", "kind": "log"}]))
    assert run(env).returncode == 0
    queues, exchanges = vhost.queues(), vhost.exchanges()
    assert exchanges["Aldebaran.Alert"]["type"] == "direct" and exchanges["Aldebaran.Alert"]["durable"]
    assert {("Aldebaran.Trade_Data", "Aldebaran.Trade_Data", "Aldebaran.Trade_Data"),
            ("Aldebaran.Alert", "Aldebaran.Alert", "Aldebaran.Alert")} <= vhost.bindings()
    assert queues["Aldebaran.Channel.ops"]["durable"] and queues["Aldebaran.Channel.ops.Dead_Letter"]["durable"]
    assert routed(vhost, "Aldebaran.Alert", b'{"alert_id": "over_purchase:1"}') == b'{"alert_id": "over_purchase:1"}'


def routed(vhost, name: str, body: bytes) -> bytes | None:
    """`body` published to exchange `name` with routing key `name`, then taken from queue `name`."""
    connection = pika.BlockingConnection(pika.URLParameters(vhost.amqp_url))
    try:
        channel = connection.channel()
        channel.basic_publish(name, name, body)
        return channel.basic_get(name, auto_ack=True)[2]
    finally:
        connection.close()


def test_trade_data_is_routed_to_its_queue(vhost, worker_env) -> None:
    assert run(worker_env).returncode == 0
    assert routed(vhost, "Aldebaran.Trade_Data", b"id:1") == b"id:1"


def test_quorum_queue_type_with_explicit_delivery_limit(vhost, worker_env) -> None:
    result = run(worker_env, "--queue-type", "quorum")
    assert result.returncode == 0, result.stderr
    trade = vhost.queues()["Aldebaran.Trade_Data"]
    assert trade["type"] == "quorum"
    assert trade["arguments"]["x-delivery-limit"] == 20
    assert trade["arguments"]["x-dead-letter-strategy"] == "at-least-once"
    assert trade["arguments"]["x-dead-letter-routing-key"] == "Aldebaran.Dead_Letter"


def test_conflicting_queue_exits_non_zero_naming_it(vhost, worker_env) -> None:
    assert run(worker_env).returncode == 0
    result = run(worker_env, "--queue-type", "quorum")
    assert result.returncode != 0
    assert "queue Aldebaran.Trade_Data already exists with different arguments" in result.stderr
    assert "inequivalent arg" in result.stderr and "current is none" in result.stderr


def test_unreachable_broker_names_the_masked_url(worker_env) -> None:
    env = dict(worker_env, ALDEBARAN_AMQP_URL="amqp://guest:s3cret@127.0.0.1:1/")
    result = run(env)
    assert result.returncode == 69
    assert "cannot connect to RabbitMQ at amqp://guest:***@127.0.0.1:1/" in result.stderr
    assert "s3cret" not in result.stderr + result.stdout


def test_dry_run_declares_nothing(vhost, worker_env) -> None:
    result = run(worker_env, "--dry-run")
    assert result.returncode == 0
    assert "would declare queue Aldebaran.Dead_Letter" in result.stdout
    assert vhost.queues() == {}
