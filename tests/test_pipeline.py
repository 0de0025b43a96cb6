"""The iteration-5 pipeline end to end: real broker, real Redis, public ingress, real process."""

from __future__ import annotations

import json
import re
import signal

import redis

from aldebaran.trades.events import Purchase, PurchaseRequest
from aldebaran.trades.generator import generate
from tests.support import services
from tests.support.pipeline import TAP, Pipeline, alert_counts, alerts_before_barrier, collect_alerts, running, worker
from tests.support.waiting import wait_until

DOC = [
    b"id:1\n# shares: 100\nclient: Sendence\nstock: AAPL\n",
    b"id:2\ninitial order id: 1\n# shares: 90\nclient: Sendence\nstock: AAPL\n",
    b"id:3\ninitial order id: 1\n# shares: 30\nclient: Sendence\nstock: AAPL\n",
]


def test_design_document_example_fires_once_after_purchase_3(broker, worker_env, tmp_path) -> None:
    with running(worker_env, tmp_path / "up.log"):
        broker.publish_raw(DOC[0])
        broker.publish_raw(DOC[1])
        assert alerts_before_barrier(broker) == []  # 90 of 100: nothing yet
        broker.publish_raw(DOC[2])
        alerts = collect_alerts(broker, expected=1, timeout=30)
        assert [a["alert_id"] for a in alerts] == ["over_purchase:1"]
        alert = alerts[0]
        assert alert["kind"] == "over_purchase" and alert["order_id"] == "1"
        assert (alert["client"], alert["stock"]) == ("Sendence", "AAPL")
        assert (alert["requested_shares"], alert["purchased_shares"]) == (100, 120)
        assert sorted(alert["purchase_ids"]) == ["2", "3"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", alert["detected_at"])
        broker.publish_raw(b"id:4\ninitial order id: 1\n# shares: 10\nclient: Sendence\nstock: AAPL\n")
        assert alerts_before_barrier(broker) == []  # a fourth purchase: no second alert


def test_contract_cases_and_junk(broker, worker_env, tmp_path) -> None:
    env = dict(worker_env, ALDEBARAN_BOOK_TTL_SECONDS="3")
    with running(env, tmp_path / "up.log") as pipeline:
        # purchases before their request: fires when the request arrives
        broker.publish([Purchase("e1", "early", 70, "c", "s"), Purchase("e2", "early", 40, "c", "s")])
        # exactly equal: no alert; one share over: alert
        broker.publish([PurchaseRequest("equal", 100, "c", "s"), Purchase("q1", "equal", 60, "c", "s"),
                        Purchase("q2", "equal", 40, "c", "s")], batch=3)
        broker.publish([PurchaseRequest("over", 100, "c", "s"), Purchase("v1", "over", 60, "c", "s"),
                        Purchase("v2", "over", 41, "c", "s")], batch=3)
        # the same purchase delivered three times counts once (60 of 100)
        dup = Purchase("d1", "dup", 60, "c", "s")
        broker.publish([PurchaseRequest("dup", 100, "c", "s"), dup, dup, dup])
        # junk mixed in, alone and inside a batch next to a good event
        broker.publish_raw(b"not a trade")
        broker.publish_raw(b'[{"id": "bad", "#shares": -5, "client": "c", "stock": "s"},'
                           b' {"id": "ok", "#shares": 5, "client": "c", "stock": "s"}]')
        broker.publish_raw(b'{"id": "ok-p", "initial_order_id": "ok", "#shares": 6, "client": "c", "stock": "s"}')
        # Everything so far committed (its dead letters are out): the request comes in a later cycle.
        wait_until(lambda: broker.depth("Aldebaran.Dead_Letter") == 2, "the two junk elements dead-lettered")
        broker.publish([PurchaseRequest("early", 100, "c", "s")])
        # a purchase whose request never comes
        broker.publish([Purchase("o1", "orphan", 7, "c", "s")])
        alerts = collect_alerts(broker, expected=4, timeout=30, settle=4)
        dead = broker.drain("Aldebaran.Dead_Letter")
        log = pipeline.log()
    assert sorted(alert_counts(alerts).items()) == [
        ("over_purchase:early", 1), ("over_purchase:ok", 1), ("over_purchase:over", 1),
        ("purchase_without_request:orphan", 1)]
    orphan = next(a for a in alerts if a["kind"] == "purchase_without_request")
    assert orphan["requested_shares"] is None and orphan["purchased_shares"] == 7
    reasons = sorted(p.headers["x-aldebaran-reason"] for p, _ in dead)
    assert reasons == ["#shares must be a positive integer, got -5", "text form line without ':': 'not a trade'"]
    bodies = {json.loads(b)["id"] if b.startswith(b"{") else b.decode() for _, b in dead}
    assert bodies == {"bad", "not a trade"}
    assert '"event": "dead-lettered"' in log


def test_sigkill_mid_stream_then_restart_loses_and_duplicates_nothing(broker, worker_env, tmp_path) -> None:
    stream = generate(orders=1200, seed=11, orphans=0.02)
    # Long enough that a loaded machine still sees each order's events inside one book's life.
    env = dict(worker_env, ALDEBARAN_BOOK_TTL_SECONDS="20")
    first = Pipeline(env, tmp_path / "up-1.log").start()
    half = len(stream.events) // 2
    broker.publish(stream.events[:half], batch=20)
    # Books open, some alerts out, much still held unacked: kill as soon as the first alert is out.
    wait_until(lambda: broker.depth(TAP) > 0, "the first alerts before the kill", timeout=60)
    first.kill()
    assert first.process.returncode == -signal.SIGKILL
    broker.publish(stream.events[half:], batch=20)
    with running(env, tmp_path / "up-2.log") as second:
        alerts = collect_alerts(broker, expected=len(stream.expected), timeout=120, settle=10)
        log = first.log() + second.log()
    counts = alert_counts(alerts)
    assert set(counts) == stream.expected, (sorted(stream.expected - set(counts))[:5],
                                            sorted(set(counts) - stream.expected)[:5])
    # The only repeat the internal alert bus may carry is the outbox's documented
    # re-publish of a pending alert after a crash; recipients dedup it by alert_id.
    repeated = {alert_id for alert_id, n in counts.items() if n > 1}
    republished = set(re.findall(r'"alert_id": "([^"]+)"[^\n]*re-publishing a pending alert', log))
    assert repeated <= republished


def test_a_book_that_starts_after_its_deadline_counts_what_was_stamped_in_time(broker, worker_env, redis_prefix,
                                                                               tmp_path) -> None:
    env = dict(worker_env, ALDEBARAN_MODE="per-order", ALDEBARAN_BOOK_TTL_SECONDS="2",
               ALDEBARAN_PER_ORDER__BOOK_CLOSE_DELAY_SECONDS="0")
    with worker(env, tmp_path / "aggregator.log", "aggregator"):
        # Many purchases first, the request last, all stamped within the book's lifetime:
        # a late book must read its whole queue before it closes.
        purchases = [Purchase(f"late-{n}", "slow", 1, "c", "s") for n in range(300)]
        broker.publish([*purchases, PurchaseRequest("slow", 100, "c", "s")], batch=301)
        wait_until(lambda: broker.depth("book-slow") >= 301, lambda: f"301 events in book-slow, "
                   f"{broker.depth('book-slow')} there")
        assert broker.depth("book-slow") == 301
        _wait_pipeline_time_past_deadline(redis_prefix, ttl_ms=2000)  # before any book manager runs
        with worker(env, tmp_path / "books.log", "books"):
            alerts = collect_alerts(broker, expected=1, timeout=30, settle=3)
    assert [a["alert_id"] for a in alerts] == ["over_purchase:slow"]


def _wait_pipeline_time_past_deadline(prefix: str, ttl_ms: int) -> None:
    """Until the stream's watermark passed every routed event's stamp plus `ttl_ms`: pipeline
    time (aldebaran/io/pipeline_watermark.py), the clock books close on, not the wall clock.
    `last` in an aggregator's record written after routing is above every stamp it handed out."""
    store = redis.Redis.from_url(services.REDIS_URL)
    key = f"{prefix}:pipeline-clock"
    seconds, micros = store.time()
    routed_ms = seconds * 1000 + micros // 1000

    def fields(name: bytes) -> list[int]:
        return [int(v) for k, v in store.hgetall(key).items() if k.startswith(name)]

    last = wait_until(lambda: max(fields(b"seen:"), default=0) > routed_ms and fields(b"last")[0],
                      "the aggregator to record its clock after routing")
    deadline = last + ttl_ms
    wait_until(lambda: min(fields(b"wm:"), default=0) >= deadline,
               lambda: f"pipeline time past the book's deadline {deadline} (watermarks {fields(b'wm:')})")
    store.close()
