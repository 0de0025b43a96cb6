"""Partitioned engines end to end (real RabbitMQ and Redis): two engine processes share the books,
each owning a partition, and fire every alert of the stream once; SIGKILL of either one mid-stream
loses and duplicates nothing."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import psutil
import pytest

from aldebaran.trades.generator import generate
from tests.support import services
from tests.support.pipeline import Broker, Pipeline, alert_counts, collect_alerts, declare
from tests.support.waiting import wait_until
from tests.test_engine import _env, _owns_books, _publish_adversarial, _republished, _wait_parent_ready

HANDOVER_QUEUES = ("aldebaran.engine.partition.0", "aldebaran.engine.partition.1")


@contextmanager
def _partitioned_up(vhost: services.Vhost, prefix: str, tmp_path) -> Iterator[tuple[Broker, Pipeline]]:
    """`aldebaran up` with two partitioned engines (a 6 s book ttl) and a tap on the alerts."""
    env = dict(_env(vhost, prefix, tmp_path, ttl="6"), ALDEBARAN_ENGINE__PARTITIONS="2")
    declare(env)
    broker = Broker(vhost.amqp_url)
    broker.tap_alerts()
    pipeline = Pipeline(env, tmp_path / "up.log").start()
    try:
        _wait_parent_ready(pipeline)
        yield broker, pipeline
    finally:
        pipeline.stop()
        broker.close()


def _children(pipeline: Pipeline) -> list[psutil.Process]:
    assert pipeline.process is not None
    return [c for c in psutil.Process(pipeline.process.pid).children() if "engine" in c.cmdline()]


def test_two_partitions_fire_every_alert_of_an_adversarial_stream_once(vhost, redis_prefix, tmp_path) -> None:
    """Out of order, duplicated, orphaned, junk inside batches, batches published twice: `up` runs one
    engine per partition; each applies its own books and hands the others' events over."""
    stream = generate(orders=400, seed=7, orphans=0.05)
    with _partitioned_up(vhost, redis_prefix, tmp_path) as (broker, pipeline):
        wait_until(lambda: _owns_books(pipeline.log(), 2), "both partitions to own their books", timeout=60)
        junk = _publish_adversarial(broker, stream.events)
        alerts = collect_alerts(broker, expected=len(stream.expected), timeout=120, settle=4)
        dead = broker.drain_until("Aldebaran.Dead_Letter", junk, timeout=30)
        declared = [broker.declared(queue) for queue in HANDOVER_QUEUES]
        # Each engine handed the other's events over (the broker's counts lag a few seconds).
        wait_until(lambda: all(_published(vhost, queue) for queue in HANDOVER_QUEUES), "handovers both ways",
                   timeout=60, pause=0.5)
        log = pipeline.log()
    counts = alert_counts(alerts)
    assert set(counts) == stream.expected
    assert max(counts.values()) == 1, [a for a, n in counts.items() if n > 1]
    assert len(dead) == junk and all(p.headers["x-aldebaran-reason"] for p, _ in dead)
    assert [d.message_count if d else None for d in declared] == [0, 0]  # every handover taken
    assert '"partition": 0' in log and '"partition": 1' in log
    assert any(a["kind"] == "purchase_without_request" for a in alerts)


@pytest.mark.faults
def test_sigkill_of_each_partitions_engine_mid_stream_loses_and_duplicates_nothing(
        vhost, redis_prefix, tmp_path) -> None:
    stream = generate(orders=2000, seed=17, orphans=0.03)
    killed: list[int] = []
    with _partitioned_up(vhost, redis_prefix, tmp_path) as (broker, pipeline):
        third = len(stream.events) // 3
        for part in range(3):
            wait_until(lambda: _owns_books(pipeline.log(), 2 + len(killed)),  # every engine recovered
                       lambda: f"the engines to own their books:\n{pipeline.log()[-3000:]}", timeout=60, pause=0.05)
            broker.publish(stream.events[part * third:(part + 1) * third if part < 2 else None], batch=40)
            if part == 2:
                break
            victim = wait_until(lambda part=part: [c for c in _children(pipeline) if c.pid not in killed
                                                   and f"ALDEBARAN_ENGINE__PARTITION={part}" in _environ(c)],
                                f"partition {part}'s engine", timeout=60, pause=0.05)[0]
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim.pid)
        alerts = collect_alerts(broker, expected=len(stream.expected), timeout=120, settle=6)
        log = pipeline.log()
    assert len(killed) == 2
    counts = alert_counts(alerts)
    missing, extra = stream.expected - set(counts), set(counts) - stream.expected
    assert not missing and not extra, (sorted(missing)[:5], sorted(extra)[:5])
    repeated = {a for a, n in counts.items() if n > 1}  # only an outbox re-publish may repeat (docs/engine.md)
    assert repeated <= _republished(log), sorted(repeated - _republished(log))[:5]


def _published(vhost: services.Vhost, queue: str) -> int:
    with services._management() as http:
        found = http.get(f"/api/queues/{quote(vhost.name, safe='')}/{queue}").json()
    return int((found.get("message_stats") or {}).get("publish", 0))


def _environ(process: psutil.Process) -> str:
    try:
        return "\n".join(f"{k}={v}" for k, v in process.environ().items())
    except psutil.Error:
        return ""
