"""`aldebaran stats` and `aldebaran health` against the real broker and Redis.

The management API refreshes queue counts every few seconds, so tests poll
`stats.collect` until the broker's view has caught up (bounded, never asserted on time),
then check the command line's `--json` once.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest
import redis

from aldebaran.io.redis import Keys
from aldebaran.ops import stats
from aldebaran.settings import Settings
from declare.declarer import declare, open_blocking
from declare.topology import DEAD_LETTER, REASON_HEADER, TRADE_DATA
from tests.support import services
from tests.support.waiting import wait_until

ALDEBARAN = str(Path(sys.executable).with_name("aldebaran"))


def aldebaran(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ALDEBARAN, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound but not listening: connections to it are refused, and nobody can take it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def eventually(read: Callable[[], stats.Stats], ok: Callable[[stats.Stats], bool], bound: float = 30) -> stats.Stats:
    """Poll until the management API's periodic statistics show what was done; the last read at
    the bound otherwise (the caller's assertions say what is missing)."""
    current: list[stats.Stats] = []

    def shown() -> bool:
        current[:] = [read()]
        return ok(current[0])

    wait_until(shown, "the management API's statistics", bound, pause=0.5, required=False)
    return current[0]


def publish(settings: Settings, queue: str, body: bytes, headers: dict | None = None,
            message_id: str | None = None) -> None:
    connection = open_blocking(settings.amqp_url)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, body, pika.BasicProperties(
            delivery_mode=2, headers=headers, message_id=message_id))
    finally:
        connection.close()


def depth(settings: Settings, queue: str) -> int:
    connection = open_blocking(settings.amqp_url)
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def by_name(result: stats.Stats) -> dict[str, stats.QueueStats]:
    return {q.name: q for q in result.queues}


# --- health -------------------------------------------------------------------------

