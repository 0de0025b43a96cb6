"""An alert publish the broker nacks reaches, later, the queue that refused it.

RabbitMQ routes one publish to every bound queue; when one of them refuses it (here a full
queue with `overflow = reject-publish`, in a cluster a quorum queue without a leader) the
others keep their copy and the publisher gets a nack. The alert's witness is among those
copies, so it proves nothing: a restart that trusted it took the alert as sent, and the
refusing queue never got it (a node-loss run lost 2 of 258 alerts at the webhook that way).
Both modes now record the publish as refused and publish again until it is confirmed.
"""

from __future__ import annotations

import pika
import pytest
import redis

from aldebaran.trades.events import Purchase, PurchaseRequest
from declare.topology import ALERT
from tests.support import services
from tests.support.pipeline import TAP, read_alert_message, running
from tests.support.waiting import wait_until

REFUSING = "test.refusing-tap"  # holds one message at most and refuses more (nacks them)
ORDER = "refused"
ALERT_ID = f"over_purchase:{ORDER}"
NOT_CONFIRMED = "alert publish not confirmed"


@pytest.mark.parametrize("mode", ["engine", "per-order"])
def test_a_nacked_alert_reaches_the_queue_that_refused_it(mode: str, broker, worker_env, redis_prefix,
                                                          tmp_path) -> None:
    broker.channel.queue_declare(REFUSING, durable=True,
                                 arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    broker.channel.queue_bind(REFUSING, ALERT, routing_key=ALERT)
    broker.channel.basic_publish("", REFUSING, b"filler", pika.BasicProperties(delivery_mode=2))
    store = redis.Redis.from_url(services.REDIS_URL)
    env = dict(worker_env, ALDEBARAN_MODE=mode, ALDEBARAN_BOOK_TTL_SECONDS="5")
    with running(env, tmp_path / "up.log") as pipeline:
        broker.publish([PurchaseRequest(ORDER, 100, "c", "s"), Purchase("r1", ORDER, 60, "c", "s"),
                        Purchase("r2", ORDER, 60, "c", "s")], batch=3)
        # The publish was routed: the tap (and the witness) hold the alert, the full queue refused it.
        wait_until(lambda: broker.depth(TAP) >= 1, "the alert on the tap", 60)
        if mode == "engine":  # the restarted session's own publish refused too: it restarts again
            wait_until(lambda: pipeline.log().count(NOT_CONFIRMED) >= 2, "a second refused publish", 60)
        broker.channel.queue_purge(REFUSING)
        refused = broker.drain_until(REFUSING, 1, timeout=30)
        if mode == "engine":
            wait_until(lambda: not store.exists(f"{redis_prefix}:engine:pending"), "the outbox settled")
        else:
            wait_until(lambda: store.get(f"{redis_prefix}:alert:{ALERT_ID}") == b"sent", "the alert marked sent")
        log = pipeline.log()
    assert [alert["alert_id"] for props, body in refused for alert in read_alert_message(props, body)] == [ALERT_ID]
    tapped = {alert["alert_id"] for props, body in broker.drain(TAP) for alert in read_alert_message(props, body)}
    assert tapped == {ALERT_ID}  # copies there are allowed: the alert exchange is at-least-once
    assert not store.exists(f"{redis_prefix}:engine:refused")
    assert NOT_CONFIRMED in log
    assert "not recorded as refused" not in log
