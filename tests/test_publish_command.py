"""`aldebaran publish FILE` end to end: what reaches the ingress, and a file it cannot read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from aldebaran.settings import Settings
from declare.declarer import declare
from declare.topology import TRADE_DATA
from tests.support.pipeline import Broker


def _publish(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALDEBARAN_")}
    env.update(ALDEBARAN_AMQP_URL=settings.amqp_url, ALDEBARAN_REDIS_URL=settings.redis_url)
    return subprocess.run([sys.executable, "-m", "aldebaran.cli", "publish", "--quiet", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def _ingress(settings: Settings) -> list[bytes]:
    broker = Broker(settings.amqp_url)
    try:
        return [body for _, body in broker.drain(TRADE_DATA)]
    finally:
        broker.close()


def test_events_go_batched_and_unreadable_lines_go_as_they_came(settings: Settings, tmp_path: Path) -> None:
    """The publisher is not the judge: a junk line and a line that is not UTF-8 reach the
    ingress byte for byte, for the pipeline to dead-letter with a reason."""
    declare(settings, echo=lambda _: None)
    not_utf8 = b'{"id": "caf\xe9", "#shares": 1, "client": "c", "stock": "s"}'
    lines = [b'{"id": "r1", "#shares": 10, "client": "c", "stock": "s"}',
             b'{"id": "p1", "initial_order_id": "r1", "#shares": 4, "client": "c", "stock": "s"}',
             b"not an event", not_utf8,
             b'{"id": "p2", "initial_order_id": "r1", "#shares": 7, "client": "c", "stock": "s"}']
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")

    done = _publish(settings, str(source), "--batch", "2")

    assert done.returncode == 0, done.stderr
    assert "published 5 events in 4 messages" in done.stderr
    bodies = _ingress(settings)
    assert b"not an event" in bodies and not_utf8 in bodies
    readable = [msgspec.json.decode(body) for body in bodies if body not in (b"not an event", not_utf8)]
    assert readable == [[{"id": "r1", "#shares": 10, "client": "c", "stock": "s"},
                         {"id": "p1", "initial_order_id": "r1", "#shares": 4, "client": "c", "stock": "s"}],
                        {"id": "p2", "initial_order_id": "r1", "#shares": 7, "client": "c", "stock": "s"}]


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_a_file_it_cannot_read_is_a_one_line_reason(settings: Settings, tmp_path: Path, what: str) -> None:
    path = tmp_path / "nowhere.jsonl" if what == "missing" else tmp_path

    done = _publish(settings, str(path))

    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"can't open '{path}'" in done.stderr.splitlines()[-1]