def test_health_all_up(worker_env: dict[str, str]) -> None:
    done = aldebaran(worker_env, "health", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert {c["name"] for c in report["checks"]} == {"rabbitmq", "management", "redis"}


def test_health_names_redis_when_it_is_down(worker_env: dict[str, str], closed_port: int) -> None:
    env = dict(worker_env, ALDEBARAN_REDIS_URL=f"redis://127.0.0.1:{closed_port}/0")
    done = aldebaran(env, "health", "--json")
    assert done.returncode != 0
    assert "redis" in done.stderr and str(closed_port) in done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["redis"]["ok"] is False
    assert checks["rabbitmq"]["ok"] is True and checks["management"]["ok"] is True


def test_health_names_rabbitmq_when_amqp_is_down(worker_env: dict[str, str], closed_port: int) -> None:
    env = dict(worker_env, ALDEBARAN_AMQP_URL=f"amqp://guest:secret-pw@127.0.0.1:{closed_port}/")
    done = aldebaran(env, "health")
    assert done.returncode != 0
    assert "rabbitmq" in done.stderr and "secret-pw" not in done.stderr + done.stdout


def test_health_names_the_management_api_when_the_vhost_is_missing(worker_env: dict[str, str]) -> None:
    env = dict(worker_env, ALDEBARAN_AMQP_URL=services.vhost_url("no-such-vhost-for-aldebaran"))
    done = aldebaran(env, "health", "--json")
    assert done.returncode != 0
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert not checks["management"]["ok"] and "no-such-vhost-for-aldebaran" in checks["management"]["detail"]


# --- stats --------------------------------------------------------------------------

def test_stats_shows_depths_books_alerts_and_dead_letters(settings: Settings, worker_env: dict[str, str]) -> None:
    declare(settings, echo=lambda _: None)
    for i in range(3):
        publish(settings, TRADE_DATA, json.dumps({"id": f"r{i}", "#shares": 10, "client": "c", "stock": "s"}).encode())
    publish(settings, DEAD_LETTER, b"not json at all", headers={REASON_HEADER: "unreadable: not JSON"},
            message_id="dl-1")
    alert = {"alert_id": "over_purchase:7", "kind": "over_purchase", "order_id": "7", "client": "acme",
             "stock": "XYZ", "requested_shares": 100, "purchased_shares": 150, "purchase_ids": ["8", "9"],
             "detected_at": "2026-01-01T00:00:00Z"}
    client = redis.Redis.from_url(settings.redis_url)
    client.lpush(Keys(settings.redis_key_prefix).recent_alerts(), b"{garbage", json.dumps(alert))
    # One open per-order book: a book manager consuming book-7.
    holder = open_blocking(settings.amqp_url)
    try:
        channel = holder.channel()
        channel.queue_declare("book-7", durable=True)
        channel.basic_consume("book-7", lambda *a: None)

        result = eventually(lambda: stats.collect(settings),
                            lambda s: by_name(s).get(TRADE_DATA, stats.QueueStats("")).ready == 3
                            and s.dead_letters == 1 and s.open_books == 1)
        queues = by_name(result)
        assert queues[TRADE_DATA].ready == 3
        assert result.open_books == 1 and result.book_queues == 1
        assert queues["book-*"].queues == 1 and queues["book-*"].consumers == 1
        assert result.dead_letters == 1
        assert [(d.reason, d.message_id, d.body) for d in result.dead_letter_peek] == [
            ("unreadable: not JSON", "dl-1", "not json at all")]
        assert result.recent_alerts is not None
        assert result.recent_alerts[0] == alert  # newest first (LPUSH)
        assert "unreadable" in result.recent_alerts[1]

        done = aldebaran(worker_env, "stats", "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["dead_letters"] == 1 and report["open_books"] == 1
        assert report["dead_letter_peek"][0]["reason"] == "unreadable: not JSON"
        assert report["recent_alerts"][0]["alert_id"] == "over_purchase:7"

        table = aldebaran(worker_env, "stats")
        assert table.returncode == 0, table.stderr
        assert "Open books: 1" in table.stdout and "unreadable: not JSON" in table.stdout
    finally:
        holder.close()
    # Peeking put the dead letter back.
    assert depth(settings, DEAD_LETTER) == 1


def test_stats_does_not_peek_a_quorum_dead_letter_queue(settings: Settings) -> None:
    quorum = settings.model_copy(update={"queue_type": "quorum"})
    declare(quorum, echo=lambda _: None)
    publish(quorum, DEAD_LETTER, b"junk", headers={REASON_HEADER: "unreadable"})
    assert depth(quorum, DEAD_LETTER) == 1
    result = stats.collect(quorum)  # the queue's type is known at once; no need to wait for counts
    assert result.dead_letter_peek == [] and "quorum" in (result.dead_letter_note or "")
    assert depth(quorum, DEAD_LETTER) == 1


def test_stats_still_reports_queues_when_redis_is_down(settings: Settings, worker_env: dict[str, str],
                                                       closed_port: int) -> None:
    declare(settings, echo=lambda _: None)
    env = dict(worker_env, ALDEBARAN_REDIS_URL=f"redis://127.0.0.1:{closed_port}/0")
    done = aldebaran(env, "stats", "--json")
    assert done.returncode == 69, done.stderr  # ExitCode.UNAVAILABLE, after printing what it could
    report = json.loads(done.stdout)
    assert report["recent_alerts"] is None and any("redis" in p for p in report["problems"])
    assert TRADE_DATA in {q["name"] for q in report["queues"]}


def test_stats_exits_unavailable_when_the_management_api_is_down(worker_env: dict[str, str], closed_port: int) -> None:
    env = dict(worker_env, ALDEBARAN_MANAGEMENT_URL=f"http://guest:secret-pw@127.0.0.1:{closed_port}/")
    done = aldebaran(env, "stats")
    assert done.returncode == 69
    assert "management" in done.stderr and "secret-pw" not in done.stderr
