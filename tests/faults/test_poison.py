"""A poison message (its handling raises every time) is retried a bounded number of times,
then dead-lettered with the reason; the ingress and the worker go on."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.faults.fleet import TEST_TIMEOUT, Fleet, RetryingPublisher
from tests.support.pipeline import Broker

pytestmark = [pytest.mark.faults, pytest.mark.timeout(TEST_TIMEOUT)]
LIMIT = 4


def event(ident: str, shares: int, order: str | None = None) -> dict:
    return {"id": ident, "#shares": shares, "client": "c", "stock": "s",
            **({"initial_order_id": order} if order else {})}


def test_poison_message_is_retried_a_bounded_number_of_times_then_dead_lettered(worker_env, vhost,
                                                                                tmp_path: Path) -> None:
    env = {**worker_env, "ALDEBARAN_BOOK_TTL_SECONDS": "3", "ALDEBARAN_DELIVERY_LIMIT": str(LIMIT)}
    fleet = Fleet(env, tmp_path / "logs", kinds=("aggregator", "books")).start_all()
    broker = Broker(vhost.amqp_url)
    broker.tap_alerts()
    publisher = RetryingPublisher(vhost.amqp_url)
    # A valid order id (100 characters) whose queue name is 305 bytes: longer than AMQP's
    # 255-byte limit, so declaring its book raises on every delivery.
    poison = json.dumps([event("p1", 1), event("p1-a", 2, "p1"), event("long-p", 5, "€" * 100)]).encode()
    try:
        publisher.publish_raw(poison)
        publisher.publish_raw(json.dumps([event("after", 1), event("after-a", 2, "after")]).encode())
        dead: list = []
        alerts: set[str] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (dead and "over_purchase:after" in alerts):
            dead += broker.drain("Aldebaran.Dead_Letter")
            alerts |= {json.loads(body)["alert_id"] for _, body in broker.drain("test.alert-tap")}
            time.sleep(0.3)
        time.sleep(2)
        dead += broker.drain("Aldebaran.Dead_Letter")
        alive = fleet.alive()
    finally:
        publisher.close()
        broker.close()
        codes = fleet.stop_all()
    log = fleet.tail("aggregator", 200_000)
    retries = log.count('"routing failed, requeueing"')
    assert alive == {"aggregator": None, "books": None}, alive
    assert len(dead) == 1, [(p.headers, b[:100]) for p, b in dead]
    props, body = dead[0]
    assert body == poison
    assert f"handling failed {LIMIT} times" in props.headers["x-aldebaran-reason"]
    assert retries == LIMIT - 1  # bounded: then dead-lettered, no hot loop
    assert {"over_purchase:p1", "over_purchase:after"} <= alerts  # neighbours and later messages went on
    assert codes == {"aggregator": 0, "books": 0}
