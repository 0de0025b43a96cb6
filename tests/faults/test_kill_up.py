"""SIGKILL of the whole `aldebaran up` three times mid-stream, as a new user would (issue 18).

Every worker dies at once (aggregator, books, lookout, deliverers), mid-stream, and a new
`up` starts while the publisher keeps publishing (3,000 orders at full scale, 300 in CI,
book ttl 8 s, 5 % orphans). Expected: no alert lost (orphans included), nothing
unexpected, and `Aldebaran.Alert` carrying every alert exactly once in both modes (the
audit counts a second copy as a duplicate); the webhook (at most once) never gets an alert
twice, and has every alert or lists it in doubt (at most one per kill).
The failures this catches came and went between runs: each run kills three times.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aldebaran.trades.generator import generate
from tests.faults.conftest import redis_url
from tests.faults.fleet import (
    FULL,
    TEST_TIMEOUT,
    RetryingPublisher,
    describe,
    in_doubt_ids,
    pull_queue_deliveries,
    wait_for_sinks,
)
from tests.support.checker import check
from tests.support.pipeline import Broker, alert_counts, collect_alerts, declare
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(TEST_TIMEOUT)]
KILLS = int(os.environ.get("FAULTS_UP_KILLS", "3"))
POINTS = tuple((n + 1) / (KILLS + 1) for n in range(KILLS))
ORDERS = int(os.environ.get("FAULTS_UP_ORDERS", "3000" if FULL else "300"))
RATE = float(os.environ.get("FAULTS_UP_RATE", "700" if FULL else "800"))
TTL = "8"


class Up:
    """Successive `aldebaran up` processes, each with its own log file."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0

    def log_path(self, n: int) -> Path:
        return self.logs / f"up-{n}.log"

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path(self.starts), "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "aldebaran.cli", "up", "--no-tracer"],
                                            env=self.env, stdout=out, stderr=out)

    def wait_ready(self, timeout: float = 90) -> None:
        process = self.process
        assert process is not None

        def ready() -> bool:
            assert process.poll() is None, self.log()[-3000:]
            return '"event": "ready"' in self.log_path(self.starts).read_text(errors="replace")

        wait_until(ready, lambda: f"up to be ready:\n{self.log()[-3000:]}", timeout)

    def bounce(self) -> None:
        """SIGKILL a working `up` (the previous start is ready first) and start the next one."""
        self.wait_ready()
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)
        self.kills += 1
        self.start()

    def stop(self) -> int:
        assert self.process is not None
        self.process.terminate()
        return self.process.wait(timeout=60)

    def log(self) -> str:
        return "\n".join(self.log_path(n).read_text(errors="replace") for n in range(1, self.starts + 1)
                         if self.log_path(n).exists())


# The reference mode under `up` at full scale only: CI kills its two workers in test_kill.py.
@pytest.mark.parametrize("mode", [pytest.param("per-order", marks=pytest.mark.skipif(
    not FULL, reason="the reference mode's `up` kill runs at full scale")), "engine"])
def test_sigkill_of_up_three_times_alerts_once_on_the_bus(mode, fault_env, webhook, redis_prefix, vhost,
                                                          tmp_path: Path) -> None:
    stream = generate(orders=ORDERS, seed=18, orphans=0.05)
    env = dict(fault_env, ALDEBARAN_MODE=mode, ALDEBARAN_BOOK_TTL_SECONDS=TTL,
               ALDEBARAN_ENGINE__LEASE_SECONDS="1")
    declare(env)
    tap = Broker(vhost.amqp_url)
    tap.tap_alerts()  # a durable queue: read after the run on a fresh connection
    tap.close()
    up = Up(env, tmp_path / "logs")
    up.start()
    up.wait_ready()
    publisher = RetryingPublisher(vhost.amqp_url)
    try:
        publisher.publish_stream(stream.events, rate=RATE, at={p: up.bounce for p in POINTS})
        up.wait_ready()
        reports = wait_for_sinks(stream.expected, {
            "webhook": webhook.deliveries,
            "queue-api": lambda: pull_queue_deliveries(redis_url(), redis_prefix),
        }, timeout=120 + len(stream.events) / 50, in_doubt={"webhook": lambda: in_doubt_ids(redis_url(), redis_prefix)})
        tap = Broker(vhost.amqp_url)
        bus = collect_alerts(tap, expected=len(stream.expected), timeout=30, settle=1)
    finally:
        publisher.close()
        tap.close()
        code = up.stop()
    on_bus = check("Aldebaran.Alert", stream.expected, [a["alert_id"] for a in bus])
    orphans = {a for a in stream.expected if a.startswith("purchase_without_request")}
    print(f"\nSIGKILL up ({mode}) x{up.kills}: {len(stream.events)} events, {ORDERS} orders, "
          f"{len(orphans)} orphans\n{on_bus.line()}\n{describe(reports.values())}")
    assert up.kills == len(POINTS)
    assert not on_bus.lost and not on_bus.unexpected, describe([on_bus])
    repeated = {a for a, n in alert_counts(bus).items() if n > 1}
    assert not repeated, (sorted(repeated)[:10], sorted(repeated & _republished(up.log()))[:10])
    # The webhook is at most once: a kill mid-send leaves that one alert in doubt, never sent twice.
    assert reports["webhook"].ok and len(reports["webhook"].in_doubt) <= up.kills, describe([reports["webhook"]])
    assert reports["queue-api"].ok, describe([reports["queue-api"]])
    assert code == 0, up.log()[-3000:]


def _republished(log: str) -> set[str]:
    """The alerts a restarted engine published again from its outbox (its one repeat window)."""
    ids: set[str] = set()
    for match in re.finditer(r'"alert_ids": (\[[^\]]*\]), "event": "re-published alerts', log):
        ids |= set(json.loads(match.group(1)))
    return ids
