"""The engine's alert witnesses (real RabbitMQ): a trim's ids-only read sees what recovery's full
read sees, and a running engine's compactions keep its witness queue empty."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiormq
import aiormq.abc
import msgspec
import pytest

from aldebaran.io.alert_witness import WITNESS_QUEUE, read_witness_ids, read_witnesses
from aldebaran.trades.events import Purchase, PurchaseRequest
from tests.support import services
from tests.support.pipeline import alert_counts, collect_alerts, running
from tests.support.waiting import wait_until

QUEUE = "witness-under-test"


def alert(n: int) -> dict[str, object]:
    return {"alert_id": f"over_purchase:{n}", "kind": "over_purchase", "order_id": str(n), "purchase_ids": ["p"]}


BODIES = [
    msgspec.json.encode([alert(1), alert(2), alert(3)]),  # a batch
    msgspec.json.encode(alert(4)),  # a lone alert
    b"  [" + msgspec.json.encode(alert(5))[:-1] + b', "extra": {"x": [1, 2]}} ]',  # spaces, an unknown field
    b"not json",  # not ours
    msgspec.json.encode([alert(6), {"kind": "no id"}, alert(7)]),  # broken after one alert
    b"[]",
    msgspec.json.encode([alert(8), {"alert_id": 9}]),  # an id that is not a string
    msgspec.json.encode(alert(10)) + b" trailing",
    b'"over_purchase:11"',  # a JSON string
    b"[" * 100_000 + b"]" * 100_000,  # deeper than the decoder goes
]


@pytest.fixture
async def channel(vhost: services.Vhost) -> AsyncIterator[aiormq.abc.AbstractChannel]:
    connection = await aiormq.connect(vhost.amqp_url)
    channel = await connection.channel()
    await channel.queue_declare(QUEUE, durable=True)
    for body in BODIES:
        await channel.basic_publish(body, routing_key=QUEUE)
    yield channel
    await connection.close()


async def test_the_ids_read_matches_the_full_read_message_for_message(channel: aiormq.abc.AbstractChannel) -> None:
    ids = await read_witness_ids(channel, QUEUE)
    await channel.basic_nack(ids[-1].tag, multiple=True, requeue=True)  # back, in queue order
    full = await read_witnesses(channel, QUEUE)
    assert [w.ids for w in ids] == [frozenset(w.alerts) for w in full]
    assert [sorted(w.ids) for w in ids] == [
        ["over_purchase:1", "over_purchase:2", "over_purchase:3"], ["over_purchase:4"], ["over_purchase:5"], [],
        ["over_purchase:6"], [], ["over_purchase:8"], [], [], []]


async def test_the_ids_read_stops_at_its_limit_and_leaves_the_rest(channel: aiormq.abc.AbstractChannel) -> None:
    first = await read_witness_ids(channel, QUEUE, limit=2)
    rest = await read_witness_ids(channel, QUEUE, limit=None)
    assert [len(w.ids) for w in first] == [3, 1] and len(rest) == len(BODIES) - 2
    assert len({w.tag for w in first + rest}) == len(BODIES)  # each one delivered once, unacked


def test_a_running_engine_trims_the_witnesses_of_alerts_it_marked_sent(broker, worker_env, redis_prefix,
                                                                      tmp_path) -> None:
    """Each alert batch leaves a witness; once its alerts are marked sent, a compaction acks it.
    After the engine stops nothing comes back to the queue: no trim held a witness unacked."""
    orders = [f"trim-{n}" for n in range(3)]
    with running(dict(worker_env, ALDEBARAN_MODE="engine"), tmp_path / "up.log"):
        for order in orders:  # one message each: a witness each
            broker.publish([PurchaseRequest(order, 100, "c", "s"), Purchase(f"{order}-p", order, 150, "c", "s")],
                           batch=2)
            alerts = collect_alerts(broker, expected=1, timeout=30, settle=0)
            assert alert_counts(alerts) == {f"over_purchase:{order}": 1}
        wait_until(lambda: broker.depth(WITNESS_QUEUE) == 0, "the witnesses trimmed", timeout=30)
    assert broker.depth(WITNESS_QUEUE) == 0
