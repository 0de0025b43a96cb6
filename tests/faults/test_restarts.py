"""Broker and Redis restarts mid-stream, a network cut and a slow link.

The broker is a private node on its own ports (never the machine's shared one); Redis
is a private redis-server with AOF on. Publishers retry what was not confirmed,
workers reconnect and declare their topology again; every sink must still get every
expected alert exactly once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aldebaran.trades.events import Purchase, PurchaseRequest
from aldebaran.trades.generator import expected_alerts
from tests.faults.conftest import BOOK_TTL_SECONDS, redis_url
from tests.faults.fleet import (
    FULL,
    ORDERS,
    TEST_TIMEOUT,
    Fault,
    Fleet,
    PrivateRedis,
    RetryingPublisher,
    describe,
    in_background,
    in_doubt_ids,
    pull_queue_deliveries,
    raise_fault_errors,
    wait_for_sinks,
)
from tests.support.checker import fault_stream
from tests.support.private_rabbit import PrivateRabbit
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(TEST_TIMEOUT)]
CMD = "FAULTS_SCALE=full .venv/bin/python -m pytest -m faults -q -s 'tests/faults/test_restarts.py::{}'"


def _run(fleet: Fleet, stream, publisher_url: str, sinks: dict, at: dict, redis: str, prefix: str) -> dict:
    """Publish the stream with the faults `at` its marks; the sinks' reports once all is in. The
    webhook is at most once: an attempt a fault interrupted is in doubt (`redis`: where to look)."""
    publisher = RetryingPublisher(publisher_url)
    faults: list[Fault] = []
    marks = {p: (lambda action=action: faults.append(action())) for p, action in at.items()}
    try:
        try:
            publisher.publish_stream(stream.events, at=marks)
        except Exception:
            raise_fault_errors(faults)  # the cause, where the publisher saw its symptom
            raise
        for fault in faults:
            fault.join(timeout=300)
        raise_fault_errors(faults)
        assert not any(fault.is_alive() for fault in faults), "a fault still running 300 s after the stream"
        reports = wait_for_sinks(stream.expected, sinks, timeout=180 + len(stream.events) / 50,
                                 in_doubt={"webhook": lambda: in_doubt_ids(redis, prefix)})
        alive = fleet.alive()
    finally:
        publisher.close()
    assert all(code is None for code in alive.values()), (alive, fleet.all_logs()[-5000:])
    # One send in flight at most once: a fault can interrupt at most that one attempt.
    assert len(reports["webhook"].in_doubt) <= len(at), reports["webhook"].in_doubt
    return reports


_background = in_background


def test_rabbitmq_restart_mid_stream(fault_env, webhook, redis_prefix, tmp_path: Path, record) -> None:
    node = PrivateRabbit(tmp_path / "rabbit").start()
    try:
        # The node is down ~10 s and workers back off up to ~15 s: the books must outlive that.
        ttl = str(max(30.0, BOOK_TTL_SECONDS))
        env = {**fault_env, "ALDEBARAN_AMQP_URL": node.url, "ALDEBARAN_BOOK_TTL_SECONDS": ttl}
        stream = fault_stream(ORDERS, seed=21)
        fleet = Fleet(env, tmp_path / "logs").start_all()
        try:
            reports = _run(fleet, stream, node.url, {
                "webhook": webhook.deliveries,
                "queue-api": lambda: pull_queue_deliveries(redis_url(), redis_prefix)},
                at={0.5: _background(node.restart)}, redis=redis_url(), prefix=redis_prefix)
        finally:
            codes = fleet.stop_all()
    finally:
        node.cleanup()
    print(f"\nRabbitMQ restart: {len(stream.events)} events\n{describe(reports.values())}")
    record("RabbitMQ node restart (private node, stop + start)", 1, len(stream.events), reports,
           CMD.format("test_rabbitmq_restart_mid_stream"))
    assert all(r.ok for r in reports.values()), describe(reports.values())
    assert all(code == 0 for code in codes.values()), codes


PER_ORDER_KINDS = ("aggregator", "books", "lookout", "hook", "pull")


def _orders_split_by_an_outage(count: int) -> tuple[list, list]:
    """Purchases first; the requests of most orders only after the outage (some over, some
    under their request); every fifth order never gets its request (a real orphan)."""
    before, after = [], []
    for n in range(count):
        order = f"w{n}"
        before += [Purchase(f"{order}-p{i}", order, 30, "c", "s") for i in range(3)]
        if n % 5:
            after.append(PurchaseRequest(order, 80 if n % 2 else 100, "c", "s"))
    return before, after


@pytest.mark.skipif(not FULL, reason="the reference mode's broker restart runs at full scale; CI restarts the broker "
                    "under the default engine (test_rabbitmq_restart_mid_stream)")
def test_per_order_books_wait_out_a_rabbitmq_restart(fault_env, webhook, redis_prefix, tmp_path: Path,
                                                     record) -> None:
    """Issue 18 item 6: books close on the stream's watermark (pipeline time), not on their own
    clock. The broker is down longer than a book lives, between an order's purchases and its
    request; pipeline time stands still meanwhile, so the request is not late and its order is
    not called an orphan. Books on the wall clock failed this: every such order fired
    purchase_without_request (the flake of test_rabbitmq_restart_mid_stream in its per-order days)."""
    # Pipeline time runs while the aggregator is connected: from the purchases to the stop, and
    # from its reconnect to the requests' publish. On a loaded box those took 5 and 4 s, so a
    # ttl of 8 s closed the books early; 12 s leaves room and the outage still outlasts it.
    ttl, delay = 12.0, 1.0
    node = PrivateRabbit(tmp_path / "rabbit").start()
    before, after = _orders_split_by_an_outage(40)
    expected = expected_alerts(before + after)
    try:
        env = {**fault_env, "ALDEBARAN_AMQP_URL": node.url, "ALDEBARAN_MODE": "per-order",
               "ALDEBARAN_BOOK_TTL_SECONDS": str(ttl), "ALDEBARAN_PER_ORDER__BOOK_CLOSE_DELAY_SECONDS": str(delay)}
        fleet = Fleet(env, tmp_path / "logs", kinds=PER_ORDER_KINDS).start_all()
        publisher = RetryingPublisher(node.url)
        try:
            publisher.publish_stream(before)
            _wait_routed(node.url, len(before) // 3)
            down = time.monotonic()
            node.stop()
            time.sleep(ttl + delay + 1)  # by design: the outage outlasts a book's life
            node.start()
            outage = time.monotonic() - down
            publisher.publish_stream(after)
            reports = wait_for_sinks(expected, {
                "webhook": webhook.deliveries,
                "queue-api": lambda: pull_queue_deliveries(redis_url(), redis_prefix)}, timeout=120)
            alive = fleet.alive()
        finally:
            publisher.close()
            codes = fleet.stop_all()
    finally:
        node.cleanup()
    print(f"\nper-order, RabbitMQ down {outage:.1f} s (book ttl {ttl} s) between purchases and requests\n"
          f"{describe(reports.values())}")
    record("per-order mode: RabbitMQ down longer than a book's ttl between an order's purchases and its request",
           1, len(before) + len(after), reports, CMD.format("test_per_order_books_wait_out_a_rabbitmq_restart"))
    assert outage > ttl + delay
    assert all(code is None for code in alive.values()), alive
    assert all(r.ok for r in reports.values()), describe(reports.values()) + "\n" + fleet.tail("books")
    assert sum(a.startswith("purchase_without_request") for a in expected) == 8  # the real orphans fired
    assert all(code == 0 for code in codes.values()), codes


def _wait_routed(url: str, orders: int, timeout: float = 60) -> None:
    """The aggregator routed everything and the books took their work items."""
    import pika

    def routed() -> bool:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        try:
            channel = connection.channel()
            depths = [channel.queue_declare(q, passive=True).method.message_count
                      for q in ("Aldebaran.Trade_Data", "Aldebaran.Purchase_Request")]
            consumed = channel.queue_declare("Aldebaran.Purchase_Request", passive=True).method.consumer_count
        finally:
            connection.close()
        return depths == [0, 0] and bool(consumed)

    wait_until(routed, f"{orders} orders routed and their work items taken", timeout, pause=0.2)


def test_redis_restart_mid_stream(fault_env, webhook, redis_prefix, vhost, tmp_path: Path, record) -> None:
    server = PrivateRedis(tmp_path / "redis").start()
    try:
        env = {**fault_env, "ALDEBARAN_REDIS_URL": server.url}
        stream = fault_stream(ORDERS, seed=22)
        fleet = Fleet(env, tmp_path / "logs").start_all()
        try:
            reports = _run(fleet, stream, vhost.amqp_url, {
                "webhook": webhook.deliveries,
                "queue-api": lambda: pull_queue_deliveries(server.url, redis_prefix)},
                at={0.5: _background(server.restart)}, redis=server.url, prefix=redis_prefix)
        finally:
            codes = fleet.stop_all()
    finally:
        server.close()
    print(f"\nRedis restart: {len(stream.events)} events\n{describe(reports.values())}")
    record("Redis restart (private redis-server, AOF everysec, SHUTDOWN + 2 s down)", server.restarts,
           len(stream.events), reports, CMD.format("test_redis_restart_mid_stream"))
    assert server.restarts == 1
    assert all(r.ok for r in reports.values()), describe(reports.values())
    assert all(code == 0 for code in codes.values()), codes


def _proxied(fault_env: dict, vhost, proxy: TcpProxy, redis_proxy: TcpProxy | None = None) -> dict:
    url = vhost.amqp_url.replace("127.0.0.1:5672", f"127.0.0.1:{proxy.port}")
    assert url != vhost.amqp_url
    env = {**fault_env, "ALDEBARAN_AMQP_URL": url}
    if redis_proxy is not None:
        env["ALDEBARAN_REDIS_URL"] = redis_url().replace("127.0.0.1:6379", f"127.0.0.1:{redis_proxy.port}")
        assert env["ALDEBARAN_REDIS_URL"] != redis_url()
    return env


PARTITION_SECONDS = 3  # a fault's length, by design (the recorded matrix row says "partitioned 3 s")


def _partition(proxy: TcpProxy) -> None:
    proxy.block()
    time.sleep(PARTITION_SECONDS)
    proxy.unblock()


def test_network_cut_and_partition(fault_env, webhook, redis_prefix, vhost, tmp_path: Path, record) -> None:
    """Every worker reaches RabbitMQ and Redis through proxies the test controls: a slow broker link,
    then the broker connections cut and partitioned, then the Redis connections cut and partitioned."""
    proxy, redis_proxy = TcpProxy(5672).start(), TcpProxy(6379).start()
    try:
        stream = fault_stream(ORDERS, seed=23)
        fleet = Fleet(_proxied(fault_env, vhost, proxy, redis_proxy), tmp_path / "logs").start_all()

        def slow() -> None:
            proxy.latency = 0.1

        def fast() -> None:
            proxy.latency = 0.0

        try:
            reports = _run(fleet, stream, vhost.amqp_url, {
                "webhook": webhook.deliveries,
                "queue-api": lambda: pull_queue_deliveries(redis_url(), redis_prefix)},
                at={0.1: _background(slow), 0.2: _background(fast), 0.3: _background(proxy.cut),
                    0.45: _background(lambda: _partition(proxy)), 0.6: _background(redis_proxy.cut),
                    0.75: _background(lambda: _partition(redis_proxy))}, redis=redis_url(), prefix=redis_prefix)
        finally:
            codes = fleet.stop_all()
    finally:
        proxy.close()
        redis_proxy.close()
    print(f"\nnetwork cuts + partitions: {proxy.cuts} broker and {redis_proxy.cuts} Redis connections cut\n"
          f"{describe(reports.values())}")
    record("slow broker link (+100 ms, 10%-20%), broker connections cut at 30% and partitioned 3 s at 45%, "
           "Redis connections cut at 60% and partitioned 3 s at 75%", 4, len(stream.events), reports,
           CMD.format("test_network_cut_and_partition"), connections_cut=proxy.cuts + redis_proxy.cuts)
    assert proxy.cuts >= 5  # every worker's connection went through the proxy and was cut
    assert redis_proxy.cuts >= 4  # engine, lookout and both deliverers hold Redis connections
    assert all(r.ok for r in reports.values()), describe(reports.values())
    assert all(code == 0 for code in codes.values()), codes


@pytest.mark.skipif(not FULL, reason="CI covers the slow link inside test_network_cut_and_partition")
def test_slow_link(fault_env, webhook, redis_prefix, vhost, tmp_path: Path, record) -> None:
    proxy = TcpProxy(5672).start()
    try:
        stream = fault_stream(ORDERS, seed=24)
        fleet = Fleet(_proxied(fault_env, vhost, proxy), tmp_path / "logs").start_all()

        def slow() -> None:
            proxy.latency = 0.1

        def fast() -> None:
            proxy.latency = 0.0

        try:
            reports = _run(fleet, stream, vhost.amqp_url, {
                "webhook": webhook.deliveries,
                "queue-api": lambda: pull_queue_deliveries(redis_url(), redis_prefix)},
                at={0.2: _background(slow), 0.8: _background(fast)}, redis=redis_url(), prefix=redis_prefix)
        finally:
            codes = fleet.stop_all()
    finally:
        proxy.close()
    print(f"\nslow link: {describe(reports.values())}")
    record("slow link (+100 ms each way, 20%-80% of the stream)", 1, len(stream.events), reports,
           CMD.format("test_slow_link"))
    assert all(r.ok for r in reports.values()), describe(reports.values())
    assert all(code == 0 for code in codes.values()), codes
