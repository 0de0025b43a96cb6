"""The sharded mode: pure shard logic, and end to end against the per-order reference mode."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import psutil
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from aldebaran.apps.trade_limits import rule
from aldebaran.core.acks import AckTracker
from aldebaran.core.book import Outcome
from aldebaran.core.shard_state import FINAL_HEADER, HEARTBEAT, ROUTER_HEADER, ShardBooks
from aldebaran.core.shards import Segment, decode_batch, encode_batch, shard_of
from aldebaran.core.snapshot import BookRecord, DoneMarker, ShardImage, decode_image, encode_image, encode_state
from aldebaran.trades.codec import TRADE_CODEC
from aldebaran.trades.events import Purchase, PurchaseRequest
from aldebaran.trades.generator import generate
from declare.topology import TRADE_DATA, shard_queue
from tests.support import services
from tests.support.pipeline import Broker, Pipeline, alert_counts, collect_alerts, declare, running

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
RULES = {"trade_limits": rule}


# --- pure shard logic -------------------------------------------------------------------

def test_shard_of_is_stable_and_in_range() -> None:
    assert shard_of("o1", 16) == shard_of("o1", 16)
    assert shard_of("o1", 16) == 4066534829 % 16  # crc32(b"o1"): the same in every process
    assert {shard_of(f"o{n}", 8) for n in range(1000)} == set(range(8))


def test_ack_tracker_acks_only_the_fully_done_prefix() -> None:
    tracker = AckTracker()
    for tag in (1, 2, 3):
        tracker.add(tag)
    tracker.hold(1)  # tag 1 has a batch in flight
    assert tracker.release(2) is None  # 1 is still held: nothing ackable
    assert tracker.release(1) is None
    assert tracker.release(3) is None
    assert tracker.release(1) == 3  # the last hold of 1 goes: 1..3 are all done
    assert len(tracker) == 0 and tracker.acked == 3


def test_shard_batch_round_trip() -> None:
    events = [PurchaseRequest("1", 100, "c", "s"), Purchase("2", "1", 90, "c", "s")]
    body = encode_batch([Segment("trade_limits", 1000, 999, TRADE_CODEC.pack_many(events))])
    (segment,) = decode_batch(body)
    assert segment.ingest_ms == 1000 and TRADE_CODEC.unpack_many(segment.events) == events


def test_restored_shard_reaches_the_same_verdicts() -> None:
    """Snapshot + deltas + the redelivered tail == never crashed (dedup makes overlap harmless)."""
    first = [PurchaseRequest("a", 100, "c", "s"), Purchase("a1", "a", 60, "c", "s"), Purchase("b1", "b", 5, "c", "s")]
    tail = [Purchase("a1", "a", 60, "c", "s"), Purchase("a2", "a", 50, "c", "s")]
    live = ShardBooks(RULES, default_ttl=3, done_retention=60)
    for event in first:
        live.offer("trade_limits", event, 10.0, NOW)
    snapshot = live.take_snapshot()
    live.offer("trade_limits", Purchase("c1", "c", 1, "c", "s"), 11.0, NOW)
    delta = live.take_delta()
    closed = live.close_due(100.0, NOW)  # every book closes: b fires purchase_without_request
    assert {a.alert_id for a in closed} == {"purchase_without_request:b", "purchase_without_request:c"}
    delta_closed = live.take_delta()

    rebuilt = ShardBooks(RULES, default_ttl=3, done_retention=60)
    rebuilt.restore([decode_image(snapshot), decode_image(delta)], now_ts=10.0)
    assert set(rebuilt.books) == {("trade_limits", "a"), ("trade_limits", "b"), ("trade_limits", "c")}
    outcomes = [rebuilt.offer("trade_limits", e, 10.5, NOW) for e in tail]
    assert [o.outcome for o in outcomes] == [Outcome.DUPLICATE, Outcome.APPLIED]
    assert [a.alert_id for a in outcomes[1].alerts] == ["over_purchase:a"]

    after_close = ShardBooks(RULES, default_ttl=3, done_retention=60)
    images = [decode_image(snapshot), decode_image(delta), decode_image(delta_closed)]
    after_close.restore(images, now_ts=50.0)
    assert not after_close.books and ("trade_limits", "b") in after_close.done
    late = after_close.offer("trade_limits", Purchase("b2", "b", 500, "c", "s"), 12.0, NOW)
    assert late.outcome is Outcome.LATE and not late.alerts


@hsettings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(
    st.lists(st.one_of(
        st.builds(PurchaseRequest, id=st.sampled_from(["a", "b", "c"]), shares=st.integers(1, 120),
                  client=st.just("c"), stock=st.just("s")),
        st.builds(Purchase, id=st.sampled_from(["1", "2", "3", "4"]), order_id=st.sampled_from(["a", "b", "c"]),
                  shares=st.integers(1, 120), client=st.just("c"), stock=st.just("s"))), max_size=8),
    st.floats(0, 12), st.booleans()), max_size=12))
def test_offer_many_is_offer_event_by_event(segments) -> None:
    """The batch call reaches the verdicts, alerts, books and images of `offer` (hence of `Book.offer`)."""
    one, many = (ShardBooks(RULES, default_ttl=3, done_retention=5) for _ in range(2))
    clock = 0.0
    for events, step, close in segments:
        clock += step
        outcomes = [one.offer("trade_limits", event, clock, NOW) for event in events]
        fired: list = []
        counts = many.offer_many("trade_limits", events, clock, NOW, fired)
        assert counts == tuple(sum(o.outcome is kind for o in outcomes)
                               for kind in (Outcome.APPLIED, Outcome.DUPLICATE, Outcome.LATE))
        assert fired == [alert for o in outcomes for alert in o.alerts]
        if close:
            assert one.close_due(clock - 1, NOW) == many.close_due(clock - 1, NOW)
        assert one.books.keys() == many.books.keys() and one.done.groups() == many.done.groups()
        assert all((b.seen, b.state, b.opened_at) == (many.books[k].seen, many.books[k].state, many.books[k].opened_at)
                   for k, b in one.books.items())
        assert one.take_delta() == many.take_delta()
    assert one.take_snapshot() == many.take_snapshot()


def test_images_are_encoded_exactly_as_book_records() -> None:
    """One encoder pass for a whole image writes the bytes `BookRecord`s did (old readers agree)."""
    live = ShardBooks(RULES, default_ttl=3, done_retention=60)
    for n, event in enumerate([PurchaseRequest("a", 100, "c", "s"), Purchase("a1", "a", 60, "c", "s"),
                               Purchase("b1", "b", 5, "c", "s"), Purchase("c1", "c", 1, "c", "s")]):
        live.offer("trade_limits", event, 10.0 + n, NOW)
    live.close_due(13.5, NOW)  # a closes (deadline 13), b and c stay open

    def records(bids):
        return [BookRecord(app, key, live.books[(app, key)].opened_at, list(live.books[(app, key)].seen),
                           encode_state(live.books[(app, key)].state)) for app, key in bids if (app, key) in live.books]

    expected_delta = encode_image(ShardImage(records(list(live._dirty)), [], list(live._closed)))
    assert live.take_delta() == expected_delta
    expected_snapshot = encode_image(ShardImage(records(list(live.books)), [], live.done.groups()))
    assert live.take_snapshot() == expected_snapshot
    image = decode_image(expected_snapshot)
    assert [(r.key, sorted(r.seen)) for r in image.books] == [("b", ["p:b1"]), ("c", ["p:c1"])]


# --- end to end -------------------------------------------------------------------------

def _env(vhost: services.Vhost, prefix: str, tmp_path, ttl: str = "3", **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALDEBARAN_")}
    env.update(
        ALDEBARAN_AMQP_URL=vhost.amqp_url, ALDEBARAN_REDIS_URL=services.REDIS_URL,
        ALDEBARAN_REDIS_KEY_PREFIX=prefix, ALDEBARAN_MANAGEMENT_URL=services.MANAGEMENT_URL,
        ALDEBARAN_TRACES_DIR=str(tmp_path / "traces"), ALDEBARAN_LOG_FORMAT="json",
        ALDEBARAN_BOOK_TTL_SECONDS=ttl, PYTHONUNBUFFERED="1", **extra)
    return env


def _sharded(env: dict[str, str]) -> dict[str, str]:
    return dict(env, ALDEBARAN_MODE="sharded", ALDEBARAN_SHARDS="4", ALDEBARAN_SHARD_CHECKPOINT_MS="100")


def _wait_parent_ready(pipeline: Pipeline, timeout: float = 60) -> None:
    """`up` with child processes: the parent's own ready line comes after every child's."""
    assert pipeline.process is not None
    marker = f'"pid": {pipeline.process.pid}'
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any('"event": "ready"' in line and marker in line for line in pipeline.log().splitlines()):
            return
        time.sleep(0.1)
    raise AssertionError(f"up not ready:\n{pipeline.log()[-3000:]}")


def _log_records(log: str) -> list[dict]:
    """The JSON log records of `up` and its children. Children share one file and `print`
    writes a record and its newline separately, so two records can share a line: parse
    every flat {...} object rather than every line."""
    records = []
    for match in re.finditer(r"\{[^{}\n]*\}", log):
        try:
            records.append(json.loads(match.group(0)))
        except json.JSONDecodeError:
            continue
    return records


def _signature(alert: dict) -> tuple:
    return (alert["alert_id"], alert["kind"], alert["order_id"], alert["client"], alert["stock"],
            alert["requested_shares"])


def test_sharded_mode_fires_exactly_the_alerts_of_the_per_order_mode(tmp_path) -> None:
    stream = generate(orders=300, seed=5, orphans=0.05)
    results = {}
    for mode in ("per-order", "sharded"):
        vhost, prefix = services.create_vhost(), services.redis_prefix()
        try:
            # 10 s, not 3: the per-order mode closes books on the wall clock, so on a loaded
            # 2-core machine (load 8-14 measured) a request queued for more than the ttl is
            # late there and fires a wrong purchase_without_request. The sharded mode closes
            # on its watermark and is immune (docs/sharding.md); the reference is not.
            env = _env(vhost, prefix, tmp_path, ttl="10")
            env = _sharded(env) if mode == "sharded" else env
            declare(env)
            broker = Broker(vhost.amqp_url)
            broker.tap_alerts()
            with running(env, tmp_path / f"{mode}.log"):
                # In chunks: the per-order mode's Redis pool (100 connections) fails when
                # hundreds of its books close in the same instant (reported to the lead).
                for start in range(0, len(stream.events), 250):
                    broker.publish(stream.events[start:start + 250], batch=25)
                    time.sleep(0.5)
                results[mode] = collect_alerts(broker, expected=len(stream.expected), timeout=120, settle=4)
            broker.close()
        finally:
            services.delete_vhost(vhost)
            services.clean_redis(prefix)
    for mode, alerts in results.items():
        counts = alert_counts(alerts)
        assert set(counts) == stream.expected, mode
        assert max(counts.values()) == 1, (mode, [a for a, n in counts.items() if n > 1])
    assert sorted(map(_signature, results["sharded"])) == sorted(map(_signature, results["per-order"]))
    assert any(a["kind"] == "purchase_without_request" for a in results["sharded"])


@pytest.mark.faults
def test_sigkill_of_a_shard_book_worker_mid_stream_loses_and_duplicates_nothing(vhost, redis_prefix, tmp_path) -> None:
    stream = generate(orders=3000, seed=13, orphans=0.03)
    env = _sharded(_env(vhost, redis_prefix, tmp_path))
    declare(env)
    broker = Broker(vhost.amqp_url)
    broker.tap_alerts()
    pipeline = Pipeline(env, tmp_path / "up.log", "--aggregators", "1", "--book-workers", "1").start()
    try:
        _wait_parent_ready(pipeline)
        assert pipeline.process is not None
        parent = psutil.Process(pipeline.process.pid)
        (victim,) = [c for c in parent.children() if "shard-books" in c.cmdline()]
        third = len(stream.events) // 3
        broker.publish(stream.events[:third], batch=50)
        time.sleep(0.6)  # checkpoints written, books open, more in flight
        broker.publish(stream.events[third:2 * third], batch=50)
        os.kill(victim.pid, signal.SIGKILL)
        broker.publish(stream.events[2 * third:], batch=50)
        alerts = collect_alerts(broker, expected=len(stream.expected), timeout=120, settle=6)
        log = pipeline.log()
        restarted = [c for c in parent.children() if "shard-books" in c.cmdline() and c.pid != victim.pid]
    finally:
        pipeline.stop()
        broker.close()
    assert restarted, "up did not restart the killed shard book worker"
    assert "shard taken over" in log
    counts = alert_counts(alerts)
    missing, extra = stream.expected - set(counts), set(counts) - stream.expected
    assert not missing and not extra, (sorted(missing)[:5], sorted(extra)[:5])
    # Exactly once, except the outbox's documented window: killed after the broker
    # confirmed an alert but before it was marked sent, the new owner re-publishes the
    # recorded (identical) alert; recipients dedup it by alert_id (docs/alerts.md).
    repeated = {a for a, n in counts.items() if n > 1}
    republished = {record.get("alert_id") for record in _log_records(log) if "re-publishing" in record.get("event", "")}
    assert repeated <= republished, sorted(repeated - republished)[:5]
    assert max(counts.values()) <= 2


def test_router_heartbeats_never_overtake_earlier_stamped_events(vhost, redis_prefix, tmp_path) -> None:
    """In every shard queue, each batch after a heartbeat T is stamped at T or later.

    That is the promise shard workers close books on (docs/sharding.md, closing clock):
    the router flushes its buffers before a heartbeat and publishes it on the same
    channel behind them. No shard worker runs here: the queues are read as published.
    """
    env = dict(_env(vhost, redis_prefix, tmp_path), ALDEBARAN_MODE="sharded", ALDEBARAN_SHARDS="2",
               ALDEBARAN_SHARD_HEARTBEAT_MS="20", ALDEBARAN_BATCH_MAX_EVENTS="30",
               ALDEBARAN_BATCH_LINGER_MS="100")  # buffers hold events when heartbeats are due
    declare(env)
    broker = Broker(vhost.amqp_url)
    log_path = tmp_path / "router.log"
    with open(log_path, "ab") as log:
        router = subprocess.Popen([sys.executable, "-m", "aldebaran.cli", "run", "router"],
                                  env=env, stdout=log, stderr=log)
    stream = generate(orders=400, seed=3, orphans=0.05)
    try:
        deadline = time.monotonic() + 60
        while '"event": "ready"' not in log_path.read_text(errors="replace"):
            assert router.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.1)
        for start in range(0, len(stream.events), 100):
            broker.publish(stream.events[start:start + 100], batch=10)
            time.sleep(0.03)  # heartbeats land between batches, not only at the end
        deadline = time.monotonic() + 60
        while broker.depth(TRADE_DATA) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        router.send_signal(signal.SIGTERM)
        assert router.wait(timeout=30) == 0, log_path.read_text()[-3000:]
    events = 0
    for shard in range(2):
        messages = broker.drain(shard_queue(shard))
        promised: dict[str, int] = {}
        heartbeats = batches_after_a_heartbeat = 0
        for properties, body in messages:
            if properties.content_type == HEARTBEAT:
                headers = properties.headers or {}
                router_id = headers[ROUTER_HEADER]
                router_id = router_id.decode() if isinstance(router_id, bytes) else router_id
                clock = int(body)
                assert clock >= promised.get(router_id, 0), "a router's clock went back"
                promised[router_id] = clock
                heartbeats += 1
                continue
            if promised:
                batches_after_a_heartbeat += 1
            for segment in decode_batch(body):
                stale = [t for t in promised.values() if segment.ingest_ms < t]
                assert not stale, (shard, segment.ingest_ms, stale)
                events += len(TRADE_CODEC.unpack_many(segment.events))
        assert len(promised) == 1 and heartbeats >= 3 and batches_after_a_heartbeat, (shard, heartbeats)
        last_properties, _ = messages[-1]
        assert last_properties.content_type == HEARTBEAT and (last_properties.headers or {}).get(FINAL_HEADER)
    broker.close()
    assert events == len(stream.events)
