"""Overload behaviour: bounded books, refused publishes that lose nothing (no timing asserted)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request

import pytest

from aldebaran.core.shards import SHARD_BATCH, decode_batch
from aldebaran.errors import PublishRefused
from aldebaran.io.publisher import Body, publish_bodies
from aldebaran.metrics import PUBLISH_NACKS
from aldebaran.publish import batches
from aldebaran.trades.events import Purchase, PurchaseRequest
from aldebaran.trades.generator import expected_alerts
from declare.declarer import declare
from tests.support.pipeline import Broker, alert_counts, collect_alerts, running, worker
from tests.support.pipeline import declare as declare_in


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def over_purchases(orders: int, prefix: str) -> list:
    events = []
    for n in range(orders):
        events += [PurchaseRequest(f"{prefix}{n}", 10, "c", "s"), Purchase(f"{prefix}{n}-p", f"{prefix}{n}", 11, "c", "s")]
    return events


def test_full_ingress_refuses_publishes_and_the_publisher_loses_nothing(settings, vhost, worker_env, tmp_path) -> None:
    settings = settings.model_copy(update={"ingress_max_length": 20})
    declare(settings, echo=lambda _: None)
    broker = Broker(vhost.amqp_url)
    broker.tap_alerts()
    events = over_purchases(40, "bp")  # 80 events, one per message: 4x the ingress limit

    # With few retries the publisher gets an error it can act on.
    with pytest.raises(PublishRefused, match="ingress full"):
        asyncio.run(publish_bodies(settings, batches(events, 1), max_retries=2))
    assert broker.depth("Aldebaran.Trade_Data") == 20
    broker.drain("Aldebaran.Trade_Data")

    # With retries it slows down until the pipeline drains the ingress, and loses nothing.
    nacks_before = PUBLISH_NACKS.labels(publisher="trade")._value.get()
    result: dict = {}
    publisher = threading.Thread(target=lambda: result.update(
        report=asyncio.run(publish_bodies(settings, batches(events, 1), max_retries=1000))))
    publisher.start()
    deadline = time.monotonic() + 30
    while PUBLISH_NACKS.labels(publisher="trade")._value.get() == nacks_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert PUBLISH_NACKS.labels(publisher="trade")._value.get() > nacks_before  # it was refused ...
    env = dict(worker_env, ALDEBARAN_INGRESS_MAX_LENGTH="20")
    with running(env, tmp_path / "up.log"):
        publisher.join(timeout=120)
        assert not publisher.is_alive()
        alerts = collect_alerts(broker, expected=40, timeout=60)
    broker.close()
    assert result["report"].events == 80 and result["report"].nacks > 0  # ... and retried
    assert alert_counts(alerts) == {alert_id: 1 for alert_id in expected_alerts(events)}


def test_book_manager_at_its_open_book_limit_does_not_grow_and_fires_everything(vhost, worker_env, tmp_path) -> None:
    limit, port = 4, free_port()
    env = dict(worker_env, ALDEBARAN_MAX_OPEN_BOOKS=str(limit), ALDEBARAN_BOOK_TTL_SECONDS="1",
               ALDEBARAN_BOOK_CLOSE_DELAY_SECONDS="0.2")
    events = over_purchases(16, "lim") + [Purchase("orph-p", "orph", 3, "c", "s")]
    with running(env, tmp_path / "up.log", "--metrics-port", str(port)):
        broker = Broker(vhost.amqp_url)
        broker.tap_alerts()
        broker.publish(events, batch=10)
        peak, samples = 0.0, 0
        alerts: list = []
        deadline = time.monotonic() + 90
        while len(alerts) < 17 and time.monotonic() < deadline:
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            value = float(next(line.split()[1] for line in metrics.splitlines()
                               if line.startswith("aldebaran_books_open ")))
            peak, samples = max(peak, value), samples + 1
            alerts += collect_alerts(broker, expected=1, timeout=0.2, settle=0)
        alerts += collect_alerts(broker, expected=1, timeout=2, settle=0)
        broker.close()
    assert samples > 10 and 0 < peak <= limit
    assert alert_counts(alerts) == {alert_id: 1 for alert_id in expected_alerts(events)}


def test_a_worker_warns_once_while_its_memory_is_above_max_rss_mib() -> None:
    from structlog.testing import capture_logs

    from workers.runtime import _memory_watch, resident_mib

    assert resident_mib() > 1

    async def watch() -> None:
        task = asyncio.create_task(_memory_watch(bound_mib=1, interval=0.01))
        await asyncio.sleep(0.1)  # several checks, all above the bound
        task.cancel()

    with capture_logs() as logs:
        asyncio.run(watch())
    warnings = [e for e in logs if e["event"] == "resident memory above max_rss_mib"]
    assert len(warnings) == 1, logs
    assert warnings[0]["max_rss_mib"] == 1 and warnings[0]["rss_mib"] > 1


def _gauge(port: int, name: str) -> float:
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return float(next(line.split()[1] for line in metrics.splitlines() if line.startswith(f"{name} ")))


def test_a_router_pauses_on_backlogged_shard_queues_and_the_surge_waits_in_the_ingress(vhost, worker_env,
                                                                                       tmp_path) -> None:
    limit, prefetch, port = 4, 8, free_port()
    # ttl 40 s: one hold lasts up to 10 s (a quarter), longer than the checks below.
    env = dict(worker_env, ALDEBARAN_MODE="sharded", ALDEBARAN_SHARDS="2", ALDEBARAN_BOOK_TTL_SECONDS="40",
               ALDEBARAN_ROUTER_MAX_SHARD_BACKLOG=str(limit), ALDEBARAN_ROUTER_PREFETCH=str(prefetch),
               ALDEBARAN_BATCH_MAX_EVENTS="1", ALDEBARAN_SHARD_CHECKPOINT_MS="100")
    # One order per message (request + purchase): a pause never splits an order, whose
    # events would otherwise be stamped apart by the pause's length (docs/backpressure.md).
    events = over_purchases(60, "surge")
    declare_in(env)
    broker = Broker(vhost.amqp_url)
    broker.tap_alerts()
    broker.publish(events, batch=2)
    with worker(env, tmp_path / "router.log", "router", "--metrics-port", str(port)):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if _gauge(port, "aldebaran_router_paused") == 1:
                    break
            except (OSError, StopIteration):
                pass
            time.sleep(0.1)
        assert _gauge(port, "aldebaran_router_paused") == 1
        # No shard worker: the router routed at most limit + 1 batches (one event each) per
        # shard and holds at most its prefetch; the other messages are still in the ingress.
        held_back = len(events) // 2 - 2 * (limit + 1) - prefetch
        assert broker.depth("Aldebaran.Trade_Data") >= held_back
        time.sleep(2)
        assert broker.depth("Aldebaran.Trade_Data") >= held_back and _gauge(port, "aldebaran_router_paused") == 1

        with worker(env, tmp_path / "books.log", "shard-books"):
            alerts = collect_alerts(broker, expected=60, timeout=90)
            assert broker.depth("Aldebaran.Trade_Data") == 0
    broker.close()
    assert alert_counts(alerts) == {alert_id: 1 for alert_id in expected_alerts(events)}
    assert "routing resumed" in (tmp_path / "router.log").read_text()


def _routed(port: int) -> float:
    """Events the router has routed (its consumed counter, every event type)."""
    try:
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    except OSError:
        return 0.0
    return sum(float(line.split()[1]) for line in metrics.splitlines()
               if line.startswith("aldebaran_events_consumed_total{"))


def test_a_router_hold_never_outlasts_a_quarter_of_the_book_ttl(vhost, worker_env, tmp_path) -> None:
    """A pause stretches the ingest stamps of an order split across it: it is bounded by ttl / 4."""
    port = free_port()
    env = dict(worker_env, ALDEBARAN_MODE="sharded", ALDEBARAN_SHARDS="2", ALDEBARAN_BOOK_TTL_SECONDS="4",
               ALDEBARAN_ROUTER_MAX_SHARD_BACKLOG="2", ALDEBARAN_ROUTER_PREFETCH="4", ALDEBARAN_BATCH_MAX_EVENTS="1")
    declare_in(env)
    broker = Broker(vhost.amqp_url)
    broker.publish(over_purchases(20, "hold"), batch=2)  # 20 messages, far over the backlog limit
    with worker(env, tmp_path / "router.log", "router", "--metrics-port", str(port)):
        # No shard worker ever drains the shard queues, yet the ingress empties, a few held
        # messages at a time, one hold per second at most (ttl 4 s / 4), while the router
        # stays throttled.
        deadline = time.monotonic() + 90
        while _routed(port) < 40 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _routed(port) == 40 and broker.depth("Aldebaran.Trade_Data") == 0
        assert _gauge(port, "aldebaran_router_paused") == 1
    batches = [body for shard in ("book-shard-0", "book-shard-1") for properties, body in broker.drain(shard)
               if properties.content_type == SHARD_BATCH]
    broker.close()
    # Every message routed exactly once (one segment each: an order's two events), none dropped by a hold.
    assert sorted(len(decode_batch(body)) for body in batches) == [1] * 20
    assert "routing paused" in (tmp_path / "router.log").read_text()
