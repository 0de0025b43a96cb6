"""Fixtures of the fault suite: sinks, the channels' config, and the matrix recorder."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.fleet import FULL, ORDERS, WebhookServer, channels_toml
from tests.support import services
from tests.support.checker import SinkReport

# Short books so purchase_without_request fires soon, long enough that a restarted
# worker (a few seconds) never makes an order's later events late.
# At full scale on a loaded 2-core machine the backlog and a restart can take tens of
# seconds, so the recorded matrix uses the production default (60 s).
BOOK_TTL_SECONDS = float(os.environ.get("FAULTS_BOOK_TTL", "60" if FULL else "15"))


@pytest.fixture
def webhook() -> Iterator[WebhookServer]:
    server = WebhookServer()
    yield server
    server.close()


@pytest.fixture
def fault_env(worker_env: dict[str, str], webhook: WebhookServer, tmp_path: Path) -> dict[str, str]:
    env = dict(worker_env)
    env.update(
        ALDEBARAN_CONFIG=str(channels_toml(tmp_path / "channels.toml", webhook.url)),
        ALDEBARAN_BOOK_TTL_SECONDS=str(BOOK_TTL_SECONDS),
        ALDEBARAN_SHUTDOWN_GRACE_SECONDS="15",
    )
    (tmp_path / "logs").mkdir(exist_ok=True)
    return env


@pytest.fixture
def record():
    """Append one fault-matrix row (JSON line) to $FAULTS_RECORD when it is set."""
    def _record(fault: str, injected: int, events: int, reports: dict[str, SinkReport], command: str,
                **extra: object) -> None:
        path = os.environ.get("FAULTS_RECORD")
        if not path:
            return
        row = {"fault": fault, "injected": injected, "events": events, "orders": ORDERS,
               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
               "sinks": {name: {"expected": r.expected, "delivered": r.delivered, "deliveries": r.deliveries,
                                "lost": len(r.lost), "duplicated": len(r.duplicated),
                                "unexpected": len(r.unexpected),
                                "in_doubt": len(r.in_doubt)} for name, r in reports.items()},
               **extra}
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
    return _record


def redis_url() -> str:
    return services.REDIS_URL
