"""An element that once poisoned the per-order aggregator (an order id whose queue name was
longer than AMQP allows: every declare raised, the message was retried until its delivery
limit) is now refused by the codec (CONTRACT §1: ids of at most 200 bytes): dead-lettered
alone, at once, with its reason, while its neighbours and later messages go on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.faults.fleet import TEST_TIMEOUT, Fleet, RetryingPublisher
from tests.support.pipeline import Broker, read_alert_message
from tests.support.waiting import quiet_window, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(TEST_TIMEOUT)]
LIMIT = 4


def event(ident: str, shares: int, order: str | None = None) -> dict:
    return {"id": ident, "#shares": shares, "client": "c", "stock": "s",
            **({"initial_order_id": order} if order else {})}


def test_a_once_poisonous_element_is_dead_lettered_alone_at_once(worker_env, vhost, tmp_path: Path) -> None:
    env = {**worker_env, "ALDEBARAN_BOOK_TTL_SECONDS": "3", "ALDEBARAN_DELIVERY_LIMIT": str(LIMIT)}
    fleet = Fleet(env, tmp_path / "logs", kinds=("aggregator", "books")).start_all()
    broker = Broker(vhost.amqp_url)
    broker.tap_alerts()
    publisher = RetryingPublisher(vhost.amqp_url)
    # An order id of 100 characters, 300 bytes of UTF-8: over the contract's 200.
    poison = json.dumps([event("p1", 1), event("p1-a", 2, "p1"), event("long-p", 5, "€" * 100)]).encode()
    try:
        publisher.publish_raw(poison)
        publisher.publish_raw(json.dumps([event("after", 1), event("after-a", 2, "after")]).encode())
        dead: list = []
        alerts: set[str] = set()

        def drain() -> bool:
            dead.extend(broker.drain("Aldebaran.Dead_Letter"))
            for props, body in broker.drain("test.alert-tap"):
                alerts.update(a["alert_id"] for a in read_alert_message(props, body))
            return bool(dead) and {"over_purchase:p1", "over_purchase:after"} <= alerts

        wait_until(drain, lambda: f"the dead letter and both alerts (dead {len(dead)}, alerts {sorted(alerts)})",
                   timeout=120, pause=0.3)
        # A second dead letter (the element retried until the delivery limit) would follow a
        # redelivery, which nothing the test publishes is ordered after.
        quiet_window(2, "a redelivered message's dead letter has no barrier", listen=drain)
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
    assert json.loads(body) == event("long-p", 5, "€" * 100)  # the element, not its batch
    assert "at most 200 bytes of UTF-8" in props.headers["x-aldebaran-reason"]
    assert retries == 0  # refused by the codec: nothing to retry
    assert {"over_purchase:p1", "over_purchase:after"} <= alerts  # neighbours and later messages went on
    assert codes == {"aggregator": 0, "books": 0}
