"""Two deployments (two vhosts) on one Redis with default settings: each keeps to its own keys.

Neither sets `redis_key_prefix`; the default derives from the vhost. Both see the same
order ids with different clients, and each alerts once, with its own client, for its own
orders only (issue 19, row 2).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aldebaran.settings import Settings, default_key_prefix
from aldebaran.trades.events import Purchase, PurchaseRequest
from tests.support import services
from tests.support.pipeline import Broker, alert_counts, collect_alerts, declare, running


def test_the_default_key_prefix_is_per_vhost() -> None:
    assert Settings().redis_key_prefix == "aldebaran"  # the default vhost keeps the old prefix
    prefixes = {default_key_prefix(services.vhost_url(v)) for v in ("a", "b", "a b", "a/b", "é")}
    assert len(prefixes) == 5
    assert Settings(amqp_url=services.vhost_url("prod")).redis_key_prefix == "aldebaran.prod"
    assert Settings(amqp_url=services.vhost_url("prod"), redis_key_prefix="x").redis_key_prefix == "x"


@pytest.fixture
def two_deployments(worker_env: dict[str, str], tmp_path) -> Iterator[list[tuple[dict[str, str], Broker]]]:
    vhosts = [services.create_vhost("shared-redis") for _ in range(2)]
    deployments = []
    try:
        for vhost in vhosts:
            env = {k: v for k, v in worker_env.items() if k != "ALDEBARAN_REDIS_KEY_PREFIX"}
            env.update(ALDEBARAN_AMQP_URL=vhost.amqp_url, ALDEBARAN_BOOK_TTL_SECONDS="4")
            declare(env)
            broker = Broker(vhost.amqp_url)
            broker.tap_alerts()
            deployments.append((env, broker))
        yield deployments
    finally:
        for _, broker in deployments:
            broker.close()
        for vhost in vhosts:
            services.clean_redis(default_key_prefix(vhost.amqp_url))
            services.delete_vhost(vhost)


@pytest.mark.parametrize("mode", ["engine", "per-order"])
def test_two_vhosts_on_one_redis_with_overlapping_order_ids(mode, two_deployments, tmp_path) -> None:
    (env_a, broker_a), (env_b, broker_b) = two_deployments
    assert default_key_prefix(env_a["ALDEBARAN_AMQP_URL"]) != default_key_prefix(env_b["ALDEBARAN_AMQP_URL"])
    env_a, env_b = dict(env_a, ALDEBARAN_MODE=mode), dict(env_b, ALDEBARAN_MODE=mode)
    with running(env_a, tmp_path / "a.log"), running(env_b, tmp_path / "b.log"):
        for n in range(10):
            order = f"100{n}"
            broker_a.publish([PurchaseRequest(order, 10, "client-a", "s"),
                              Purchase(f"pa{n}", order, 11, "client-a", "s")])
        alerts_a = collect_alerts(broker_a, expected=10, timeout=60)
        for n in range(10):  # the same ids, after A closed its books: B must not see them as late
            order = f"100{n}"
            broker_b.publish([PurchaseRequest(order, 10, "client-b", "s"),
                              Purchase(f"pb{n}", order, 12, "client-b", "s")])
        broker_b.publish([Purchase("orphan-b", "only-b", 1, "client-b", "s")])
        alerts_b = collect_alerts(broker_b, expected=11, timeout=60, settle=2)
    assert alert_counts(alerts_a) == {f"over_purchase:100{n}": 1 for n in range(10)}
    assert {a["client"] for a in alerts_a} == {"client-a"}
    expected_b = {f"over_purchase:100{n}": 1 for n in range(10)} | {"purchase_without_request:only-b": 1}
    assert alert_counts(alerts_b) == expected_b
    assert {a["client"] for a in alerts_b} == {"client-b"}
    assert {a["purchased_shares"] for a in alerts_b if a["kind"] == "over_purchase"} == {12}
